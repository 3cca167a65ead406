"""A drop-in for PyG's ``GCNConv`` whose propagation is one SpMM on a ``TCSparseTensor``.

The math and its order are PyG's: ``out = Â (x W) + b`` with ``Â = D^-1/2 (A + fill I) D^-1/2``,
where ``A[target, source]`` holds the edge weight and ``D`` is the row sum of ``A + fill I``.
What differs is only where the work goes: the normalized adjacency becomes a ``TCSparseTensor``
(canonical CSR plus the Tensor-Core layout, built once), and ``Â @ h`` is the library's SpMM.
In a first layer (features without gradient, in_channels < out_channels) W's gradient is
computed as ``grad^T (Â x)`` rather than ``(Â^T grad)^T x``: equal, with a narrower SpMM.
"""
from __future__ import annotations

import math
import sys

import torch
from torch import Tensor

from ..tensor import TCSparseTensor


__all__ = ["GCNConv", "gcn_norm"]

_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)
_FLOWS = ("source_to_target", "target_to_source")


def _is_pyg_edge_index(value) -> bool:
    """A PyG ``EdgeIndex`` (torch_geometric >= 2.5), a Tensor subclass carrying its sparse size.
    Looked up without importing torch_geometric (seconds): an EdgeIndex implies it is loaded."""
    module = sys.modules.get("torch_geometric")
    edge_index_class = getattr(module, "EdgeIndex", None)
    return edge_index_class is not None and isinstance(value, edge_index_class)


def _is_torch_sparse(value) -> bool:
    return isinstance(value, Tensor) and value.layout in _SPARSE_LAYOUTS


def _check_edge_index(edge_index: Tensor, num_nodes: int) -> Tensor:
    """A plain int64 [2, E] tensor with every index in [0, num_nodes)."""
    if _is_pyg_edge_index(edge_index):
        size = edge_index.sparse_size()
        if any(s is not None and s != num_nodes for s in size):
            raise ValueError(f"EdgeIndex has sparse size {tuple(size)} but the graph has {num_nodes} nodes")
        edge_index = edge_index.as_tensor()
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integers, got dtype {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, num_edges], got {tuple(edge_index.shape)}")
    if edge_index.numel():
        low, high = int(edge_index.min()), int(edge_index.max())
        if low < 0:
            raise ValueError(f"edge_index holds a negative node index ({low})")
        if high >= num_nodes:
            raise ValueError(f"edge_index holds node {high}, out of range for {num_nodes} nodes")
    return edge_index.long()


def _infer_num_nodes(edge_index: Tensor) -> int:
    """An EdgeIndex's known size, else the largest index + 1 (PyG's ``maybe_num_nodes``)."""
    if _is_pyg_edge_index(edge_index):
        known = [s for s in edge_index.sparse_size() if s is not None]
        if known:
            return max(known)
        edge_index = edge_index.as_tensor()
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integers, got dtype {edge_index.dtype}")
    return int(edge_index.max()) + 1 if edge_index.numel() else 0


def _check_edge_weight(edge_weight: Tensor | None, num_edges: int, device) -> None:
    if edge_weight is None:
        return
    if not isinstance(edge_weight, Tensor):
        raise TypeError(f"edge_weight must be a torch.Tensor or None, got {type(edge_weight).__name__}")
    if not edge_weight.dtype.is_floating_point:
        raise TypeError(f"edge_weight must be floating point, got dtype {edge_weight.dtype}")
    if edge_weight.dim() != 1 or edge_weight.numel() != num_edges:
        raise ValueError(
            f"edge_weight must be 1-D with one entry per edge ({num_edges}), got shape {tuple(edge_weight.shape)}"
        )
    if edge_weight.device != device:
        raise ValueError(f"edge_weight is on {edge_weight.device} but edge_index is on {device}")


