"""The ``"rows"`` path: the CUDA-core CSR kernel of ``csrc/csr_rows_spmm.h``, one warp per row
piece (``csr_rows``: how long rows are split). It serves graphs whose row windows share few
columns (R-MAT, uniform random), where Tensor-Core blocks hold a few nonzeros each. Values, X,
bias and Y share one dtype; sums are fp32 with plain FMAs (no TF32 rounding). A reordered matrix
runs its rows in the reordering's order (rows sharing columns side by side, their rows of X
found in L2) and writes Y in the user's order."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import csr_rows, kernels
from .base import Engine


class RowsIndices(NamedTuple):
    """The CSR the kernel reads, its rows in the order the warps take them, original column ids;
    ``gather`` (canonical nonzero of each entry) and ``row_map`` (Y row of each row) are None
    where that is the canonical order; and the split of its long rows."""

    rowptr: torch.Tensor
    col: torch.Tensor
    gather: torch.Tensor | None
    row_map: torch.Tensor | None
    pieces: csr_rows.RowPieces
    num_cols: int


class RowsOperands(NamedTuple):
    indices: RowsIndices
    values: torch.Tensor  # in the kernel's order


class RowsEngine(Engine):
    name = operand_key = "rows"

    def index_key(self, structure, dtype):
        # The split depends on the matrix, the dtype and deterministic mode (no split rows there).
        reads = csr_rows.reads_longest_row(structure.nnz, dtype)
        longest = structure.max_row_nnz() if reads else structure.known_max_row_nnz()
        return ("rows", csr_rows.product_piece_nnz(structure.nnz, longest, dtype))

    def build_indices(self, structure, dtype):
        csr_rows.check_indices(structure.rowptr)
        piece_nnz = self.index_key(structure, dtype)[1]
        if structure.row_perm is None:
            rowptr, col, gather, row_map = structure.rowptr, structure.col, None, None
        else:
            # A copy with the rows in the reordering's order: a contiguous stream of indices in
            # the order the warps take them, faster than reading ours through an order index.
            rowptr, col, gather = csr_rows.permuted_rows(structure.rowptr, structure.col, structure.row_perm)
            row_map = structure.layout.row_map[: structure.num_rows]
        # Where the longest row is unknown (a transpose built in a backward pass) the split is
        # padded to bounds from nnz, so that building it waits for nothing on the device.
        pieces = csr_rows.row_pieces(rowptr, piece_nnz, structure.known_max_row_nnz(), structure.nnz)
        return RowsIndices(rowptr, col, gather, row_map, pieces, structure.num_cols)

    def operands(self, indices, values):
        return RowsOperands(indices, values if indices.gather is None else values.index_select(0, indices.gather))

    def reads_in_place(self, operands, values):
        return operands.indices.gather is None  # else a gathered copy in the warps' order

    def run(self, x, operands, bias):
        i, values = operands
        return kernels.csr_rows_spmm(x, i.rowptr, i.col, values, i.pieces, i.num_cols, bias, i.row_map)

    scatters = True

    def scatter(self, grad_y, operands):
        # Each row piece of the product adds its nonzeros' share of dX: the forward's split and
        # row order serve as they are.
        i, values = operands
        return kernels.csr_rows_scatter(grad_y, i.rowptr, i.col, values, i.pieces, i.num_cols, i.row_map)

    def flat(self, i):
        optional = [t for t in (i.gather, i.row_map) if t is not None]
        p = i.pieces
        tensors = [i.rowptr, i.col, *optional, p.piece_slots, p.piece_starts, p.split_rows]
        return tensors, [i.num_cols, p.piece_nnz, i.gather is not None, i.row_map is not None]

    def unflat(self, tensors, ints):
        num_cols, piece_nnz, has_gather, has_row_map = ints
        rowptr, col, *optional, slots, starts, split_rows = tensors
        gather = optional.pop(0) if has_gather else None
        row_map = optional.pop(0) if has_row_map else None
        pieces = csr_rows.RowPieces(slots, starts, split_rows, piece_nnz)
        return RowsIndices(rowptr, col, gather, row_map, pieces, num_cols)


ROWS = RowsEngine()
