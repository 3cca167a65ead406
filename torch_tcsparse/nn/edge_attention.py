"""Attention weights [E, heads] over an :class:`.attention_graph.AttentionGraph` from per-node
arrays, the softmax over each row of the edges' scores (PyG's formula, ``segment_softmax``):

- ``gat_attention(graph, src, dst, negative_slope)``: GAT's scores
  ``leaky_relu(src[j] + dst[i])`` from src [num_cols, heads] and dst [num_rows, heads] (or None);
- ``dot_attention(graph, query, key, scale)``: ``scale * <query[i], key[j]>`` from
  [nodes, heads, channels] arrays (TransformerConv's).

Differentiable, each an autograd function that keeps only the weights and the per-node arrays:
the scores are recomputed where the backward needs them. On CUDA (a kernel dtype, int32 indices,
the extension built) the kernels of ``csrc/edge_softmax.cu`` form each edge's score from the two
arrays inside the softmax, forward and backward, so no [E, heads] gather of node scores is
materialised; GAT's gradient of ``dst`` is summed per row there, that of ``src`` per column over
the transpose (``csrc/attention.cu``'s row sums), dot attention's of ``query`` and ``key`` are
the weighted sums of ``multihead``. Elsewhere the same contract runs in torch ops
(``TorchRoute``), which the kernels are tested against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import kernels
from .attention_graph import AttentionGraph, KernelOperands
from .multihead import edge_dots, weighted_sums
from .segment_softmax import row_reduce, softmax, softmax_backward


def gat_attention(graph: AttentionGraph, src: Tensor, dst: Tensor | None, negative_slope: float) -> Tensor:
    """Softmax over each row of ``leaky_relu(src[j] + dst[i], negative_slope)`` (``src[j]`` alone
    where dst is None), in the arrays' common dtype."""
    if dst is not None:
        dtype = torch.promote_types(src.dtype, dst.dtype)
        src, dst = src.to(dtype), dst.to(dtype)
    return GatAttention.apply(src, dst, route(graph, src), float(negative_slope))


def dot_attention(graph: AttentionGraph, query: Tensor, key: Tensor, scale: float) -> Tensor:
    """Softmax over each row of ``scale * <query[i], key[j]>``, per head, summed in float32
    (float64 for float64) and in the arrays' common dtype."""
    dtype = torch.promote_types(query.dtype, key.dtype)
    query, key = query.to(dtype), key.to(dtype)
    return DotAttention.apply(query, key, route(graph, query), float(scale))


def route(graph: AttentionGraph, x: Tensor):
    """The kernels where they can read ``x``, else torch ops."""
    operands = graph.kernel_operands(x)
    return TorchRoute(graph) if operands is None else KernelRoute(graph, operands)


class TorchRoute:
    """The attention functions' contract in torch ops. ``gat_backward`` gives the gradient of the
    leaky_relu's input and (with ``need_dst``) its row sums, ``column_sums`` the sums over each
    column, ``dot_backward`` the gradient of the scaled dot products."""

    def __init__(self, graph: AttentionGraph):
        self.graph = graph

    def _gat_input(self, src: Tensor, dst: Tensor | None) -> Tensor:
        scores = src.index_select(0, self.graph.col)
        return scores if dst is None else scores + dst.index_select(0, self.graph.row)

    def gat(self, src, dst, negative_slope):
        return softmax(F.leaky_relu(self._gat_input(src, dst), negative_slope), self.graph)

    def gat_backward(self, alpha, grad_alpha, src, dst, negative_slope, need_dst):
        grad = softmax_backward(alpha, grad_alpha, self.graph)
        # torch's leaky_relu backward: slope 1 where the input is positive.
        grad = torch.where(self._gat_input(src, dst) > 0, grad, grad * negative_slope)
        grad_dst = row_reduce(grad, "sum", self.graph.segments) if need_dst else None
        return grad, grad_dst

    def column_sums(self, values):
        return values.new_zeros(self.graph.num_cols, values.shape[1]).index_add_(0, self.graph.col, values)

    def dot(self, query, key, scale):
        return softmax(edge_dots(query, key, self.graph.row, self.graph.col) * scale, self.graph)

    def dot_backward(self, alpha, grad_alpha, query, key, scale):
        return softmax_backward(alpha, grad_alpha, self.graph) * scale


class KernelRoute:
    """``TorchRoute``'s contract on the kernels (``kernels.attention_softmax``, its backward and
    the transpose's row sums)."""

    def __init__(self, graph: AttentionGraph, operands: KernelOperands):
        self.graph, self.operands = graph, operands

    def gat(self, src, dst, negative_slope):
        o = self.operands
        return kernels.attention_softmax(False, src, dst, o.col, o.softmax_pieces, negative_slope)

    def gat_backward(self, alpha, grad_alpha, src, dst, negative_slope, need_dst):
        o = self.operands
        grads = kernels.attention_softmax_backward(False, alpha, grad_alpha.to(alpha.dtype), src, dst, o.col,
                                                   o.softmax_pieces, negative_slope, o.num_rows, need_dst)
        return grads[0], grads[1] if need_dst else None

    def column_sums(self, values):
        o = self.operands
        return kernels.attention_row_sums(values, o.edge_ids_t, o.pieces_t, o.num_cols)

    def dot(self, query, key, scale):
        o = self.operands
        return kernels.attention_softmax(True, query, key, o.col, o.softmax_pieces, scale)

    def dot_backward(self, alpha, grad_alpha, query, key, scale):
        o = self.operands
        return kernels.attention_softmax_backward(True, alpha, grad_alpha.to(alpha.dtype), query, key, o.col,
                                                  o.softmax_pieces, scale, o.num_rows, False)[0]


class GatAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src, dst, route, negative_slope):
        alpha = route.gat(src, dst, negative_slope)
        ctx.save_for_backward(alpha, src, dst)
        ctx.route, ctx.negative_slope = route, negative_slope
        return alpha

    @staticmethod
    def backward(ctx, grad_alpha):
        alpha, src, dst = ctx.saved_tensors
        need_src, need_dst = ctx.needs_input_grad[0], ctx.needs_input_grad[1] and dst is not None
        grad, grad_dst = ctx.route.gat_backward(alpha, grad_alpha, src, dst, ctx.negative_slope, need_dst)
        grad_src = ctx.route.column_sums(grad) if need_src else None
        return grad_src, grad_dst, None, None


class DotAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, route, scale):
        alpha = route.dot(query, key, scale)
        ctx.save_for_backward(alpha, query, key)
        ctx.route, ctx.scale = route, scale
        return alpha

    @staticmethod
    def backward(ctx, grad_alpha):
        alpha, query, key = ctx.saved_tensors
        graph = ctx.route.graph
        grad = ctx.route.dot_backward(alpha, grad_alpha, query, key, ctx.scale)
        grad_query = weighted_sums(graph, grad, key) if ctx.needs_input_grad[0] else None
        grad_key = weighted_sums(graph, grad, query, transposed=True) if ctx.needs_input_grad[1] else None
        return grad_query, grad_key, None, None
