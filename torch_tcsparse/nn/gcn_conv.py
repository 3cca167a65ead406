"""A drop-in for PyG's ``GCNConv`` whose propagation is one SpMM on a ``TCSparseTensor``.

The math and its order are PyG's: ``out = Â (x W) + b`` with ``Â = D^-1/2 (A + fill I) D^-1/2``,
where ``A[target, source]`` holds the edge weight and ``D`` is the row sum of ``A + fill I``.
``Â`` is PyG's own ``gcn_norm``, computed in float32 (see :mod:`.normalization`); it becomes a
``TCSparseTensor`` (canonical CSR plus the Tensor-Core layout, built once), and ``Â @ h`` is the
library's SpMM.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..paths import VALUE_DTYPES
from ..tensor import TCSparseTensor
from . import linear_then_propagate
from ._checks import check_channels, check_features, check_flag
from .graph_inputs import check_edge_index, check_edge_weight, check_matrix, is_matrix
from .normalization import as_torch_matrix, normalized_edges, normalized_torch_matrix
from .normalized_matrices import compute_dtype, gcn_normalized

__all__ = ["GCNConv"]


class GCNConv(torch.nn.Module):
    r"""Graph convolution of Kipf and Welling, a drop-in for ``torch_geometric.nn.GCNConv``:
    ``out = D^-1/2 (A + I) D^-1/2 (x W) + b``, with ``A + 2I`` when ``improved``.

    Parameters and state-dict keys (``lin.weight``, ``bias``) are PyG's, so weights load
    either way. ``forward(x, edge_index, edge_weight=None)`` takes ``edge_index`` as a
    ``[2, E]`` tensor (``edge_index[0]`` source, ``edge_index[1]`` target), a PyG ``EdgeIndex``,
    a torch sparse ``adj_t`` (``adj_t[target, source]``) or a ``TCSparseTensor`` ``adj_t``.
    Self-loops follow PyG per input kind (see :func:`gcn_norm`); duplicate edges are summed.
    Normalizing needs PyG (``pip install -e ".[pyg]"`` in a clone); ``normalize=False`` does not.

    ``cached=True`` keeps the converted (and normalized) ``TCSparseTensor`` from the first call
    and reuses it, ignoring later graphs: building it is the expensive step, one SpMM is cheap.
    The cache follows ``x`` to another dtype or device (after ``module.to``). Unlike PyG, the
    cache also applies with ``normalize=False``, since conversion still happens.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        cached: bool = False,
        add_self_loops: bool | None = None,
        normalize: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        self.in_channels = check_channels("in_channels", in_channels)
        self.out_channels = check_channels("out_channels", out_channels)
        self.improved = check_flag("improved", improved)
        self.cached = check_flag("cached", cached)
        self.normalize = check_flag("normalize", normalize)
        if add_self_loops is None:
            add_self_loops = normalize
        self.add_self_loops = check_flag("add_self_loops", add_self_loops)
        if add_self_loops and not normalize:
            raise ValueError(
                "GCNConv cannot add self-loops without normalization (add_self_loops=True, normalize=False)"
            )
        self.lin = torch.nn.Linear(in_channels, out_channels, bias=False)
        if check_flag("bias", bias):
            self.bias = torch.nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self._cached_adj: TCSparseTensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot weights and zero bias, as PyG initializes them; drops the cached graph."""
        torch.nn.init.xavier_uniform_(self.lin.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)
        self._cached_adj = None

    def forward(self, x: Tensor, edge_index, edge_weight: Tensor | None = None) -> Tensor:
        if isinstance(x, (tuple, list)):
            raise ValueError("GCNConv does not support bipartite message passing; got a tuple of node features")
        check_features(x, "num_nodes", self.in_channels)
        if x.dtype not in VALUE_DTYPES:
            raise TypeError(f"x must be one of {VALUE_DTYPES}, got dtype {x.dtype}")
        adj = self._adjacency(x, edge_index, edge_weight)
        if linear_then_propagate.applies(self.lin, x, adj):
            return linear_then_propagate.LinearThenPropagate.apply(x, self.lin.weight, adj, self.bias)
        return adj.matmul(self.lin(x), bias=self.bias)

    def _adjacency(self, x: Tensor, edge_index, edge_weight) -> TCSparseTensor:
        adj = self._cached_adj
        if adj is None:
            adj = self._propagation_matrix(x, edge_index, edge_weight)
            if self.cached:
                self._cached_adj = adj
        elif adj._values.dtype != x.dtype or adj._values.device != x.device:
            # module.to() moves parameters and buffers, not this cache: it follows x instead.
            adj = self._cached_adj = adj.to(x.device, x.dtype)
        return adj

    def _propagation_matrix(self, x: Tensor, graph, edge_weight) -> TCSparseTensor:
        """The (normalized) adjacency in x's dtype, built in float32 or float64 and rounded once."""
        num_nodes = x.size(0)
        if is_matrix(graph):
            check_matrix(graph, edge_weight, num_nodes)
            if graph.device != x.device:
                raise ValueError(f"the adjacency matrix is on {graph.device} but x is on {x.device}")
            if self.normalize and isinstance(graph, TCSparseTensor):
                matrix = gcn_normalized(graph, self.improved, self.add_self_loops)
            elif self.normalize:
                normalized = normalized_torch_matrix(as_torch_matrix(graph), num_nodes, self.improved, self.add_self_loops)
                matrix = TCSparseTensor.from_torch(normalized)
            else:
                matrix = graph if isinstance(graph, TCSparseTensor) else TCSparseTensor.from_torch(as_torch_matrix(graph))
        else:
            edge_index = check_edge_index(graph, num_nodes)
            if edge_index.device != x.device:
                raise ValueError(f"edge_index is on {edge_index.device} but x is on {x.device}")
            check_edge_weight(edge_weight, edge_index.size(1), edge_index.device)
            if self.normalize:
                edge_index, weight = normalized_edges(
                    edge_index, edge_weight, num_nodes, self.improved, self.add_self_loops, "source_to_target", x.dtype
                )
            elif edge_weight is None:
                weight = torch.ones(edge_index.size(1), dtype=compute_dtype(x.dtype), device=x.device)
            else:
                weight = edge_weight.to(compute_dtype(x.dtype, edge_weight.dtype))
            matrix = TCSparseTensor.from_edge_index(edge_index, weight, num_nodes=num_nodes)
        return matrix if matrix.dtype == x.dtype else matrix.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, improved={self.improved}, cached={self.cached}"
