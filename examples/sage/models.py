"""GraphSAGE on PyG's SAGEConv, with the adjacency as our TCSparseTensor or as PyG's own formats.

``prepare_adjacency`` builds, once per graph, what every layer takes as ``adj_t``
(``A[target, source]``): a TCSparseTensor for ``backend="ours"``; for ``backend="pyg"`` a torch
sparse CSR matrix or the ``edge_index`` itself (PyG's scatter route). ``batch_adjacency`` builds
it for a sampled batch or one of its bipartite blocks, used for one training step: ours in its
CSR-only form (``TCSparseTensor.from_batch``), which skips the Tensor-Core layout a few products
would not pay back; PyG's by its own ``to_torch_csr_tensor``.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import to_torch_csr_tensor

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import fused

BACKENDS = ("ours", "pyg")
AGGRS = ("mean", "max")
PYG_FORMATS = ("csr", "edge_index")


def pyg_format_for(aggr: str, device: torch.device) -> str:
    """PyG's fastest route for ``aggr``: its CSR ``adj_t`` product, except max on CUDA, which PyG's
    ``spmm`` refuses for every sparse matrix, so max there scatters over ``edge_index``."""
    return "edge_index" if aggr == "max" and device.type == "cuda" else "csr"


def _check(backend: str, pyg_format: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if pyg_format not in PYG_FORMATS:
        raise ValueError(f"pyg_format must be one of {PYG_FORMATS}, got {pyg_format!r}")


def prepare_adjacency(backend: str, edge_index: torch.Tensor, num_nodes: int, pyg_format: str = "csr"):
    _check(backend, pyg_format)
    if backend == "ours":
        adj = TCSparseTensor.from_edge_index(edge_index, num_nodes=num_nodes)
        # The backward pass multiplies by the transpose, built on first use and cached on the
        # matrix: building it here keeps every conversion inside the preprocessing time.
        adj.t()
        return adj
    return _pyg_adjacency(edge_index, (num_nodes, num_nodes), pyg_format)


def batch_adjacency(backend: str, edge_index: torch.Tensor, num_nodes, pyg_format: str = "csr"):
    """``adj_t`` of a sampled batch (``num_nodes`` an int) or of a bipartite block (``num_nodes``
    = (num_sources, num_targets)): ours CSR-only (its transpose, for the backward, built by the
    backward itself), PyG's CSR or its ``edge_index`` as given."""
    _check(backend, pyg_format)
    sizes = (num_nodes, num_nodes) if isinstance(num_nodes, int) else tuple(num_nodes)
    if backend == "ours":
        return TCSparseTensor.from_batch(edge_index, num_nodes=sizes)
    return _pyg_adjacency(edge_index, sizes, pyg_format)


def _pyg_adjacency(edge_index: torch.Tensor, sizes: tuple[int, int], pyg_format: str):
    if pyg_format == "edge_index":
        return edge_index
    num_sources, num_targets = sizes
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        return to_torch_csr_tensor(edge_index.flip(0), size=(num_targets, num_sources))


class SAGE(torch.nn.Module):
    """OGB's GraphSAGE: SAGEConv -> ReLU -> dropout, repeated, then a last SAGEConv."""

    def __init__(self, backend, in_channels, hidden_channels, out_channels, num_layers, dropout, aggr="mean"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if aggr not in AGGRS:
            raise ValueError(f"aggr must be one of {AGGRS}, got {aggr!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        # fused(SAGEConv) multiplies a TCSparseTensor itself, max on CUDA included, where PyG's
        # own spmm would refuse it; any other adj_t takes PyG's route.
        conv = fused(SAGEConv) if backend == "ours" else SAGEConv
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = torch.nn.ModuleList(conv(a, b, aggr=aggr) for a, b in zip(sizes[:-1], sizes[1:]))
        self.dropout = dropout

    def forward(self, x, adj_t):
        for conv in self.convs[:-1]:
            x = F.dropout(F.relu(conv(x, adj_t)), p=self.dropout, training=self.training)
        return self.convs[-1](x, adj_t)

    def forward_blocks(self, x, blocks):
        """The outputs of a sampled batch's seeds: ``x`` holds the features of the batch's nodes,
        ``blocks`` per layer, first layer first, ``(adj_t, num_targets)`` of its bipartite block
        (``SampledBatch.layer_edges``); each layer maps its sources to their first
        ``num_targets``, as PyG's layers do with ``x = (x_sources, x_targets)``."""
        if len(blocks) != len(self.convs):
            raise ValueError(f"blocks must hold one block per layer ({len(self.convs)}), got {len(blocks)}")
        for i, (conv, (adj_t, num_targets)) in enumerate(zip(self.convs, blocks)):
            x = conv((x, x[:num_targets]), adj_t)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x
