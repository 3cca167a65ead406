"""``adj @ (x W^T) + bias`` for a first GCN layer, where only W needs a gradient: W's gradient
is taken as ``grad^T (adj @ x)``, equal to autograd's ``(adj^T grad)^T x`` but one SpMM of
in_channels columns instead of out_channels."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.modules import module as _module

from ..tensor import TCSparseTensor


def applies(lin: torch.nn.Module, x: Tensor, adj: TCSparseTensor) -> bool:
    """Whether the narrower product gives the same gradients: features need no gradient, the
    matrix's values neither, in_channels < out_channels, no autocast, and ``lin`` is a plain
    Linear whose weight needs a gradient. Not in a function torch.compile traces: the compiler
    derives the gradients itself, and the Function's own backward would read the forward's
    outputs after a CUDA graph replay has overwritten them."""
    return (
        torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and not x.requires_grad
        and _is_plain_linear(lin)
        and lin._parameters["weight"].requires_grad
        and not adj._values.requires_grad
        and lin.in_features < lin.out_features
        and not torch.is_autocast_enabled(x.device.type)
    )


def _is_plain_linear(lin: torch.nn.Module) -> bool:
    """Calling ``lin`` computes ``x W^T``, with no bias."""
    return calls_only_its_weight(lin, torch.nn.Linear) and lin._parameters["bias"] is None


def calls_only_its_weight(lin: torch.nn.Module, linear_type: type) -> bool:
    """Calling ``lin``, of exactly ``linear_type``, computes ``x W^T`` (+ its bias) with W its own
    initialized Parameter and nothing else. Pruning, weight_norm, spectral_norm and
    parametrizations make W inside the call (a pre-hook or a property), lazy modules initialize it
    in a pre-hook, and hooks may change the result: those take autograd's path. Read through
    ``_parameters``, as ``lin.weight`` costs a module attribute lookup on every call."""
    parameters = lin._parameters
    weight = parameters.get("weight")
    return (
        type(lin) is linear_type
        and "forward" not in vars(lin)
        and isinstance(weight, torch.nn.Parameter)
        and not isinstance(weight, torch.nn.parameter.UninitializedParameter)
        and "bias" in parameters
        and not (lin._forward_pre_hooks or lin._forward_hooks or lin._backward_pre_hooks or lin._backward_hooks)
        and not (
            _module._global_forward_pre_hooks
            or _module._global_forward_hooks
            or _module._global_backward_pre_hooks
            or _module._global_backward_hooks
        )
    )


class LinearThenPropagate(torch.autograd.Function):
    """``adj @ (x W^T) + bias`` (PyG's order: linear, propagate, bias)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, adj: TCSparseTensor, bias: Tensor | None):
        ctx.save_for_backward(x)
        ctx.adj = adj
        return adj.matmul(torch.nn.functional.linear(x, weight), bias=bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        grad_weight = grad_out.t() @ (ctx.adj @ x) if ctx.needs_input_grad[1] else None
        grad_bias = grad_out.sum(0) if ctx.needs_input_grad[3] else None
        return None, grad_weight, None, grad_bias
