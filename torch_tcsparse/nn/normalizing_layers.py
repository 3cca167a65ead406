"""PyG's normalizing layers on a ``TCSparseTensor`` ``adj_t``: the forward of GCNConv, SGConv,
APPNP, TAGConv, ClusterGCNConv and LGConv as PyG writes it for a sparse ``adj_t``, with the
normalization computed on our side (:mod:`.normalized_matrices`, kept by the layer through
:mod:`.derived_graph`) instead of PyG's, which builds a torch.sparse matrix and so never reaches
our product. Each propagation is the layer's own ``propagate``, hence one product of ours.

``fused(Layer)`` (:mod:`.pyg_layers`) installs these as the layer's forward for a TCSparseTensor;
every other input goes to PyG's forward.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..tensor import TCSparseTensor
from .derived_graph import derived_graph
from .graph_inputs import check_matrix
from .normalized_matrices import cluster_gcn_normalized, gcn_normalized


def _gcn_matrix(layer, x: Tensor, adj: TCSparseTensor, edge_weight, improved: bool, add_self_loops: bool,
                keep_first: bool = False) -> TCSparseTensor:
    check_matrix(adj, edge_weight, x.size(layer.node_dim))
    return derived_graph(layer).get(adj, lambda: gcn_normalized(adj, improved, add_self_loops), keep_first)


def gcn_conv(layer, x: Tensor, edge_index: TCSparseTensor, edge_weight: Tensor | None = None) -> Tensor:
    if isinstance(x, (tuple, list)):
        raise ValueError(f"'{type(layer).__name__}' received a tuple of node features as input while this layer "
                         "does not support bipartite message passing")
    if layer.normalize:
        edge_index = _gcn_matrix(layer, x, edge_index, edge_weight, layer.improved, layer.add_self_loops, layer.cached)
    out = layer.propagate(edge_index, x=layer.lin(x), edge_weight=None)
    return out if layer.bias is None else out + layer.bias


def sg_conv(layer, x: Tensor, edge_index: TCSparseTensor, edge_weight: Tensor | None = None) -> Tensor:
    # SGConv caches the propagated features, PyG's own attribute, which its reset_parameters clears.
    if layer._cached_x is None:
        adj = _gcn_matrix(layer, x, edge_index, edge_weight, False, layer.add_self_loops)
        for _ in range(layer.K):
            x = layer.propagate(adj, x=x, edge_weight=None)
        if layer.cached:
            layer._cached_x = x
    else:
        x = layer._cached_x.detach()
    return layer.lin(x)


def appnp(layer, x: Tensor, edge_index: TCSparseTensor, edge_weight: Tensor | None = None) -> Tensor:
    if layer.normalize:
        edge_index = _gcn_matrix(layer, x, edge_index, edge_weight, False, layer.add_self_loops, layer.cached)
    h = x
    for _ in range(layer.K):
        if layer.dropout > 0 and layer.training:
            # PyG drops from the previous step's values: the drops compound over the K steps.
            edge_index = edge_index.with_values(F.dropout(edge_index.values(), p=layer.dropout))
        x = layer.propagate(edge_index, x=x, edge_weight=None)
        x = x * (1 - layer.alpha)
        x = x + layer.alpha * h
    return x


def tag_conv(layer, x: Tensor, edge_index: TCSparseTensor, edge_weight: Tensor | None = None) -> Tensor:
    if layer.normalize:
        edge_index = _gcn_matrix(layer, x, edge_index, edge_weight, False, False)
    out = layer.lins[0](x)
    for lin in layer.lins[1:]:
        x = layer.propagate(edge_index, x=x, edge_weight=None)
        out = out + lin.forward(x)
    return out if layer.bias is None else out + layer.bias


def lg_conv(layer, x: Tensor, edge_index: TCSparseTensor, edge_weight: Tensor | None = None) -> Tensor:
    if layer.normalize:
        edge_index = _gcn_matrix(layer, x, edge_index, edge_weight, False, False)
    return layer.propagate(edge_index, x=x, edge_weight=None)


def cluster_gcn_conv(layer, x: Tensor, edge_index: TCSparseTensor) -> Tensor:
    check_matrix(edge_index, None, x.size(layer.node_dim))
    adj = edge_index
    adj = derived_graph(layer).get(adj, lambda: cluster_gcn_normalized(adj, layer.diag_lambda, layer.add_self_loops))
    out = layer.propagate(adj, x=x, edge_weight=None)
    return layer.lin_out(out) + layer.lin_root(x)


# PyG class name -> its forward on a TCSparseTensor.
FORWARDS = {
    "GCNConv": gcn_conv,
    "SGConv": sg_conv,
    "APPNP": appnp,
    "TAGConv": tag_conv,
    "LGConv": lg_conv,
    "ClusterGCNConv": cluster_gcn_conv,
}
