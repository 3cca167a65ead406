"""What every engine provides: its index arrays, its operands, its launch.

A product on an engine is ``engine.run(x, engine.operands(indices, values), bias)``, whoever calls
it: an eager product (``product.py``) with the indices its matrix keeps, or the ``tcsparse::spmm``
op (``ops.py``) with the indices a compiled function takes as inputs. Indices depend on the
sparsity pattern alone and are built once per matrix structure (``Structure.kept``); operands are
derived from the values in canonical CSR order at every product, except those that read the
values where they lie (``Engine.reads_in_place``), which the matrix keeps
(``operands.OperandCache``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..structure import Structure


class Engine:
    """One path of ``A @ X``. ``name`` is its path name (``paths.ENGINE_PATHS``); engines that read
    the same indices and operands (base and balanced) share ``operand_key``. ``traceable``: its
    indices travel with a matrix that ``torch.compile`` takes as an input (``flattening``)."""

    name: str
    operand_key: str
    traceable = True

    def index_key(self, structure: "Structure", dtype: torch.dtype) -> tuple:
        """The name under which a structure keeps this engine's indices for values of ``dtype``
        (under torch's current modes)."""
        return (self.operand_key,)

    def indices(self, structure: "Structure", dtype: torch.dtype):
        """This engine's index arrays of ``structure``, built on first need and kept by it."""
        return self.kept_indices(structure, self.index_key(structure, dtype), dtype)

    def kept_indices(self, structure: "Structure", key: tuple, dtype: torch.dtype):
        """``indices`` for a caller that has their ``index_key`` already."""
        indices = structure._derived.get(key)
        return indices if indices is not None else structure.kept(key, lambda: self.build_indices(structure, dtype))

    def build_indices(self, structure: "Structure", dtype: torch.dtype):
        raise NotImplementedError

    def operands(self, indices, values: torch.Tensor):
        """What the launch reads, from ``indices`` and CSR-order ``values`` in X's dtype."""
        raise NotImplementedError

    def reads_in_place(self, operands, values: torch.Tensor) -> bool:
        """Whether ``operands`` (of ``values``) hold no copy of the values but read them where they
        lie, so that every later write reaches them: what a matrix may keep across products."""
        return False

    def run(self, x: torch.Tensor, operands, bias: torch.Tensor | None) -> torch.Tensor:
        """A @ x (+ bias on every row) for a 2-D x of the matrix's dtype and device."""
        raise NotImplementedError

    # Whether ``scatter`` can sum a backward pass's dX = A^T dY from the forward's operands.
    scatters = False

    def scatter(self, grad_y: torch.Tensor, operands) -> torch.Tensor:
        """A^T grad_y from the operands of A's own product, without the transpose (an engine that
        ``scatters``; where a backward pass takes it: ``product.scatters_transpose``)."""
        raise NotImplementedError

    def flat(self, indices) -> tuple[list[torch.Tensor], list[int]]:
        """``indices`` as the ``tcsparse::spmm`` op carries them: their tensors and their ints."""
        raise NotImplementedError

    def unflat(self, tensors: list[torch.Tensor], ints: list[int]):
        """The indices ``flat`` gave, from (stand-ins of) their tensors and their ints."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<engine {self.name!r}>"
