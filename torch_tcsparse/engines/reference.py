"""The ``"reference"`` path: ME-TCF computed block by block with dense torch ops, on any device and
dtype. It is what the CUDA kernels are tested against: each 16 x 8 block multiplies its 8 rows
of X as a dense tile, so (like the Tensor-Core kernels) an inf or NaN in a row of X reaches every
row of the window whose block reads it. Sums are float32 (float64 for float64)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..formats.metcf import BLOCK_WIDTH, MetcfLayout, segment_ids
from .base import Engine
from .tensor_core import block_order, kernel_arrays

# Upper bound on the elements of one chunk of dense temporaries: 16M floats (64 MB) keeps the
# reference usable on graphs of millions of nonzeros without running out of memory, while each
# chunk is still large enough to amortize the per-op overhead.
CHUNK_ELEMENTS = 1 << 24


def _chunks(total: int, per_item: int):
    step = max(1, CHUNK_ELEMENTS // max(per_item, 1))
    for start in range(0, total, step):
        yield start, min(total, start + step)


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def spmm(x: Tensor, values: Tensor, layout: MetcfLayout) -> Tensor:
    """Y = A @ x from the ME-TCF arrays: each block becomes a dense window x 8 tile, multiplied by
    the 8 rows of x it names (zeros for padding), tiles of a window summed, stored via row_map."""
    w, n = layout.window, x.shape[1]
    acc_dtype = accumulate_dtype(x.dtype)
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


def sddmm(grad_y: Tensor, x: Tensor, layout: MetcfLayout) -> Tensor:
    """<grad_y[row], x[col]> for every nonzero in block order, summed in float32 (float64)."""
    _, row, col = layout.nonzero_coordinates()
    acc_dtype = accumulate_dtype(x.dtype)
    out = torch.empty(layout.nnz, dtype=x.dtype, device=x.device)
    for start, end in _chunks(layout.nnz, x.shape[1]):
        rows = grad_y[row[start:end]].to(acc_dtype)
        cols = x[col[start:end]].to(acc_dtype)
        out[start:end] = (rows * cols).sum(1).to(x.dtype)
    return out


def csr_sddmm(grad_y: Tensor, x: Tensor, rowptr: Tensor, col: Tensor) -> Tensor:
    """<grad_y[row], x[col]> for every nonzero of the CSR (rowptr, col), in its order, summed in
    float32 (float64): the values' gradient from the CSR alone, which a compiled function forms
    where the matrix's layout does not travel (``flattening``); inductor fuses the gathers into
    the sums."""
    counts = (rowptr[1:] - rowptr[:-1]).long()
    nnz = col.numel()
    row = torch.repeat_interleave(torch.arange(counts.numel(), device=col.device), counts, output_size=nnz)
    acc_dtype = accumulate_dtype(x.dtype)
    parts = [(grad_y[row[start:end]].to(acc_dtype) * x[col[start:end].long()].to(acc_dtype)).sum(1).to(x.dtype)
             for start, end in _chunks(nnz, x.shape[1])]
    return torch.cat(parts) if parts else x.new_empty(0)


class ReferenceEngine(Engine):
    name = operand_key = "reference"

    def kept_indices(self, structure, key, dtype):
        return structure.layout

    def operands(self, layout, values):
        return block_order(values, layout), layout

    def run(self, x, operands, bias):
        values, layout = operands
        # Autocast already picked the operands' dtype; it must not recast the products inside.
        with torch.autocast(x.device.type, enabled=False):
            y = spmm(x, values.to(x.dtype), layout) if layout.nnz and x.shape[1] else x.new_zeros(layout.num_rows, x.shape[1])
        return y if bias is None else y + bias

    def flat(self, layout):
        return kernel_arrays(layout), [layout.window, layout.num_rows, layout.num_cols]

    def unflat(self, tensors, ints):
        return MetcfLayout.from_fields(dict(zip(MetcfLayout.KERNEL_FIELDS, tensors)), *ints)


REFERENCE = ReferenceEngine()
