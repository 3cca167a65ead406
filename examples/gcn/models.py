"""The GCN models of OGB's reference examples, built on either GCNConv (ours or PyG's).

Both layers take ``(x, graph, edge_weight)``; the graph is prepared once per backend by
``prepare_graph``: normalized ``D^-1/2 (A + I) D^-1/2`` as a TCSparseTensor for ours, as a
torch sparse CSR ``adj_t`` (or an (edge_index, edge_weight) pair) for PyG's. The layers then run
with ``normalize=False``, which is what ``cached=True`` amounts to, without converting the same
graph once per layer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_gcn_norm

from torch_tcsparse import TCSparseTensor
from torch_tcsparse import nn as tc_nn

BACKENDS = ("tcsparse", "pyg")


def conv_class(backend: str):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return tc_nn.GCNConv if backend == "tcsparse" else pyg_nn.GCNConv


def prepare_graph(backend: str, edge_index: torch.Tensor, num_nodes: int, dtype=torch.float32, pyg_format="csr"):
    """``(graph, edge_weight)`` to pass to every layer: the normalized adjacency, built once. For
    PyG's layer a torch sparse CSR ``adj_t`` (its fast full-batch mode, the one OGB's examples
    use), or with ``pyg_format="edge_index"`` the normalized (edge_index, edge_weight) pair."""
    if backend == "tcsparse":
        loops_index, weight = tc_nn.gcn_norm(edge_index, None, num_nodes, dtype=dtype)
        adj = TCSparseTensor.from_edge_index(loops_index, weight, num_nodes=num_nodes)
        # The backward pass multiplies by A^T, whose layout is built on first use and cached on
        # the matrix; building it here keeps all conversion work in the preprocessing time.
        adj.t()
        return adj, None
    conv_class(backend)
    if pyg_format not in ("csr", "edge_index"):
        raise ValueError(f"pyg_format must be 'csr' or 'edge_index', got {pyg_format!r}")
    index, weight = pyg_gcn_norm(edge_index, None, num_nodes, dtype=dtype)
    if pyg_format == "edge_index":
        return index, weight
    adj_t = torch.sparse_coo_tensor(index.flip(0), weight, (num_nodes, num_nodes)).coalesce().to_sparse_csr()
    return adj_t, None


class GCN(torch.nn.Module):
    """OGB's full-batch GCN: conv -> [BatchNorm] -> ReLU -> dropout, repeated, then a last conv."""

    def __init__(self, backend, in_channels, hidden_channels, out_channels, num_layers, dropout, batch_norm=False):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        conv = conv_class(backend)
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = torch.nn.ModuleList(conv(a, b, normalize=False) for a, b in zip(sizes[:-1], sizes[1:]))
        hidden_sizes = sizes[1:-1] if batch_norm else []
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm1d(size) for size in hidden_sizes)
        self.dropout = dropout

    def reset_parameters(self):
        for module in [*self.convs, *self.norms]:
            module.reset_parameters()

    def forward(self, x, graph, edge_weight=None):
        for i, conv in enumerate(self.convs[:-1]):
            x = conv(x, graph, edge_weight)
            if self.norms:
                x = self.norms[i](x)
            x = F.relu(x)
            x = F.dropout(x, p=self.dropout, training=self.training)
        return self.convs[-1](x, graph, edge_weight)


class LinkPredictor(torch.nn.Module):
    """OGB's link predictor: an MLP on the element-wise product of the two node embeddings."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers, dropout):
        super().__init__()
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.lins = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.dropout = dropout

    def reset_parameters(self):
        for lin in self.lins:
            lin.reset_parameters()

    def forward(self, x_i, x_j):
        x = x_i * x_j
        for lin in self.lins[:-1]:
            x = F.dropout(F.relu(lin(x)), p=self.dropout, training=self.training)
        return torch.sigmoid(self.lins[-1](x))
