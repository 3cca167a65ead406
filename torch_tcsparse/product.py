"""``A @ X`` from a TCSparseTensor to its engine: the operand checks, autocast, the path (one
function decides it: ``choose_path``), the operands, and autograd.

One route for eager and compiled products alike: the engine's indices come from the matrix's
structure, its operands from the values (``engines.base``), and the launch is ``engine.run``. An
eager product calls it directly (through ``engines.autograd.Product`` when a gradient is needed)
with the operands its matrix keeps; a traced one (under ``torch.compile``, whose stand-in tensors
no kernel can read) calls the ``tcsparse::spmm`` op (``ops.py``), which runs the same functions on
the indices the compiled function takes as inputs.
"""
from __future__ import annotations

import torch

from . import flattening, kernels, ops
from .engines import ENGINES, extreme
from .engines.autograd import Product
from .engines.tensor_core import kernel_arrays
from .paths import CUDA_ONLY_PATHS, EXTREME_PATHS, KERNEL_DTYPES, PATHS, REDUCTION_ALIASES, REDUCTIONS
from .structure import BUILD_AFTER_USES


def matmul(matrix, other, path: str = "auto", bias: torch.Tensor | None = None, reduce: str = "sum") -> torch.Tensor:
    """Y = A @ X (+ bias) for X of shape [K] or [K, N]: ``TCSparseTensor.matmul``. ``reduce``
    combines the products of a row (``paths.REDUCTIONS``)."""
    # The per-call path reads the plain tensors the subclass holds: attributes of the subclass
    # itself (shape, device, dtype) go through __torch_function__ on every access.
    traced = is_traced(matrix._values, other)
    if traced and matrix.requires_grad:
        matrix = _connected(matrix)
    autocast_dtype = _autocast_dtype(matrix._values, other)
    if autocast_dtype is not None:
        bias = bias.to(autocast_dtype) if isinstance(bias, torch.Tensor) else bias
        return matmul(_in_dtype(matrix, autocast_dtype, traced), other.to(autocast_dtype), path, bias, reduce)
    if reduce != "sum":
        reduce = check_reduce(reduce)
    x = _check_operand(matrix, other)
    if bias is not None:
        _check_bias(bias, x)
    vector = x.dim() == 1
    if vector:
        x = x.unsqueeze(1)
    path, trial = choose_path(matrix._structure, x, path, reduce, traced)
    if reduce in ("max", "min"):
        y = _extreme(matrix, x, path, reduce, traced)
        y = y if bias is None else y + bias
    elif trial is not None:
        # this product measures the choice (torch_tcsparse.trials)
        y = matrix._structure.selection.measure(trial, lambda candidate: _sum(matrix, x, candidate, bias, reduce, False))
    else:
        y = _sum(matrix, x, path, bias, reduce, traced)
    return y.squeeze(1) if vector else y


def is_traced(values: torch.Tensor, x) -> bool:
    """Whether this product is being traced (``torch.compile``, ``torch.export``): its tensors are
    stand-ins that no kernel can read. Read from the tensors themselves, which every torch
    version agrees on (whether ``torch.compiler.is_compiling()`` holds while the compiler runs a
    graph's operators on fake tensors depends on the version)."""
    stand_ins = _STAND_INS or _stand_ins()
    return torch.compiler.is_compiling() or isinstance(values, stand_ins) or isinstance(x, stand_ins)


