"""What a matrix derives from its values, kept in one place with one rule for when it is stale."""
from __future__ import annotations

from collections.abc import Callable, Hashable

import torch


class OperandCache:
    """Values-derived operands of one matrix (each engine's, its transpose's for backward passes,
    casts for autocast), built on first need and kept: a product on a small graph costs less than
    rebuilding them. One rule keeps them fresh: every entry is dropped as soon as the values'
    version counter moves, that is after any in-place change (an optimizer step on a learnable
    ``nn.Parameter``, ``w.mul_(2)`` under ``no_grad``). Writes through ``w.data`` bypass the
    counter, as they bypass autograd's own checks: change values in place on the tensor itself.
    Entries are built without grad; gradients flow through ``engines.autograd.Product``."""

    __slots__ = ("_values", "_version", "_entries")

    def __init__(self, values: torch.Tensor):
        self._values = values
        self._version = values._version
        self._entries: dict = {}

    def lookup(self, key: Hashable):
        """The entry ``key``, or None if absent or stale: what a product asks first (no closure
        to build on the common path, where the entry is there)."""
        if self._values._version != self._version:
            return None
        return self._entries.get(key)

    def get(self, key: Hashable, build: Callable[[], object]):
        """The entry ``key``, built by ``build()`` if absent or if the values changed since."""
        version = self._values._version
        if version != self._version:
            self._entries.clear()
            self._version = version
        entry = self._entries.get(key)
        if entry is None:
            with torch.no_grad():
                entry = self._entries[key] = build()
        return entry

    def __len__(self) -> int:
        return len(self._entries)
