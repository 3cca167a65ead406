"""Softmax of edge scores over each row of an attention graph, per head, in torch ops: PyG's
``torch_geometric.utils.softmax`` (the row's maximum subtracted, ``exp``, divided by the row's
sum plus 1e-16), over the canonical CSR rows (``A.csr.rowptr``) with segment reductions, and its
exact gradient ``alpha * (g - sum_row(alpha * g))`` (the 1e-16 included), which needs only the
result. The attention functions of :mod:`.edge_attention` call them where the kernels do not run.

Each row's reduction runs in two levels, over pieces of at most ``SOFTMAX_PIECE_EDGES`` edges
and then over the pieces of each row (``row_reduce``, on ``AttentionGraph.segments``): torch's segment reduction gives each output one
thread that walks its whole segment, so a hub row of a power-law graph (tens of thousands of
edges) held the whole launch.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .attention_graph import AttentionGraph, RowSegments


def row_reduce(x: Tensor, reduce: str, segments: RowSegments) -> Tensor:
    """``reduce`` ("max" or "sum") of x [E, ...] over each row's edges, by pieces then rows: an
    empty row's max is -inf, its sum 0."""
    pieces = torch.segment_reduce(x, reduce, lengths=segments.piece_lengths, axis=0)
    return torch.segment_reduce(pieces, reduce, lengths=segments.pieces_per_row, axis=0)


def softmax(scores: Tensor, graph: AttentionGraph) -> Tensor:
    """Softmax of scores [E, heads] over the edges of each row of ``graph``."""
    # An empty row's maximum is -inf; no edge reads it. In place on the fresh tensor: one
    # [E, heads] tensor alive at a time beside the scores, the gathers aside.
    segments, row = graph.segments, graph.row
    alpha = (scores - row_reduce(scores, "max", segments).index_select(0, row)).exp_()
    row_sum = row_reduce(alpha, "sum", segments) + 1e-16
    return alpha.div_(row_sum.index_select(0, row))


def softmax_backward(alpha: Tensor, grad_alpha: Tensor, graph: AttentionGraph) -> Tensor:
    """The scores' gradient from the softmax's result ``alpha`` and its gradient."""
    weighted = grad_alpha * alpha
    row_sum = row_reduce(weighted, "sum", graph.segments)
    return weighted.sub_(alpha * row_sum.index_select(0, graph.row))
