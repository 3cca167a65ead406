"""A TCSparseTensor as ``torch.compile`` takes it: its tensors (values and index arrays) and the
structure they come from, the traceable wrapper subclass protocol (``__tensor_flatten__`` /
``__tensor_unflatten__``), and the autograd link that carries a gradient of the values across it.

The compiler replaces every tensor by a stand-in (a fake tensor while tracing, a graph input at
run time), so a traced product must read every array it passes to a kernel from the flattened
tensors, never from the kept structure, and must build none of them from stand-ins (a host read
of a fake tensor fails, and a CUDA graph replays no host work). So flattening carries, for the
matrix and for its transpose (for dX), what every traceable engine reads (``Engine.indices``:
the ME-TCF layout, the canonical CSR, the rows kernel's CSR and split for each dtype the kernels
take), built on the host from real arrays when the compiler first takes the matrix. ``unflatten``
rebuilds a structure whose kept indices are the stand-ins, so ``engine.indices`` finds them.

Gradients: inside a compiled function the matrix is one input, and autograd reaches its values
only through it. A matrix whose values require grad is therefore built through ``Wrap`` (its
backward hands the matrix's gradient, a TCSparseTensor, to the values), and a traced product
reads such a matrix's values through ``Unwrap`` (the gradient of the values becomes the matrix's).
Eager products read the values directly and never use either link.
"""
from __future__ import annotations

import functools
import hashlib
import weakref
from pathlib import Path

import torch

from .engines import ENGINES
from .formats.metcf import MetcfLayout
from .paths import KERNEL_DTYPES
from .structure import Structure

# Flattened arrays per structure and mode: the compiled code flattens its matrix inputs at every
# call, and a small graph's product costs about as much as building them.
_flattened: "weakref.WeakKeyDictionary[Structure, dict]" = weakref.WeakKeyDictionary()


class Recipe:
    """How to rebuild one structure's traced copy from the flattened tensors: for each kept item
    (key, engine name, positions of its tensors in the flattened list, its ints), and the
    positions of the layout's and the CSR's arrays."""

    __slots__ = ("layout", "rowptr", "col", "items", "ints")

    def __init__(self, layout, rowptr, col, items, ints):
        self.layout, self.rowptr, self.col, self.items, self.ints = layout, rowptr, col, items, ints

    def __repr__(self) -> str:
        # Part of the cache key: which array each traced structure reads where, and the ints a
        # graph bakes in (two patterns of equal sizes can differ in both).
        return f"Recipe({self.layout}, {self.rowptr}, {self.col}, {self.items}, {sorted(self.ints.items())})"


class StructureRef:
    """The flattening's context: the structure itself, the mode its arrays were built for
    (deterministic algorithms split no rows) and the recipes of it and its transpose. The
    compiler keeps a deep copy of the context and guards on its equality; the same structure is
    the same matrix pattern, so the reference copies as itself and compares the structure by
    identity (a copy of the arrays would cost their size and never compare equal)."""

    __slots__ = ("structure", "deterministic", "recipes", "names")

    def __init__(self, structure: Structure, deterministic: bool, recipes: tuple, names: list[str]):
        self.structure, self.deterministic, self.recipes, self.names = structure, deterministic, recipes, names

    def __deepcopy__(self, memo) -> "StructureRef":
        return self

    def __eq__(self, other) -> bool:
        return (isinstance(other, StructureRef) and other.structure is self.structure
                and other.deterministic == self.deterministic)

    def __hash__(self) -> int:
        return hash((id(self.structure), self.deterministic))

    def stable_hash(self) -> str:
        """A digest that two processes building the same matrix agree on (the compiled-graph
        caches' key): everything a traced product's graph depends on besides the flattened
        arrays' shapes (which join it from the tensors) and X: the sizes and mode, the recipes
        (which arrays travel, the ints the graph bakes in), the selector's features of the matrix
        (its choice of path follows from them), and the library's code."""
        s = self.structure
        features = s.selection.features(s.layout)
        digest = hashlib.blake2b(digest_size=16)
        digest.update(repr((s.num_rows, s.num_cols, s.nnz, s.window, s.method, self.deterministic,
                            features.max_row_nnz, features.rows_share_ratio, features.grouped_blocks,
                            features.grouped_rest_nnz, features.grouped_one_chunk, self.recipes,
                            _code_digest())).encode())
        for prefix in features.prefixes:
            digest.update(prefix.tobytes())
        return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """The library's Python sources: a graph traced by other code must not be reused."""
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def flatten(structure: Structure) -> tuple[dict[str, torch.Tensor], StructureRef]:
    """The index arrays of ``structure`` and of its transpose, by name, and the context that
    rebuilds the structure from them (``unflatten``)."""
    traced = getattr(structure, "traced_flat", None)
    if traced is not None:  # a rebuilt copy flattens into the stand-ins it was built from
        return traced
    deterministic = torch.are_deterministic_algorithms_enabled()
    per_mode = _flattened.setdefault(structure, {})
    flat = per_mode.get(deterministic)
    if flat is None:
        tensors: list[torch.Tensor] = []
        positions: dict[int, int] = {}
        transpose = structure.transposed()  # first: building it links both layouts
        recipes = (_recipe(structure, tensors, positions), _recipe(transpose, tensors, positions))
        # The selector's features of both, from the real arrays now: a traced product reads them
        # to choose its path, and building them while tracing would put host copies of the layout
        # into the graph.
        for s in (structure, transpose):
            s.selection.features(s.layout)
        names = [f"_index_{i}" for i in range(len(tensors))]
        flat = per_mode[deterministic] = (dict(zip(names, tensors)), StructureRef(structure, deterministic, recipes,
                                                                                   names))
    return flat


