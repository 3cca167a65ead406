"""Multi-head attention's weighted sum over an :class:`.attention_graph.AttentionGraph` (edges
(i, j) in ``A.csr`` order, features [nodes, heads, channels]), differentiable:
``multihead_spmm(graph, weights, x)``: out[i, h] = sum over the edges (i, j) of
weights[e, h] * x[j, h]; and ``weighted_sums``, the same product or its transpose's without
autograd (the gradients of dot-product attention's query and key).

Neither forms the E x heads x channels messages PyG gathers. On CUDA (a kernel dtype, int32
indices, the extension built, several heads) the weighted sum runs ``csrc/attention.cu``
forward and backward: d(weights) = the dots kernel of d(out) and x, d(x) = the transpose's spmm
of the weights and d(out). Elsewhere, and for a single head on CUDA, it is our SpMM, one product
per head (``A.with_values(weights[:, h]) @ x[:, h]``, the library's backward). ``edge_dots``
gives the dot products of node pairs in torch ops, for the attention scores off the kernels.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..kernels import attention_sddmm, attention_spmm
from ..tensor import TCSparseTensor
from .attention_graph import AttentionGraph, KernelOperands, RowPieces

# Elements of one chunk's gathered operands in the torch dots: bounds their memory to a few
# times this, whatever the graph.
_CHUNK_ELEMENTS = 1 << 24


def multihead_spmm(graph: AttentionGraph, weights: Tensor, x: Tensor) -> Tensor:
    """[num_rows, heads, channels] from weights [E, heads] and x [num_cols, heads, channels],
    computed in x's dtype."""
    weights = weights.to(x.dtype)
    operands = graph.kernel_operands(x) if weights.shape[1] > 1 else None
    if operands is not None:
        return KernelSpmm.apply(weights, x, operands, CUDA_KERNELS)
    return per_head_products(graph.matrix, weights, x)


def weighted_sums(graph: AttentionGraph, weights: Tensor, x: Tensor, transposed: bool = False) -> Tensor:
    """``multihead_spmm``'s product without autograd, or with ``transposed`` its transpose's:
    out[j, h] = sum over the edges (i, j) of weights[e, h] * x[i, h]."""
    weights = weights.to(x.dtype)
    operands = graph.kernel_operands(x) if weights.shape[1] > 1 else None
    if operands is None:
        return per_head_products(graph.matrix, weights, x, transposed)
    return (_spmm_transposed if transposed else _spmm)(CUDA_KERNELS, operands, weights, x)


def per_head_products(matrix: TCSparseTensor, weights: Tensor, x: Tensor, transposed: bool = False) -> Tensor:
    """Our SpMM per head: (matrix with values weights[:, h]) @ x[:, h], or its transpose's."""
    outputs = []
    for values, features in zip(weights.t().contiguous().unbind(0), x.transpose(0, 1).contiguous().unbind(0)):
        head_matrix = matrix.with_values(values)
        outputs.append((head_matrix.t() if transposed else head_matrix) @ features)
    return torch.stack(outputs, dim=1)


class CudaKernels:
    """The kernels (``kernels.attention_spmm``/``attention_sddmm``) in the shape the products call
    them; tests give ``KernelSpmm`` a torch stand-in of the same contract."""

    @staticmethod
    def spmm(weights: Tensor, x: Tensor, col: Tensor, edge_ids: Tensor | None, pieces: RowPieces,
             num_rows: int) -> Tensor:
        return attention_spmm(weights, x, col, edge_ids, pieces, num_rows)

    @staticmethod
    def sddmm(a: Tensor, b: Tensor, row: Tensor, col: Tensor) -> Tensor:
        return attention_sddmm(a, b, row, col)


CUDA_KERNELS = CudaKernels()


def _spmm(kernels, o: KernelOperands, weights: Tensor, x: Tensor) -> Tensor:
    return kernels.spmm(weights, x, o.col, None, o.pieces, o.num_rows)


def _spmm_transposed(kernels, o: KernelOperands, weights: Tensor, x: Tensor) -> Tensor:
    return kernels.spmm(weights, x, o.col_t, o.edge_ids_t, o.pieces_t, o.num_cols)


class KernelSpmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights, x, operands, kernels):
        ctx.save_for_backward(weights, x)
        ctx.operands, ctx.kernels = operands, kernels
        return _spmm(kernels, operands, weights, x)

    @staticmethod
    def backward(ctx, grad_out):
        weights, x = ctx.saved_tensors
        o, kernels = ctx.operands, ctx.kernels
        grad_weights = kernels.sddmm(grad_out, x, o.row, o.col) if ctx.needs_input_grad[0] else None
        grad_x = _spmm_transposed(kernels, o, weights, grad_out) if ctx.needs_input_grad[1] else None
        return grad_weights, grad_x, None, None


def edge_dots(a: Tensor, b: Tensor, row: Tensor, col: Tensor) -> Tensor:
    """<a[row[e], h], b[col[e], h]> with torch ops, chunk by chunk of edges."""
    heads, channels = a.shape[1], a.shape[2]
    accumulate = torch.float64 if a.dtype == torch.float64 else torch.float32
    out = a.new_empty(row.numel(), heads)
    step = max(1, _CHUNK_ELEMENTS // max(heads * channels, 1))
    for start in range(0, row.numel(), step):
        rows, cols = row[start:start + step], col[start:start + step]
        products = a.index_select(0, rows).to(accumulate) * b.index_select(0, cols).to(accumulate)
        out[start:start + step] = products.sum(-1).to(a.dtype)
    return out
