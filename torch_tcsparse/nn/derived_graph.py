"""What a layer derives from its ``TCSparseTensor`` ``adj_t`` once (a normalized matrix, the
pattern attention runs over), kept on the layer beside its parameters.

Kept while the same matrix object comes back with its values unchanged (their ``_version``), so
a training loop derives it once whatever ``cached`` says; a matrix whose values need a gradient
is derived at every forward, so that the gradient flows through the derivation. ``keep_first``
is PyG's ``cached=True``: the first result serves every later call, whatever graph it gets.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..tensor import TCSparseTensor

_ATTRIBUTE = "_tcsparse_derived_graph"


class DerivedGraph:
    __slots__ = ("source", "version", "derived")

    def __init__(self):
        self.source = self.version = self.derived = None

    def get(self, source: TCSparseTensor, build: Callable[[], object], keep_first: bool = False):
        values = source.values()
        if self.derived is not None and (keep_first or (source is self.source and values._version == self.version)):
            return self.derived
        derived = build()
        if keep_first or not (values.requires_grad and torch.is_grad_enabled()):
            self.source, self.version, self.derived = source, values._version, derived
        return derived


def derived_graph(layer: torch.nn.Module) -> DerivedGraph:
    """The layer's DerivedGraph, made on first use (PyG's ``__init__`` knows nothing of it)."""
    kept = layer.__dict__.get(_ATTRIBUTE)
    if kept is None:
        kept = layer.__dict__[_ATTRIBUTE] = DerivedGraph()
    return kept


def forget(layer: torch.nn.Module) -> None:
    """Drops what the layer derived (``reset_parameters``, as PyG drops its own caches)."""
    layer.__dict__.pop(_ATTRIBUTE, None)