def choose_path(structure, x: torch.Tensor, path: str, reduce: str, traced: bool):
    """(the engine of a product, the ``trials.Trial`` that is to measure the choice or None): the
    one place a path is decided. ``path`` as the caller names it ("auto": the selector's choice
    where the kernels run, else torch.sparse), checked against X; a matrix whose Tensor-Core
    layout is pending runs the rows kernel (or torch.sparse) until it has paid for the layout;
    the grouped kernel adds with atomics, so deterministic mode runs "base" instead, as do
    traced products (its layout does not travel with a compiled function's input); a traced
    product runs "csr" where its path's indices did not travel (``flattening``)."""
    if reduce in ("max", "min"):
        return _extreme_path(path, x, structure), None
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    usable = kernels.usable(x)
    if path in CUDA_ONLY_PATHS and not usable:
        raise ValueError(f"path {path!r} needs a CUDA tensor of dtype {KERNEL_DTYPES}, got {x.dtype} on {x.device}")
    trial = None
    requested = path
    if path == "auto":
        if not usable:
            return "csr", None
        if structure.layout_pending and structure.uses < BUILD_AFTER_USES and not traced:
            structure.uses += 1
            return ("rows" if structure.col.dtype == torch.int32 else "csr"), None
        source = flattening.source_of(structure)
        path, trial = source.selection.choose(source.layout, x.shape[1], x.dtype, x.device)
        if traced:
            trial = None
    if path == "grouped" and (traced or torch.are_deterministic_algorithms_enabled()):
        path, trial = "base", None
    if traced and not flattening.carries(structure, path, ENGINES[path].index_key(structure, x.dtype)):
        return _carried_path(structure, path, requested), None
    return path, trial


def _carried_path(structure, path: str, requested: str) -> str:
    """The path of a traced product whose chosen engine's indices did not travel with its matrix
    (``flattening``: another N bucket or dtype than planned): "csr", whose indices always do; a
    path the caller named is refused."""
    if requested == "auto":
        return "csr"
    carried = sorted({name for name, _ in structure.traced_keys})
    raise ValueError(f"path {requested!r} does not travel with a TCSparseTensor taken in by a compiled function here "
                     f"(its indices for this dtype and device: {carried}); use path='auto' or one of those")


def _extreme_path(path: str, x: torch.Tensor, structure) -> str:
    """The path of a max/min product: ``path`` as given, or for "auto" the kernel where it applies
    (a CUDA X of a kernel dtype, int32 indices), else the torch ops."""
    if path not in EXTREME_PATHS:
        raise ValueError(f"reduce='max'/'min' runs on path {EXTREME_PATHS}, got path={path!r}")
    kernel = kernels.usable(x) and structure.rowptr.dtype == torch.int32
    if path == "rows" and not kernel:
        raise ValueError(f"path 'rows' needs a CUDA tensor of dtype {KERNEL_DTYPES} and int32 indices, "
                         f"got {x.dtype} on {x.device}")
    if path == "auto":
        return "rows" if kernel else "reference"
    return path


def check_reduce(reduce) -> str:
    """``reduce`` in its canonical spelling (``paths.REDUCTIONS``); torch's and PyG's names too."""
    if not isinstance(reduce, str):
        raise TypeError(f"reduce must be a str, got {type(reduce).__name__}")
    reduce = REDUCTION_ALIASES.get(reduce, reduce)
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    return reduce


def _sum(matrix, x: torch.Tensor, path: str, bias: torch.Tensor | None, reduce: str, traced: bool) -> torch.Tensor:
    """A @ X with ``reduce`` "sum" or "mean" (+ bias on every row) for a checked 2-D X on engine
    ``path``. The mean is the sum over the values divided by their row's nonzero count: every
    engine, its backward and the kernels' precision serve it unchanged."""
    engine = ENGINES[path]
    s = matrix._structure
    mean = reduce == "mean"
    values = _mean_values(matrix, traced) if mean else matrix._values
    index_key = engine.index_key(s, x.dtype)
    indices = engine.kept_indices(s, index_key, x.dtype)
    if traced:
        return _traced_sum(s, x, values, bias, engine, indices)
    needs_x = x.requires_grad
    needs_values = values.requires_grad or (bias is not None and bias.requires_grad)
    key = (engine.operand_key, index_key, mean)
    # Detached: the gradients of the values flow through the product's own backward (only when an
    # operand is built: a kept one costs no alias). The mean's values are a copy: operands over
    # them read no values in place.
    operands = matrix._cache.get(key, lambda: engine.operands(indices, values.detach()),
                                 lambda built: not mean and engine.reads_in_place(built, values))
    if torch.is_grad_enabled() and (needs_x or needs_values):
        # The backward pass holds the forward's operands only where it may scatter from them.
        kept = operands if engine.scatters else None
        return Product.apply(x, values, bias, engine, operands,
                             lambda grad_y: _transposed_product(matrix, engine, key, values, kept, grad_y), s)
    return engine.run(x, operands, bias)


