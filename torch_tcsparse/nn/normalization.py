"""``gcn_norm``: PyG's ``D^-1/2 (A + fill I) D^-1/2``, computed in float32 (float64 for float64
inputs) and rounded once to the inputs' dtype: by PyG for an edge_index or a torch sparse matrix,
by :mod:`.normalized_matrices` for a TCSparseTensor (its structure kept where no loop is added).
Summed in 16 bits, a hub's degree stops growing (in bfloat16, 256 + 1 is 256), which misweights
every edge of the hub."""
from __future__ import annotations

import torch
from torch import Tensor

from ..paths import VALUE_DTYPES
from ..tensor import TCSparseTensor
from . import _pyg
from ._checks import check_flag
from .graph_inputs import (
    check_edge_index,
    check_edge_weight,
    check_matrix,
    check_num_nodes,
    edge_index_nodes,
    is_matrix,
)
from .normalized_matrices import compute_dtype, gcn_normalized

__all__ = ["gcn_norm"]

_FLOWS = ("source_to_target", "target_to_source")


def normalized_edges(edge_index: Tensor, edge_weight: Tensor | None, num_nodes: int, improved: bool,
                     add_self_loops: bool, flow: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """PyG's ``gcn_norm`` of a checked edge_index for results in ``dtype``: the weights come back
    in ``compute_dtype`` (of ``dtype`` and the weights'), for the caller to round once."""
    compute = compute_dtype(dtype) if edge_weight is None else compute_dtype(dtype, edge_weight.dtype)
    if edge_weight is None:
        # Explicit unit weights: PyG creates its own only after adding the self-loops, which
        # then get weight 1 even when ``improved`` asks for 2.
        weight = torch.ones(edge_index.size(1), dtype=compute, device=edge_index.device)
    else:
        weight = edge_weight.to(compute)
    return _pyg.gcn_norm()(edge_index, weight, num_nodes, improved, add_self_loops, flow, compute)


def normalized_torch_matrix(adj_t: Tensor, num_nodes: int, improved: bool, add_self_loops: bool) -> Tensor:
    """PyG's ``gcn_norm`` of a square torch sparse COO or CSR ``adj_t``, in ``compute_dtype``."""
    normalized, _ = _pyg.gcn_norm()(adj_t.to(compute_dtype(adj_t.dtype)), None, num_nodes, improved, add_self_loops)
    return normalized


def as_torch_matrix(matrix: Tensor) -> Tensor:
    """A torch sparse COO or CSR tensor for PyG (which takes no CSC)."""
    if isinstance(matrix, TCSparseTensor):
        return matrix.to_torch_csr()
    return matrix.to_sparse_csr() if matrix.layout == torch.sparse_csc else matrix


def gcn_norm(
    edge_index,
    edge_weight: Tensor | None = None,
    num_nodes: int | None = None,
    improved: bool = False,
    add_self_loops: bool = True,
    flow: str = "source_to_target",
    dtype: torch.dtype | None = None,
):
    """PyG's ``gcn_norm``, also for a ``TCSparseTensor``, normalized in float32 (float64 for
    float64) and rounded once to the result's dtype:

    - ``edge_index`` ([2, E] tensor or PyG ``EdgeIndex``): returns ``(edge_index, edge_weight)``
      with the remaining self-loops appended (a node that already has a self-loop keeps its
      weight, the others get ``2`` if ``improved`` else ``1``) and the weights normalized, in
      ``edge_weight``'s dtype, else ``dtype``, else the default dtype.
    - a torch sparse matrix or a ``TCSparseTensor`` ``adj_t`` (``adj_t[target, source]``):
      returns ``(matrix, None)``, the matrix of the same kind and dtype with ``fill * I`` added
      (an existing diagonal entry grows by ``fill``) and normalized; a CSC matrix comes back as
      CSR, as PyG takes no CSC.

    Degrees are taken over targets (over sources when ``flow="target_to_source"``, edge_index only).
    ``improved`` fills 2 also for an unweighted edge_index, where PyG fills 1 (its unit weights
    are created after the self-loops).
    """
    if flow not in _FLOWS:
        raise ValueError(f"flow must be one of {_FLOWS}, got {flow!r}")
    check_flag("improved", improved)
    check_flag("add_self_loops", add_self_loops)
    if dtype is not None and dtype not in VALUE_DTYPES:
        raise TypeError(f"dtype must be one of {VALUE_DTYPES} or None, got {dtype}")
    if is_matrix(edge_index):
        if num_nodes is not None:
            check_num_nodes(num_nodes)
        num_nodes = check_matrix(edge_index, edge_weight, num_nodes)
        if isinstance(edge_index, TCSparseTensor):
            return gcn_normalized(edge_index, improved, add_self_loops), None
        normalized = normalized_torch_matrix(as_torch_matrix(edge_index), num_nodes, improved, add_self_loops)
        return normalized.to(edge_index.dtype), None
    num_nodes = edge_index_nodes(edge_index, num_nodes)
    edge_index = check_edge_index(edge_index, num_nodes)
    check_edge_weight(edge_weight, edge_index.size(1), edge_index.device)
    out_dtype = edge_weight.dtype if edge_weight is not None else dtype or torch.get_default_dtype()
    edge_index, weight = normalized_edges(edge_index, edge_weight, num_nodes, improved, add_self_loops, flow, out_dtype)
    return edge_index, weight.to(out_dtype)