def _add_remaining_self_loops(edge_index: Tensor, edge_weight: Tensor, fill: float, num_nodes: int):
    """PyG's ``add_remaining_self_loops``: a node with a self-loop keeps that loop's weight,
    every other node gets a loop of weight ``fill``; all loops are appended after the other edges."""
    row, col = edge_index[0], edge_index[1]
    is_loop = row == col
    loop_weight = torch.full((num_nodes,), fill, dtype=edge_weight.dtype, device=edge_weight.device)
    loop_weight = loop_weight.scatter(0, row[is_loop], edge_weight[is_loop])
    loops = torch.arange(num_nodes, device=edge_index.device).expand(2, num_nodes)
    keep = ~is_loop
    return (
        torch.cat([edge_index[:, keep], loops], dim=1),
        torch.cat([edge_weight[keep], loop_weight]),
    )


def _symmetric_norm(row: Tensor, col: Tensor, weight: Tensor, degree_index: Tensor, num_nodes: int) -> Tensor:
    """``deg^-1/2[row] * weight * deg^-1/2[col]``, isolated nodes (degree 0) getting 0, as in PyG."""
    deg = torch.zeros(num_nodes, dtype=weight.dtype, device=weight.device).index_add(0, degree_index, weight)
    deg_inv_sqrt = deg.pow(-0.5)
    deg_inv_sqrt = deg_inv_sqrt.masked_fill(deg_inv_sqrt == math.inf, 0.0)
    return deg_inv_sqrt[row] * weight * deg_inv_sqrt[col]


def _matrix_entries(matrix: TCSparseTensor) -> tuple[Tensor, Tensor, Tensor]:
    csr = matrix.csr
    return csr.row_indices(), csr.col.long(), csr.values


def _as_tcsparse(matrix: Tensor) -> TCSparseTensor:
    if isinstance(matrix, TCSparseTensor):
        return matrix
    if matrix.layout == torch.sparse_csc:
        matrix = matrix.to_sparse_csr()
    return TCSparseTensor.from_torch(matrix)


def _check_square(matrix: Tensor, num_nodes: int | None) -> int:
    rows, cols = matrix.shape
    if rows != cols:
        raise ValueError(f"the adjacency matrix must be square, got shape {tuple(matrix.shape)}")
    if num_nodes is not None and rows != num_nodes:
        raise ValueError(f"the adjacency matrix has {rows} rows but the graph has {num_nodes} nodes")
    return rows


def gcn_norm(
    edge_index,
    edge_weight: Tensor | None = None,
    num_nodes: int | None = None,
    improved: bool = False,
    add_self_loops: bool = True,
    flow: str = "source_to_target",
    dtype: torch.dtype | None = None,
):
    """PyG's ``gcn_norm`` for the inputs this library accepts, with PyG's semantics for each:

    - ``edge_index`` ([2, E] tensor or PyG ``EdgeIndex``): returns ``(edge_index, edge_weight)``
      with the remaining self-loops appended (a node that already has a self-loop keeps its
      weight, the others get ``2`` if ``improved`` else ``1``) and the weights normalized.
    - a torch sparse matrix or a ``TCSparseTensor`` ``adj_t`` (``adj_t[target, source]``):
      returns ``(matrix, None)``, the matrix of the same kind with ``fill * I`` added to it
      (an existing diagonal entry grows by ``fill``, as PyG's torch-sparse path does) and
      normalized; a torch sparse matrix comes back in its layout (CSC as CSR).
    Degrees are taken over targets (over sources when ``flow="target_to_source"``, edge_index only).
    ``improved`` fills 2 also for an unweighted edge_index, where PyG 2.8 fills 1 (it creates the
    unit weights only after adding the loops), so pass unit weights to PyG to compare.
    """
    if flow not in _FLOWS:
        raise ValueError(f"flow must be one of {_FLOWS}, got {flow!r}")
    fill = 2.0 if improved else 1.0
    if isinstance(edge_index, TCSparseTensor) or _is_torch_sparse(edge_index):
        normalized = _normalized_matrix(_as_tcsparse(edge_index), num_nodes, fill, add_self_loops)
        if isinstance(edge_index, TCSparseTensor):
            return normalized, None
        matrix = normalized.to_torch_csr()
        return (matrix.to_sparse_coo() if edge_index.layout == torch.sparse_coo else matrix), None
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"edge_index must be a Tensor, EdgeIndex, torch sparse tensor or TCSparseTensor, "
                        f"got {type(edge_index).__name__}")
    if num_nodes is None:
        num_nodes = _infer_num_nodes(edge_index)
    edge_index = _check_edge_index(edge_index, num_nodes)
    _check_edge_weight(edge_weight, edge_index.size(1), edge_index.device)
    return _normalized_edges(edge_index, edge_weight, num_nodes, fill, add_self_loops, flow, dtype)


