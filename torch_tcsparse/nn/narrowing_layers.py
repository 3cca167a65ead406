"""PyG's SAGEConv and GraphConv on a ``TCSparseTensor`` ``adj_t``, with the layer's linear map of
the neighbours' features applied before their sum or mean where it narrows them (out_channels
below the features' width), as DGL's SAGEConv does: the product, forward and backward, then runs
on out_channels columns instead of the features' width. A linear map commutes with a sum and a
mean; its bias is added after the product, so an empty row gives the bias, as in PyG's order.
Every other case (max/min, a widening or hooked map, PyG's hooks on the layer) is PyG's forward,
whose propagation is our product.

``fused(Layer)`` (:mod:`.pyg_layers`) installs these as the layer's forward for a TCSparseTensor.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import Tensor

from ..tensor import TCSparseTensor
from .linear_then_propagate import calls_only_its_weight

_LINEAR_REDUCTIONS = ("sum", "add", "mean")


def _pyg_forward(layer_name: str):
    return getattr(sys.modules["torch_geometric.nn.conv"], layer_name).forward


def _narrows_first(layer, lin, x_source: Tensor) -> bool:
    """Whether ``lin`` (PyG's Linear) may map the sources before the layer's aggregation: a sum or
    a mean, a plain map to fewer channels than the sources have, no autocast (the map's output
    and its bias would differ in dtype), and no PyG hooks or explanation on the layer's
    propagation (they expect it to carry the sources' features)."""
    linear_type = getattr(sys.modules.get("torch_geometric.nn.dense.linear"), "Linear", None)
    return (
        isinstance(layer.aggr, str)
        and layer.aggr in _LINEAR_REDUCTIONS
        and isinstance(x_source, Tensor)
        and x_source.dim() == 2
        and linear_type is not None
        and calls_only_its_weight(lin, linear_type)
        and lin.weight.size(0) < x_source.size(1)
        and not torch.is_autocast_enabled(x_source.device.type)
        and not (
            layer._propagate_forward_pre_hooks
            or layer._propagate_forward_hooks
            or layer._message_and_aggregate_forward_pre_hooks
            or layer._message_and_aggregate_forward_hooks
            or getattr(layer, "explain", None)
            or layer.decomposed_layers > 1
        )
    )


def _map_then_aggregate(lin, x_source: Tensor, adj: TCSparseTensor, reduce: str) -> Tensor:
    return adj.matmul(F.linear(x_source, lin.weight), bias=lin.bias, reduce=reduce)


def sage_conv(layer, x, edge_index: TCSparseTensor, size=None) -> Tensor:
    x_source, x_target = (x, x) if isinstance(x, Tensor) else x
    if not _narrows_first(layer, layer.lin_l, x_source):
        return _pyg_forward("SAGEConv")(layer, x, edge_index, size)
    if layer.project and hasattr(layer, "lin"):
        x_source = layer.lin(x_source).relu()
    out = _map_then_aggregate(layer.lin_l, x_source, edge_index, layer.aggr)
    if layer.root_weight and x_target is not None:
        out = out + layer.lin_r(x_target)
    if layer.normalize:
        out = F.normalize(out, p=2.0, dim=-1)
    return out


def graph_conv(layer, x, edge_index: TCSparseTensor, edge_weight: Tensor | None = None, size=None) -> Tensor:
    x_source, x_target = (x, x) if isinstance(x, Tensor) else x
    # PyG's propagation over a sparse adj_t reads the matrix's values, not edge_weight: so does ours.
    if not _narrows_first(layer, layer.lin_rel, x_source):
        return _pyg_forward("GraphConv")(layer, x, edge_index, edge_weight, size)
    out = _map_then_aggregate(layer.lin_rel, x_source, edge_index, layer.aggr)
    if x_target is not None:
        out = out + layer.lin_root(x_target)
    return out


FORWARDS = {"SAGEConv": sage_conv, "GraphConv": graph_conv}
