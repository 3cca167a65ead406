"""The engines behind ``A @ X``: one module per path and a registry from path name to engine.

An engine knows three things (``base.Engine``): how to build the operands its kernel reads from a
matrix (its value-independent ``Structure`` and its values in canonical CSR order; the matrix
keeps them in its ``OperandCache``), how to take them from the ME-TCF arrays the
``tcsparse::spmm`` op carries under ``torch.compile``, and how to multiply. The backward of every
engine is the same formula (``autograd.py``): dX runs the engine on the transpose's operands, the
values' gradient is one SDDMM. ``reduce="mean"`` runs these engines on row-scaled values;
``reduce="max"``/``"min"`` is no sum and has its own forward and backward (``extreme.py``).
"""
from __future__ import annotations

import torch

from .. import kernels
from ..paths import CUDA_ONLY_PATHS, KERNEL_DTYPES, PATHS
from .base import Engine
from .csr import CSR_ENGINE
from .grouped import GROUPED
from .reference import REFERENCE
from .rows import ROWS
from .tensor_core import BALANCED, BASE

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (BASE, BALANCED, ROWS, GROUPED, CSR_ENGINE, REFERENCE)}


def kernels_apply(x: torch.Tensor) -> bool:
    """Whether the CUDA kernels can multiply this operand (device, dtype, built)."""
    return x.is_cuda and x.dtype in KERNEL_DTYPES and kernels.available()


def resolve(path: str, x: torch.Tensor) -> str:
    """The engine ``path`` names for this X: "auto" means the Tensor-Core base kernel where the
    kernels apply (a TCSparseTensor asks the selector before this), else torch.sparse; a path
    that cannot run on X raises ValueError."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path in CUDA_ONLY_PATHS and not (x.is_cuda and x.dtype in KERNEL_DTYPES):
        raise ValueError(f"path {path!r} needs a CUDA tensor of dtype {KERNEL_DTYPES}, got {x.dtype} on {x.device}")
    if path != "auto":
        return path
    return "base" if kernels_apply(x) else "csr"


__all__ = ["ENGINES", "Engine", "kernels_apply", "resolve"]
