"""Python entry points of the CUDA kernels (ME-TCF SpMM and SDDMM); ``ops.py`` calls these.

Precision of ``spmm`` on float32 (see csrc/metcf_spmm.h):

* TF32 (``torch.backends.cuda.matmul.allow_tf32`` or float32 matmul precision "high"/"medium"):
  operands rounded to TF32, fp32 accumulation; relative error ~1e-4..1e-3 of sum |a * x| per
  output, as torch's own TF32 matmul.
* exact (otherwise): 3xTF32 split (hi*hi + hi*lo + lo*hi), about fp32 accuracy (~1e-6 relative).
"""
from __future__ import annotations

import torch

from . import _ext
from .formats.metcf import BALANCE_CHUNK, MetcfLayout

KERNELS = ("base", "balanced")

_available: bool | None = None


def available() -> bool:
    """True when a CUDA device is present and the extension builds; never raises."""
    global _available
    if _available is None:
        try:
            _available = torch.cuda.is_available() and _ext.load() is not None
        except Exception:  # any build or driver failure means: use the other paths
            _available = False
    return _available


def tf32_allowed() -> bool:
    return bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"


def _layout_args(layout: MetcfLayout) -> list:
    return [
        layout.window_offsets,
        layout.block_offsets,
        layout.local_ids,
        layout.block_cols,
        layout.row_map,
        layout.chunk_offsets,
        layout.window,
        layout.num_rows,
        layout.num_cols,
        BALANCE_CHUNK,
    ]


def spmm(x: torch.Tensor, values: torch.Tensor, layout: MetcfLayout, kernel: str = "base") -> torch.Tensor:
    """Y[num_rows, N] = A @ x with A given by (layout, values in block order); x is [num_cols, N]."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [num_cols, N], got shape {tuple(x.shape)}")
    return _ext.load().spmm(
        x,
        values,
        *_layout_args(layout),
        kernel == "balanced",
        torch.are_deterministic_algorithms_enabled(),
        not tf32_allowed(),
    )


def sddmm(grad_y: torch.Tensor, x: torch.Tensor, layout: MetcfLayout) -> torch.Tensor:
    """For every nonzero in block order, <grad_y[row], x[col]>: the gradient of the values."""
    return _ext.load().sddmm(grad_y, x, *_layout_args(layout))
