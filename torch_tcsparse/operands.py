"""What a matrix keeps of the operands it derives from its values, with one rule for when it may."""
from __future__ import annotations

from collections.abc import Callable, Hashable

import torch


class OperandCache:
    """The operands of one matrix that read its values where they lie (torch's CSR tensor over
    them, the rows kernel's values when its order is the canonical one): such an operand sees
    every write, whatever made it (an in-place op, ``w.data``, a fused optimizer step, the
    storage, a numpy or DLPack view, a custom kernel), so it is kept while the values keep their
    storage. An operand that copies the values (a gather, a cast, a block order) would hold them
    as they were when it was made, and no writer but torch's own in-place ops tells: those are
    derived at every product and never kept (a pass over the values, small beside the product)."""

    __slots__ = ("_values", "_stamp", "_entries")

    def __init__(self, values: torch.Tensor):
        self._values = values
        self._stamp = None  # read on first need: a traced matrix's stand-in values have no storage
        self._entries: dict = {}

    def get(self, key: Hashable, build: Callable[[], object], reads_in_place: Callable[[object], bool]):
        """The operand ``key``: kept from an earlier product if the values still lie where it read
        them, else ``build()``, kept if ``reads_in_place(operand)`` (it holds no copy)."""
        stamp = _stamp(self._values)
        if stamp != self._stamp:
            self._entries.clear()
            self._stamp = stamp
        entry = self._entries.get(key)
        if entry is None:
            entry = build()
            if reads_in_place(entry):
                self._entries[key] = entry
        return entry

    def __len__(self) -> int:
        return len(self._entries)


def _stamp(values: torch.Tensor) -> tuple:
    """Where the values lie: what replacing them (``w.data = ...``, ``w.set_(...)``) changes."""
    return values.data_ptr(), values.dtype, values.stride()
