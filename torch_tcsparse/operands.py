"""What a matrix derives from its values, kept in one place with one rule for when it may be."""
from __future__ import annotations

from collections.abc import Callable, Hashable

import torch


class OperandCache:
    """Values-derived operands of one matrix (each engine's, its transpose's for backward passes,
    the mean's row-scaled values, casts for autocast), built on first need and kept: a product on
    a small graph costs less than rebuilding them. They must never outlive the values they came
    from, whatever wrote them, and not every writer tells: a fused optimizer step
    (``torch.optim.Adam(fused=True)``) and writes through ``w.data`` leave the version counter
    as it was. So values that require grad, the ones optimizers and training code write, are
    never kept: their operands are derived at every product (a gather of the values, small beside
    the product and its backward). Other values are kept while their version counter and storage
    stay: any in-place torch operation on them moves the counter."""

    __slots__ = ("_values", "_stamp", "_entries")

    def __init__(self, values: torch.Tensor):
        self._values = values
        self._stamp = None  # read on first need: a traced matrix's stand-in values have no storage
        self._entries: dict = {}

    def get(self, key: Hashable, build: Callable[[], object]):
        """The entry ``key``: built by ``build()`` if absent or if the values changed since, and
        every time for values that require grad (then as part of autograd's graph, where
        ``build`` reads them so)."""
        values = self._values
        if values.requires_grad:
            return build()
        stamp = _stamp(values)
        if stamp != self._stamp:
            self._entries.clear()
            self._stamp = stamp
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = build()
        return entry

    def __len__(self) -> int:
        return len(self._entries)


def _stamp(values: torch.Tensor) -> tuple:
    """What every in-place torch operation on ``values`` changes, and what replacing their
    storage (``w.data = ...``) changes."""
    return values._version, values.data_ptr()