def launcher(matrix, path: str):
    """``x -> A @ x`` on engine ``path`` with the operands prepared once: the launch alone, without
    the route's checks and choice (what a benchmark times to tell the two apart)."""
    engine = ENGINES[path]
    s, values = matrix._structure, matrix._values
    operands = engine.operands(engine.indices(s, values.dtype), values.detach())
    return lambda x: engine.run(x, operands, None)


def _transposed_product(matrix, engine, key, values: torch.Tensor, operands, grad_y: torch.Tensor) -> torch.Tensor:
    """dX = A^T grad_y in an eager product's backward pass: the engine's scatter from the
    forward's ``operands`` (the mean's too: they hold the values it multiplied by) where
    ``scatters_transpose`` says so, else a product by the transpose's operands."""
    if scatters_transpose(matrix._structure, engine, grad_y):
        return engine.scatter(grad_y, operands)
    return engine.run(grad_y, _transposed_operands(matrix, engine, key, values, grad_y.dtype), None)


def scatters_transpose(structure, engine, grad_y: torch.Tensor) -> bool:
    """Whether this backward pass through ``structure`` sums dX by the engine's scatter rather
    than on the transpose; it counts the pass (``Structure.backward_passes``). Only the first
    pass scatters, and only where the transpose is not built yet, the kernels run and
    deterministic algorithms are off (the scatter's atomics add in any order). A matrix
    multiplied once (a sampled block) thus never pays the transpose's build, host time well
    above its product's; one trained on (full batch) builds it at its second pass and reuses it
    (docs/DECISIONS.md)."""
    first = structure.backward_passes == 0
    structure.backward_passes += 1
    return (first and engine.scatters and structure.linked_transpose() is None
            and not torch.are_deterministic_algorithms_enabled() and kernels.usable(grad_y))


def _transposed_operands(matrix, engine, key, values: torch.Tensor, dtype: torch.dtype):
    """The operands of the transpose on ``engine`` (a backward pass's dX = A^T dY): the values
    gathered to the transpose's order, a copy kept as ``operands.OperandCache`` keeps copies. A
    matrix equal to its transpose (GCN's normalized adjacency) shares its own operands."""
    s = matrix._structure

    def build():
        t = s.transposed()
        values_t = s.transpose_values(values.detach())
        # Kept values only: comparing them reads the device, once per version of the values.
        if not values.requires_grad and t.col is s.col and t.rowptr is s.rowptr and torch.equal(values_t, values):
            return matrix._cache.get(key, lambda: engine.operands(engine.indices(s, dtype), values.detach()),
                                     lambda built: not key[-1] and engine.reads_in_place(built, values))
        return engine.operands(engine.indices(t, dtype), values_t)

    return matrix._cache.get(key + ("transposed",), build)


def _traced_sum(structure, x, values, bias, engine, indices) -> torch.Tensor:
    """The product as ``torch.compile`` sees it: the ``tcsparse::spmm`` op on the engine's indices
    of the matrix it takes as an input (``flattening``), with what a gradient will need: for dX
    the transpose's indices and the gathers to the transpose's order, for the values the layout's
    kernel arrays where they travel, else the canonical CSR."""
    grad = torch.is_grad_enabled()
    tensors, ints = engine.flat(indices)
    tensors_t, ints_t, gathers, layout, csr = [], [], [], [], []
    if grad and x.requires_grad:
        transpose = structure.transposed()
        tensors_t, ints_t = engine.flat(engine.indices(transpose, x.dtype))
        gathers = [structure.layout.csr_gather, transpose.layout.transpose_gather, transpose.layout.csr_gather]
    if grad and values.requires_grad:
        layout = kernel_arrays(structure.layout)
        if any(t is None for t in layout):
            layout, csr = [], [structure.rowptr, structure.col]
    sizes = [structure.window, structure.num_rows, structure.num_cols]
    return ops.spmm(x, values, bias, tensors, ints, tensors_t, ints_t, gathers, layout, csr, sizes, engine.name)


