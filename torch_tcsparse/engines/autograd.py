"""The one backward formula of ``A @ X + bias``, for eager products (``Product``) and for the
``tcsparse::spmm`` op that ``torch.compile`` traces (``ops.py``):

- dX = A^T dY, on the same engine: with the transpose's operands, or in an eager product's
  first backward pass through a matrix, by the engine's scatter from the forward's operands
  (``product.scatters_transpose``);
- d(values) = for every nonzero (i, j): <dY[i], X[j]> (an SDDMM), in canonical CSR order;
- d(bias) = the column sums of dY.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .. import kernels
from ..formats.metcf import MetcfLayout
from . import reference


def backward(grad_y: Tensor, needs: tuple[bool, bool, bool], transposed_product: Callable[[Tensor], Tensor],
             values_gradient: Callable[[Tensor], Tensor]) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dX, d(values), d(bias)) for the inputs ``needs`` asks for."""
    needs_x, needs_values, needs_bias = needs
    grad_x = transposed_product(grad_y) if needs_x else None
    grad_values = values_gradient(grad_y) if needs_values else None
    grad_bias = grad_y.sum(0) if needs_bias else None
    return grad_x, grad_values, grad_bias


def values_gradient(grad_y: Tensor, x: Tensor, layout: MetcfLayout) -> Tensor:
    """<grad_y[row], x[col]> for every nonzero of ``layout``, in canonical CSR order and x's dtype
    (summed in float32): the CUDA kernel where it applies, the torch reference elsewhere; both
    work in the layout's block order."""
    if layout.nnz and kernels.usable(x):
        block = kernels.sddmm(grad_y, x, layout)
    else:
        with torch.autocast(x.device.type, enabled=False):
            block = reference.sddmm(grad_y, x, layout)
    return block.index_select(0, layout.csr_gather)


class Product(torch.autograd.Function):
    """``engine.run(x, operands, bias)`` in eager mode, differentiable for x, the matrix's values
    (canonical CSR order) and the bias. ``transposed_product(grad_y)`` gives dX = A^T grad_y (on
    the same engine); ``structure`` gives the layout of the SDDMM."""

    @staticmethod
    def forward(ctx, x, values, bias, engine, operands, transposed_product, structure):
        ctx.transposed_product, ctx.structure = transposed_product, structure
        # Saving the values makes autograd refuse a backward after they changed in place.
        ctx.save_for_backward(x, values)
        return engine.run(x, operands, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, _ = ctx.saved_tensors
        grad_x, grad_values, grad_bias = backward(
            grad_y,
            ctx.needs_input_grad[:3],
            ctx.transposed_product,
            lambda g: values_gradient(g, x, ctx.structure.layout),
        )
        return grad_x, grad_values, grad_bias, None, None, None, None
