"""The product's paths and the dtypes they take: every module names them from here."""
from __future__ import annotations

import torch

# Every value of ``path=``: the engines, and "auto" (the selector's choice).
ENGINE_PATHS = ("base", "balanced", "rows", "grouped", "csr", "reference")
PATHS = ("auto",) + ENGINE_PATHS
# The ME-TCF Tensor-Core kernels.
KERNEL_PATHS = ("base", "balanced")
# Paths that need a CUDA X in one of KERNEL_DTYPES.
CUDA_ONLY_PATHS = KERNEL_PATHS + ("rows", "grouped")
# The paths the selector ranks (the reference is never chosen).
SELECTOR_PATHS = ("base", "balanced", "csr", "rows", "grouped")
# The dtypes the CUDA kernels take (X, Y; values reach the Tensor-Core kernels as float32).
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The dtypes a TCSparseTensor may hold.
VALUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# torch's CPU sparse CSR product has no half-precision kernels.
CPU_CSR_DTYPES = (torch.float32, torch.float64)
# The values of ``reduce=``: how the products A[i, j] * X[j] of a row combine. torch.sparse.mm's
# and PyG's spellings name the same reductions.
REDUCTIONS = ("sum", "mean", "max", "min")
REDUCTION_ALIASES = {"add": "sum", "amax": "max", "amin": "min"}
# The paths "max" and "min" run on: "rows", the CUDA-core kernel over the CSR rows
# (csrc/reduce_rows.cu); "reference", torch ops on any device and dtype; "auto", the first where
# it applies.
EXTREME_PATHS = ("auto", "rows", "reference")
