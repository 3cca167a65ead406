"""The ``"rows"`` path: the CUDA-core CSR kernel of ``csrc/csr_rows_spmm.h``, one warp per row
piece (``csr_rows``: how long rows are split). It serves graphs whose row windows share few
columns (R-MAT, uniform random), where Tensor-Core blocks hold a few nonzeros each. Values, X,
bias and Y share one dtype; sums are fp32 with plain FMAs (no TF32 rounding). A reordered matrix
runs its rows in the reordering's order (rows sharing columns side by side, their rows of X
found in L2) and writes Y in the user's order."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .. import _ext, csr_rows
from .base import Engine


def launch(x, rowptr, col, values, pieces: csr_rows.RowPieces, num_cols: int, bias=None, row_map=None,
           addend=None) -> torch.Tensor:
    """Y = A @ x (+ bias on every row) for the CSR (rowptr, col, values) split by ``pieces``; x may
    be a column slice of a wider tensor (any row stride), Y is contiguous. ``row_map`` (int32, a
    permutation) writes CSR row i to row ``row_map[i]`` of Y. ``addend`` (fp32, Y's shape and row
    order) is added to Y before its one rounding: another kernel's sums over the same Y. The
    binding checks every argument (RuntimeError naming it)."""
    return _ext.load().csr_rows_spmm(
        x, rowptr, col, values, pieces.piece_slots, pieces.piece_starts, pieces.split_rows, num_cols,
        pieces.piece_nnz, bias, row_map, addend,
    )


class RowsOperands(NamedTuple):
    rowptr: torch.Tensor
    col: torch.Tensor
    values: torch.Tensor
    num_cols: int
    row_map: torch.Tensor | None
    # The split of long rows for products in the values' dtype, and the one without split rows
    # that deterministic mode runs (built on first need, asked per call: the mode may change).
    split: csr_rows.RowPieces
    unsplit: Callable[[], csr_rows.RowPieces]


class RowsEngine(Engine):
    name = operand_key = "rows"

    def prepare(self, structure, values):
        csr_rows.check_indices(structure.rowptr)
        rows = structure.rows_csr()
        ordered = values if rows.gather is None else values[rows.gather]
        split = structure.row_pieces(csr_rows.split_piece_nnz(structure.nnz, structure.max_row_nnz(), values.dtype))
        return RowsOperands(rows.rowptr, rows.col, ordered, structure.num_cols, rows.row_map, split,
                            lambda: structure.row_pieces(csr_rows.UNSPLIT))

    def from_layout(self, layout, block_values, row_pieces):
        csr_rows.check_indices(layout.csr_rowptr)
        size = csr_rows.piece_size()
        if row_pieces:
            pieces = csr_rows.RowPieces(*row_pieces[:3], size)
        else:
            pieces = csr_rows.row_pieces(layout.csr_rowptr, size)
        return RowsOperands(layout.csr_rowptr, layout.csr_col, block_values[layout.csr_gather], layout.num_cols, None,
                            pieces, lambda: pieces)

    def run(self, x, operands, bias):
        o = operands
        values = o.values if o.values.dtype == x.dtype else o.values.to(x.dtype)
        pieces = o.unsplit() if torch.are_deterministic_algorithms_enabled() else o.split
        return launch(x, o.rowptr, o.col, values, pieces, o.num_cols, bias, o.row_map)


ROWS = RowsEngine()
