"""PyG's message-passing layers on a TCSparseTensor ``adj_t``, where PyG's own route does not reach
our kernels.

A TCSparseTensor reports the sparse CSR layout and its CSR arrays, so PyG's ``MessagePassing``
takes it as a sparse ``adj_t`` and runs the layer's ``message_and_aggregate``, whose
``torch_geometric.utils.spmm`` calls ``torch.sparse.mm(adj_t, x, reduce)``: our product, with no
adapter, for every reduction on the CPU and for "sum" and "mean" on CUDA. PyG's route misses our
kernels, or their cheaper order, in four cases, which ``fused(Layer)`` covers, a subclass of the
PyG layer (PyG itself untouched) that loads the layer's state_dict and leaves any other ``adj_t``
to the layer's own code:

- on CUDA, PyG's ``spmm`` refuses "max" and "min" for every torch.sparse matrix before it
  multiplies: the subclass's ``message_and_aggregate`` multiplies a TCSparseTensor with
  ``reduce=layer.aggr`` itself;
- GCNConv, SGConv, APPNP, TAGConv, ClusterGCNConv and LGConv normalize the matrix inside their
  forward by building a torch.sparse one: the subclass's forward normalizes a TCSparseTensor on
  our side once (:mod:`.normalizing_layers`) and propagates over it;
- GATConv and TransformerConv gather E x heads x channels messages: the subclass's forward runs
  their attention on our kernels (:mod:`.attention_layers`);
- SAGEConv and GraphConv aggregate before their linear map: where the map narrows the features,
  the subclass's forward applies it first, so the product runs on fewer columns
  (:mod:`.narrowing_layers`).
"""
from __future__ import annotations

import functools
import inspect
import sys

from ..tensor import TCSparseTensor
from . import attention_layers, narrowing_layers, normalizing_layers
from .derived_graph import forget

_FUSED: dict[type, type] = {}
# PyG layer name -> its forward on a TCSparseTensor.
_FORWARDS = {**normalizing_layers.FORWARDS, **attention_layers.FORWARDS, **narrowing_layers.FORWARDS}


def fused(layer_class: type) -> type:
    """The subclass of the PyG ``MessagePassing`` layer ``layer_class`` that runs on our kernels for
    a TCSparseTensor ``adj_t``: ``message_and_aggregate`` as ``adj_t.matmul(x, reduce=self.aggr)``
    (x: the layer's first feature argument, the source features of a pair), and for the PyG layers
    named in the module's docstring (their forward not overridden) the forward of ours. Built once
    per class; it takes the layer's arguments and loads its state_dict."""
    if not isinstance(layer_class, type) or not callable(getattr(layer_class, "message_and_aggregate", None)):
        raise TypeError(f"layer_class must be a PyG MessagePassing class, got {layer_class!r}")
    subclass = _FUSED.get(layer_class)
    if subclass is None:
        subclass = _FUSED[layer_class] = _subclass(layer_class)
    return subclass


def _subclass(layer_class: type) -> type:
    namespace = {"__module__": layer_class.__module__, "__qualname__": f"fused({layer_class.__qualname__})"}
    # Replaced only where the layer implements one (PyG marks its own abstract): attention has none.
    if not getattr(layer_class.message_and_aggregate, "__isabstractmethod__", False):
        namespace["message_and_aggregate"] = _message_and_aggregate(layer_class.message_and_aggregate)
        namespace["propagate"] = _propagate(layer_class.propagate, layer_class.message_and_aggregate)
    ours = _forward_on_matrix(layer_class)
    if ours is not None:
        namespace["forward"] = _forward(layer_class.forward, ours)
        namespace["reset_parameters"] = _reset_parameters(layer_class.reset_parameters)
    return type(layer_class.__name__, (layer_class,), namespace)


def _forward_on_matrix(layer_class: type):
    """Our forward for the PyG layer whose forward ``layer_class`` runs, if we have one. A PyG
    layer class implies PyG is loaded: looked up without importing it."""
    pyg_conv = sys.modules.get("torch_geometric.nn.conv")
    for name, forward in _FORWARDS.items():
        pyg_class = getattr(pyg_conv, name, None)
        if pyg_class is not None and layer_class.forward is pyg_class.forward:
            return forward
    return None


def _message_and_aggregate(parent):
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

    return message_and_aggregate


def _propagate(parent, message_and_aggregate):
    """PyG's ``propagate`` for a sparse ``adj_t`` (``message_and_aggregate``, then ``update``), for a
    TCSparseTensor without PyG's input checks: they read the matrix's layout, which is strided
    while torch.compile takes the matrix in (the compiler refuses sparse inputs), so PyG's route
    would break the compiled graph. Hooks, explanations and decomposed layers keep PyG's route."""
    names = [name for name in inspect.signature(message_and_aggregate).parameters if name != "self"][1:]

    @functools.wraps(parent)
    def propagate(self, edge_index, size=None, **kwargs):
        if (not isinstance(edge_index, TCSparseTensor) or self._propagate_forward_pre_hooks
                or self._propagate_forward_hooks or getattr(self, "explain", None) or self.decomposed_layers > 1):
            return parent(self, edge_index, size=size, **kwargs)
        out = self.message_and_aggregate(edge_index, **{name: kwargs[name] for name in names if name in kwargs})
        return self.update(out)

    return propagate


def _forward(parent, ours):
    # PyG's forwards take the features, then the graph.
    graph_name = [name for name in inspect.signature(parent).parameters if name != "self"][1]

    @functools.wraps(parent)
    def forward(self, *args, **kwargs):
        graph = args[1] if len(args) > 1 else kwargs.get(graph_name)
        return (ours if isinstance(graph, TCSparseTensor) else parent)(self, *args, **kwargs)

    return forward


def _reset_parameters(parent):
    @functools.wraps(parent)
    def reset_parameters(self):
        parent(self)
        forget(self)

    return reset_parameters