def unflatten(context: StructureRef, tensors: dict[str, torch.Tensor]) -> Structure:
    """A copy of the context's structure (and of its transpose, linked) reading the given index
    arrays; ``traced_from`` on each copy names the structure it stands for."""
    arrays = [tensors[name] for name in context.names]
    source = context.structure
    ours = _replaced(source, context.recipes[0], arrays)
    theirs = _replaced(source.transposed(), context.recipes[1], arrays)
    ours.link_transpose(theirs)
    ours.traced_flat = ({name: tensors[name] for name in context.names}, context)
    return ours


def source_of(structure: Structure) -> Structure:
    """The structure a rebuilt copy stands for (with real arrays), or ``structure`` itself."""
    return getattr(structure, "traced_from", structure)


def _recipe(structure: Structure, tensors: list, positions: dict) -> Recipe:
    def place(group) -> list[int]:
        slots = []
        for t in group:
            if id(t) not in positions:  # an array read by several engines travels once
                positions[id(t)] = len(tensors)
                tensors.append(t)
            slots.append(positions[id(t)])
        return slots

    items = []
    for engine in ENGINES.values():
        if not engine.traceable:
            continue
        for key in dict.fromkeys(engine.index_key(structure, dtype) for dtype in KERNEL_DTYPES):
            indices = engine.indices(structure, _dtype_of(engine, structure, key))
            group, ints = engine.flat(indices)
            items.append((key, engine.name, place(group), ints))
    layout = structure.layout
    return Recipe(place(layout.tensors()), place([structure.rowptr])[0], place([structure.col])[0], items,
                  {"max_row_nnz": structure.max_row_nnz()})


def _dtype_of(engine, structure: Structure, key) -> torch.dtype:
    """A kernel dtype whose indices on ``engine`` are kept under ``key``."""
    return next(dtype for dtype in KERNEL_DTYPES if engine.index_key(structure, dtype) == key)


def _replaced(structure: Structure, recipe: Recipe, arrays: list) -> Structure:
    copy = object.__new__(Structure)
    copy.__dict__.update(structure.__dict__)
    copy.rowptr, copy.col = arrays[recipe.rowptr], arrays[recipe.col]
    layout = structure.layout
    copy.layout = MetcfLayout.from_tensors([arrays[i] for i in recipe.layout], layout.window, layout.num_rows,
                                           layout.num_cols)
    # Only the stand-ins: nothing derived from the kept arrays is built from them.
    copy._derived = dict(recipe.ints)
    for key, name, slots, ints in recipe.items:
        copy._derived[key] = ENGINES[name].unflat([arrays[i] for i in slots], ints)
    copy.traced_from = structure
    return copy


class Wrap(torch.autograd.Function):
    """``make(structure, values)``: a matrix whose own gradient (a TCSparseTensor, from a compiled
    function that took the matrix as an input) reaches ``values``."""

    @staticmethod
    def forward(ctx, make, structure, values):
        return make(structure, values)

    @staticmethod
    def backward(ctx, grad):
        return None, None, None if grad is None else grad._values


class Unwrap(torch.autograd.Function):
    """The values of ``matrix`` (an alias), their gradient handed back as the matrix's:
    ``make(structure, gradient)``."""

    @staticmethod
    def forward(ctx, matrix, make):
        ctx.structure, ctx.make = matrix._structure, make
        return matrix._values.view_as(matrix._values)

    @staticmethod
    def backward(ctx, grad):
        return ctx.make(ctx.structure, grad), None
