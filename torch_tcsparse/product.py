"""``A @ X`` from a TCSparseTensor to its engine: the operand checks, autocast, the path (the
selector's choice or the caller's), the operands the matrix keeps, and autograd.

Eager products call the engine directly, through ``engines.autograd.Product`` when a gradient
is needed; under ``torch.compile`` they go through the ``tcsparse::spmm`` op (``ops.py``), which
the compiler traces.
"""
from __future__ import annotations

import torch

from . import flattening, ops
from .engines import ENGINES, Engine, extreme, kernels_apply, resolve
from .engines.autograd import Product
from .paths import REDUCTION_ALIASES, REDUCTIONS


def matmul(matrix, other, path: str = "auto", bias: torch.Tensor | None = None, reduce: str = "sum") -> torch.Tensor:
    """Y = A @ X (+ bias) for X of shape [K] or [K, N]: ``TCSparseTensor.matmul``. ``reduce``
    combines the products of a row (``paths.REDUCTIONS``)."""
    # The per-call path reads the plain tensors the subclass holds: attributes of the subclass
    # itself (shape, device, dtype) go through __torch_function__ on every access.
    if torch.compiler.is_compiling() and matrix.requires_grad:
        matrix = _connected(matrix)
    autocast_dtype = _autocast_dtype(matrix._values, other)
    if autocast_dtype is not None:
        bias = bias.to(autocast_dtype) if isinstance(bias, torch.Tensor) else bias
        return matmul(_in_dtype(matrix, autocast_dtype), other.to(autocast_dtype), path, bias, reduce)
    if reduce != "sum":
        reduce = check_reduce(reduce)
    x = _check_operand(matrix, other)
    if bias is not None:
        _check_bias(bias, x)
    vector = x.dim() == 1
    if vector:
        x = x.unsqueeze(1)
    y = _extreme(matrix, x, path, bias, reduce) if reduce in ("max", "min") else _sum(matrix, x, path, bias, reduce)
    return y.squeeze(1) if vector else y


def _sum(matrix, x: torch.Tensor, path: str, bias: torch.Tensor | None, reduce: str) -> torch.Tensor:
    """A @ X with ``reduce`` "sum" or "mean" (+ bias on every row) for a checked 2-D X."""
    mean = reduce == "mean"
    if mean and not torch.compiler.is_compiling():
        # The mean is the sum over the matrix whose values are divided by their row's nonzero
        # count: every sum path, its backward and the kernels' precision serve it unchanged.
        matrix = _mean_matrix(matrix)
    s = matrix._structure
    if torch.compiler.is_compiling():
        n = x.shape[1]
        return _run(matrix, x, _traced_path(s, path, n if isinstance(n, int) else None, x.dtype, x.device),
                    bias, mean)
    trial = None
    if path == "auto" and kernels_apply(x):
        path, trial = s.selection.choose(s.layout, x.shape[1], x.dtype, x.device)
    path = resolve(path, x)
    if trial is None:
        return _run(matrix, x, path, bias, mean)
    # this product measures the choice (torch_tcsparse.trials)
    return s.selection.measure(trial, lambda candidate: _run(matrix, x, candidate, bias, mean))


def check_reduce(reduce) -> str:
    """``reduce`` in its canonical spelling (``paths.REDUCTIONS``); torch's and PyG's names too."""
    if not isinstance(reduce, str):
        raise TypeError(f"reduce must be a str, got {type(reduce).__name__}")
    reduce = REDUCTION_ALIASES.get(reduce, reduce)
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    return reduce


def _extreme(matrix, x: torch.Tensor, path: str, bias: torch.Tensor | None, reduce: str) -> torch.Tensor:
    """A @ X with ``reduce`` "max" or "min" (+ bias on every row) for a checked 2-D X:
    ``engines/extreme.py``."""
    s, values = matrix._structure, matrix._values
    if torch.compiler.is_compiling():
        path = _traced_extreme_path(path, x.dtype, x.device, s.rowptr.dtype)
        y = ops.spmm_extreme(x, values, s.rowptr, s.col, reduce, path)[0]
        return y if bias is None else y + bias
    path = extreme.resolve(path, x, s.rowptr)
    if torch.is_grad_enabled() and (x.requires_grad or values.requires_grad):
        y = extreme.ExtremeProduct.apply(x, values, s.rowptr, s.col, reduce, path)
    else:
        y = extreme.output(x, values, s.rowptr, s.col, reduce, path)
    return y if bias is None else y + bias


