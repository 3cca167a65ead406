"""The ``"csr"`` path: ``torch.sparse`` (cuSPARSE on CUDA, MKL or torch's own kernels on the CPU)
on the canonical CSR, with strict sparse semantics (an inf or NaN in X reaches only the rows
that store a nonzero in its row). The vendor baseline the selector ranks the kernels against,
and the CPU's engine. torch's CPU CSR product has no 16-bit kernels: there the matrix is held in
float32 and X is rounded up for the product and Y rounded once, so the CPU sums 16-bit products
in float32 as the CUDA kernels do."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..formats.csr import torch_csr
from ..paths import CPU_CSR_DTYPES
from .base import Engine


class CsrIndices(NamedTuple):
    rowptr: torch.Tensor
    col: torch.Tensor
    num_rows: int
    num_cols: int


def product(matrix: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.sparse.mm(matrix, x)``, plus ``bias`` on every row if given: cuSPARSE then
    accumulates onto the bias, with no zero fill and no separate pass to add it."""
    return torch.sparse.mm(matrix, x) if bias is None else torch.addmm(bias, matrix, x)


def _held_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    return dtype if device.type != "cpu" or dtype in CPU_CSR_DTYPES else torch.float32


class CsrEngine(Engine):
    name = operand_key = "csr"

    def build_indices(self, structure, dtype):
        return CsrIndices(structure.rowptr, structure.col, structure.num_rows, structure.num_cols)

    def operands(self, indices, values):
        held = values.to(_held_dtype(values.dtype, values.device))
        return torch_csr(indices.rowptr, indices.col, held, (indices.num_rows, indices.num_cols))

    def reads_in_place(self, operands, values):
        # torch's CSR tensor holds the values themselves unless they were cast (16-bit on the CPU).
        return operands.dtype == values.dtype and operands.values().data_ptr() == values.data_ptr()

    def run(self, x, operands, bias):
        matrix = operands
        if matrix.dtype == x.dtype:
            return product(matrix, x.contiguous(), bias)
        with torch.autocast(x.device.type, enabled=False):
            wide = None if bias is None else bias.to(matrix.dtype)
            return product(matrix, x.to(matrix.dtype), wide).to(x.dtype)

    def flat(self, indices):
        return [indices.rowptr, indices.col], [indices.num_rows, indices.num_cols]

    def unflat(self, tensors, ints):
        return CsrIndices(*tensors, *ints)


CSR_ENGINE = CsrEngine()