def _extreme(matrix, x: torch.Tensor, path: str, reduce: str, traced: bool) -> torch.Tensor:
    """A @ X with ``reduce`` "max" or "min" for a checked 2-D X: ``engines/extreme.py``."""
    s, values = matrix._structure, matrix._values
    # The longest row (kept on the host) spares a matrix without long rows the kernel's split.
    longest = s.max_row_nnz() if path == "rows" else -1
    if traced:
        return ops.spmm_extreme(x, values, s.rowptr, s.col, reduce, path, longest)[0]
    if torch.is_grad_enabled() and (x.requires_grad or values.requires_grad):
        return extreme.ExtremeProduct.apply(x, values, s.rowptr, s.col, reduce, path, longest)
    return extreme.output(x, values, s.rowptr, s.col, reduce, path, longest)


def _mean_values(matrix, traced: bool) -> torch.Tensor:
    """The values divided by their row's nonzero count: the quotient is formed in float32
    (float64 for float64) and rounded once to the values' dtype. A copy, kept as
    ``operands.OperandCache`` keeps copies; the row scale depends on the indices alone and is kept
    by the structure."""
    values, s = matrix._values, matrix._structure
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32

    def build():
        scale = s.kept(("row_scale", dtype), lambda: _row_scale(s, dtype, traced))
        return (values.to(dtype) * scale).to(values.dtype)

    return build() if traced else matrix._cache.get(("mean",), build)


def _row_scale(structure, dtype: torch.dtype, traced: bool) -> torch.Tensor:
    """1 / (nonzeros of its row) for every nonzero, in ``dtype``: one kernel where the kernels run
    (a traced product's rowptr is a stand-in that no kernel may read), else torch's ops."""
    if not traced and kernels.usable_for(torch.float32, structure.rowptr.device):
        return kernels.row_scale(structure.rowptr, structure.nnz, dtype)
    counts = (structure.rowptr[1:] - structure.rowptr[:-1]).long()
    inverse = 1.0 / counts.clamp(min=1).to(dtype)
    return torch.repeat_interleave(inverse, counts, output_size=structure.nnz)


def _connected(matrix):
    """A matrix taken by a compiled function as an input, whose values need a gradient: the same
    matrix reading its values through ``flattening.Unwrap``, so that their gradient becomes the
    input's (which ``flattening.Wrap`` hands on to the values)."""
    return type(matrix)(matrix._structure, flattening.Unwrap.apply(matrix, type(matrix)))


def _in_dtype(matrix, dtype: torch.dtype, traced: bool):
    """The matrix with values in ``dtype``, cast as autocast casts (as ``torch.matmul`` would): a
    copy, kept as ``operands.OperandCache`` keeps copies, so a model under autocast converts fixed
    values once, not at every product."""
    def cast():
        return type(matrix)(matrix._structure, matrix._values.to(dtype))

    return cast() if traced else matrix._cache.get(("cast", dtype), cast)


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


_STAND_INS: tuple | None = None


def _stand_ins() -> tuple:
    """The tensor types a tracer hands an operator: fake tensors, and the functional tensors that
    wrap them (imported on the first product: the compiler's modules are not the library's)."""
    global _STAND_INS
    if _STAND_INS is None:
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor

        _STAND_INS = (FakeTensor, FunctionalTensor)
    return _STAND_INS
