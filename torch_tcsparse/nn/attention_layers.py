"""PyG's GATConv and TransformerConv on a ``TCSparseTensor`` ``adj_t``: the layer's forward as PyG
writes it, same parameters and order of operations, with the attention over its edges as two
steps on our side, neither of which forms E x heads x channels messages:

1. the softmax over each row of the canonical CSR, per head, of the edges' scores formed from
   per-node arrays: GAT's ``leaky_relu(a_src[j] + a_dst[i])`` (``gat_attention``),
   TransformerConv's ``<q_i, k_j> / sqrt(channels)`` (``dot_attention``); then dropout;
2. the weighted sum of the neighbours' features (``multihead_spmm``).

The graph attended over (with GAT's self-loops: one per node, as PyG removes and adds them) is
derived once per matrix and kept by the layer (:mod:`.derived_graph`). Attention weights and
dropout masks are [E, heads] in ``A.csr`` order, PyG's order for a torch.sparse CSR ``adj_t``, so
a seeded dropout draws the same mask as PyG's layer.

Edge features (``edge_dim``, ``edge_attr``) take PyG's own route for the sparse ``adj_t``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..tensor import TCSparseTensor
from .attention_graph import AttentionGraph, attention_graph
from .derived_graph import derived_graph
from .edge_attention import dot_attention, gat_attention
from .multihead import multihead_spmm


def _graph(layer, adj: TCSparseTensor, self_loops: bool) -> AttentionGraph:
    return derived_graph(layer).get(adj, lambda: attention_graph(adj, self_loops))


def _check_rows(graph: AttentionGraph, sources: Tensor, targets: Tensor | None) -> None:
    if sources.size(0) != graph.num_cols:
        raise ValueError(f"the source features have {sources.size(0)} rows but adj_t has {graph.num_cols} columns")
    if targets is not None and targets.size(0) != graph.num_rows:
        raise ValueError(f"the target features have {targets.size(0)} rows but adj_t has {graph.num_rows} rows")


def gat_conv(layer, x, edge_index: TCSparseTensor, edge_attr: Tensor | None = None, size=None,
             return_attention_weights=None):
    # Edge features keep PyG's route: projected per edge, they are the E x channels tensor this
    # route avoids, and PyG's own sparse route refuses them with self-loops.
    if layer.lin_edge is not None or edge_attr is not None:
        from torch_geometric.nn import GATConv

        return GATConv.forward(layer, x, edge_index, edge_attr, size, return_attention_weights)
    heads, channels = layer.heads, layer.out_channels
    res = None
    if isinstance(x, Tensor):
        if layer.res is not None:
            res = layer.res(x)
        if layer.lin is not None:
            x_src = x_dst = layer.lin(x).view(-1, heads, channels)
        else:
            x_src = layer.lin_src(x).view(-1, heads, channels)
            x_dst = layer.lin_dst(x).view(-1, heads, channels)
    else:
        x_src, x_dst = x
        if x_dst is not None and layer.res is not None:
            res = layer.res(x_dst)
        lin_src, lin_dst = (layer.lin, layer.lin) if layer.lin is not None else (layer.lin_src, layer.lin_dst)
        x_src = lin_src(x_src).view(-1, heads, channels)
        if x_dst is not None:
            x_dst = lin_dst(x_dst).view(-1, heads, channels)

    graph = _graph(layer, edge_index, layer.add_self_loops)
    _check_rows(graph, x_src, x_dst)
    score_dst = None if x_dst is None else (x_dst * layer.att_dst).sum(-1)
    alpha = gat_attention(graph, (x_src * layer.att_src).sum(-1), score_dst, layer.negative_slope)
    alpha = F.dropout(alpha, p=layer.dropout, training=layer.training)
    out = multihead_spmm(graph, alpha, x_src)

    out = out.view(-1, heads * channels) if layer.concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    if layer.bias is not None:
        out = out + layer.bias
    if return_attention_weights:
        from torch_geometric.utils.sparse import set_sparse_value

        return out, (set_sparse_value(graph.matrix, alpha), alpha)
    return out


def transformer_conv(layer, x, edge_index: TCSparseTensor, edge_attr: Tensor | None = None,
                     return_attention_weights=None):
    if layer.lin_edge is not None or edge_attr is not None:  # as GATConv's
        from torch_geometric.nn import TransformerConv

        return TransformerConv.forward(layer, x, edge_index, edge_attr, return_attention_weights)
    heads, channels = layer.heads, layer.out_channels
    if isinstance(x, Tensor):
        x = (x, x)
    query = layer.lin_query(x[1]).view(-1, heads, channels)
    key = layer.lin_key(x[0]).view(-1, heads, channels)
    value = layer.lin_value(x[0]).view(-1, heads, channels)

    graph = _graph(layer, edge_index, False)
    _check_rows(graph, key, query)
    attention = dot_attention(graph, query, key, 1 / math.sqrt(channels))
    alpha = F.dropout(attention, p=layer.dropout, training=layer.training)
    out = multihead_spmm(graph, alpha, value)

    out = out.view(-1, heads * channels) if layer.concat else out.mean(dim=1)
    if layer.root_weight:
        x_r = layer.lin_skip(x[1])
        if layer.lin_beta is not None:
            beta = layer.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
            out = beta * x_r + (1 - beta) * out
        else:
            out = out + x_r
    if isinstance(return_attention_weights, bool):
        return out, (edge_index, attention)
    return out


# PyG class name -> its forward on a TCSparseTensor.
FORWARDS = {"GATConv": gat_conv, "TransformerConv": transformer_conv}
