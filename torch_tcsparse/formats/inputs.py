"""User inputs (edge_index, COO, CSR, scipy, torch sparse, dense, PyG EdgeIndex) to canonical CSR."""
from __future__ import annotations

import sys

import numpy as np
import torch

from ..paths import VALUE_DTYPES
from . import csr as csr_mod
from .csr import CSR, check_index_tensor, check_size

INT64_MAX = 2**63 - 1
# Conversion and transposition key every nonzero by its row-major position (row * num_cols + col)
# in int64, and a transpose holds num_cols + 1 int64 row offsets: both must be representable.
MAX_ELEMENTS = INT64_MAX
MAX_DIMENSION = INT64_MAX // 8 - 1


def check_shape(num_rows: int, num_cols: int, name: str = "shape") -> tuple[int, int]:
    """``(num_rows, num_cols)`` as ints, refused where the matrix's indexing would overflow int64."""
    num_rows, num_cols = check_size("num_rows", num_rows), check_size("num_cols", num_cols)
    if max(num_rows, num_cols) > MAX_DIMENSION or num_rows * num_cols > MAX_ELEMENTS:
        raise ValueError(
            f"{name} ({num_rows}, {num_cols}) is too large: each dimension must be at most {MAX_DIMENSION} "
            f"and num_rows * num_cols at most 2**63 - 1 (the matrix is indexed in int64)"
        )
    return num_rows, num_cols


def _check_dtype(dtype) -> None:
    if dtype is not None and dtype not in VALUE_DTYPES:
        raise TypeError(f"dtype must be None or one of {VALUE_DTYPES}, got {dtype!r}")


def _as_values(values, dtype: torch.dtype | None, name: str = "values"):
    """Values ready for ``csr_mod``, which casts them to ``dtype`` once their duplicates are summed
    (in float32 or float64: a cast first would sum 16-bit values in 16 bits). Non-float values
    need ``dtype`` and become floats of the accumulation dtype here. Complex values are refused
    even with a ``dtype``: a cast would drop the imaginary part."""
    _check_dtype(dtype)
    if values is None:
        return None
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(values).__name__}")
    if values.dtype.is_complex:
        raise TypeError(f"{name} has complex dtype {values.dtype}; TCSparseTensor holds real values only")
    if dtype is not None and not values.dtype.is_floating_point:
        return values.to(csr_mod.accumulation_dtype(dtype))
    if not values.dtype.is_floating_point:
        raise TypeError(f"{name} has dtype {values.dtype}; pass dtype=torch.float32 (or another float dtype) to convert")
    return values


def _edge_index_parts(edge_index):
    """Plain [2, E] tensor and (num_sources, num_targets) if a PyG EdgeIndex knows them."""
    # Looked up without importing PyG (seconds on first import): an EdgeIndex implies it is loaded.
    EdgeIndex = getattr(sys.modules.get("torch_geometric"), "EdgeIndex", ())
    if EdgeIndex and isinstance(edge_index, EdgeIndex):
        sizes = edge_index.sparse_size()
        return edge_index.as_tensor(), sizes
    return edge_index, (None, None)


def from_edge_index(edge_index, edge_weight=None, num_nodes=None, dtype=None) -> CSR:
    """PyG convention: edge_index[0] is the source, edge_index[1] the target, A[target, source] = w.

    ``num_nodes`` is an int (square matrix) or a (num_sources, num_targets) pair; by default it is
    taken from a PyG EdgeIndex's sparse size, else from the largest index + 1."""
    edge_index, (num_src, num_dst) = _edge_index_parts(edge_index)
    check_index_tensor("edge_index", edge_index)
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    if isinstance(num_nodes, (tuple, list)):
        if len(num_nodes) != 2:
            raise ValueError(f"num_nodes must be an int or a (num_sources, num_targets) pair, got {num_nodes}")
        num_src, num_dst = num_nodes
    elif num_nodes is not None:
        num_src = num_dst = num_nodes
    if num_src is None or num_dst is None:
        inferred = int(edge_index.max()) + 1 if edge_index.numel() else 0
        num_src = inferred if num_src is None else num_src
        num_dst = inferred if num_dst is None else num_dst
    values = _as_values(edge_weight, dtype, "edge_weight")
    if values is not None and values.dim() != 1:
        raise ValueError(f"edge_weight must be 1-D with one weight per edge, got shape {tuple(values.shape)}")
    num_src, num_dst = check_size("num_nodes", num_src), check_size("num_nodes", num_dst)
    check_shape(num_dst, num_src, "num_nodes as (num_targets, num_sources)")
    return csr_mod.from_coo(
        edge_index[1], edge_index[0], values, num_dst, num_src, dtype,
        names=("edge_index[1] (targets)", "edge_index[0] (sources)", "edge_weight"),
    )


