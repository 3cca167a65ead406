"""The ``tcsparse`` operators: schema, implementation per path, fake implementation and autograd.

``tcsparse::spmm`` multiplies an ME-TCF matrix (its layout arrays, ``MetcfLayout.tensors()``,
and its values in block order) by a dense ``x`` of shape [K, N]. ``path`` picks the engine:

- ``"base"`` / ``"balanced"``: the Tensor-Core CUDA kernels (``kernels.py``);
- ``"csr"``: ``torch.sparse.mm`` on the layout's CSR arrays (cuSPARSE on CUDA, MKL or
  native on CPU): the fast CPU path and the vendor fallback;
- ``"rows"``: the CUDA-core CSR kernel (``csr_rows.py``), on CUDA with int32 indices, in the
  kernels' dtypes;
- ``"grouped"``: the Tensor-Core kernel on the grouped layout (``grouped.py``), which a
  TCSparseTensor keeps; the op itself carries the ME-TCF layout only and runs ``"base"`` for it
  (the same product);
- ``"reference"``: ME-TCF computed block by block with dense torch ops, the reference the CUDA
  kernels are tested against;
- ``"auto"``: the kernel on CUDA where it supports the dtype, ``"csr"`` elsewhere.

The backward of ``spmm`` needs the transpose's layout (``layout_t``): dX = A^T dY runs the same
op on it, and d(values) is ``tcsparse::sddmm``. Both ops are opaque to ``torch.compile``, which
traces them through their fake implementations.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from . import csr_rows, kernels
from .formats.csr import torch_csr
from .formats.metcf import BLOCK_WIDTH, MetcfLayout, segment_ids
from .paths import CPU_CSR_DTYPES, CUDA_ONLY_PATHS, KERNEL_DTYPES, KERNEL_PATHS, PATHS

CSR_PATHS = ("csr", "rows")
# Paths a TCSparseTensor runs from layouts of its own (not the op's ME-TCF arrays).
PRODUCT_PATHS = CSR_PATHS + ("grouped",)

# Upper bound on the elements of one chunk of dense temporaries in the torch paths: 16M floats
# (64 MB) keeps the reference usable on graphs of millions of nonzeros without running out of
# memory, while each chunk is still large enough to amortize the per-op overhead.
CHUNK_ELEMENTS = 1 << 24


def resolve_path(path: str, x: Tensor) -> str:
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path in CUDA_ONLY_PATHS and not (x.is_cuda and x.dtype in KERNEL_DTYPES):
        raise ValueError(f"path {path!r} needs a CUDA tensor of dtype {KERNEL_DTYPES}, got {x.dtype} on {x.device}")
    if path == "csr" and not x.is_cuda and x.dtype not in CPU_CSR_DTYPES:
        raise ValueError(f"path 'csr' on the CPU supports {CPU_CSR_DTYPES}, got {x.dtype}; use 'reference' or 'auto'")
    if path != "auto":
        return path
    if kernels_apply(x):
        return "base"
    if x.dtype in CPU_CSR_DTYPES or x.is_cuda:
        return "csr"
    return "reference"


def kernels_apply(x: Tensor) -> bool:
    """Whether the Tensor-Core kernels can multiply this operand (device, dtype, built)."""
    return x.is_cuda and x.dtype in KERNEL_DTYPES and kernels.available()


def _layout(tensors, window: int, num_rows: int, num_cols: int) -> MetcfLayout:
    return MetcfLayout.from_tensors(tensors, window, num_rows, num_cols)


def _chunks(total: int, per_item: int):
    step = max(1, CHUNK_ELEMENTS // max(per_item, 1))
    for start in range(0, total, step):
        yield start, min(total, start + step)


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def reference_spmm(x: Tensor, values: Tensor, layout: MetcfLayout) -> Tensor:
    """Y = A @ x from the ME-TCF arrays: each block becomes a dense window x 8 tile, multiplied by
    the 8 rows of x it names (zeros for padding), tiles of a window summed, stored via row_map."""
    w, n = layout.window, x.shape[1]
    acc_dtype = _accumulate_dtype(x.dtype)
    window_rows = torch.zeros(layout.num_windows * w, n, dtype=acc_dtype, device=x.device)
    block_window = segment_ids(layout.window_offsets, layout.num_blocks)
    nonzero_block = segment_ids(layout.block_offsets, layout.nnz)
    tile_size = w * BLOCK_WIDTH
    for start, end in _chunks(layout.num_blocks, tile_size * n):
        lo, hi = int(layout.block_offsets[start]), int(layout.block_offsets[end])
        tiles = torch.zeros((end - start) * tile_size, dtype=acc_dtype, device=x.device)
        flat = (nonzero_block[lo:hi] - start) * tile_size + layout.local_ids[lo:hi].long()
        tiles[flat] = values[lo:hi].to(acc_dtype)
        cols = layout.block_cols[start * BLOCK_WIDTH : end * BLOCK_WIDTH].long()
        gathered = torch.where((cols >= 0)[:, None], x[cols.clamp(min=0)].to(acc_dtype), 0.0)
        products = torch.bmm(tiles.view(-1, w, BLOCK_WIDTH), gathered.view(-1, BLOCK_WIDTH, n))
        slots = (block_window[start:end, None] * w + torch.arange(w, device=x.device)).reshape(-1)
        window_rows.index_add_(0, slots, products.reshape(-1, n))
    y = torch.zeros(layout.num_rows, n, dtype=x.dtype, device=x.device)
    valid = layout.row_map >= 0
    y[layout.row_map[valid].long()] = window_rows[valid].to(x.dtype)
    return y


def csr_spmm(x: Tensor, values: Tensor, layout: MetcfLayout) -> Tensor:
    csr_values = values[layout.csr_gather]
    matrix = torch_csr(layout.csr_rowptr, layout.csr_col, csr_values, (layout.num_rows, layout.num_cols))
    return torch.sparse.mm(matrix, x)


def rows_spmm(x: Tensor, values: Tensor, layout: MetcfLayout, row_pieces: Sequence[Tensor]) -> Tensor:
    """The "rows" path on the layout's CSR, split by ``row_pieces`` (``csr_rows.RowPieces``' three
    tensors for ``csr_rows.piece_size()``), or by a split built here when the list is empty."""
    csr_rows.check_indices(layout.csr_rowptr)
    if row_pieces:
        pieces = csr_rows.RowPieces(*row_pieces, csr_rows.piece_size())
    else:
        pieces = csr_rows.row_pieces(layout.csr_rowptr, csr_rows.piece_size())
    csr_values = values.to(x.dtype)[layout.csr_gather]
    return csr_rows.spmm(x, layout.csr_rowptr, layout.csr_col, csr_values, pieces, layout.num_cols)


def reference_sddmm(grad_y: Tensor, x: Tensor, layout: MetcfLayout) -> Tensor:
    """<grad_y[row], x[col]> for every nonzero in block order."""
    _, row, col = layout.nonzero_coordinates()
    acc_dtype = _accumulate_dtype(x.dtype)
    out = torch.empty(layout.nnz, dtype=x.dtype, device=x.device)
    for start, end in _chunks(layout.nnz, x.shape[1]):
        rows = grad_y[row[start:end]].to(acc_dtype)
        cols = x[col[start:end]].to(acc_dtype)
        out[start:end] = (rows * cols).sum(1).to(x.dtype)
    return out


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
    return run_spmm(x, values, _layout(layout, window, num_rows, num_cols), path, row_pieces=row_pieces[:3])


def run_spmm(x: Tensor, values: Tensor, a: MetcfLayout, path: str, validated: bool = False,
             row_pieces: Sequence[Tensor] = ()) -> Tensor:
    """The body of ``tcsparse::spmm`` without the op's dispatch, for eager calls that need no
    autograd: on small graphs the custom-op machinery costs more than the kernel itself.
    ``values`` may be float32 whatever x's dtype (the kernels take fp32 values). ``validated``:
    the operands and the path come from a TCSparseTensor that checked and resolved them, so
    neither is checked again (the kernels go through kernels.launch_spmm). ``row_pieces``: as
    ``spmm``'s, for this layout alone."""
    if not validated:
        path = resolve_path(path, x)
    if a.nnz == 0 or x.shape[1] == 0:
        return torch.zeros(a.num_rows, x.shape[1], dtype=x.dtype, device=x.device)
    if path == "grouped":
        path = "base"  # the op's arrays are ME-TCF's; base computes the same product
    if path in KERNEL_PATHS:
        if validated:
            return kernels.launch_spmm(x, values, a, path == "balanced")
        return kernels.spmm(x, values, a, path)
    if path == "rows":
        return rows_spmm(x, values, a, row_pieces)
    # The torch engines accumulate in their own precision; autocast, which already picked the
    # operands' dtype, must not recast their internal products (the kernels ignore autocast).
    with torch.autocast(x.device.type, enabled=False):
        if path == "csr":
            return csr_spmm(x.contiguous(), values.to(x.dtype), a)
        return reference_spmm(x, values, a)