def _mean_matrix(matrix):
    """The matrix with every row's values divided by its nonzero count (canonical CSR order, so
    right for a reordered matrix too). Kept by the matrix while its values need no gradient;
    with one, built per product so that the division is part of the graph."""
    if torch.is_grad_enabled() and matrix._values.requires_grad:
        return type(matrix)(matrix._structure, _mean_values(matrix))
    return matrix._cache.get(("mean",), lambda: type(matrix)(matrix._structure, _mean_values(matrix)))


def _mean_values(matrix) -> torch.Tensor:
    """The values divided by their row's nonzero count: the quotient is formed in float32
    (float64 for float64) and rounded once to the values' dtype."""
    values = matrix._values
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    if torch.compiler.is_compiling():
        scale = _row_scale(matrix._structure, dtype)
    else:
        scale = matrix._cache.get(("row_scale", dtype), lambda: _row_scale(matrix._structure, dtype))
    return (values.to(dtype) * scale).to(values.dtype)


def _row_scale(structure, dtype: torch.dtype) -> torch.Tensor:
    """1 / (nonzeros of its row) for every nonzero, in ``dtype``."""
    counts = (structure.rowptr[1:] - structure.rowptr[:-1]).long()
    inverse = 1.0 / counts.clamp(min=1).to(dtype)
    return torch.repeat_interleave(inverse, counts, output_size=structure.nnz)


def _run(matrix, x: torch.Tensor, path: str, bias: torch.Tensor | None, mean: bool = False) -> torch.Tensor:
    """A @ x (+ bias) on a resolved path, with the autograd the operands need. ``mean``: under
    ``torch.compile``, divide the values by their row's nonzero count inside the graph (eager
    products get a matrix divided already)."""
    if path == "grouped" and torch.are_deterministic_algorithms_enabled():
        path = "base"  # the same product without the grouped kernel's atomics
    if torch.compiler.is_compiling():
        return _traced(matrix, x, path, bias, mean)
    engine = ENGINES[path]
    values = matrix._values
    operands = operands_of(matrix, engine)
    if torch.is_grad_enabled() and (x.requires_grad or values.requires_grad or
                                    (bias is not None and bias.requires_grad)):
        return Product.apply(x, values, bias, engine, operands, lambda: transposed_operands(matrix, engine),
                             matrix._structure.layout)
    return engine.run(x, operands, bias)


def operands_of(matrix, engine: Engine):
    """``engine``'s operands of ``matrix``, kept by the matrix while its values do not change."""
    cache = matrix._cache
    operands = cache.lookup(engine.operand_key)
    if operands is None:
        operands = cache.get(engine.operand_key, lambda: engine.prepare(matrix._structure, matrix._values))
    return operands


def transposed_operands(matrix, engine: Engine):
    """``engine``'s operands of the transpose (the backward's dX = A^T dY), kept likewise. A
    matrix equal to its transpose (GCN's normalized adjacency) shares its own."""

    def build():
        transposed = matrix.t()
        if transposed._structure.col is matrix._structure.col and torch.equal(transposed._values, matrix._values):
            return operands_of(matrix, engine)
        return engine.prepare(transposed._structure, transposed._values)

    if torch.compiler.is_compiling():
        # An eager backward inside a function the compiler runs piecewise (a training step
        # around loss.backward()): the transpose is built outside the compiler, which would
        # otherwise split the matrix's construction across graphs.
        build = torch.compiler.disable(build)
    return matrix._cache.get((engine.operand_key, "transposed"), build)