def _normalized_edges(edge_index, edge_weight, num_nodes, fill, add_self_loops, flow="source_to_target", dtype=None):
    if edge_weight is None:
        edge_weight = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
    if add_self_loops:
        edge_index, edge_weight = _add_remaining_self_loops(edge_index, edge_weight, fill, num_nodes)
    row, col = edge_index[0], edge_index[1]
    degree_index = col if flow == "source_to_target" else row
    return edge_index, _symmetric_norm(row, col, edge_weight, degree_index, num_nodes)


def _normalized_matrix(matrix: TCSparseTensor, num_nodes, fill, add_self_loops) -> TCSparseTensor:
    num_nodes = _check_square(matrix, num_nodes)
    row, col, value = _matrix_entries(matrix)
    if add_self_loops:
        loops = torch.arange(num_nodes, device=row.device)
        row, col = torch.cat([row, loops]), torch.cat([col, loops])
        value = torch.cat([value, torch.full((num_nodes,), fill, dtype=value.dtype, device=value.device)])
    value = _symmetric_norm(row, col, value, row, num_nodes)
    return TCSparseTensor.from_edge_index(torch.stack([col, row]), value, num_nodes=num_nodes)


def _check_channels(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _weight_gradient_through_narrow_product(lin, x: Tensor, adj: TCSparseTensor) -> bool:
    """Whether ``adj @ lin(x)`` needs only W's gradient and ``adj @ x`` is the narrower product
    (a first layer: features need no gradient, in_channels < out_channels)."""
    return (
        torch.is_grad_enabled()
        and type(lin) is torch.nn.Linear
        and lin.weight.requires_grad
        and not x.requires_grad
        and not adj._values.requires_grad
        and lin.in_features < lin.out_features
        and not torch.is_autocast_enabled(x.device.type)
    )


class _LinearThenPropagate(torch.autograd.Function):
    """``adj @ lin(x) + bias`` (PyG's order: linear, propagate, bias) whose backward gives W's
    gradient as ``grad^T (adj @ x)``, the same as autograd's ``(adj^T grad)^T x``: one SpMM of
    in_channels columns instead of out_channels (100 instead of 256 for ogbn-products' first
    layer)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, adj: TCSparseTensor, lin: torch.nn.Linear, bias: Tensor | None):
        ctx.save_for_backward(x)
        ctx.adj = adj
        return adj.matmul(lin(x), bias=bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        grad_bias = grad_out.sum(0) if ctx.needs_input_grad[4] else None
        return None, grad_out.t() @ (ctx.adj @ x), None, None, grad_bias


class GCNConv(torch.nn.Module):
    r"""Graph convolution of Kipf and Welling, a drop-in for ``torch_geometric.nn.GCNConv``:
    ``out = D^-1/2 (A + I) D^-1/2 (x W) + b``, with ``A + 2I`` when ``improved``.

    Parameters and state-dict keys (``lin.weight``, ``bias``) are PyG's, so weights load
    either way. ``forward(x, edge_index, edge_weight=None)`` takes ``edge_index`` as a
    ``[2, E]`` tensor (``edge_index[0]`` source, ``edge_index[1]`` target), a PyG ``EdgeIndex``,
    a torch sparse ``adj_t`` (``adj_t[target, source]``) or a ``TCSparseTensor`` ``adj_t``.
    Self-loops follow PyG per input kind (see :func:`gcn_norm`); duplicate edges are summed.

    ``cached=True`` keeps the converted (and normalized) ``TCSparseTensor`` from the first call
    and reuses it, ignoring later graphs: building it is the expensive step, one SpMM is cheap.
    Unlike PyG, the cache also applies with ``normalize=False``, since conversion still happens.
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
        self.in_channels = _check_channels("in_channels", in_channels)
        self.out_channels = _check_channels("out_channels", out_channels)
        self.improved = _check_flag("improved", improved)
        self.cached = _check_flag("cached", cached)
        self.normalize = _check_flag("normalize", normalize)
        if add_self_loops is None:
            add_self_loops = normalize
        self.add_self_loops = _check_flag("add_self_loops", add_self_loops)
        if add_self_loops and not normalize:
            raise ValueError(
                "GCNConv cannot add self-loops without normalization (add_self_loops=True, normalize=False)"
            )
        self.lin = torch.nn.Linear(in_channels, out_channels, bias=False)
        if _check_flag("bias", bias):
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
        if not isinstance(x, Tensor) or x.dim() != 2:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a 2-D tensor [num_nodes, in_channels], got {shape}")
        if x.size(1) != self.in_channels:
            raise ValueError(f"x has {x.size(1)} channels but the layer expects in_channels={self.in_channels}")
        adj = self._cached_adj
        if adj is None:
            adj = self._propagation_matrix(x, edge_index, edge_weight)
            if self.cached:
                self._cached_adj = adj
        if _weight_gradient_through_narrow_product(self.lin, x, adj):
            return _LinearThenPropagate.apply(x, self.lin.weight, adj, self.lin, self.bias)
        return adj.matmul(self.lin(x), bias=self.bias)

    def _propagation_matrix(self, x: Tensor, edge_index, edge_weight) -> TCSparseTensor:
        num_nodes = x.size(0)
        fill = 2.0 if self.improved else 1.0
        if isinstance(edge_index, TCSparseTensor) or _is_torch_sparse(edge_index):
            if edge_weight is not None:
                raise ValueError("edge_weight is only used with edge_index; a sparse matrix carries its own values")
            matrix = _as_tcsparse(edge_index)
            _check_square(matrix, num_nodes)
            if matrix.device != x.device:
                raise ValueError(f"the adjacency matrix is on {matrix.device} but x is on {x.device}")
            if self.normalize:
                matrix = _normalized_matrix(matrix, num_nodes, fill, self.add_self_loops)
            return matrix if matrix.dtype == x.dtype else matrix.to(x.dtype)
        if not isinstance(edge_index, Tensor):
            raise TypeError(
                "edge_index must be a [2, E] Tensor, EdgeIndex, torch sparse tensor or TCSparseTensor, "
                f"got {type(edge_index).__name__}"
            )
        edge_index = _check_edge_index(edge_index, num_nodes)
        if edge_index.device != x.device:
            raise ValueError(f"edge_index is on {edge_index.device} but x is on {x.device}")
        _check_edge_weight(edge_weight, edge_index.size(1), edge_index.device)
        if edge_weight is not None:
            edge_weight = edge_weight.to(x.dtype)
        if self.normalize:
            edge_index, edge_weight = _normalized_edges(
                edge_index, edge_weight, num_nodes, fill, self.add_self_loops, dtype=x.dtype
            )
        elif edge_weight is None:
            edge_weight = torch.ones(edge_index.size(1), dtype=x.dtype, device=x.device)
        return TCSparseTensor.from_edge_index(edge_index, edge_weight, num_nodes=num_nodes)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, improved={self.improved}, cached={self.cached}"
