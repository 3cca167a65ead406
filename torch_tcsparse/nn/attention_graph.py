"""The pattern attention runs over, derived once per ``TCSparseTensor`` ``adj_t`` and kept by the
layer (:mod:`.derived_graph`): its canonical CSR (``A.csr``: rows are targets, the softmax runs
over each row), the row of each edge, and for the CUDA kernels of ``csrc/attention.cu`` and
``csrc/edge_softmax.cu`` the rows cut into pieces and the transpose's CSR with each of its edges'
place in the forward's order.

The edges' order is ``A.csr``'s: attention weights, scores and dropout masks are [E, heads]
tensors in that order, the order PyG's own layers use for a torch.sparse CSR ``adj_t``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .. import kernels
from ..tensor import TCSparseTensor
from .self_loops import complete_diagonal

# Nonzeros per piece of a row: a hub row is shared among groups of lanes, each walking at most
# this many, so that one row does not hold a launch's last warps (power-law graphs); short rows
# stay whole, written once without partial sums.
PIECE_NNZ = 256


# Edges per piece of a row in the softmax's reductions (``segment_softmax`` and the softmax
# kernel, one thread per piece and head): short rows are one piece; a hub's pieces are reduced in
# parallel, and their results by one thread per row.
SOFTMAX_PIECE_EDGES = 64


class RowSegments(NamedTuple):
    """The rows of a CSR cut into pieces: the edges of each piece (at most
    ``SOFTMAX_PIECE_EDGES``; an empty row has one empty piece) and the pieces of each row."""

    piece_lengths: Tensor
    pieces_per_row: Tensor


def row_segments(lengths: Tensor, piece_edges: int = SOFTMAX_PIECE_EDGES) -> RowSegments:
    """The pieces of rows of ``lengths`` edges each (int64)."""
    counts = torch.div(lengths + piece_edges - 1, piece_edges, rounding_mode="floor").clamp(min=1)
    total = int(counts.sum())
    row = torch.repeat_interleave(torch.arange(counts.numel(), device=lengths.device), counts, output_size=total)
    within = torch.arange(total, device=lengths.device) - (torch.cumsum(counts, 0) - counts).index_select(0, row)
    piece_lengths = (lengths.index_select(0, row) - within * piece_edges).clamp(max=piece_edges)
    return RowSegments(piece_lengths, counts)


class RowPieces(NamedTuple):
    """A CSR's rows cut into pieces of at most ``PIECE_NNZ`` nonzeros (int32 arrays, see
    ``csrc/attention.h``): piece p covers nonzeros [begin[p], begin[p + 1]) of row row[p]; the
    pieces of a row longer than one piece write partial sums to their slots, which split row s
    (``split_rows[s]``) sums over [split_begin[s], split_begin[s + 1])."""

    begin: Tensor
    row: Tensor
    slot: Tensor
    split_rows: Tensor
    split_begin: Tensor
    num_slots: int


def row_pieces(rowptr: Tensor, piece_nnz: int = PIECE_NNZ) -> RowPieces:
    """The pieces of a CSR's rows; an empty row gets one empty piece (which writes its zeros)."""
    rowptr = rowptr.long()
    device = rowptr.device
    lengths = rowptr[1:] - rowptr[:-1]
    counts = torch.div(lengths + piece_nnz - 1, piece_nnz, rounding_mode="floor").clamp(min=1)
    total = int(counts.sum())
    row = torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts, output_size=total)
    first = torch.cumsum(counts, 0) - counts
    within = torch.arange(total, device=device) - first[row]
    begin = torch.cat([rowptr[row] + within * piece_nnz, rowptr[-1:]])
    split = counts > 1
    split_rows = torch.nonzero(split).squeeze(1)
    split_begin = torch.cat([counts.new_zeros(1), torch.cumsum(counts[split_rows], 0)])
    in_split = split[row]
    slot = torch.where(in_split, torch.cumsum(in_split.long(), 0) - 1, -1)
    arrays = (t.to(torch.int32) for t in (begin, row, slot, split_rows, split_begin))
    return RowPieces(*arrays, int(split_begin[-1]))


class KernelOperands(NamedTuple):
    """What the kernels read besides the features: int32 rows and columns of the edges, the
    rows' pieces (of ``PIECE_NNZ`` for the products, of ``SOFTMAX_PIECE_EDGES`` for the
    softmax), and the transpose's CSR (its columns, the forward's place of each of its edges, its
    pieces) for the products of the backward."""

    row: Tensor
    col: Tensor
    pieces: RowPieces
    softmax_pieces: RowPieces
    col_t: Tensor
    edge_ids_t: Tensor
    pieces_t: RowPieces
    num_rows: int
    num_cols: int


class AttentionGraph:
    """``matrix``'s pattern as attention reads it (its values are never read)."""

    def __init__(self, matrix: TCSparseTensor):
        csr = matrix.csr
        self.matrix = matrix
        self.num_rows, self.num_cols = csr.num_rows, csr.num_cols
        self.col = csr.col
        self.row = csr.row_indices(csr.col.dtype)
        self.lengths = (csr.rowptr[1:] - csr.rowptr[:-1]).long()
        self._rowptr = csr.rowptr
        self._kernel_operands: KernelOperands | None = None
        self._segments = None

    @property
    def segments(self):
        """The rows cut into pieces for the softmax's reductions (``row_segments``), built on
        first need."""
        if self._segments is None:
            self._segments = row_segments(self.lengths)
        return self._segments

    @property
    def nnz(self) -> int:
        return self.col.numel()

    def kernel_operands(self, x: Tensor) -> KernelOperands | None:
        """The kernels' operands where they can multiply ``x`` (a CUDA tensor of a kernel dtype,
        int32 indices, the extension built), built on first need; else None."""
        if not (kernels.usable(x) and self.col.dtype == torch.int32):
            return None
        if self._kernel_operands is None:
            self._kernel_operands = build_kernel_operands(self._rowptr, self.col, self.row, self.num_cols)
        return self._kernel_operands


def build_kernel_operands(rowptr: Tensor, col: Tensor, row: Tensor, num_cols: int,
                          piece_nnz: int = PIECE_NNZ) -> KernelOperands:
    """The kernels' operands of the CSR (rowptr, col) whose edges lie in ``row``; the transpose's
    edges are sorted by column, stably, so rows ascend within each (its canonical order)."""
    order = torch.sort(col.long(), stable=True).indices
    counts_t = torch.bincount(col.long(), minlength=num_cols)
    rowptr_t = torch.cat([counts_t.new_zeros(1), torch.cumsum(counts_t, 0)])
    return KernelOperands(
        row.to(torch.int32), col.to(torch.int32), row_pieces(rowptr, piece_nnz),
        row_pieces(rowptr, SOFTMAX_PIECE_EDGES), row[order].to(torch.int32), order.to(torch.int32), row_pieces(rowptr_t, piece_nnz),
        rowptr.numel() - 1, num_cols,
    )


def attention_graph(adj: TCSparseTensor, self_loops: bool) -> AttentionGraph:
    """The graph of adj_t, with one self-loop per node i < min(rows, cols) where ``self_loops``
    (the loops adj_t has count once: PyG removes them and adds one per node)."""
    return AttentionGraph(complete_diagonal(adj).matrix if self_loops else adj)
