"""A TCSparseTensor as ``torch.compile`` takes it: its tensors (values and index arrays) and the
structure they come from, the traceable wrapper subclass protocol (``__tensor_flatten__`` /
``__tensor_unflatten__``), and the autograd link that carries a gradient of the values across it.

The compiler replaces every tensor by a stand-in (a fake tensor while tracing, a graph input at
run time), so the product's code under compile must read every array it passes to a kernel from
the flattened tensors, never from the kept structure, and must build none from them on the host
(a CUDA graph replays no host work). A traced product reads the layout, the transpose's layout
(for dX), the canonical CSR arrays (the "mean" and max/min products) and the "rows" path's split
of the canonical CSR rows, of the matrix and of its transpose: all of them travel. What is built
from the indices on the host (the transpose, the split) is built on flattening, from real arrays.

Gradients: inside a compiled function the matrix is one input, and autograd reaches its values
only through it. A matrix whose values require grad is therefore built through ``Wrap`` (its
backward hands the matrix's gradient, a TCSparseTensor, to the values), and a traced product
reads such a matrix's values through ``Unwrap`` (the gradient of the values becomes the matrix's).
Eager products read the values directly and never use either link.
"""
from __future__ import annotations

import dataclasses
import weakref

import torch

from . import csr_rows
from .formats.metcf import MetcfLayout
from .structure import Structure

_LAYOUT_FIELDS = MetcfLayout.TENSOR_FIELDS
_PIECE_FIELDS = ("piece_slots", "piece_starts", "split_rows")
_FIELDS = ("rowptr", "col") + tuple(f"layout_{name}" for name in _LAYOUT_FIELDS) + tuple(
    f"pieces_{name}" for name in _PIECE_FIELDS)
INDEX_NAMES = tuple(f"_index_{name}" for name in _FIELDS) + tuple(f"_index_t_{name}" for name in _FIELDS)

# Flattened arrays per structure and piece size: the compiled code flattens its matrix inputs at
# every call, and a small graph's product costs about as much as building this dictionary.
_flattened: "weakref.WeakKeyDictionary[Structure, dict]" = weakref.WeakKeyDictionary()


class StructureRef:
    """The flattening's context: the structure itself, and the "rows" split's piece size the
    traced product reads (``csr_rows.piece_size()``, which deterministic mode changes). The
    compiler keeps a deep copy of the context and guards on its equality; the same structure is
    the same matrix pattern, so the reference copies as itself and compares the structure by
    identity (a copy of the arrays would cost their size and never compare equal)."""

    __slots__ = ("structure", "piece_nnz")

    def __init__(self, structure: Structure, piece_nnz: int):
        self.structure = structure
        self.piece_nnz = piece_nnz

    def __deepcopy__(self, memo) -> "StructureRef":
        return self

    def __eq__(self, other) -> bool:
        return (isinstance(other, StructureRef) and other.structure is self.structure
                and other.piece_nnz == self.piece_nnz)

    def __hash__(self) -> int:
        return hash((id(self.structure), self.piece_nnz))


def flatten(structure: Structure) -> tuple[dict[str, torch.Tensor], StructureRef]:
    """The index arrays of ``structure`` and of its transpose, by their names in ``INDEX_NAMES``,
    and the context that rebuilds the structure from them (``unflatten``)."""
    piece_nnz = csr_rows.piece_size()
    per_size = _flattened.setdefault(structure, {})
    tensors = per_size.get(piece_nnz)
    if tensors is None:
        ours, theirs = _arrays(structure, piece_nnz), _arrays(structure.transposed(), piece_nnz)
        tensors = per_size[piece_nnz] = {**{f"_index_{k}": v for k, v in ours.items()},
                                         **{f"_index_t_{k}": v for k, v in theirs.items()}}
    return tensors, StructureRef(structure, piece_nnz)


def unflatten(context: StructureRef, tensors: dict[str, torch.Tensor]) -> Structure:
    """A copy of the context's structure (and of its transpose, linked) reading the given index
    arrays; ``traced_from`` on each copy names the structure it stands for."""
    source = context.structure
    ours = _replaced(source, {k[len("_index_"):]: v for k, v in tensors.items() if not k.startswith("_index_t_")},
                     context.piece_nnz)
    theirs = _replaced(source.transposed(),
                       {k[len("_index_t_"):]: v for k, v in tensors.items() if k.startswith("_index_t_")},
                       context.piece_nnz)
    ours._derived["transpose"], theirs._derived["transpose"] = theirs, ours
    return ours


def traced_row_pieces(structure: Structure) -> list[torch.Tensor]:
    """The flattened "rows" split of a structure that ``unflatten`` rebuilt (``ops.spmm``'s
    ``row_pieces`` for it)."""
    return list(structure.traced_row_pieces)


def source_of(structure: Structure) -> Structure:
    """The structure a rebuilt copy stands for (with real arrays), or ``structure`` itself."""
    return getattr(structure, "traced_from", structure)


def _arrays(structure: Structure, piece_nnz: int) -> dict[str, torch.Tensor]:
    layout = {f"layout_{name}": getattr(structure.layout, name) for name in _LAYOUT_FIELDS}
    # A rebuilt copy (a matrix built inside the compiled function from an input's structure)
    # hands on the split it was given.
    split = getattr(structure, "traced_row_pieces", None) or structure.row_pieces(piece_nnz, canonical=True)
    pieces = {f"pieces_{name}": getattr(split, name) for name in _PIECE_FIELDS}
    return {"rowptr": structure.rowptr, "col": structure.col, **layout, **pieces}


def _replaced(structure: Structure, arrays: dict[str, torch.Tensor], piece_nnz: int) -> Structure:
    copy = object.__new__(Structure)
    copy.__dict__.update(structure.__dict__)
    copy.rowptr, copy.col = arrays["rowptr"], arrays["col"]
    copy.layout = dataclasses.replace(structure.layout, **{name: arrays[f"layout_{name}"] for name in _LAYOUT_FIELDS})
    copy.traced_row_pieces = csr_rows.RowPieces(*(arrays[f"pieces_{name}"] for name in _PIECE_FIELDS), piece_nnz)
    copy.traced_from = structure
    # What was derived from the kept arrays (splits, the rows kernel's CSR) stays behind: a
    # traced product builds no such item from stand-ins.
    copy._derived = {}
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
