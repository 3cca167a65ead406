"""``reduce="max"`` and ``reduce="min"``: Y[i, c] = max (min) over the nonzeros (i, j) of row i of
A[i, j] * X[j, c], 0 for an empty row, together with the nonzero each output came from (its
index in canonical CSR order, int32; -1 for an empty row). The backward sends each output's
gradient to that one nonzero, as torch_scatter does: to X[j, c] (times A[i, j]) and to the value
A[i, j] (times X[j, c]).

A tie goes to the row's first nonzero; a NaN product wins over every number and the first NaN
wins among NaNs, so the result does not depend on the order of the work. Products are exact for
16-bit operands (formed in float32) and the extreme is rounded once to X's dtype, so Y equals
the float64 extreme rounded to X's dtype.

Two paths: "rows", the CUDA-core kernel of ``csrc/reduce_rows.h`` (a group of lanes per row over
the canonical CSR, long rows in pieces merged in order) and for the backward its scatter by fp32
atomics, torch ops under deterministic algorithms; and "reference", torch ops on any device and
dtype.
"""
from __future__ import annotations

import bisect

import torch
from torch import Tensor

from .. import kernels
from ..formats.csr import torch_csr
from ..paths import CPU_CSR_DTYPES
from .reference import CHUNK_ELEMENTS


def forward(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, reduce: str, path: str,
            longest: int = -1) -> tuple[Tensor, Tensor]:
    """(Y, the winning nonzero of every output) for the canonical CSR (rowptr, col, values) and a
    2-D ``x`` of the values' dtype, on a path ``product.choose_path`` gave; ``longest``, the
    nonzeros of the longest row where known (-1: unknown), lets the kernel skip its split of long
    rows where there are none."""
    if path == "rows":
        return kernels.reduce_rows(x, rowptr, col, values, reduce == "max", longest)
    return _torch_forward(x, values, rowptr, col, reduce == "max")


