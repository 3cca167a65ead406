"""A TCSparseTensor as ``torch.compile`` takes it: its tensors (values and index arrays) and the
structure they come from, the traceable wrapper subclass protocol (``__tensor_flatten__`` /
``__tensor_unflatten__``), and the autograd link that carries a gradient of the values across it.

The compiler replaces every tensor by a stand-in (a fake tensor while tracing, a graph input at
run time), so a traced product must read every array it passes to a kernel from the flattened
tensors, never from the kept structure, and must build none of them from stand-ins (a host read
of a fake tensor fails, and a CUDA graph replays no host work). Every flattened array is a graph
input that each call unwraps and guards, so a matrix carries what its products can use and no
more (a ``Plan``, from the modes of the call that takes it in):

- always, the canonical CSR (the "csr" engine, max/min, the mean's row scale, ``A.values()``);
- the indices of the engines the path decision can pick for the matrix (``choose_path``: "csr"
  where the kernels do not run, else the selector's choices and trial candidates for the
  values' dtype at every N bucket);
- the same of the transpose (dX), and both layouts' gathers that put values in the transpose's
  order;
- where the matrix's own values require grad: the layout's kernel arrays for their SDDMM (a
  matrix built inside the compiled function gets its values' gradient on the CSR instead).

The plan follows from the matrix and deterministic mode alone: torch's runtime wrappers unwrap
the inputs under grad and autocast modes of their own (an inference graph runs without grad),
so a plan that read those modes would flatten differently at run time than when traced. A traced
product whose path does not travel (another N bucket, autocast's dtype) runs "csr"
(``product.choose_path``). The arrays are built on the host from real arrays when the compiler
first takes the matrix in a given plan.
``unflatten`` rebuilds a structure whose kept indices are the stand-ins, so ``engine.indices``
finds them.

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
from typing import NamedTuple

import torch

from . import kernels
from .engines import ENGINES
from .formats.metcf import MetcfLayout
from .structure import Structure

# Flattened arrays per structure and plan key: the compiled code flattens its matrix inputs at
# every call, and a small graph's product costs about as much as building them.
_flattened: "weakref.WeakKeyDictionary[Structure, dict]" = weakref.WeakKeyDictionary()
# Contexts by their stable hash: what a compiled-graph cache entry, loaded in another process,
# names its matrix by (``StructureRef.__reduce__``).
_by_hash: "weakref.WeakValueDictionary[str, StructureRef]" = weakref.WeakValueDictionary()

# The layout's arrays that put CSR-order values in the transpose's CSR order (both ways).
GATHER_FIELDS = ("csr_gather", "transpose_gather")


class Plan(NamedTuple):
    """What a matrix carries into a compiled function: the engines of its products (``paths``),
    the dtype of X whose engine indices travel, and whether the SDDMM's layout arrays do (its
    values require grad)."""

    paths: tuple[str, ...]
    dtype: torch.dtype
    values_gradient: bool


class Recipe:
    """How to rebuild one structure's traced copy from the flattened tensors: the positions of
    its layout's arrays that travel (by field), of its CSR, its kept items (key, engine name,
    positions of its tensors, its ints) and the ints a traced product reads."""

    __slots__ = ("layout", "rowptr", "col", "items", "ints")

    def __init__(self, layout, rowptr, col, items, ints):
        self.layout, self.rowptr, self.col, self.items, self.ints = layout, rowptr, col, items, ints

    def __repr__(self) -> str:
        # Part of the cache key: which array each traced structure reads where, and the ints a
        # graph bakes in (two patterns of equal sizes can differ in both).
        return (f"Recipe({sorted(self.layout.items())}, {self.rowptr}, {self.col}, {self.items}, "
                f"{sorted(self.ints.items())})")


class StructureRef:
    """The flattening's context: the structure itself, the mode its arrays were built for
    (deterministic algorithms split no rows), the plan, and the recipes of it and of its
    transpose. The compiler keeps a deep copy of the context and
    guards on its equality; the same structure is the same matrix pattern, so the reference
    copies as itself and compares the structure by identity (a copy of the arrays would cost
    their size and never compare equal). A compiled-graph cache pickles it by its stable hash."""

    __slots__ = ("structure", "deterministic", "plan", "recipes", "names", "_hash", "__weakref__")

    def __init__(self, structure: Structure, deterministic: bool, plan: Plan, recipes: tuple, names: list[str]):
        self.structure, self.deterministic, self.plan = structure, deterministic, plan
        self.recipes, self.names = recipes, names
        self._hash = None

    def transposed(self) -> "StructureRef":
        """The context of the transpose over the same arrays."""
        return StructureRef(self.structure.transposed(), self.deterministic, self.plan, self.recipes[::-1],
                            self.names)

    def __deepcopy__(self, memo) -> "StructureRef":
        return self

    def __reduce__(self):
        # Not the structure: its arrays (copied to the host to be pickled) and its selector's
        # native handle mean nothing to another process, which takes in its own matrix.
        return _registered, (self.stable_hash(),)

    def __eq__(self, other) -> bool:
        return (isinstance(other, StructureRef) and other.structure is self.structure
                and other.deterministic == self.deterministic and other.plan == self.plan)

    def __hash__(self) -> int:
        return hash((id(self.structure), self.deterministic, self.plan))

    def stable_hash(self) -> str:
        """A digest that two processes building the same matrix agree on (the compiled-graph
        caches' key): everything a traced product's graph depends on besides the flattened
        arrays' shapes (which join it from the tensors) and X: the sizes, mode and plan, the
        recipes (which arrays travel, the ints the graph bakes in), the selector's features of the
        matrix (its choice of path follows from them), and the library's code."""
        if self._hash is None:
            s = self.structure
            features = s.selection.features(s.layout)
            digest = hashlib.blake2b(digest_size=16)
            digest.update(repr((s.num_rows, s.num_cols, s.nnz, s.window, s.method, self.deterministic, self.plan,
                                features.max_row_nnz, features.rows_share_ratio, features.grouped_blocks,
                                features.grouped_rest_nnz, features.grouped_one_chunk, self.recipes,
                                _code_digest())).encode())
            for prefix in features.prefixes:
                digest.update(prefix.tobytes())
            self._hash = digest.hexdigest()
            _by_hash[self._hash] = self
        return self._hash


def _registered(stable_hash: str) -> StructureRef | str:
    """The context of this process's matrix with ``stable_hash`` (the one a cache lookup keyed
    by it was made for), or the hash itself where no such matrix was taken in."""
    return _by_hash.get(stable_hash, stable_hash)


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """The library's Python sources: a graph traced by other code must not be reused."""
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def flatten(structure: Structure, dtype: torch.dtype, learnable: bool) -> tuple[dict[str, torch.Tensor], StructureRef]:
    """The index arrays a matrix of ``structure`` with values of ``dtype`` (``learnable``: whether
    they require grad) carries into a compiled function in the current deterministic mode, by
    name, and the context that rebuilds the structure from them (``unflatten``)."""
    traced = getattr(structure, "traced_flat", None)
    if traced is not None:  # a rebuilt copy flattens into the stand-ins it was built from
        return traced
    key = (torch.are_deterministic_algorithms_enabled(), dtype, learnable)
    per_mode = _flattened.get(structure)
    if per_mode is None:
        per_mode = _flattened[structure] = {}
    flat = per_mode.get(key)
    if flat is None:
        flat = per_mode[key] = _flatten(structure, *key)
    return flat


def _flatten(structure: Structure, deterministic: bool, dtype: torch.dtype, learnable: bool):
    plan = Plan(_paths(structure, dtype), dtype, learnable)
    tensors: list[torch.Tensor] = []
    positions: dict[int, int] = {}
    transpose = structure.transposed()  # first: building it links both layouts
    recipes = (_recipe(structure, plan, _layout_fields(plan, learnable), tensors, positions),
               _recipe(transpose, plan, _layout_fields(plan, False), tensors, positions))
    # The selector's features, from the real arrays now: a traced product reads them to choose
    # its path, and building them while tracing would put host copies of the layout into the graph.
    for s in (structure, transpose):
        s.selection.features(s.layout)
    names = [f"_index_{i}" for i in range(len(tensors))]
    return dict(zip(names, tensors)), StructureRef(structure, deterministic, plan, recipes, names)


def _paths(structure: Structure, dtype: torch.dtype) -> tuple[str, ...]:
    """The engines the path decision can pick for products of ``dtype`` (``choose_path``): "csr"
    always (its indices are the canonical CSR, which travels anyway), and where the kernels run,
    every path the selector may settle on; "grouped" runs "base" when traced."""
    paths = {"csr"}
    if kernels.usable_for(dtype, structure.device):
        paths.update(structure.selection.possible(structure.layout, dtype, structure.device))
    paths = {"base" if path == "grouped" else path for path in paths}
    return tuple(name for name in ENGINES if name in paths)


def _layout_fields(plan: Plan, values_gradient: bool) -> tuple[str, ...]:
    """The layout's arrays a structure carries in ``plan``: the kernels' where a product runs on
    the layout or its values' SDDMM needs them, and the gathers."""
    fields = set(GATHER_FIELDS)
    if values_gradient or any(ENGINES[path].operand_key in ("tensor_core", "reference") for path in plan.paths):
        fields.update(MetcfLayout.KERNEL_FIELDS)
    return tuple(name for name in MetcfLayout.TENSOR_FIELDS if name in fields)


def unflatten(context: StructureRef, tensors: dict[str, torch.Tensor]) -> Structure:
    """A copy of the context's structure (and of its transpose, linked) reading the given index
    arrays; ``traced_from`` on each copy names the structure it stands for."""
    arrays = [tensors[name] for name in context.names]
    source = context.structure
    ours = _replaced(source, context.recipes[0], arrays)
    theirs = _replaced(source.transposed(), context.recipes[1], arrays)
    ours.link_transpose(theirs)
    inner = {name: tensors[name] for name in context.names}
    ours.traced_flat = (inner, context)
    # ``A.t()`` inside the compiled function: a matrix of the same arrays, read the other way.
    theirs.traced_flat = (inner, context.transposed())
    return ours


def source_of(structure: Structure) -> Structure:
    """The structure a rebuilt copy stands for (with real arrays), or ``structure`` itself."""
    return getattr(structure, "traced_from", structure)


def carries(structure: Structure, path: str, key) -> bool:
    """Whether a traced product on ``structure`` can run ``path`` with its indices under ``key``
    (``Engine.index_key``): always for a structure with real arrays."""
    keys = getattr(structure, "traced_keys", None)
    return keys is None or (path, key) in keys


def _recipe(structure: Structure, plan: Plan, fields: tuple, tensors: list, positions: dict) -> Recipe:
    def place(group) -> list[int]:
        slots = []
        for t in group:
            if id(t) not in positions:  # an array read by several engines travels once
                positions[id(t)] = len(tensors)
                tensors.append(t)
            slots.append(positions[id(t)])
        return slots

    items = []
    for name in plan.paths:
        engine = ENGINES[name]
        key = engine.index_key(structure, plan.dtype)
        group, ints = engine.flat(engine.kept_indices(structure, key, plan.dtype))
        items.append((key, name, place(group), ints))
    layout = structure.layout
    placed = dict(zip(fields, place([getattr(layout, name) for name in fields])))
    return Recipe(placed, place([structure.rowptr])[0], place([structure.col])[0], items,
                  {"max_row_nnz": structure.max_row_nnz()})


def _replaced(structure: Structure, recipe: Recipe, arrays: list) -> Structure:
    copy = object.__new__(Structure)
    copy.__dict__.update(structure.__dict__)
    copy.rowptr, copy.col = arrays[recipe.rowptr], arrays[recipe.col]
    layout = structure.layout
    copy.layout = MetcfLayout.from_fields({name: arrays[i] for name, i in recipe.layout.items()}, layout.window,
                                          layout.num_rows, layout.num_cols)
    # Only the stand-ins: nothing derived from the kept arrays is built from them.
    copy._derived = dict(recipe.ints)
    for key, name, slots, ints in recipe.items:
        copy._derived[key] = ENGINES[name].unflat([arrays[i] for i in slots], ints)
    copy.traced_keys = frozenset((name, key) for key, name, _, _ in recipe.items)
    copy.traced_from = structure
    return copy


class Wrap(torch.autograd.Function):
    """``make(structure, values)``: a matrix whose own gradient (a TCSparseTensor, from a compiled
    function that took the matrix as an input) reaches ``values``."""

    @staticmethod
    def forward(ctx, make, structure, values):
        # A compiled function that reads only the matrix's index arrays, or its values through
        # another input, gives the matrix no gradient: backward then gets None, not the dense
        # M x K zero tensor autograd would make in its place.
        ctx.set_materialize_grads(False)
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
