"""PyG's message-passing layers on a TCSparseTensor ``adj_t``, where PyG's own route refuses one.

A TCSparseTensor reports the sparse CSR layout and its CSR arrays, so PyG's ``MessagePassing``
takes it as a sparse ``adj_t`` and runs the layer's ``message_and_aggregate``, whose
``torch_geometric.utils.spmm`` calls ``torch.sparse.mm(adj_t, x, reduce)``: our product, with no
adapter, for every reduction on the CPU and for "sum" and "mean" on CUDA. On CUDA, PyG's ``spmm``
refuses "max" and "min" for every torch.sparse matrix before it multiplies; ``fused(Layer)``
is the one adapter, a subclass of the PyG layer (PyG itself untouched) whose
``message_and_aggregate`` multiplies a TCSparseTensor with ``reduce=layer.aggr`` and leaves any
other ``adj_t`` to the layer's own.
"""
from __future__ import annotations

import functools
import inspect

from ..tensor import TCSparseTensor

_FUSED: dict[type, type] = {}


def fused(layer_class: type) -> type:
    """The subclass of the PyG ``MessagePassing`` layer ``layer_class`` whose
    ``message_and_aggregate`` runs ``adj_t.matmul(x, reduce=self.aggr)`` for a TCSparseTensor
    ``adj_t`` (x: the layer's first feature argument, the source features of a pair). Built once
    per class; it takes the layer's arguments and loads its state_dict."""
    if not isinstance(layer_class, type) or not callable(getattr(layer_class, "message_and_aggregate", None)):
        raise TypeError(f"layer_class must be a PyG MessagePassing class, got {layer_class!r}")
    subclass = _FUSED.get(layer_class)
    if subclass is None:
        subclass = _FUSED[layer_class] = _subclass(layer_class)
    return subclass


def _subclass(layer_class: type) -> type:
    parent = layer_class.message_and_aggregate
    signature = inspect.signature(parent)
    adj_name, x_name = [name for name in signature.parameters if name != "self"][:2]

    @functools.wraps(parent)  # PyG's inspector reads the parent's parameters and types
    def message_and_aggregate(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        adj_t = arguments[adj_name]
        if not isinstance(adj_t, TCSparseTensor):
            return parent(self, *args, **kwargs)
        x = arguments[x_name]
        return adj_t.matmul(x[0] if isinstance(x, (tuple, list)) else x, reduce=self.aggr)

    return type(layer_class.__name__, (layer_class,), {
        "message_and_aggregate": message_and_aggregate,
        "__module__": layer_class.__module__,
        "__qualname__": f"fused({layer_class.__qualname__})",
    })
