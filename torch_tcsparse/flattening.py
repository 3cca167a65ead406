"""A TCSparseTensor as ``torch.compile`` takes it: its tensors (values and index arrays) and the
structure they come from, the traceable wrapper subclass protocol (``__tensor_flatten__`` /
``__tensor_unflatten__``).

The compiler replaces every tensor by a stand-in (a fake tensor while tracing, a graph input at
run time), so the product's code under compile must read the index arrays from the flattened
tensors, never from the kept structure. A traced product needs the layout, the transpose's layout
(for dX) and the canonical CSR arrays (the "mean" and max/min products): those travel; the
transpose is built on flattening so that a traced backward never builds it from stand-ins.
"""
from __future__ import annotations

import dataclasses

import torch

from .formats.metcf import MetcfLayout
from .structure import Structure

_LAYOUT_FIELDS = MetcfLayout.TENSOR_FIELDS
_FIELDS = ("rowptr", "col") + tuple(f"layout_{name}" for name in _LAYOUT_FIELDS)
INDEX_NAMES = tuple(f"_index_{name}" for name in _FIELDS) + tuple(f"_index_t_{name}" for name in _FIELDS)


class StructureRef:
    """The flattening's context: the structure itself. The compiler keeps a deep copy of the
    context and guards on its equality; the same structure is the same matrix pattern, so the
    reference copies as itself and compares by identity (a copy of the arrays would cost their
    size and never compare equal)."""

    __slots__ = ("structure",)

    def __init__(self, structure: Structure):
        self.structure = structure

    def __deepcopy__(self, memo) -> "StructureRef":
        return self

    def __eq__(self, other) -> bool:
        return isinstance(other, StructureRef) and other.structure is self.structure

    def __hash__(self) -> int:
        return id(self.structure)


def index_tensors(structure: Structure) -> dict[str, torch.Tensor]:
    """The index arrays of ``structure`` and of its transpose, by their names in ``INDEX_NAMES``."""
    ours, theirs = _arrays(structure), _arrays(structure.transposed())
    return {**{f"_index_{k}": v for k, v in ours.items()}, **{f"_index_t_{k}": v for k, v in theirs.items()}}


def with_index_tensors(structure: Structure, tensors: dict[str, torch.Tensor]) -> Structure:
    """A copy of ``structure`` (and of its transpose, linked) reading the given index arrays."""
    ours = _replaced(structure, {k[len("_index_"):]: v for k, v in tensors.items() if not k.startswith("_index_t_")})
    theirs = _replaced(structure.transposed(), {k[len("_index_t_"):]: v for k, v in tensors.items() if k.startswith("_index_t_")})
    ours._derived["transpose"], theirs._derived["transpose"] = theirs, ours
    return ours


def _arrays(structure: Structure) -> dict[str, torch.Tensor]:
    layout = {f"layout_{name}": getattr(structure.layout, name) for name in _LAYOUT_FIELDS}
    return {"rowptr": structure.rowptr, "col": structure.col, **layout}


def _replaced(structure: Structure, arrays: dict[str, torch.Tensor]) -> Structure:
    copy = object.__new__(Structure)
    copy.__dict__.update(structure.__dict__)
    copy.rowptr, copy.col = arrays["rowptr"], arrays["col"]
    copy.layout = dataclasses.replace(structure.layout, **{name: arrays[f"layout_{name}"] for name in _LAYOUT_FIELDS})
    # What was derived from the kept arrays (splits, the rows kernel's CSR) stays behind: a
    # traced product builds no such item from stand-ins.
    copy._derived = {}
    return copy
