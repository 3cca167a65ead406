"""The ``tcsparse`` operators, which ``torch.compile`` traces through their fake implementations.

``tcsparse::spmm`` multiplies an ME-TCF matrix (its layout arrays, ``MetcfLayout.tensors()``,
and its values in block order) by a dense ``x`` of shape [K, N] on the engine ``path`` names
(``engines``); ``"grouped"`` runs ``"base"`` here (the op carries the ME-TCF arrays only: the
same product). Its backward is the engines' one formula (``engines.autograd.backward``): dX
runs the same op on the transpose's layout (``layout_t``), the values' gradient is
``tcsparse::sddmm``. Eager products do not go through the dispatcher: ``product.py`` runs the
engines directly (the custom op's dispatch costs more than a whole product on a small graph).

``tcsparse::spmm_extreme`` is the max/min product (``engines/extreme.py``) on the canonical CSR;
its backward sends each output's gradient to the nonzero it came from.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .engines import ENGINES, extreme, resolve
from .engines.autograd import backward, block_values_gradient
from .formats.metcf import MetcfLayout


def _layout(tensors, window: int, num_rows: int, num_cols: int) -> MetcfLayout:
    return MetcfLayout.from_tensors(tensors, window, num_rows, num_cols)


@torch.library.custom_op("tcsparse::spmm", mutates_args=())
def spmm(
    x: Tensor,
    values: Tensor,
    layout: list[Tensor],
    layout_t: list[Tensor],
    window: int,
    num_rows: int,
    num_cols: int,
    path: str,
    row_pieces: list[Tensor],
) -> Tensor:
    """Y[num_rows, N] = A @ x for the ME-TCF matrix A given by ``layout`` and block-order ``values``.

    ``layout_t`` is the transpose's layout (for the backward) or an empty list when no gradient
    for ``x`` is needed. ``row_pieces``, read by the "rows" path only: the split of the layout's
    CSR into pieces (``csr_rows.RowPieces``' three tensors, for ``csr_rows.piece_size()``), then
    the transpose's when ``layout_t`` is given; the split needs a host sync to build, so a
    TCSparseTensor passes the one it keeps. Empty: built at each call."""
    path = resolve(path, x)
    engine = ENGINES["base" if path == "grouped" else path]
    a = _layout(layout, window, num_rows, num_cols)
    return engine.run(x, engine.from_layout(a, values, row_pieces[:3]), None)


@spmm.register_fake
def _(x, values, layout, layout_t, window, num_rows, num_cols, path, row_pieces):
    return x.new_empty(num_rows, x.shape[1])


@torch.library.custom_op("tcsparse::sddmm", mutates_args=())
def sddmm(grad_y: Tensor, x: Tensor, layout: list[Tensor], window: int, num_rows: int, num_cols: int) -> Tensor:
    """For every nonzero (row, col) of the ME-TCF matrix, in block order: <grad_y[row], x[col]>."""
    return block_values_gradient(grad_y, x, _layout(layout, window, num_rows, num_cols))


@sddmm.register_fake
def _(grad_y, x, layout, window, num_rows, num_cols):
    return x.new_empty(layout[2].shape[0])


def _spmm_setup_context(ctx, inputs, output):
    x, values, layout, layout_t, window, num_rows, num_cols, path, row_pieces = inputs
    ctx.save_for_backward(x, values, *layout, *layout_t, *row_pieces)
    ctx.sizes = (len(layout), len(layout_t), window, num_rows, num_cols, path)


def _spmm_backward(ctx, grad_y):
    count, count_t, window, num_rows, num_cols, path = ctx.sizes
    x, values, *arrays = ctx.saved_tensors
    layout, layout_t, row_pieces = arrays[:count], arrays[count : count + count_t], arrays[count + count_t :]

    def transposed_product(g: Tensor) -> Tensor:
        if not layout_t:
            raise RuntimeError("tcsparse::spmm was called without the transpose layout; it cannot compute dX")
        values_t = values[_layout(layout_t, window, num_cols, num_rows).transpose_gather]
        # The transpose's pieces first: its product is the one this call runs.
        pieces_t = row_pieces[3:] + row_pieces[:3] if len(row_pieces) == 6 else []
        return spmm(g, values_t, layout_t, layout, window, num_cols, num_rows, path, pieces_t)

    grad_x, grad_values, _ = backward(
        grad_y,
        (ctx.needs_input_grad[0], ctx.needs_input_grad[1], False),
        transposed_product,
        lambda g: sddmm(g, x, layout, window, num_rows, num_cols),
    )
    return grad_x, grad_values, [None] * count, [None] * count_t, None, None, None, None, [None] * len(row_pieces)


spmm.register_autograd(_spmm_backward, setup_context=_spmm_setup_context)


@torch.library.custom_op("tcsparse::spmm_extreme", mutates_args=())
def spmm_extreme(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, reduce: str, path: str) -> tuple[Tensor, Tensor]:
    """(Y, winners) of the max/min product (``reduce``: "max" or "min") of the canonical CSR
    (rowptr, col, values) and a 2-D ``x`` on the ``engines.extreme`` path ``path``: Y[i, c] the
    extreme of A[i, j] * x[j, c] over row i (0 for an empty row), winners[i, c] the CSR index of
    the nonzero it came from (int32, -1 for an empty row)."""
    return extreme.forward(x, values, rowptr, col, reduce, path)


@spmm_extreme.register_fake
def _(x, values, rowptr, col, reduce, path):
    num_rows = rowptr.shape[0] - 1
    return x.new_empty(num_rows, x.shape[1]), x.new_empty(num_rows, x.shape[1], dtype=torch.int32)


def _extreme_setup_context(ctx, inputs, output):
    x, values, rowptr, col, reduce, path = inputs
    ctx.save_for_backward(x, values, col, output[1])


def _extreme_backward(ctx, grad_y, grad_winners):
    x, values, col, winners = ctx.saved_tensors
    grad_x, grad_values = extreme.backward(grad_y, x, values, col, winners, *ctx.needs_input_grad[:2])
    return grad_x, grad_values, None, None, None, None


spmm_extreme.register_autograd(_extreme_backward, setup_context=_extreme_setup_context)