def _traced(matrix, x: torch.Tensor, path: str, bias: torch.Tensor | None, mean: bool) -> torch.Tensor:
    """The product as ``torch.compile`` sees it: the ``tcsparse::spmm`` op on the ME-TCF arrays,
    with the values put in block order inside the graph (so never stale, and differentiable)."""
    s = matrix._structure
    x_needs_grad = torch.is_grad_enabled() and x.requires_grad
    values = s.to_block_order(_mean_values(matrix) if mean else matrix._values)
    layout_t = s.transposed().layout.tensors() if x_needs_grad else []
    pieces = _op_row_pieces(s, path, x_needs_grad)
    y = ops.spmm(x, values, s.layout.tensors(), layout_t, s.window, s.num_rows, s.num_cols, path, pieces)
    return y if bias is None else y + bias


def _op_row_pieces(structure, path: str, with_transpose: bool) -> list[torch.Tensor]:
    """``tcsparse::spmm``'s ``row_pieces``: the splits of the canonical CSR (and of the
    transpose's) that travel with the matrix (``flattening``): built on the host once, never in
    the graph, whose size they would make data-dependent."""
    if path != "rows":
        return []
    pieces = flattening.traced_row_pieces(structure)
    return pieces + flattening.traced_row_pieces(structure.transposed()) if with_transpose else pieces


def _traced_path(structure, path: str, n: int | None, dtype: torch.dtype, device: torch.device) -> str:
    """The engine a traced product runs: ``path`` as given, or for "auto" the selector's choice
    for the structure the traced one stands for, at ``n`` columns (None: N varies between calls;
    then "base" where the kernels apply, as ``resolve`` picks). The compiler runs this at trace
    time and keeps the answer as a constant of the graph (``assume_constant_result``): a Python
    side choice per (matrix, N, dtype), which the graph's guards on the matrix and X cover. The
    choice is not measured here (``trials``); a later measured choice leaves compiled code on
    the predicted path."""
    probe = torch.empty(0, dtype=dtype, device=device)
    if path == "auto" and n is not None and kernels_apply(probe):
        s = flattening.source_of(structure)
        path = s.selection.choose(s.layout, n, dtype, device)[0]
    return resolve(path, probe)


def _traced_extreme_path(path: str, dtype: torch.dtype, device: torch.device, index_dtype: torch.dtype) -> str:
    """``extreme.resolve`` for a traced max/min product, run at trace time like ``_traced_path``."""
    return extreme.resolve(path, torch.empty(0, dtype=dtype, device=device), torch.empty(0, dtype=index_dtype))


# What torch._dynamo.assume_constant_result sets: the compiler calls the function at trace time
# and keeps its result; set here so that importing the package does not import the compiler.
_traced_path._dynamo_marked_constant = True
_traced_extreme_path._dynamo_marked_constant = True


def _connected(matrix):
    """A matrix taken by a compiled function as an input, whose values need a gradient: the same
    matrix reading its values through ``flattening.Unwrap``, so that their gradient becomes the
    input's (which ``flattening.Wrap`` hands on to the values)."""
    return type(matrix)(matrix._structure, flattening.Unwrap.apply(matrix, type(matrix)))


def _in_dtype(matrix, dtype: torch.dtype):
    """The matrix with values in ``dtype``; kept while the values need no gradient (and do not
    change), so a model under autocast converts them once, not at every product."""
    if matrix._values.requires_grad or torch.compiler.is_compiling():
        return matrix.to(dtype)
    return matrix._cache.get(("cast", dtype), lambda: matrix.to(dtype))


def _check_operand(matrix, x) -> torch.Tensor:
    if isinstance(x, type(matrix)):
        raise TypeError("the product of two TCSparseTensors is not supported; convert one with .to_dense()")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"A @ X needs a torch.Tensor X, got {type(x).__name__}")
    if x.is_nested:
        raise TypeError("A @ X needs a dense X, got a nested tensor; multiply each component (X.unbind()) instead")
    if x.layout != torch.strided:
        raise TypeError(f"A @ X needs a dense X, got layout {x.layout}")
    if x.dim() not in (1, 2):
        raise ValueError(f"A @ X needs X of shape [K] or [K, N], got shape {tuple(x.shape)}")
    values = matrix._values
    num_cols = matrix._structure.num_cols
    if x.shape[0] != num_cols:
        shape = (matrix._structure.num_rows, num_cols)
        raise ValueError(f"shape mismatch: A is {shape} but X has {x.shape[0]} rows (shape {tuple(x.shape)})")
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
