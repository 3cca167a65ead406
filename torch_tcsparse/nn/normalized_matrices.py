"""The normalizations PyG's layers apply to a sparse ``adj_t``, computed on a ``TCSparseTensor``
with torch ops: the result shares adj_t's structure (no conversion) unless self-loops add
entries, its values follow adj_t's in ``A.csr`` order and carry their gradient.

Each is PyG's computation for a torch.sparse matrix, step for step, in float32 (float64 for
float64) and rounded once to adj_t's dtype (summed in 16 bits, a hub's degree stops growing).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..tensor import TCSparseTensor
from .self_loops import complete_diagonal, diagonal_positions

__all__ = ["cluster_gcn_normalized", "compute_dtype", "gcn_normalized"]


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float32, or float64 when any input is float64."""
    result = torch.float32
    for dtype in dtypes:
        result = torch.promote_types(result, dtype)
    return result


def _row_lengths(matrix: TCSparseTensor) -> Tensor:
    rowptr = matrix.csr.rowptr
    return (rowptr[1:] - rowptr[:-1]).long()


def gcn_normalized(adj: TCSparseTensor, improved: bool = False, add_self_loops: bool = True) -> TCSparseTensor:
    """``D^-1/2 (A + fill I) D^-1/2`` (fill 2 if ``improved`` else 1) with D the row sums, as
    ``torch_geometric.nn.conv.gcn_conv.gcn_norm`` gives it for a torch.sparse ``adj_t``: the
    fill adds to an existing diagonal entry; a zero degree gives zero weights."""
    values = adj.values().to(compute_dtype(adj.dtype))
    matrix = adj
    if add_self_loops:
        completed = complete_diagonal(adj)
        matrix = completed.matrix
        fill = torch.full(completed.diagonal.shape, 2.0 if improved else 1.0, dtype=values.dtype, device=values.device)
        if completed.kept is not None:
            values = values.new_zeros(matrix.nnz).index_add(0, completed.kept, values)
        values = values.index_add(0, completed.diagonal, fill)
    lengths = _row_lengths(matrix)
    degree = torch.segment_reduce(values, "sum", lengths=lengths, axis=0)
    inverse_sqrt = degree.pow(-0.5)
    inverse_sqrt = inverse_sqrt.masked_fill(inverse_sqrt == float("inf"), 0.0)
    csr = matrix.csr
    # PyG's order of the products: source scale, value, target scale.
    values = inverse_sqrt[csr.col.long()] * values * inverse_sqrt.repeat_interleave(lengths, output_size=matrix.nnz)
    return matrix.with_values(values.to(adj.dtype))


def cluster_gcn_normalized(adj: TCSparseTensor, diag_lambda: float = 0.0, add_self_loops: bool = True) -> TCSparseTensor:
    """ClusterGCN's ``D^-1 (A + I) + diag_lambda * diag(D^-1)``, as PyG's ``ClusterGCNConv``
    gives it for a torch.sparse ``adj_t``: D counts the entries of each row (adj_t's values are
    not read), at least 1."""
    if add_self_loops:
        completed = complete_diagonal(adj)
        matrix, diagonal = completed.matrix, completed.diagonal
    else:
        matrix = adj
        diagonal = diagonal_positions(adj)
    lengths = _row_lengths(matrix)
    inverse = 1.0 / lengths.clamp(min=1).to(compute_dtype(adj.dtype))
    values = inverse.repeat_interleave(lengths, output_size=matrix.nnz)
    values = values.index_add(0, diagonal, diag_lambda * values[diagonal])
    return matrix.with_values(values.to(adj.dtype))