def output(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, reduce: str, path: str,
           longest: int = -1) -> Tensor:
    """Y alone, for a product that needs no gradient. On the CPU torch's own CSR reduction gives
    it (the same products, extremes and empty rows, without the winners, which cost the torch
    ops most of their time); 16-bit operands go up to float32 for it, which keeps the products
    exact."""
    if path == "rows" or x.device.type != "cpu":
        return forward(x, values, rowptr, col, reduce, path, longest)[0]
    held = values.dtype if values.dtype in CPU_CSR_DTYPES else torch.float32
    matrix = torch_csr(rowptr, col, values.to(held), (rowptr.numel() - 1, x.shape[0]))
    with torch.autocast("cpu", enabled=False):
        y = torch.sparse.mm(matrix, x.to(held).contiguous(), "amax" if reduce == "max" else "amin")
    return y.to(x.dtype)


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_chunks(rowptr: Tensor, n: int):
    """(first row, end row, first nonzero, end nonzero) of row ranges whose products fill at most
    CHUNK_ELEMENTS (a row longer than that is a chunk of its own)."""
    starts = rowptr.tolist()
    num_rows = len(starts) - 1
    step = max(1, CHUNK_ELEMENTS // max(n, 1))
    first = 0
    while first < num_rows:
        end = min(num_rows, max(first + 1, bisect.bisect_right(starts, starts[first] + step) - 1))
        yield first, end, starts[first], starts[end]
        first = end


def _torch_forward(x: Tensor, values: Tensor, rowptr: Tensor, col: Tensor, is_max: bool) -> tuple[Tensor, Tensor]:
    """The torch ops: per chunk of rows, the products, their extreme per row (``segment_reduce``
    over the rows' contiguous runs, several times faster than a scatter), and the first nonzero
    whose product equals it: the (nonzero, column) pairs that equal their row's extreme are about
    one per output, so a scatter over them, not over every product, picks the first."""
    num_rows, n = rowptr.numel() - 1, x.shape[1]
    acc = _accumulate_dtype(x.dtype)
    y = torch.zeros(num_rows, n, dtype=acc, device=x.device)
    arg = torch.full((num_rows, n), -1, dtype=torch.int32, device=x.device)
    if col.numel() == 0 or n == 0:
        return y.to(x.dtype), arg
    reduce = "max" if is_max else "min"
    with torch.autocast(x.device.type, enabled=False):
        for first, end, lo, hi in _row_chunks(rowptr, n):
            if lo == hi:
                continue
            lengths = (rowptr[first + 1 : end + 1] - rowptr[first:end]).long()
            rows = torch.repeat_interleave(torch.arange(end - first, device=x.device), lengths, output_size=hi - lo)
            products = values[lo:hi].to(acc)[:, None] * x[col[lo:hi].long()].to(acc)
            best = torch.segment_reduce(products, reduce, lengths=lengths, axis=0)
            best_of_edge = best[rows]
            won = products == best_of_edge
            if best.isnan().any():
                won |= products.isnan() & best_of_edge.isnan()
            del products, best_of_edge
            edge, column = won.nonzero(as_tuple=True)
            first_win = torch.full(((end - first) * n,), hi, dtype=torch.long, device=x.device)
            first_win.scatter_reduce_(0, rows[edge] * n + column, edge + lo, "amin")
            nonempty = (lengths > 0)[:, None]
            y[first:end] = torch.where(nonempty, best, 0.0)
            arg[first:end] = torch.where(nonempty, first_win.view(-1, n), -1).int()
    return y.to(x.dtype), arg


def backward(grad_y: Tensor, x: Tensor, values: Tensor, col: Tensor, arg: Tensor, needs_x: bool,
             needs_values: bool, path: str,
             atomic_sums=kernels.reduce_rows_backward) -> tuple[Tensor | None, Tensor | None]:
    """(dX, d(values)) of a max/min product whose winners are ``arg``: each output's gradient goes
    to its one nonzero. Sums are float32 (float64 for float64). The "rows" path adds them by
    atomics (``atomic_sums``: ``kernels.reduce_rows_backward``, or in a traced graph the op that
    wraps it), in no fixed order; deterministic algorithms and the "reference" path take the torch
    ops, where ``index_put_`` sorts the adds into a fixed order."""
    nnz, (num_cols, n) = values.numel(), x.shape
    if nnz == 0 or grad_y.numel() == 0 or not (needs_x or needs_values):
        return (x.new_zeros(num_cols, n) if needs_x else None), (values.new_zeros(nnz) if needs_values else None)
    if path == "rows" and not torch.are_deterministic_algorithms_enabled():
        sums_x, sums_values = atomic_sums(grad_y.to(x.dtype), arg, col, values, x, needs_x, needs_values)
        return (sums_x.to(x.dtype) if needs_x else None), (sums_values.to(values.dtype) if needs_values else None)
    return _torch_backward(grad_y, x, values, col, arg, needs_x, needs_values)


def _torch_backward(grad_y: Tensor, x: Tensor, values: Tensor, col: Tensor, arg: Tensor, needs_x: bool,
                    needs_values: bool) -> tuple[Tensor | None, Tensor | None]:
    """``backward`` in torch ops, for a product with nonzeros and outputs."""
    nnz, (num_cols, n) = values.numel(), x.shape
    acc = _accumulate_dtype(x.dtype)
    grad_x, grad_values = None, None
    with torch.autocast(grad_y.device.type, enabled=False):
        won = arg >= 0
        edge = arg.clamp(min=0).long()
        g = torch.where(won, grad_y.to(acc), 0.0)
        column = torch.arange(n, device=x.device)
        x_index = (col.long()[edge] * n + column).reshape(-1)
        if needs_x:
            flat = torch.zeros(num_cols * n, dtype=acc, device=x.device)
            flat.index_put_((x_index,), (values.to(acc)[edge] * g).reshape(-1), accumulate=True)
            grad_x = flat.view(num_cols, n).to(x.dtype)
        if needs_values:
            x_of_edge = x.to(acc).reshape(-1)[x_index]
            sums = torch.zeros(nnz, dtype=acc, device=x.device)
            sums.index_put_((edge.reshape(-1),), x_of_edge * g.reshape(-1), accumulate=True)
            grad_values = sums.to(values.dtype)
    return grad_x, grad_values


class ExtremeProduct(torch.autograd.Function):
    """The eager max/min product, differentiable for X and the values (canonical CSR order)."""

    @staticmethod
    def forward(ctx, x, values, rowptr, col, reduce, path, longest):
        y, arg = forward(x, values, rowptr, col, reduce, path, longest)
        ctx.save_for_backward(x, values, col, arg)
        ctx.path = path
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, values, col, arg = ctx.saved_tensors
        grad_x, grad_values = backward(grad_y, x, values, col, arg, *ctx.needs_input_grad[:2], ctx.path)
        return grad_x, grad_values, None, None, None, None, None
