"""TCSparseTensor: a sparse matrix (M, K) in Tensor-Core storage that multiplies like a tensor.

``A @ X``, ``torch.matmul``, ``torch.mm``, ``torch.sparse.mm``, ``A.matmul(X)`` and
``torch_tcsparse.spmm(A, X)`` run the engine the selector picks (``product.py``) and return a
plain dense tensor in the user's row order (``reduce=`` on ``matmul``, ``torch.sparse.mm`` and
``spmm`` picks "sum", "mean", "max" or "min"). Like a torch sparse CSR tensor, the matrix reports
``layout == torch.sparse_csr`` and gives its canonical CSR arrays through ``crow_indices()``,
``col_indices()`` and ``values()``: what PyG reads to take it as a sparse ``adj_t``. Any other
torch operation raises a TypeError that says what to do instead: the subclass holds no dense
storage, so nothing may silently compute on it. The class holds the constructors, views, the torch-function table and ``matmul``; the operands
it keeps across products (those that read its values in place) live in its ``OperandCache``.
"""
from __future__ import annotations

import copy

import torch

from . import flattening, product, serialization
from .product import is_traced
from .conversion import build_batch_structure, build_structure
from .formats import inputs
from .formats.csr import CSR, cast_values, check_values, scipy_csr, torch_csr
from .formats.bcsr import BCSR, build_bcsr
from .operands import OperandCache
from .paths import VALUE_DTYPES
from .structure import Structure