def _shape(shape, name="shape") -> tuple[int, int]:
    if not isinstance(shape, (tuple, list, torch.Size)) or len(shape) != 2:
        raise ValueError(f"{name} must be a pair (num_rows, num_cols), got {shape!r}")
    return check_shape(shape[0], shape[1], name)


def from_coo(row, col, values=None, shape=None, dtype=None) -> CSR:
    check_index_tensor("row", row)
    check_index_tensor("col", col)
    if shape is None:
        shape = (int(row.max()) + 1 if row.numel() else 0, int(col.max()) + 1 if col.numel() else 0)
    num_rows, num_cols = _shape(shape)
    return csr_mod.from_coo(row, col, _as_values(values, dtype), num_rows, num_cols, dtype)


def from_csr(rowptr, col, values=None, shape=None, dtype=None) -> CSR:
    check_index_tensor("rowptr", rowptr)
    check_index_tensor("col", col)
    if rowptr.dim() != 1 or rowptr.numel() < 1:
        raise ValueError(f"rowptr must be 1-D with num_rows + 1 entries (at least one), got shape {tuple(rowptr.shape)}")
    if shape is None:
        shape = (rowptr.numel() - 1, int(col.max()) + 1 if col.numel() else 0)
    num_rows, num_cols = _shape(shape)
    return csr_mod.from_csr_arrays(rowptr, col, _as_values(values, dtype), num_rows, num_cols, dtype)


def from_scipy(matrix, dtype=None) -> CSR:
    import scipy.sparse as sp

    if not sp.issparse(matrix):
        raise TypeError(f"from_scipy expects a scipy.sparse matrix or array, got {type(matrix).__name__}")
    check_shape(*matrix.shape)
    if np.issubdtype(matrix.dtype, np.complexfloating):
        raise TypeError(f"the scipy matrix has complex dtype {matrix.dtype}; TCSparseTensor holds real values only")
    coo = matrix.tocoo()
    data = coo.data
    if dtype is None and not np.issubdtype(data.dtype, np.floating):
        raise TypeError(f"the scipy matrix has dtype {data.dtype}; pass dtype=torch.float32 to convert")
    values = torch.from_numpy(np.ascontiguousarray(data))
    row = torch.from_numpy(coo.row.astype(np.int64))
    col = torch.from_numpy(coo.col.astype(np.int64))
    return csr_mod.from_coo(row, col, _as_values(values, dtype), coo.shape[0], coo.shape[1], dtype)


def from_torch(tensor: torch.Tensor, dtype=None) -> CSR:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"from_torch expects a torch sparse tensor, got {type(tensor).__name__}")
    if tensor.dim() != 2:
        raise ValueError(f"from_torch expects a 2-D sparse tensor, got {tensor.dim()} dimensions")
    if tensor.layout in (torch.sparse_coo, torch.sparse_csr) and tensor.dense_dim() != 0:
        raise ValueError(
            f"from_torch expects a sparse tensor without dense dimensions, got sparse_dim={tensor.sparse_dim()}, "
            f"dense_dim={tensor.dense_dim()}"
        )
    check_shape(*tensor.shape)
    if tensor.layout == torch.sparse_coo:
        # coalesce() sums duplicates in the tensor's dtype: 16-bit values are widened first.
        widened = tensor.to(csr_mod.accumulation_dtype(tensor.dtype)) if tensor.dtype.is_floating_point else tensor
        coalesced = widened.coalesce()
        row, col = coalesced.indices()
        out_dtype = tensor.dtype if dtype is None and tensor.dtype.is_floating_point else dtype
        return csr_mod.from_coo(row, col, _as_values(coalesced.values(), dtype), *tensor.shape, out_dtype)
    if tensor.layout == torch.sparse_csr:
        values = _as_values(tensor.values(), dtype)
        return csr_mod.from_csr_arrays(
            tensor.crow_indices(), tensor.col_indices(), values, tensor.shape[0], tensor.shape[1], dtype
        )
    raise TypeError(f"from_torch supports sparse COO and CSR tensors, got layout {tensor.layout}")


def from_dense(dense: torch.Tensor, dtype=None) -> CSR:
    if not isinstance(dense, torch.Tensor) or dense.layout != torch.strided:
        raise TypeError(f"from_dense expects a dense (strided) torch.Tensor, got {type(dense).__name__}")
    if dense.dim() != 2:
        raise ValueError(f"from_dense expects a 2-D tensor, got shape {tuple(dense.shape)}")
    row, col = torch.nonzero(dense, as_tuple=True)
    return csr_mod.from_coo(row, col, _as_values(dense[row, col], dtype), *dense.shape, dtype)
