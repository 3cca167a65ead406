"""RoDe (Pang et al., "RoDe: a row decomposition-based approach for sparse matrix multiplication
on GPUs", PPoPP'24; github.com/CRAFT-THU/RoDe) as a peer of the SpMM benchmark.

RoDe's code carries no license, so none of it is in this repository: ``get_rode.sh`` clones it
at a pinned commit into the git-ignored ``third_party/RoDe`` (or ``$RODE_DIR``), and
``extension()`` compiles our binding (``rode_binding.cu``), which includes the clone's
``RoDe_SpMM/RoDeSpmm.cu``, with ``torch.utils.cpp_extension.load``. ``<cstdint>`` is
force-included: the clone's headers use fixed-width integers without including it, which newer
compilers reject.

RoDe cuts every row into segments of 512 nonzeros (aligned down to 4-element vectors), runs the
segments of at least one 32-nonzero block in one kernel and the rest of each row in a residue
kernel on a second stream; both add into Y with atomics, so every call zeroes Y first (timed with
it). Its float32 kernels come for N = 32 and for 64 columns per block (its "n128" variant), which
serves any multiple of 64. Float32 only, exact (no TF32): it has no other.
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CLONE = Path(os.environ.get("RODE_DIR", HERE / "third_party" / "RoDe"))
# The segmentation RoDe's evaluation asks of its preprocessing (RowDivide2Segment(512, 4, 32)).
SEGMENT = 512
VECTOR = 4
BLOCK = 32


def unavailable() -> str | None:
    """Why RoDe cannot be built here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not (CLONE / "RoDe_SpMM" / "RoDeSpmm.cu").is_file():
        return f"no clone of RoDe in {CLONE} (benchmarks/peers/get_rode.sh makes one)"
    if shutil.which("nvcc") is None and "CUDA_HOME" not in os.environ:
        return "no CUDA compiler (nvcc) on the PATH"
    return None


@functools.lru_cache(maxsize=None)
def extension():
    from torch.utils.cpp_extension import load

    return load(
        name="tcsparse_rode_peer",
        sources=[str(HERE / "rode_binding.cu")],
        extra_include_paths=[str(CLONE / "RoDe_SpMM"), str(CLONE / "utils")],
        extra_cuda_cflags=["-O3", "-include", "cstdint", "--expt-relaxed-constexpr"],
    )


def segments(rowptr: torch.Tensor):
    """RoDe's row decomposition of a CSR: (segment rows, segment starts with the end appended,
    residue rows), int32 on ``rowptr``'s device. A row's length counts the nonzeros before its
    start back to a 4-element boundary; its full 512-nonzero segments start at the row (the first)
    and on the boundaries after it; the rest is a segment when it holds a 32-nonzero block, and a
    residue row when it does not divide into blocks."""
    if not isinstance(rowptr, torch.Tensor) or rowptr.dim() != 1 or rowptr.numel() == 0:
        raise ValueError(f"rowptr must be a non-empty 1-D tensor, got {rowptr!r}")
    rowptr = rowptr.long()
    offset = rowptr[:-1]
    misalign = offset % VECTOR
    padded = rowptr[1:] - offset + misalign
    full = torch.where(padded > SEGMENT, (padded + SEGMENT - 1) // SEGMENT - 1, torch.zeros_like(padded))
    rest = padded - full * SEGMENT
    count = full + (rest >= BLOCK).long()
    rows = torch.arange(offset.numel(), device=rowptr.device).repeat_interleave(count)
    first = torch.cumsum(count, 0) - count
    index = torch.arange(rows.numel(), device=rowptr.device) - first.repeat_interleave(count)
    starts = offset[rows] + index * SEGMENT - torch.where(index > 0, misalign[rows], torch.zeros_like(index))
    starts = torch.cat([starts, rowptr[-1:]])
    residue = torch.nonzero((rest > 0) & (rest % BLOCK != 0)).flatten()
    return rows.int(), starts.int(), residue.int()


class RoDe:
    """``RoDe(rowptr, col, values)(x)``: A @ X through RoDe's kernels, float32, on a CUDA device."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor):
        if not (rowptr.is_cuda and col.is_cuda and values.is_cuda):
            raise ValueError("RoDe runs on a CUDA device: rowptr, col and values must be CUDA tensors")
        if col.numel() != values.numel() or int(rowptr[-1]) != col.numel():
            raise ValueError(f"a CSR of {int(rowptr[-1])} nonzeros needs as many columns and values, "
                             f"got {col.numel()} and {values.numel()}")
        self.module = extension()
        # Vector loads of a row's last nonzeros may reach past the arrays' end: a few zeros after.
        tail = 2 * VECTOR
        self.values = torch.cat([values.float(), values.new_zeros(tail, dtype=torch.float32)]).contiguous()
        self.col = torch.cat([col.int(), col.new_zeros(tail, dtype=torch.int32)]).contiguous()
        self.rowptr = rowptr.int().contiguous()
        self.segment_rows, self.segment_starts, self.residue_rows = segments(rowptr)
        self.num_rows = rowptr.numel() - 1
        self._out = {}

    @staticmethod
    def supports(n: int) -> bool:
        return n == 32 or (n > 0 and n % 64 == 0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not x.is_cuda or x.dim() != 2 or not self.supports(x.shape[1]):
            raise ValueError(f"x must be a CUDA float32 matrix of 32 or a multiple of 64 columns, got "
                             f"{x.dtype} {tuple(x.shape)} on {x.device}")
        n = x.shape[1]
        y = self._out.get(n)
        if y is None:
            y = self._out[n] = torch.empty(self.num_rows, n, device=x.device)
        y.zero_()
        self.module.spmm(self.values, self.col, self.rowptr, self.segment_rows, self.residue_rows,
                         self.segment_starts, x.contiguous(), y)
        return y
