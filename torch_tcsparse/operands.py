"""What a matrix keeps of the operands it derives from its values, with one rule for when it may."""
from __future__ import annotations

from collections.abc import Callable, Hashable

import torch


class OperandCache:
    """Values-derived operands of one matrix (each engine's, its transpose's for backward passes,
    the mean's row-scaled values, casts for autocast), built on first need, under one rule.

    - An operand that reads the values where they lie (the Tensor-Core kernels' and the rows
      kernel's values, torch's CSR tensor over them) sees every write, whatever made it (an
      in-place op, ``w.data``, a fused optimizer step, the storage, a numpy view): it is kept
      while the values keep their storage.
    - An operand that copies them (a gather, a cast, the mean's scaled values, the transpose's
      order) holds them as they were when it was made. Values that require grad, the ones
      optimizers and training code write, never keep one: it is derived at every product. Other
      values keep it while their version counter stays, which every in-place torch operation
      moves; a write no counter sees (``.data``, the storage, a fused step on the parameter whose
      ``.detach()`` the matrix holds) reaches the in-place operands only (docs/DECISIONS.md)."""

    __slots__ = ("_values", "_place", "_entries")

    def __init__(self, values: torch.Tensor):
        self._values = values
        self._place = None  # read on first need: a traced matrix's stand-in values have no storage
        self._entries: dict = {}

    def get(self, key: Hashable, build: Callable[[], object],
            reads_in_place: Callable[[object], bool] = lambda operand: False):
        """The operand ``key``: kept from an earlier product if it may be (above), else
        ``build()``, kept if it may be."""
        values = self._values
        place = _place(values)
        if place != self._place:
            self._entries.clear()
            self._place = place
        kept = self._entries.get(key)
        if kept is not None:
            operand, version = kept
            if version is None or version == values._version:
                return operand
        operand = build()
        if reads_in_place(operand):
            self._entries[key] = (operand, None)
        elif not values.requires_grad:
            self._entries[key] = (operand, values._version)
        else:
            self._entries.pop(key, None)
        return operand

    def __len__(self) -> int:
        return len(self._entries)


def _place(values: torch.Tensor) -> tuple:
    """Where the values lie: what replacing them (``w.data = ...``, ``w.set_(...)``) changes."""
    return values.data_ptr(), values.dtype, values.stride()
