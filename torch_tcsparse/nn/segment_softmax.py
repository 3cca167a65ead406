"""Softmax of edge scores over each row of an attention graph, per head: PyG's
``torch_geometric.utils.softmax`` (the row's maximum subtracted, ``exp``, divided by the row's
sum plus 1e-16), over the canonical CSR rows (``A.csr.rowptr``) with segment reductions.

An autograd function keeps only the result for its backward, ``alpha * (g - sum_row(alpha * g))``
(the exact gradient of PyG's formula, the 1e-16 included): autograd through the torch ops would
keep three more [E, heads] tensors.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .attention_graph import AttentionGraph


def segment_softmax(scores: Tensor, graph: AttentionGraph) -> Tensor:
    """Softmax of scores [E, heads] over the edges of each row of ``graph``."""
    return SegmentSoftmax.apply(scores, graph.lengths, graph.row)


class SegmentSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, lengths, row):
        # An empty row's maximum is -inf; no edge reads it.
        # In place where a fresh tensor allows: one [E, heads] tensor alive at a time beside the
        # scores, the gathers aside.
        row_max = torch.segment_reduce(scores, "max", lengths=lengths, axis=0)
        alpha = (scores - row_max.index_select(0, row)).exp_()
        row_sum = torch.segment_reduce(alpha, "sum", lengths=lengths, axis=0) + 1e-16
        alpha.div_(row_sum.index_select(0, row))
        ctx.save_for_backward(alpha, lengths, row)
        return alpha

    @staticmethod
    def backward(ctx, grad_alpha):
        alpha, lengths, row = ctx.saved_tensors
        weighted = grad_alpha * alpha
        row_sum = torch.segment_reduce(weighted, "sum", lengths=lengths, axis=0)
        return weighted.sub_(alpha * row_sum.index_select(0, row)), None, None