class TCSparseTensor(torch.Tensor):
    """A sparse matrix in ME-TCF Tensor-Core storage; build it with one of the ``from_*`` methods."""

    _structure: Structure
    _values: torch.Tensor

    @staticmethod
    def __new__(cls, structure: Structure, values: torch.Tensor):
        if values.requires_grad and not is_traced(values, None):
            # The matrix requires grad too, linked to its values: a compiled function that takes
            # it as an input sends the values' gradient through it (flattening.py).
            with torch.enable_grad():
                return flattening.Wrap.apply(_wrapper, structure, values)
        return _wrapper(structure, values)

    @classmethod
    def _build(cls, csr: CSR, window=16, reorder="none", symmetric=None, seed=0) -> "TCSparseTensor":
        return cls(build_structure(csr, window, reorder, symmetric, seed), csr.values)

    # Constructors. Keywords shared by all: dtype (cast the values), window (16 or 8 rows),
    # reorder ("none", "auto", a method of torch_tcsparse.reorder, or a row permutation as an
    # integer tensor or numpy array),
    # symmetric (one permutation for rows and columns; default: for square matrices), seed (for
    # randomized reorderings).

    @classmethod
    def from_edge_index(cls, edge_index, edge_weight=None, num_nodes=None, *, dtype=None, **options):
        """From a PyG [2, E] edge_index or EdgeIndex: A[target, source] = weight, duplicates summed."""
        return cls._build(inputs.from_edge_index(edge_index, edge_weight, num_nodes, dtype), **options)

    @classmethod
    def from_batch(cls, edge_index, edge_weight=None, num_nodes=None, *, dtype=None, window=16):
        """For a matrix multiplied a few times, such as a sampled mini-batch or one of its
        bipartite blocks: as ``from_edge_index`` (``num_nodes`` an int or a (num_sources,
        num_targets) pair), but only the CSR is built. Products run the CSR rows kernel (or
        torch.sparse where the kernels do not run) until the matrix has been used often enough to
        pay for the Tensor-Core layout, which it then builds for itself (``structure.CsrStructure``);
        a path named by the caller or a gradient of the values builds it at once. No reordering."""
        return cls(*build_batch_structure(edge_index, edge_weight, num_nodes, dtype, window))

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
        return self._structure.csr(live_values(self))

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
        if dtype not in VALUE_DTYPES:
            raise TypeError(f"TCSparseTensor values must be a floating dtype, got {dtype}")
        structure = self._structure if device == self.device else self._structure.to(device)
        values = live_values(self).to(device=device)
        # A value beyond the dtype's range would silently become inf: refused, with one host read
        # (not in traced code, which cannot read its values).
        values = values.to(dtype) if is_traced(values, None) else cast_values(values, dtype)
        return TCSparseTensor(structure, values)

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
        values are gathered (differentiable) with the order of the structure's build where this
        call builds it, else through the block orders (``Structure.transpose_values``), the links
        the kernels' backward keeps anyway: no CSR-to-CSR order is stored. Either way the same
        values, a permutation of ours."""
        values = live_values(self)
        structure_t, order = self._structure.transposed_with_order()
        if order is not None:
            return TCSparseTensor(structure_t, values.index_select(0, order))
        return TCSparseTensor(structure_t, self._structure.transpose_values(values))

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
        """A scipy CSR matrix in the user's order (16-bit values in float32: scipy computes on
        neither float16 nor bfloat16)."""
        s = self._structure
        return scipy_csr(s.rowptr, s.col, self._values, self.shape)

    def __repr__(self, *, tensor_contents=None) -> str:
        # Printing a CSR-only matrix must not build its layout: the blocks are "pending" until then.
        # A matrix inside a compiled function counts them on the structure it stands for, whose
        # layout is whole.
        structure = flattening.source_of(self._structure)
        blocks = "pending" if structure.layout_pending else structure.layout.num_blocks
        return (
            f"TCSparseTensor(shape={tuple(self.shape)}, nnz={self.nnz}, dtype={self.dtype}, device={self.device}, "
            f"window={self._structure.window}, tc_blocks={blocks}, reorder={self._structure.method!r})"
        )

    # Multiplication.

    def matmul(self, other: torch.Tensor, path: str = "auto", bias: torch.Tensor | None = None,
               reduce: str = "sum") -> torch.Tensor:
        """Y = A @ X for X of shape [K] or [K, N]; differentiable for X, the values and the bias.
        Under ``torch.autocast`` a float32 A or X runs in the autocast dtype, as torch.matmul does.
        ``bias`` (shape [N], X's dtype and device) is added to every row of Y; on the CSR paths
        within the product (each starts from the bias instead of zeros).

        ``reduce`` combines the products A[i, j] * X[j] of row i: "sum" (default), "mean" (the sum
        divided by the row's nonzero count), "max" or "min" (the gradient goes to the nonzero
        that gave each output, as in torch_scatter); an empty row gives 0. torch's "amax"/"amin"
        and PyG's "add" are accepted. "max"/"min" take ``path`` "auto", "rows" (the CUDA kernel)
        or "reference" (torch ops)."""
        return product.matmul(self, other, path, bias, reduce)

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
        if is_traced(self._values, None):
            # Only a compiled-graph cache pickles a matrix of stand-ins (torch versions that do not
            # ask for _stable_hash_for_caching key it so): its key must tell patterns apart, which
            # the stand-ins' shapes alone do not.
            return (str, (self._stable_hash_for_caching(),))
        return (serialization.rebuild, (serialization.state_of(self._structure, self._values),))

    def __deepcopy__(self, memo):
        rebuild, (state,) = self.__reduce_ex__(2)
        copied = rebuild(copy.deepcopy(state, memo))
        memo[id(self)] = copied
        return copied

    # Traceable wrapper subclass: torch.compile takes the matrix as an input of the compiled
    # function through its values and the index arrays its traced products can read
    # (flattening.py); the structure rides in the context, which the compiled code guards on.

    def __tensor_flatten__(self):
        tensors, context = flattening.flatten(self._structure, self._values.dtype, learnable(self))
        # The protocol reads the inner tensors as attributes, by name.
        if self.__dict__.get("_flattened") is not tensors:
            self.__dict__.update(tensors)
            self._flattened = tensors
        return ["_values", *context.names], context

    @staticmethod
    def __tensor_unflatten__(inner_tensors, context, outer_size, outer_stride):
        return _wrapper(flattening.unflatten(context, inner_tensors), inner_tensors["_values"])

    def _stable_hash_for_caching(self) -> str:
        """The compiled graph cache's key for this input (no pickling of the structure): what the
        traced code depends on, the sizes of every array it reads and the values' dtype."""
        names, context = self.__tensor_flatten__()
        arrays = [(tuple(getattr(self, name).shape), str(getattr(self, name).dtype)) for name in names]
        return f"TCSparseTensor:{context.stable_hash()}:{self.requires_grad}:{arrays}"

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
        if func is torch.ops.aten.detach.default:
            # The compiler detaches a matrix input that requires grad to take it in (and torch's
            # runtime wrappers one whose gradient the graph does not need): the detached matrix
            # flattens as the matrix did (``learnable``), or the graph's inputs would not match.
            matrix = args[0]
            detached = _wrapper(matrix._structure, matrix._values.detach())
            detached._learnable = learnable(matrix)
            return detached
        raise TypeError(
            f"TCSparseTensor does not support {func}: it supports A @ X, torch.matmul, torch.mm, "
            "torch.sparse.mm, .t(), .to(), .with_values(), .crow_indices(), .col_indices(), .values(); "
            "convert with .to_dense() or .to_torch_csr() first"
        )


def _wrapper(structure: Structure, values: torch.Tensor) -> TCSparseTensor:
    """The matrix of ``structure`` and ``values``, with no autograd link of its own."""
    out = torch.Tensor._make_wrapper_subclass(
        TCSparseTensor, (structure.num_rows, structure.num_cols), dtype=values.dtype, device=values.device
    )
    out._structure = structure
    out._values = values
    out._cache = OperandCache(values)
    # What torch._dynamo.mark_static_address sets: a matrix taken by a compiled function is a
    # static input of its CUDA graphs, every flattened array read in place, none copied into the
    # graph's own buffers at each replay (a copy per index array would cost a small graph's
    # product many times over). A matrix of new values is recaptured, so a training loop passes
    # the same matrix (its values may change in place) or builds it inside the compiled function.
    out._dynamo_static_input_type = "unguarded"
    return out


def learnable(matrix: TCSparseTensor) -> bool:
    """Whether the matrix's values require grad, or did before the compiler detached it: what its
    flattening plans for (``flattening.flatten``)."""
    return matrix.__dict__.get("_learnable", matrix._values.requires_grad)


def live_values(matrix: TCSparseTensor) -> torch.Tensor:
    """The matrix's values as autograd reaches them. Inside a compiled function a matrix input
    whose values require grad is one input to autograd: its values are read through
    ``flattening.Unwrap``, which hands their gradient back as the matrix's."""
    if matrix.requires_grad and is_traced(matrix._values, None):
        return flattening.Unwrap.apply(matrix, TCSparseTensor)
    return matrix._values


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


def _sparse_mm(a, x, reduce="sum"):
    """``torch.sparse.mm(A, X, reduce)`` (torch checks the arguments before this is called)."""
    if not isinstance(a, TCSparseTensor):
        _reject_right_operand()
    return a.matmul(x, reduce=reduce)


def _layout(a):
    """torch.sparse_csr to code that reads the layout, eager or traced. torch.compile refuses to
    take a sparse-layout tensor as an input; while it wraps the matrix (outside traced code, with
    a tracing context set) the matrix reports the layout of what it holds: strided values."""
    if not torch.compiler.is_dynamo_compiling() and torch._guards.TracingContext.try_get() is not None:
        return torch.strided
    return torch.sparse_csr


def _crow_indices(a):
    return a._structure.rowptr


def _col_indices(a):
    return a._structure.col


def _values(a):
    return live_values(a)


def _rebuild(state: dict) -> TCSparseTensor:
    """The loader that files saved by version 0.1.0 name."""
    return serialization.rebuild(state)


torch.serialization.add_safe_globals([_rebuild])

_HANDLED = {
    torch.matmul: _matmul,
    torch.mm: _matmul,
    torch.sparse.mm: _sparse_mm,
    torch.Tensor.matmul: _matmul,
    torch.Tensor.mm: _matmul,
    torch.Tensor.__matmul__: _matmul,
    torch.Tensor.__rmatmul__: _reject_right_operand,
    torch.t: lambda a: a.t(),
    torch.Tensor.t: lambda a: a.t(),
    # A sparse CSR matrix to code that asks (PyG's MessagePassing and spmm): its layout and its
    # canonical CSR arrays, read-only views of what the matrix holds.
    torch.Tensor.layout.__get__: _layout,
    torch.Tensor.crow_indices: _crow_indices,
    torch.Tensor.col_indices: _col_indices,
    torch.Tensor.values: _values,
}

