"""The ``tcsparse`` operators: what ``torch.compile`` traces, through their fake implementations.

``tcsparse::spmm`` is one product on one engine: it runs exactly what an eager product runs,
``engine.run(x, engine.operands(indices, values), bias)`` (``engines.base``), with the engine's
index arrays given as the op's inputs (``Engine.flat``), so that a compiled function reads them
from the matrix it takes as an input (``flattening``). Values are in canonical CSR order. Its
backward is the engines' one formula (``engines.autograd.backward``): dX runs the same op on the
transpose's indices, with the values put in the transpose's order through the layouts' gathers
(given where dX is needed), and the values' gradient is the ``tcsparse::sddmm`` op on the layout's
kernel arrays, or where they do not travel, the same sums on the canonical CSR in torch ops.
Eager products do not go through the dispatcher (its boxing of a dozen arguments costs more than
a whole product on a small graph): ``product.py`` calls the same engine functions directly.

``tcsparse::spmm_extreme`` is the max/min product (``engines/extreme.py``) on the canonical CSR;
its backward sends each output's gradient to the nonzero it came from, on the "rows" path through
``tcsparse::spmm_extreme_backward``, the kernel's atomic sums as an op of its own so that the
backward graph can hold it.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import kernels
from .engines import ENGINES, extreme
from .engines.autograd import backward, values_gradient
from .engines.reference import csr_sddmm
from .engines.tensor_core import placed
from .formats.metcf import MetcfLayout


@torch.library.custom_op("tcsparse::spmm", mutates_args=())
def spmm(
    x: Tensor,
    values: Tensor,
    bias: Optional[Tensor],
    indices: list[Tensor],
    index_ints: list[int],
    indices_t: list[Tensor],
    index_ints_t: list[int],
    gathers: list[Tensor],
    layout: list[Tensor],
    csr: list[Tensor],
    sizes: list[int],
    path: str,
) -> Tensor:
    """Y[num_rows, N] = A @ x (+ bias on every row) on engine ``path``, for the matrix given by the
    engine's ``indices`` / ``index_ints`` (``Engine.flat``) and CSR-order ``values``.

    For dX (empty when no gradient of x is needed): ``indices_t`` / ``index_ints_t``, the engine's
    indices of the transpose, and ``gathers``, the matrix's ``csr_gather`` and the transpose's
    ``transpose_gather`` and ``csr_gather`` (which put the values in the transpose's order). For
    the values' gradient (empty when none is needed): ``layout``, the ME-TCF arrays of
    ``MetcfLayout.KERNEL_FIELDS``, or else ``csr``, the canonical (rowptr, col). ``sizes``:
    (window, num_rows, num_cols)."""
    engine = ENGINES[path]
    return engine.run(x, engine.operands(engine.unflat(indices, index_ints), values), bias)


@spmm.register_fake
def _(x, values, bias, indices, index_ints, indices_t, index_ints_t, gathers, layout, csr, sizes, path):
    return x.new_empty(sizes[1], x.shape[1])


@torch.library.custom_op("tcsparse::sddmm", mutates_args=())
def sddmm(grad_y: Tensor, x: Tensor, layout: list[Tensor], sizes: list[int]) -> Tensor:
    """For every nonzero (row, col) of the matrix given by its ME-TCF arrays ``layout``
    (``MetcfLayout.KERNEL_FIELDS``) and ``sizes`` (window, num_rows, num_cols), in canonical CSR
    order: <grad_y[row], x[col]>, the gradient of the values (``engines.autograd.values_gradient``)."""
    return values_gradient(grad_y, x, MetcfLayout.from_fields(dict(zip(MetcfLayout.KERNEL_FIELDS, layout)), *sizes))


@sddmm.register_fake
def _(grad_y, x, layout, sizes):
    return x.new_empty(layout[MetcfLayout.KERNEL_FIELDS.index("csr_gather")].shape[0])


_LISTS = ("indices", "indices_t", "gathers", "layout", "csr")


def _spmm_setup_context(ctx, inputs, output):
    x, values, bias, indices, index_ints, indices_t, index_ints_t, gathers, layout, csr, sizes, path = inputs
    lists = (indices, indices_t, gathers, layout, csr)
    ctx.save_for_backward(x, values, *(t for group in lists for t in group))
    ctx.counts = tuple(len(group) for group in lists)
    ctx.options = (index_ints, index_ints_t, sizes, path)
    ctx.no_gradients = tuple(_no_gradient(a) for a in inputs[3:])


def _no_gradient(argument):
    """The gradient of an argument that gets none, in the structure autograd checks it against: a
    None per tensor of a list of tensors (an empty list counts as one), one None for anything
    else."""
    if isinstance(argument, (list, tuple)) and all(isinstance(a, Tensor) for a in argument):
        return [None] * len(argument)
    return None


def _spmm_backward(ctx, grad_y):
    index_ints, index_ints_t, sizes, path = ctx.options
    x, values, *arrays = ctx.saved_tensors
    groups = {}
    for name, count in zip(_LISTS, ctx.counts):
        groups[name], arrays = arrays[:count], arrays[count:]
    indices, indices_t = groups["indices"], groups["indices_t"]

    def transposed_product(g: Tensor) -> Tensor:
        if not indices_t:
            raise RuntimeError("tcsparse::spmm was called without the transpose's indices; it cannot compute dX")
        csr_gather, transpose_gather_t, csr_gather_t = groups["gathers"]
        values_t = placed(values, csr_gather).index_select(0, transpose_gather_t).index_select(0, csr_gather_t)
        sizes_t = [sizes[0], sizes[2], sizes[1]]
        return spmm(g, values_t, None, indices_t, index_ints_t, indices, index_ints, [], [], [], sizes_t, path)

    def values_gradient_of(g: Tensor) -> Tensor:
        if groups["layout"]:
            return sddmm(g, x, groups["layout"], sizes)
        if not groups["csr"]:
            raise RuntimeError("tcsparse::spmm was called without the arrays its values' gradient needs")
        with torch.autocast(x.device.type, enabled=False):
            return csr_sddmm(g, x, *groups["csr"])

    grad_x, grad_values, grad_bias = backward(grad_y, tuple(ctx.needs_input_grad[:3]), transposed_product,
                                              values_gradient_of)
    return (grad_x, grad_values, grad_bias, *ctx.no_gradients)


spmm.register_autograd(_spmm_backward, setup_context=_spmm_setup_context)


@torch.library.custom_op("tcsparse::spmm_extreme", mutates_args=())
def spmm_extreme(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, reduce: str, path: str,
                 longest: int) -> tuple[Tensor, Tensor]:
    """(Y, winners) of the max/min product (``reduce``: "max" or "min") of the canonical CSR
    (rowptr, col, values) and a 2-D ``x`` on the ``engines.extreme`` path ``path``: Y[i, c] the
    extreme of A[i, j] * x[j, c] over row i (0 for an empty row), winners[i, c] the CSR index of
    the nonzero it came from (int32, -1 for an empty row). ``longest``: the nonzeros of the
    longest row, -1 where unknown."""
    return extreme.forward(x, values, rowptr, col, reduce, path, longest)


@spmm_extreme.register_fake
def _(x, values, rowptr, col, reduce, path, longest):
    num_rows = rowptr.shape[0] - 1
    return x.new_empty(num_rows, x.shape[1]), x.new_empty(num_rows, x.shape[1], dtype=torch.int32)


@torch.library.custom_op("tcsparse::spmm_extreme_backward", mutates_args=())
def spmm_extreme_backward(grad_y: Tensor, winners: Tensor, col: Tensor, values: Tensor, x: Tensor, needs_x: bool,
                          needs_values: bool) -> tuple[Tensor, Tensor]:
    """(dX, d(values)) of a max/min product on the "rows" path as float32 sums
    (``kernels.reduce_rows_backward``), each empty where not wanted."""
    return kernels.reduce_rows_backward(grad_y, winners, col, values, x, needs_x, needs_values)


@spmm_extreme_backward.register_fake
def _(grad_y, winners, col, values, x, needs_x, needs_values):
    return (x.new_empty(x.shape[0] if needs_x else 0, x.shape[1], dtype=torch.float32),
            x.new_empty(values.shape[0] if needs_values else 0, dtype=torch.float32))


def _extreme_setup_context(ctx, inputs, output):
    x, values, rowptr, col, reduce, path, longest = inputs
    ctx.save_for_backward(x, values, col, output[1])
    ctx.path = path


def _extreme_backward(ctx, grad_y, grad_winners):
    x, values, col, winners = ctx.saved_tensors
    grad_x, grad_values = extreme.backward(grad_y, x, values, col, winners, *ctx.needs_input_grad[:2], ctx.path,
                                           spmm_extreme_backward)
    return grad_x, grad_values, None, None, None, None, None


spmm_extreme.register_autograd(_extreme_backward, setup_context=_extreme_setup_context)
