"""Softmax of edge scores over each row of an attention graph, per head: PyG's
``torch_geometric.utils.softmax`` (the row's maximum subtracted, ``exp``, divided by the row's
sum plus 1e-16), over the canonical CSR rows (``A.csr.rowptr``) with segment reductions.

An autograd function keeps only the result for its backward, ``alpha * (g - sum_row(alpha * g))``
(the exact gradient of PyG's formula, the 1e-16 included): autograd through the torch ops would
keep three more [E, heads] tensors.

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


def segment_softmax(scores: Tensor, graph: AttentionGraph) -> Tensor:
    """Softmax of scores [E, heads] over the edges of each row of ``graph``."""
    return SegmentSoftmax.apply(scores, graph.segments, graph.row)


class SegmentSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, segments, row):
        # An empty row's maximum is -inf; no edge reads it.
        # In place where a fresh tensor allows: one [E, heads] tensor alive at a time beside the
        # scores, the gathers aside.
        row_max = row_reduce(scores, "max", segments)
        alpha = (scores - row_max.index_select(0, row)).exp_()
        row_sum = row_reduce(alpha, "sum", segments) + 1e-16
        alpha.div_(row_sum.index_select(0, row))
        ctx.save_for_backward(alpha, row)
        ctx.segments = segments
        return alpha

    @staticmethod
    def backward(ctx, grad_alpha):
        alpha, row = ctx.saved_tensors
        weighted = grad_alpha * alpha
        row_sum = row_reduce(weighted, "sum", ctx.segments)
        return weighted.sub_(alpha * row_sum.index_select(0, row)), None, None