class SpMMGradX(torch.autograd.Function):
    """Y = A @ X differentiable for X only (A's values need no gradient), in eager mode, for the
    operands of a TCSparseTensor (validated by it; grad_y has Y's shape and dtype): the math
    of ``tcsparse::spmm``'s backward for dX (the product with the transpose) in a plain autograd
    Function. The custom op's dispatch costs tens of microseconds per call, more than the whole
    product on a small graph; torch.compile and gradients for the values still go through the op.

    ``values_t`` are the transpose's values in its block order (``values[a_t.transpose_gather]``)."""

    @staticmethod
    def forward(ctx, x: Tensor, values: Tensor, values_t: Tensor, a: MetcfLayout, a_t: MetcfLayout, path: str):
        ctx.save_for_backward(values_t)
        ctx.a_t, ctx.path = a_t, path
        return run_spmm(x, values, a, path, validated=True)

    @staticmethod
    def backward(ctx, grad_y):
        (values_t,) = ctx.saved_tensors
        return run_spmm(grad_y, values_t, ctx.a_t, ctx.path, validated=True), None, None, None, None, None


def torch_sparse_product(matrix: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """``torch.sparse.mm(matrix, x)``, plus ``bias`` on every row if given: cuSPARSE then
    accumulates onto the bias, with no zero fill and no separate pass to add it."""
    return torch.sparse.mm(matrix, x) if bias is None else torch.addmm(bias, matrix, x)


class ProductGradX(torch.autograd.Function):
    """``product(x, bias)`` (A @ x, plus ``bias`` on every row if given) differentiable for x and
    the bias, for the CSR paths ("csr", "rows") in eager mode. Its backward multiplies by A^T
    through ``transposed_product()``, which the caller builds on first need and keeps: torch's
    own backward of torch.sparse.mm transposes the CSR matrix at every call (a CSR -> COO
    conversion, a sort and a gather of every nonzero: 24 of the 85 ms of a GCN epoch on R-MAT
    scale 21)."""

    @staticmethod
    def forward(ctx, x: Tensor, product, transposed_product, bias: Tensor | None):
        ctx.transposed_product = transposed_product
        return product(x, bias)

    @staticmethod
    def backward(ctx, grad_y):
        grad_x = ctx.transposed_product()(grad_y, None) if ctx.needs_input_grad[0] else None
        grad_bias = grad_y.sum(0) if ctx.needs_input_grad[3] else None
        return grad_x, None, None, grad_bias


@spmm.register_fake
def _(x, values, layout, layout_t, window, num_rows, num_cols, path, row_pieces):
    return x.new_empty(num_rows, x.shape[1])


@torch.library.custom_op("tcsparse::sddmm", mutates_args=())
def sddmm(grad_y: Tensor, x: Tensor, layout: list[Tensor], window: int, num_rows: int, num_cols: int) -> Tensor:
    """For every nonzero (row, col) of the ME-TCF matrix, in block order: <grad_y[row], x[col]>."""
    a = _layout(layout, window, num_rows, num_cols)
    if a.nnz and kernels_apply(x):
        return kernels.sddmm(grad_y, x, a)
    with torch.autocast(x.device.type, enabled=False):
        return reference_sddmm(grad_y, x, a)


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
    grad_x = grad_values = None
    if ctx.needs_input_grad[0]:
        if not layout_t:
            raise RuntimeError("tcsparse::spmm was called without the transpose layout; it cannot compute dX")
        values_t = values[_layout(layout_t, window, num_cols, num_rows).transpose_gather]
        # The transpose's pieces first: its product is the one this call runs.
        pieces_t = row_pieces[3:] + row_pieces[:3] if len(row_pieces) == 6 else []
        grad_x = spmm(grad_y, values_t, layout_t, layout, window, num_cols, num_rows, path, pieces_t)
    if ctx.needs_input_grad[1]:
        grad_values = sddmm(grad_y, x, layout, window, num_rows, num_cols)
    no_grad_for = [None] * count
    return grad_x, grad_values, no_grad_for, [None] * len(layout_t), None, None, None, None, [None] * len(row_pieces)


spmm.register_autograd(_spmm_backward, setup_context=_spmm_setup_context)
