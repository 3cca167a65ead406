"""TCSparseTensor: a sparse matrix (M, K) in Tensor-Core storage that multiplies like a tensor.

``A @ X``, ``torch.matmul``, ``torch.mm``, ``torch.sparse.mm``, ``A.matmul(X)`` and
``torch_tcsparse.spmm(A, X)`` run the engine the selector picks (through the ``tcsparse::spmm``
op when autograd or torch.compile is involved, directly otherwise) and return a plain dense
tensor in the user's row order. Any other torch operation raises a TypeError that says what to do instead: the
subclass holds no dense storage, so nothing may silently compute on it.
"""
from __future__ import annotations

import copy
import functools

import torch

from . import csr_rows, grouped, ops, serialization
from .conversion import build_structure
from .formats import inputs
from .formats.csr import CSR, check_values, torch_csr
from .formats.bcsr import BCSR, build_bcsr
from .formats.grouped import fragment_values
from .structure import Structure

class TCSparseTensor(torch.Tensor):
    """A sparse matrix in ME-TCF Tensor-Core storage; build it with one of the ``from_*`` methods."""

    _structure: Structure
    _values: torch.Tensor

    @staticmethod
    def __new__(cls, structure: Structure, values: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls, (structure.num_rows, structure.num_cols), dtype=values.dtype, device=values.device
        )
        out._structure = structure
        out._values = values
        out._csr_matrix = out._csr_t = None
        out._casts = {}
        out._block_values_built = None  # see _block_values
        out._operands = {}  # see _operand_values and _rows_values
        return out

    @property
    def _block_values(self) -> torch.Tensor:
        """The values in block order, what the kernels read: built on first need, so a matrix
        whose products all go to torch.sparse never holds a second copy of its values."""
        if self._block_values_built is None:
            with torch.no_grad():
                self._block_values_built = self._structure.to_block_order(self._values)
        return self._block_values_built

    @classmethod
    def _build(cls, csr: CSR, window=16, reorder="none", symmetric=None, seed=0) -> "TCSparseTensor":
        return cls(build_structure(csr, window, reorder, symmetric, seed), csr.values)

    # Constructors. Keywords shared by all: dtype (cast the values), window (16 or 8 rows),
    # reorder ("none", "auto", a method of torch_tcsparse.reorder, or a row permutation),
    # symmetric (one permutation for rows and columns; default: for square matrices), seed (for
    # randomized reorderings).

    @classmethod
    def from_edge_index(cls, edge_index, edge_weight=None, num_nodes=None, *, dtype=None, **options):
        """From a PyG [2, E] edge_index or EdgeIndex: A[target, source] = weight, duplicates summed."""
        return cls._build(inputs.from_edge_index(edge_index, edge_weight, num_nodes, dtype), **options)

    @classmethod
    def from_coo(cls, row, col, values=None, shape=None, *, dtype=None, **options):
        """From COO triplets; duplicate (row, col) pairs are summed."""
        return cls._build(inputs.from_coo(row, col, values, shape, dtype), **options)

    @classmethod
    def from_csr(cls, rowptr, col, values=None, shape=None, *, dtype=None, **options):
        """From CSR arrays (columns may be unsorted; duplicates are summed)."""
        return cls._build(inputs.from_csr(rowptr, col, values, shape, dtype), **options)

    @classmethod
    def from_scipy(cls, matrix, *, dtype=None, **options):
        return cls._build(inputs.from_scipy(matrix, dtype), **options)

    @classmethod
    def from_torch(cls, tensor, *, dtype=None, **options):
        """From a torch sparse COO or CSR tensor."""
        return cls._build(inputs.from_torch(tensor, dtype), **options)

    @classmethod
    def from_dense(cls, dense, *, dtype=None, **options):
        return cls._build(inputs.from_dense(dense, dtype), **options)

    # Views and conversions.

    @property
    def csr(self) -> CSR:
        """Canonical CSR (rows and columns in the user's order, duplicates summed)."""
        return self._structure.csr(self._values)

    @property
    def nnz(self) -> int:
        return self._structure.nnz

    @property
    def reorder_method(self) -> str:
        return self._structure.method

    def stats(self) -> dict:
        """TC blocks, MeanNnzTC, blocks per window (mean, std, max), bytes against CSR."""
        return self._structure.stats(self._values.element_size())

    def explain(self, n: int):
        """Why ``A @ X`` with N columns runs the path it runs: features, simulated makespans of the
        kernels, predicted costs, and the choice (see ``torch_tcsparse.selector``)."""
        return self._structure.selection.explain(self._structure.layout, n, self.dtype, self.device)

    def with_values(self, values: torch.Tensor) -> "TCSparseTensor":
        """Same sparsity structure, new values given in canonical CSR order (``A.csr`` order)."""
        check_values(values, self.nnz, self.device)
        return TCSparseTensor(self._structure, values)

    def to(self, *args, **kwargs) -> "TCSparseTensor":
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        device = self.device if device is None else torch.device(device)
        dtype = self.dtype if dtype is None else dtype
        if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"TCSparseTensor values must be a floating dtype, got {dtype}")
        structure = self._structure if device == self.device else self._structure.to(device)
        return TCSparseTensor(structure, self._values.to(device=device, dtype=dtype))

    def half(self) -> "TCSparseTensor":
        return self.to(torch.float16)

    def bfloat16(self) -> "TCSparseTensor":
        return self.to(torch.bfloat16)

    def float(self) -> "TCSparseTensor":
        return self.to(torch.float32)

    def double(self) -> "TCSparseTensor":
        return self.to(torch.float64)

    def requires_grad_(self, requires_grad: bool = True):
        raise TypeError(
            "gradients flow to the values of a TCSparseTensor, not to the matrix object: build it "
            "with values that require grad, e.g. A.with_values(v.requires_grad_())"
        )

    def cuda(self, device=None) -> "TCSparseTensor":
        return self.to(torch.device("cuda") if device is None else torch.device("cuda", device) if isinstance(device, int) else device)

    def cpu(self) -> "TCSparseTensor":
        return self.to("cpu")

    def t(self) -> "TCSparseTensor":
        """The transpose (K, M); its structure is built once and cached on both matrices. Its
        values are gathered through the block orders (differentiable), the links the kernels'
        backward keeps anyway, so no CSR-to-CSR order is stored."""
        structure_t = self._structure.transposed()
        block_values_t = self._structure.to_block_order(self._values)[structure_t.layout.transpose_gather]
        return TCSparseTensor(structure_t, block_values_t[structure_t.layout.csr_gather])

    @property
    def T(self) -> "TCSparseTensor":
        return self.t()

    def to_bcsr(self, block_shape=(16, 8)) -> BCSR:
        """BCSR of this matrix in its row order (the permutation, if any, applied): 16x8 tiles
        for TF32 ``m16n8k8``, 16x16 for fp16/bf16 ``m16n8k16``."""
        return build_bcsr(self.csr, block_shape, self._structure.row_perm)

    def to_dense(self) -> torch.Tensor:
        row = self.csr.row_indices()
        dense = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        return dense.index_put_((row, self._structure.col.long()), self._values)

    def to_torch_csr(self) -> torch.Tensor:
        s = self._structure
        return torch_csr(s.rowptr, s.col, self._values, self.shape)

    def to_scipy(self):
        import scipy.sparse as sp

        s = self._structure
        values = self._values.detach().cpu()
        if values.dtype == torch.bfloat16:
            values = values.float()
        return sp.csr_matrix((values.numpy(), s.col.cpu().numpy(), s.rowptr.cpu().numpy()), shape=tuple(self.shape))

    def __repr__(self, *, tensor_contents=None) -> str:
        stats = self._structure.layout
        return (
            f"TCSparseTensor(shape={tuple(self.shape)}, nnz={self.nnz}, dtype={self.dtype}, device={self.device}, "
            f"window={stats.window}, tc_blocks={stats.num_blocks}, reorder={self._structure.method!r})"
        )

    # Multiplication.

    def matmul(self, other: torch.Tensor, path: str = "auto", bias: torch.Tensor | None = None) -> torch.Tensor:
        """Y = A @ X for X of shape [K] or [K, N]; differentiable for X and the values. Under
        ``torch.autocast`` a float32 A or X runs in the autocast dtype, as torch.matmul does.
        ``bias`` (shape [N], X's dtype and device; differentiable) is added to every row of Y;
        on the CSR paths within the product (each starts from the bias instead of zeros)."""
        # The per-call path reads the plain tensors the subclass holds: attributes of the
        # subclass itself (shape, device, dtype) go through __torch_function__ on every access.
        autocast_dtype = _autocast_dtype(self._values, other)
        if autocast_dtype is not None:
            bias = bias.to(autocast_dtype) if isinstance(bias, torch.Tensor) else bias
            return self._in_dtype(autocast_dtype).matmul(other.to(autocast_dtype), path, bias)
        x = _check_operand(self, other)
        if bias is not None:
            _check_bias(bias, x)
        vector = x.dim() == 1
        if vector:
            x = x.unsqueeze(1)
        s = self._structure
        trial = None
        if path == "auto" and ops.kernels_apply(x):
            path, trial = s.selection.choose(s.layout, x.shape[1], x.dtype, x.device)
        path = ops.resolve_path(path, x)
        if trial is None:
            y = self._product(x, path, bias)
        else:  # this product measures the choice (torch_tcsparse.trials)
            y = s.selection.measure(trial, lambda candidate: self._product(x, candidate, bias))
        return y.squeeze(1) if vector else y

    def _product(self, x: torch.Tensor, path: str, bias: torch.Tensor | None) -> torch.Tensor:
        """A @ x (+ bias) on a resolved path, with the autograd the operands need."""
        s = self._structure
        values_need_grad = torch.is_grad_enabled() and self._values.requires_grad
        x_needs_grad = torch.is_grad_enabled() and x.requires_grad
        if path == "grouped" and torch.are_deterministic_algorithms_enabled():
            path = "base"  # the same product without the grouped kernel's atomics
        if torch.compiler.is_compiling() or values_need_grad:
            values = s.to_block_order(self._values) if values_need_grad else self._block_values
            layout_t = s.transposed().layout.tensors() if x_needs_grad else []
            pieces = self._op_row_pieces(path, x_needs_grad)
            y = ops.spmm(x, values, s.layout.tensors(), layout_t, s.window, s.num_rows, s.num_cols, path, pieces)
        elif path in ops.PRODUCT_PATHS:
            # The CSR paths read the CSR-order values the tensor holds: no per-call gather, so
            # "csr" costs what torch.sparse.mm costs; the bias goes in with the product.
            product = self._csr_product(path)
            if x_needs_grad:
                return ops.ProductGradX.apply(x, product, functools.partial(self._transposed_csr_product, path), bias)
            return product(x, bias)
        elif x_needs_grad:
            values, values_t = self._operand_values(path), self._operand_values(path, transpose=True)
            y = ops.SpMMGradX.apply(x, values, values_t, s.layout, s.transposed().layout, path)
        else:
            y = ops.run_spmm(x, self._operand_values(path), s.layout, path, validated=True)
        return y if bias is None else y + bias

    def _op_row_pieces(self, path: str, with_transpose: bool) -> list[torch.Tensor]:
        """``tcsparse::spmm``'s ``row_pieces``: the structure's splits of its canonical CSR (and
        of the transpose's), kept across calls. A split not built yet is built outside any
        compiled graph (its size is data-dependent)."""
        if path != "rows":
            return []
        s = self._structure
        structures = (s, s.transposed()) if with_transpose else (s,)

        def splits():
            size = csr_rows.piece_size()
            return [t for structure in structures for t in structure.row_pieces(size, canonical=True)[:3]]

        return torch.compiler.disable(splits)() if torch.compiler.is_compiling() else splits()

    def _operand_values(self, path: str, transpose: bool = False) -> torch.Tensor:
        """Block-order values for ``path`` (fp32 for the kernels, converted once, not per call),
        or with ``transpose`` the transpose's in its block order, gathered from those; kept while
        the values need no gradient."""
        key = (path in ops.KERNEL_PATHS, transpose)
        if key not in self._operands:
            if transpose:
                values = self._operand_values(path)
                values_t = values[self._structure.transposed().layout.transpose_gather]
                # A symmetric matrix (GCN's normalized adjacency) is its own transpose: one copy.
                self._operands[key] = values if torch.equal(values_t, values) else values_t
            else:
                self._operands[key] = self._block_values.float() if key[0] else self._block_values
        return self._operands[key]

    def _in_dtype(self, dtype: torch.dtype) -> "TCSparseTensor":
        """This matrix with values in ``dtype``; kept while the values need no gradient, so a
        model under autocast converts them once, not at every product."""
        if self._values.requires_grad:
            return self.to(dtype)
        if dtype not in self._casts:
            self._casts[dtype] = self.to(dtype)
        return self._casts[dtype]

    def _torch_csr(self) -> torch.Tensor:
        if self._csr_matrix is None:
            with torch.no_grad():
                self._csr_matrix = self.to_torch_csr()
        return self._csr_matrix

    def _csr_product(self, path: str):
        """``(x, bias) -> A @ x + bias`` on a path with a layout of its own: torch.sparse ("csr"),
        the CUDA-core kernel ("rows", whose split of long rows the structure keeps) or the grouped
        Tensor-Core kernel ("grouped")."""
        if path == "csr":
            matrix = self._torch_csr()
            return lambda x, bias: ops.torch_sparse_product(matrix, x.contiguous(), bias)
        s = self._structure
        if path == "grouped":
            layout, (fragments, rest_values) = s.grouped(), self._grouped_values()
            pieces = None if layout.rest is None else s.grouped_pieces()
            return lambda x, bias: grouped.spmm(x, layout, fragments, bias, rest_values, pieces)
        csr_rows.check_indices(s.rowptr)
        rows, pieces = s.rows_csr(), s.row_pieces(s.rows_piece_nnz(self._values.dtype))
        values = self._rows_values()
        return lambda x, bias: csr_rows.spmm(x, rows.rowptr, rows.col, values, pieces, s.num_cols, bias, rows.row_map)

    def _rows_values(self) -> torch.Tensor:
        """The values in the order of the structure's ``rows_csr`` (a reordered matrix's rows
        in its order), gathered once and kept while the values need no gradient."""
        gather = self._structure.rows_csr().gather
        if gather is None:
            return self._values
        if "rows" not in self._operands:
            self._operands["rows"] = self._values[gather]
        return self._operands["rows"]

    def _grouped_values(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The grouped layout's fragments, and the values of its rest (None: no rest) in the
        rest's order, built once and kept while the values need no gradient."""
        if "grouped" not in self._operands:
            layout = self._structure.grouped()
            rest = None if layout.rest is None else self._values[layout.rest.gather.long()]
            self._operands["grouped"] = (fragment_values(layout, self._values), rest)
        return self._operands["grouped"]

    def _transposed_csr_product(self, path: str):
        return self._csr_transpose()._csr_product(path)

    def _csr_transpose(self) -> "TCSparseTensor":
        """A^T for the backward of the CSR paths, built on first need and kept: a symmetric
        matrix (GCN's normalized adjacency) is its own, so its CSR serves both directions. It
        comes from the structure's cached transpose (``t()``), which a symmetric pattern shares
        and GCN builds beforehand: a CSR transpose of its own here would sort every nonzero again,
        and its temporaries raised R-MAT 21's training peak from 11.07 to 12.97 GB."""
        if self._csr_t is None:
            with torch.no_grad():
                transposed = self.t()
                symmetric = transposed._structure.col is self._structure.col and torch.equal(
                    transposed._values, self._values
                )
                self._csr_t = self if symmetric else transposed
        return self._csr_t

    def __matmul__(self, other):
        return self.matmul(other)

    def mm(self, other):
        return self.matmul(other)

    # Python operators would otherwise turn torch's TypeError into NotImplemented and fall back
    # to a generic message (or, for ==, to an identity check): refuse them here with guidance.

    def _unsupported_operator(self, *args, **kwargs):
        raise TypeError(
            "TCSparseTensor supports A @ X only among Python operators; for elementwise math or "
            "comparisons convert with .to_dense(), or change the values with .with_values(v)"
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _unsupported_operator
    __truediv__ = __rtruediv__ = __pow__ = __neg__ = __abs__ = _unsupported_operator
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _unsupported_operator
    __hash__ = torch.Tensor.__hash__

    def __rmatmul__(self, other):
        _reject_right_operand()

    # Serialization: only canonical CSR, the permutation and options travel (serialization.py).

    def __reduce_ex__(self, protocol):
        return (serialization.rebuild, (serialization.state_of(self._structure, self._values),))

    def __deepcopy__(self, memo):
        rebuild, (state,) = self.__reduce_ex__(2)
        copied = rebuild(copy.deepcopy(state, memo))
        memo[id(self)] = copied
        return copied

    # torch function protocol.

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLED.get(func)
        if handler is not None:
            return handler(*args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise TypeError(
            f"TCSparseTensor does not support {func}: it supports A @ X, torch.matmul, torch.mm, "
            "torch.sparse.mm, .t(), .to(), .with_values(); convert with .to_dense() or .to_torch_csr() first"
        )


def _check_operand(a: TCSparseTensor, x) -> torch.Tensor:
    if isinstance(x, TCSparseTensor):
        raise TypeError("the product of two TCSparseTensors is not supported; convert one with .to_dense()")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"A @ X needs a torch.Tensor X, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"A @ X needs a dense X, got layout {x.layout}")
    if x.dim() not in (1, 2):
        raise ValueError(f"A @ X needs X of shape [K] or [K, N], got shape {tuple(x.shape)}")
    values = a._values
    if x.shape[0] != a._structure.num_cols:
        raise ValueError(f"shape mismatch: A is {tuple(a.shape)} but X has {x.shape[0]} rows (shape {tuple(x.shape)})")
    if x.device != values.device:
        raise ValueError(f"device mismatch: A is on {values.device} but X is on {x.device}")
    if x.dtype != values.dtype:
        raise TypeError(f"dtype mismatch: A is {values.dtype} but X is {x.dtype}; convert one with .to(dtype)")
    return x


def _check_bias(bias, x: torch.Tensor) -> None:
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if x.dim() != 2:
        raise ValueError(f"bias needs X of shape [K, N], got X of shape {tuple(x.shape)}")
    if bias.dim() != 1 or bias.shape[0] != x.shape[1]:
        raise ValueError(f"bias must have shape [N] = [{x.shape[1]}], got {tuple(bias.shape)}")
    if bias.device != x.device or bias.dtype != x.dtype:
        raise TypeError(f"bias must match X ({x.dtype} on {x.device}), got {bias.dtype} on {bias.device}")


def _autocast_dtype(values: torch.Tensor, x) -> torch.dtype | None:
    """The dtype autocast asks for when it applies to A @ X (A's ``values`` given): float32
    operands on a device where autocast is on are cast to its dtype; float64 is never cast (as
    in torch)."""
    if not isinstance(x, torch.Tensor) or not torch.is_autocast_enabled(values.device.type):
        return None
    dtype = torch.get_autocast_dtype(values.device.type)
    operands = {values.dtype, x.dtype}
    if torch.float32 not in operands or not operands <= {torch.float32, dtype}:
        return None
    return dtype


def _reject_right_operand(*args, **kwargs):
    raise TypeError(
        "a TCSparseTensor can only be the left operand of a matrix product (A @ X); "
        "for X @ A compute (A.t() @ X.t()).t()"
    )


def _matmul(a, x, *rest, **kwargs):
    if not isinstance(a, TCSparseTensor):
        _reject_right_operand()
    if rest or kwargs:
        raise TypeError("TCSparseTensor matmul takes no out= or extra arguments")
    return a.matmul(x)


def _rebuild(state: dict) -> TCSparseTensor:
    """The loader that files saved by version 0.1.0 name."""
    return serialization.rebuild(state)


torch.serialization.add_safe_globals([_rebuild])

_HANDLED = {
    torch.matmul: _matmul,
    torch.mm: _matmul,
    torch.sparse.mm: _matmul,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.mm: _matmul,
    torch.Tensor.__matmul__: _matmul,
    torch.Tensor.__rmatmul__: _reject_right_operand,
    torch.t: lambda a: a.t(),
    torch.Tensor.t: lambda a: a.t(),
}

