"""Checks of the graph a GCN layer or ``gcn_norm`` receives: a [2, E] edge_index (or PyG
``EdgeIndex``) with optional edge weights, or a square sparse matrix (torch sparse or
``TCSparseTensor``)."""
from __future__ import annotations

import sys

import torch
from torch import Tensor

from ..tensor import TCSparseTensor
from . import _pyg

_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)


def is_pyg_edge_index(value) -> bool:
    """A PyG ``EdgeIndex``, a Tensor subclass carrying its sparse size. Looked up without
    importing torch_geometric (seconds): an EdgeIndex implies it is loaded."""
    module = sys.modules.get("torch_geometric")
    edge_index_class = getattr(module, "EdgeIndex", None)
    return edge_index_class is not None and isinstance(value, edge_index_class)


def is_matrix(value) -> bool:
    """A TCSparseTensor or a torch sparse tensor: an ``adj_t`` rather than an edge_index."""
    return isinstance(value, TCSparseTensor) or (isinstance(value, Tensor) and value.layout in _SPARSE_LAYOUTS)


def check_num_nodes(num_nodes) -> int:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int):
        raise TypeError(f"num_nodes must be an int, got {type(num_nodes).__name__}")
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be non-negative, got {num_nodes}")
    return num_nodes


def _check_integer_dtype(edge_index: Tensor) -> None:
    dtype = edge_index.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise TypeError(f"edge_index must hold integers, got dtype {dtype}")


def _check_tensor(edge_index) -> None:
    if not isinstance(edge_index, Tensor):
        raise TypeError(
            "edge_index must be a [2, E] Tensor, EdgeIndex, torch sparse tensor or TCSparseTensor, "
            f"got {type(edge_index).__name__}"
        )


def edge_index_nodes(edge_index, num_nodes: int | None) -> int:
    """``num_nodes`` if given, else PyG's count: an EdgeIndex's sparse size, else the largest
    index + 1."""
    if num_nodes is not None:
        return check_num_nodes(num_nodes)
    _check_tensor(edge_index)
    _check_integer_dtype(edge_index)
    return _pyg.maybe_num_nodes()(edge_index)


def check_edge_index(edge_index: Tensor, num_nodes: int) -> Tensor:
    """A plain int64 [2, E] tensor with every index in [0, num_nodes)."""
    _check_tensor(edge_index)
    if is_pyg_edge_index(edge_index):
        size = edge_index.sparse_size()
        if any(s is not None and s != num_nodes for s in size):
            raise ValueError(f"EdgeIndex has sparse size {tuple(size)} but the graph has {num_nodes} nodes")
        edge_index = edge_index.as_tensor()
    _check_integer_dtype(edge_index)
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, num_edges], got {tuple(edge_index.shape)}")
    if edge_index.numel():
        low, high = int(edge_index.min()), int(edge_index.max())
        if low < 0:
            raise ValueError(f"edge_index holds a negative node index ({low})")
        if high >= num_nodes:
            raise ValueError(f"edge_index holds node {high}, out of range for {num_nodes} nodes")
    return edge_index.long()


def check_edge_weight(edge_weight: Tensor | None, num_edges: int, device: torch.device) -> None:
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


def check_matrix(matrix: Tensor, edge_weight, num_nodes: int | None) -> int:
    """The node count of a square sparse ``adj_t``, which carries its own values."""
    if edge_weight is not None:
        raise ValueError("edge_weight is only used with edge_index; a sparse matrix carries its own values")
    if matrix.dim() != 2:
        raise ValueError(f"the adjacency matrix must be 2-D, got shape {tuple(matrix.shape)}")
    if not matrix.dtype.is_floating_point:
        raise TypeError(f"the adjacency matrix must hold floating-point values, got dtype {matrix.dtype}")
    rows, cols = matrix.shape
    if rows != cols:
        raise ValueError(f"the adjacency matrix must be square, got shape {tuple(matrix.shape)}")
    if num_nodes is not None and rows != num_nodes:
        raise ValueError(f"the adjacency matrix has {rows} rows but the graph has {num_nodes} nodes")
    return rows
