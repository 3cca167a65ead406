"""The CUDA kernels' build state, precision mode, launch shapes and SDDMM (the products' own
launches live with their engines, ``engines/``).

X and Y are float32, float16 or bfloat16 (Y has X's dtype); the values of A reach the kernels
as float32, and every product is accumulated in fp32. Precision of ``spmm`` (csrc/metcf_spmm.h):

* float32 with TF32 allowed (``torch.backends.cuda.matmul.allow_tf32`` or float32 matmul
  precision "high"/"medium"): operands rounded to TF32; relative error ~1e-4..1e-3 of
  sum |a * x| per output, as torch's own TF32 matmul.
* float32 otherwise: 3xTF32 split (hi*hi + hi*lo + lo*hi), about fp32 accuracy (~1e-6 relative).
* float16 / bfloat16: exact products of the 16-bit operands summed in fp32, one rounding to the
  output dtype at the end (relative 2^-11 / 2^-8 of each output), however long the row.
"""
from __future__ import annotations

import torch

from . import _ext
from .formats.metcf import BALANCE_CHUNK, MetcfLayout
from .paths import KERNEL_DTYPES as DTYPES
from .paths import KERNEL_PATHS as KERNELS

# Row windows of a matrix large enough for the widest column slices of every kernel (the launch
# shape of 16-bit kernels depends on the window count; see use_wide_slices in csrc/metcf_spmm.cuh).
MANY_WINDOWS = 1 << 40

available = _ext.available


# torch.backends.cuda.matmul.allow_tf32 is read through a module __getattr__, a cost paid on every
# float32 product that is comparable to a small graph's kernel; the accessor it calls is cheap.
_cublas_allow_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None)


def tf32_allowed() -> bool:
    """Whether float32 products may round to TF32: torch's cuBLAS flag or matmul precision."""
    allowed = _cublas_allow_tf32() if _cublas_allow_tf32 is not None else torch.backends.cuda.matmul.allow_tf32
    return bool(allowed) or torch.get_float32_matmul_precision() != "highest"


def layout_arguments(layout: MetcfLayout) -> list:
    """The ME-TCF layout as the kernels' bindings take it."""
    return [
        layout.window_offsets,
        layout.block_offsets,
        layout.local_ids,
        layout.block_cols,
        layout.block_bitmap,
        layout.row_map,
        layout.chunk_offsets,
        layout.window,
        layout.num_rows,
        layout.num_cols,
        BALANCE_CHUNK,
    ]


def _check_dense(layout: MetcfLayout, **dense) -> None:
    """Each dense operand: one of DTYPES (all the same), 2-D with the given rows, on the layout's
    CUDA device."""
    if layout.device.type != "cuda":
        raise ValueError(f"the kernels need a CUDA layout, got one on {layout.device}")
    dtypes = set()
    for name, (t, rows) in dense.items():
        if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES:
            raise TypeError(f"{name} must be a float32, float16 or bfloat16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        dtypes.add(t.dtype)
        if t.dim() != 2 or t.shape[0] != rows:
            raise ValueError(f"{name} must be 2-D with {rows} rows, got shape {tuple(t.shape)}")
        if t.device != layout.device:
            raise ValueError(f"{name} is on {t.device} but the layout is on {layout.device}")
    if len(dtypes) > 1:
        raise TypeError(f"the dense operands must share one dtype, got {sorted(map(str, dtypes))}")


def sddmm(grad_y: torch.Tensor, x: torch.Tensor, layout: MetcfLayout) -> torch.Tensor:
    """For every nonzero in block order, <grad_y[row], x[col]>: the gradient of the values, summed
    in fp32 and returned in x's dtype."""
    _check_dense(layout, grad_y=(grad_y, layout.num_rows), x=(x, layout.num_cols))
    if grad_y.shape[1] != x.shape[1]:
        raise ValueError(f"grad_y has {grad_y.shape[1]} columns but x has {x.shape[1]}")
    return _ext.load().sddmm(grad_y, x, *layout_arguments(layout)).to(x.dtype)


def _launch_shape(kernel: str, n: int, dtype: torch.dtype, num_windows: int) -> list[int]:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be one of {DTYPES}, got {dtype}")
    exact = dtype == torch.float32 and not tf32_allowed()
    return list(_ext.load().launch_shape(16, int(num_windows), int(n), kernel == "balanced", exact, dtype))


def occupancy(kernel: str, n: int, dtype: torch.dtype = torch.float32, num_windows: int = MANY_WINDOWS) -> int:
    """Warps of ``kernel``'s SpMM resident per SM at N = n for X of ``dtype`` on a matrix of
    ``num_windows`` row windows, on the current CUDA device."""
    return _launch_shape(kernel, n, dtype, num_windows)[0]


def column_slices(kernel: str, n: int, dtype: torch.dtype = torch.float32, num_windows: int = MANY_WINDOWS) -> int:
    """Warps per row window (base) or chunk (balanced) along N at N = n for X of ``dtype``."""
    return _launch_shape(kernel, n, dtype, num_windows)[1]
