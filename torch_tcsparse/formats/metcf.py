"""ME-TCF: the Tensor-Core storage of DTC-SpMM (ASPLOS'24, section 4.2).

Rows are grouped in windows of ``window`` rows (16, or 8). Inside a window the distinct columns
are condensed (listed once each, ascending) and cut into blocks of 8 columns, so a window with
``d`` distinct columns holds ``ceil(d / 8)`` blocks of ``window x 8``: the A operand of one TF32
``mma.m16n8k8`` per block. Each nonzero keeps a one-byte id ``row_in_window * 8 + col_in_block``.

Arrays (every one on the device of the matrix; built by the conversion kernels of
``csrc/metcf_convert.cu`` on a GPU, by vectorized torch ops elsewhere, entry for entry alike):

============== ======== ====================== ============================================
name           dtype    shape                  meaning
============== ======== ====================== ============================================
window_offsets int32    [windows + 1]          first block of each window
block_offsets  int32    [blocks + 1]           first nonzero of each block (block order)
local_ids      uint8    [nnz]                  row_in_window * 8 + col_in_block, ascending
                                               inside a block
block_cols     int32    [blocks * 8]           original column id of each block column,
                                               -1 for padding
block_bitmap   int32    [blocks * 4]           occupancy of each block: bit (r % 4) * 8 + c of
                                               word r // 4 marks entry (r, c); the kernels
                                               find a value's place in its block by popcount
row_map        int32    [windows * window]     original row written by each window row,
                                               -1 past the last row
chunk_offsets  int32    [windows + 1]          first balanced-kernel chunk of each window
                                               (``BALANCE_CHUNK`` blocks per chunk)
chunk_row_starts int32  [chunks * window]      CSR position of the first entry of window row
                                               r in the chunk's blocks (row_start + the row's
                                               entries in the window's earlier chunks); any
                                               value for rows past the last
transpose_gather int32  [nnz] or [0]           values of the transpose's layout are
                                               ``values[t.transpose_gather]``; empty until
                                               the transpose is built
csr_rowptr     int32/64 [rows + 1]             canonical CSR of the original matrix
csr_col        int32/64 [nnz]
csr_gather     int32    [nnz]                  CSR-order values are ``values[csr_gather]``
============== ======== ====================== ============================================

``host_counts`` (``HostCounts``): the window and chunk offsets, the non-empty windows before each
window, the longest row and the rows longer than a ``"rows"`` piece, copied to the host by the
conversion in the synchronization it needs anyway (the block count sizes the arrays), so the
kernel selector neither reads the device again nor recomputes prefix sums. Layouts rebuilt from
tensors alone (``from_tensors``) have none; the selector then reads them back once.

Index arrays over the nonzeros (the gathers) are int32, int64 only past 2**31 - 1 nonzeros: on a
graph of 63M nonzeros each int64 gather would cost 0.5 GB of GPU memory.

The kernels read the values where they are, in canonical CSR order: a row's entries are sorted
by column, and the block columns of a window are its distinct columns ascending, so a row's
entries come in the same order block after block, and a kernel finds an entry's CSR position
from ``chunk_row_starts`` and the bitmaps alone (no index per nonzero). The block order is what
the SDDMM writes (``csr_gather`` puts it in CSR order) and what ``transpose_gather`` links. Row reordering is carried entirely by
``row_map`` (and the choice of windows); ``block_cols`` always holds original column ids, so a
kernel gathers X and stores Y in the user's order and a permutation costs no pass over X or Y.
Column order does not change the number of blocks (columns are condensed per window), only
which rows of X neighbouring blocks touch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import kernels
from .. import csr_rows
from . import native, packed
from .arrays import INT32_MAX, compress, first_of_runs, sort_keys
from .csr import CSR, index_dtype_for
from .packed import bit_width

# TC blocks handled by one thread block of the balanced kernel. 32 blocks of 16x8 are 4096
# candidate products: long enough to hide the gather latency, short enough that a hub window
# of 100,000 blocks still spreads over ~3,000 thread blocks (all SMs busy).
BALANCE_CHUNK = 32

WINDOWS = (8, 16)
BLOCK_WIDTH = 8
# Bits of a block's occupancy bitmap (four int32 words): one per entry of the largest block.
BITMAP_BITS = 128


@dataclass(frozen=True)
class MetcfLayout:
    """Index arrays of an ME-TCF matrix; the values travel separately (CSR order)."""

    window: int
    num_rows: int
    num_cols: int
    window_offsets: torch.Tensor
    block_offsets: torch.Tensor
    local_ids: torch.Tensor
    block_cols: torch.Tensor
    block_bitmap: torch.Tensor
    row_map: torch.Tensor
    chunk_offsets: torch.Tensor
    chunk_row_starts: torch.Tensor
    transpose_gather: torch.Tensor
    csr_rowptr: torch.Tensor
    csr_col: torch.Tensor
    csr_gather: torch.Tensor
    host_counts: "HostCounts | None" = field(default=None, compare=False, repr=False)

    TENSOR_FIELDS = (
        "window_offsets",
        "block_offsets",
        "local_ids",
        "block_cols",
        "block_bitmap",
        "row_map",
        "chunk_offsets",
        "chunk_row_starts",
        "transpose_gather",
        "csr_rowptr",
        "csr_col",
        "csr_gather",
    )
    # What the Tensor-Core kernels, their SDDMM and the reference read: the layout's arrays less the
    # transpose's link and the CSR copies.
    KERNEL_FIELDS = tuple(name for name in TENSOR_FIELDS
                          if name not in ("transpose_gather", "csr_rowptr", "csr_col"))

    @property
    def num_windows(self) -> int:
        return self.window_offsets.numel() - 1

    @property
    def num_blocks(self) -> int:
        return self.block_offsets.numel() - 1

    @property
    def nnz(self) -> int:
        return self.local_ids.numel()

    @property
    def device(self) -> torch.device:
        return self.local_ids.device

    def tensors(self) -> list[torch.Tensor]:
        """The arrays in the fixed order the ``tcsparse`` ops take them."""
        return [getattr(self, name) for name in self.TENSOR_FIELDS]

    @classmethod
    def from_tensors(cls, tensors, window: int, num_rows: int, num_cols: int) -> "MetcfLayout":
        if len(tensors) != len(cls.TENSOR_FIELDS):
            raise ValueError(f"an ME-TCF layout has {len(cls.TENSOR_FIELDS)} arrays, got {len(tensors)}")
        return cls(window, num_rows, num_cols, *tensors)

    @classmethod
    def from_fields(cls, arrays: dict, window: int, num_rows: int, num_cols: int) -> "MetcfLayout":
        """A layout holding only the arrays given by field name (the others None, so that a read
        of one fails at once): what a compiled function takes in of a layout
        (``flattening``)."""
        unknown = set(arrays) - set(cls.TENSOR_FIELDS)
        if unknown:
            raise ValueError(f"not ME-TCF arrays: {sorted(unknown)}")
        return cls(window, num_rows, num_cols, *(arrays.get(name) for name in cls.TENSOR_FIELDS))

    def to(self, device) -> "MetcfLayout":
        moved = {name: getattr(self, name).to(device) for name in self.TENSOR_FIELDS}
        return dataclasses.replace(self, **moved)

    def with_transpose_gather(self, gather: torch.Tensor) -> "MetcfLayout":
        return dataclasses.replace(self, transpose_gather=gather)

    def nonzero_coordinates(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(block, original row, original column) of every nonzero in block order, int64."""
        block = segment_ids(self.block_offsets, self.nnz)
        window = segment_ids(self.window_offsets, self.num_blocks)[block]
        local = self.local_ids.long()
        row = self.row_map.long()[window * self.window + (local >> 3)]
        col = self.block_cols.long()[block * BLOCK_WIDTH + (local & 7)]
        return block, row, col

    def stats(self, value_bytes: int = 4) -> dict:
        """Block statistics (DTC-SpMM's MeanNnzTC among them) and bytes against plain CSR."""
        per_window = (self.window_offsets[1:] - self.window_offsets[:-1]).double()
        blocks = self.num_blocks
        metcf_bytes = (
            self.window_offsets.numel() * 4
            + self.block_offsets.numel() * 4
            + self.nnz * (1 + value_bytes)
            + self.block_cols.numel() * 4
            + self.block_bitmap.numel() * 4
        )
        csr_bytes = (self.num_rows + 1) * 4 + self.nnz * (4 + value_bytes)
        return {
            "rows": self.num_rows,
            "cols": self.num_cols,
            "nnz": self.nnz,
            "window": self.window,
            "tc_blocks": blocks,
            "mean_nnz_per_block": self.nnz / blocks if blocks else 0.0,
            "blocks_per_window_mean": float(per_window.mean()) if per_window.numel() else 0.0,
            "blocks_per_window_std": float(per_window.std(unbiased=False)) if per_window.numel() else 0.0,
            "blocks_per_window_max": int(per_window.max()) if per_window.numel() else 0,
            "bytes": metcf_bytes,
            "csr_bytes": csr_bytes,
            "bytes_vs_csr": metcf_bytes / csr_bytes,
        }


@dataclass(frozen=True)
class HostCounts:
    """Host copies of per-window prefix sums (int64 numpy, length windows + 1) and the longest row."""

    window_offsets: np.ndarray
    chunk_offsets: np.ndarray
    nonempty_before: np.ndarray  # windows with at least one block before each window
    max_row_nnz: int

    @property
    def prefixes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Chunks, TC blocks and non-empty windows before each window (what the selector reads)."""
        return self.chunk_offsets, self.window_offsets, self.nonempty_before


def segment_ids(offsets: torch.Tensor, total: int) -> torch.Tensor:
    """For offsets of segments, the segment id of each of the ``total`` items (int64)."""
    counts = (offsets[1:] - offsets[:-1]).long()
    ids = torch.arange(counts.numel(), device=offsets.device)
    return ids.repeat_interleave(counts, output_size=total)


def _log2(power_of_two: int) -> int:
    """Shift for a division by a power of two (windows, block width): shifts are several times
    cheaper than integer divisions over every nonzero."""
    return power_of_two.bit_length() - 1


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(counts.numel() + 1, dtype=torch.long, device=counts.device)
    torch.cumsum(counts, 0, out=out[1:])
    return out


def row_slots(num_rows: int, row_perm: torch.Tensor | None, device) -> torch.Tensor:
    """Window slot of every original row: its position in the (reordered) row order."""
    if row_perm is None:
        return torch.arange(num_rows, device=device)
    slots = torch.empty(num_rows, dtype=torch.long, device=device)
    slots[row_perm.long()] = torch.arange(num_rows, device=device)
    return slots


def count_blocks(
    csr: CSR, window: int = 16, row_perm: torch.Tensor | None = None, use_kernels: bool | None = None
) -> torch.Tensor:
    """Blocks per window (int64 [windows]) without building the layout: the reordering objective.
    ``use_kernels`` as for ``build_layout``."""
    return _builder(csr, window, row_perm, use_kernels).blocks_per_window()


def build_metcf(
    csr: CSR, window: int = 16, row_perm: torch.Tensor | None = None, use_kernels: bool | None = None
) -> tuple[MetcfLayout, torch.Tensor]:
    """ME-TCF layout and block-order values of ``csr``; ``row_perm[i]`` is the row placed at slot i.
    See ``build_layout``."""
    layout = build_layout(csr, window, row_perm, use_kernels)
    block_values = csr.values.new_empty(csr.values.shape).index_put_((layout.csr_gather,), csr.values)
    return layout, block_values


def build_layout(
    csr: CSR, window: int = 16, row_perm: torch.Tensor | None = None, use_kernels: bool | None = None
) -> MetcfLayout:
    """ME-TCF layout of ``csr`` without its values (what a structure shared by several value
    tensors keeps: the block-order copy of the values costs a scatter and a value array).
    On a GPU with the extension built, the conversion kernels (``csrc/metcf_convert.cu``) build
    it; on the CPU the compiled pass of ``csrc/cpu_metcf.cpp`` where it is built (``native``);
    elsewhere torch ops do, with the same result entry for entry. ``use_kernels=False`` forces
    the torch ops (the reference of both in tests and benchmarks)."""
    build = _builder(csr, window, row_perm, use_kernels)
    window_offsets, chunk_offsets, host_counts = build.count()
    num_blocks = int(host_counts.window_offsets[-1])
    block_cols, block_bitmap, block_offsets, local_ids, csr_gather = build.fill(window_offsets, num_blocks)
    row_starts = chunk_row_starts(window_offsets, chunk_offsets, block_bitmap, build.row_map, csr.rowptr, window,
                                  int(host_counts.chunk_offsets[-1]))
    return MetcfLayout(
        window=window,
        num_rows=csr.num_rows,
        num_cols=csr.num_cols,
        window_offsets=window_offsets,
        block_offsets=block_offsets,
        local_ids=local_ids,
        block_cols=block_cols,
        block_bitmap=block_bitmap,
        row_map=build.row_map,
        chunk_offsets=chunk_offsets,
        chunk_row_starts=row_starts,
        transpose_gather=torch.empty(0, dtype=csr_gather.dtype, device=csr_gather.device),
        csr_rowptr=csr.rowptr,
        csr_col=csr.col,
        csr_gather=csr_gather,
        host_counts=host_counts,
    )


# Set bits of every byte value: a block's entries in one of its rows (byte r of the bitmap, the
# int32 words being little-endian on every device torch runs the kernels on).
_BYTE_POPCOUNT = torch.tensor([bin(b).count("1") for b in range(256)], dtype=torch.int32)


def chunk_row_starts(window_offsets, chunk_offsets, block_bitmap, row_map, rowptr, window: int,
                     num_chunks: int) -> torch.Tensor:
    """``MetcfLayout.chunk_row_starts`` (int32 [num_chunks * window]) from the structure alone:
    for each window row, the running count of its entries over the blocks, read at each chunk's
    first block less at its window's, offset by the row's CSR start. A few rows at a time, so the
    work arrays stay near ``_ROW_COUNT_ENTRIES`` entries on large matrices while a small one (a
    sampled mini-batch) takes one pass of a few kernels."""
    device = window_offsets.device
    num_blocks = block_bitmap.numel() // 4
    rows_bytes = block_bitmap.contiguous().view(torch.uint8).view(num_blocks, BITMAP_BITS // 8)
    popcount = _BYTE_POPCOUNT.to(device)
    window_of_chunk = segment_ids(chunk_offsets, num_chunks)
    window_first = window_offsets.long()[window_of_chunk]
    chunk_first = window_first + (torch.arange(num_chunks, device=device)
                                  - chunk_offsets.long()[window_of_chunk]) * BALANCE_CHUNK
    starts = rowptr.long()[row_map.long().view(-1, window)[window_of_chunk].clamp_(min=0)]
    step = max(1, min(window, _ROW_COUNT_ENTRIES // max(num_blocks, 1)))
    for first in range(0, window, step):
        counts = popcount[rows_bytes[:, first : first + step].long()]
        before = torch.zeros(num_blocks + 1, counts.shape[1], dtype=torch.int32, device=device)
        torch.cumsum(counts, 0, out=before[1:])
        starts[:, first : first + step] += before[chunk_first] - before[window_first]
    return starts.view(-1).to(torch.int32)


# Entries of the per-block row counts ``chunk_row_starts`` holds at once (int64 indices: 32 MB).
_ROW_COUNT_ENTRIES = 1 << 22


def _builder(csr: CSR, window: int, row_perm: torch.Tensor | None, use_kernels: bool | None = None):
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, got {window}")
    if use_kernels is None:
        lib = native.usable(csr.col, csr.rowptr) if csr.num_cols <= native.MAX_COLUMNS else None
        if lib is not None:
            return _NativeBuild(csr, window, row_perm, lib)
        use_kernels = csr.col.is_cuda and kernels.available()
    if use_kernels:
        return _KernelBuild(csr, window, row_perm)
    return _TorchBuild(csr, window, row_perm)


def _row_map(num_rows: int, window: int, row_perm: torch.Tensor | None, device) -> torch.Tensor:
    """Original row of every window slot (int32), -1 past the last row."""
    num_windows = -(-num_rows // window)
    row_map = torch.full((num_windows * window,), -1, dtype=torch.int32, device=device)
    row_map[:num_rows] = torch.arange(num_rows, device=device) if row_perm is None else row_perm
    return row_map


class _TorchBuild:
    """The layout with torch ops, on any device, from one sort: the nonzeros by (window, column,
    row in window). Equal (window, column) pairs come together in it, ranked inside their
    window, which gives each nonzero its block and lane. The block order needs no second sort:
    inside a block the nonzeros go by local id, so a nonzero's place is the number of bits of
    the block-order occupancy bitmap before its own. Per-nonzero arrays are int32 where the
    index dtype is (an int64 array per nonzero costs 160 MB at 20M nonzeros) and int64 work is
    done in slices."""

    def __init__(self, csr: CSR, window: int, row_perm: torch.Tensor | None):
        device = csr.col.device
        self.csr, self.window = csr, window
        self.row_map = _row_map(csr.num_rows, window, row_perm, device)
        self.num_windows = -(-csr.num_rows // window)
        # The nonzeros in slot order (the rows as the windows take them): a window's nonzeros are
        # one range, the same before and after the sort. ``to_csr``: the canonical nonzero of each.
        if row_perm is None:
            self.rowptr, self.col, self.to_csr = csr.rowptr, csr.col, None
        else:
            self.rowptr, self.col, self.to_csr = csr_rows.permuted_rows(csr.rowptr, csr.col, row_perm)
        slots = torch.arange(self.num_windows + 1, device=device) * window
        self.window_starts = self.rowptr.long()[slots.clamp_(max=csr.num_rows)]
        self.index_dtype = index_dtype_for(csr.num_rows, csr.num_cols, csr.nnz)

    def _sort(self, for_fill: bool) -> None:
        """Sorts the nonzeros by (window, column, row in window) and keeps ``is_first`` (where
        each (window, column) pair starts); ``for_fill`` also keeps, in that order, each pair's
        column (``pair_col``), and each nonzero's row in its window (``row_in_window``, uint8)
        and canonical position (``source``)."""
        csr, nnz = self.csr, self.csr.nnz
        lengths = self.rowptr[1:] - self.rowptr[:-1]
        row_bits = bit_width(int(lengths.max()) - 1) if nnz else 0
        col_bits = bit_width(csr.num_cols - 1)
        window_bits = bit_width(self.num_windows - 1)
        if window_bits + col_bits + _log2(self.window) + row_bits <= packed.KEY_BITS:
            self._sort_packed(lengths, row_bits, col_bits, for_fill)
        else:
            self._sort_stable(lengths, for_fill)

    def _sort_packed(self, lengths: torch.Tensor, row_bits: int, col_bits: int, for_fill: bool) -> None:
        """One int64 per nonzero, window | column | row in window | position in row, sorted in
        place: distinct keys, and every field comes back from the key."""
        nnz, device, shift = self.csr.nnz, self.col.device, _log2(self.window)
        num_rows = self.csr.num_rows
        pair_shift = shift + row_bits  # the bits under the (window, column) pair
        slots = torch.arange(num_rows, device=device)
        base = (slots >> shift) << (col_bits + pair_shift)
        base |= (slots & (self.window - 1)) << row_bits
        base -= self.rowptr[:-1]  # adding the nonzero's position leaves its position in its row
        del slots
        key = packed.expand(base, lengths, nnz)
        del base
        # In slices, on numpy arrays on the CPU (``packed.host``): an int32 operand whole would be
        # widened to an int64 copy of every nonzero.
        keys, col = packed.host(key), packed.host(self.col)
        for start, stop in packed.slices(nnz):
            part = keys[start:stop]
            part += packed.arange(start, stop, part)
            part += packed.cast(col[start:stop], torch.int64) << pair_shift
        key = sort_keys(key)
        keys = packed.host(key)
        self.is_first = torch.empty(nnz, dtype=torch.bool, device=device)
        is_first = packed.host(self.is_first)
        for start, stop in packed.slices(nnz):
            pair = keys[max(start - 1, 0) : stop] >> pair_shift
            is_first[start + (start == 0) : stop] = pair[1:] != pair[:-1]
        if nnz:
            is_first[0] = True
        if not for_fill:
            return
        self.row_in_window = torch.empty(nnz, dtype=torch.uint8, device=device)
        self.source = torch.empty(nnz, dtype=self.index_dtype, device=device)
        self.pair_col = torch.empty(int(torch.count_nonzero(self.is_first)), dtype=torch.int32, device=device)
        rows_in_window, source, pair_cols = (packed.host(t) for t in (self.row_in_window, self.source, self.pair_col))
        rowptr_long = self.rowptr.long()
        rowptr = packed.host(rowptr_long)
        to_csr = None if self.to_csr is None else packed.host(self.to_csr)
        pairs_done = 0
        for start, stop in packed.slices(nnz):
            part = keys[start:stop]
            row_in_window = part >> row_bits
            row_in_window &= self.window - 1
            rows_in_window[start:stop] = row_in_window
            slot = part >> (col_bits + pair_shift)
            slot <<= shift
            slot |= row_in_window
            del row_in_window
            position = packed.take(rowptr, slot)
            del slot
            position += part & ((1 << row_bits) - 1)
            source[start:stop] = position if to_csr is None else packed.take(to_csr, position)
            del position
            pair_col = part[is_first[start:stop]] >> pair_shift
            pair_col &= (1 << col_bits) - 1
            pair_cols[pairs_done : pairs_done + len(pair_col)] = pair_col
            pairs_done += len(pair_col)

    def _sort_stable(self, lengths: torch.Tensor, for_fill: bool) -> None:
        """Where the packed fields would not fit 63 bits (columns or windows past 2**40 or so): a
        stable sort of window * width + column, whose order gives the rows."""
        nnz, device = self.csr.nnz, self.col.device
        width = max(self.csr.num_cols, 1)
        slot = packed.expand(torch.arange(self.csr.num_rows, device=device), lengths, nnz)
        key = (slot >> _log2(self.window)) * width + self.col
        key, order = torch.sort(key, stable=True)
        self.is_first = first_of_runs(key)
        if for_fill:
            self.pair_col = (compress(key, self.is_first) % width).to(torch.int32)
            self.row_in_window = (slot.index_select(0, order) & (self.window - 1)).to(torch.uint8)
            source = order if self.to_csr is None else self.to_csr.index_select(0, order)
            self.source = source.to(self.index_dtype)

    def blocks_per_window(self, for_fill: bool = False) -> torch.Tensor:
        """Blocks of every window (int64); ``for_fill`` also keeps what ``fill`` needs."""
        self._sort(for_fill)
        # Pairs before each window: the pair starts before its range of sorted nonzeros.
        self.pair_ids = torch.cumsum(self.is_first, 0, dtype=self.index_dtype)
        self.is_first = self.is_first if for_fill else None
        last_before = self.window_starts - 1
        if self.csr.nnz:
            counted = self.pair_ids.index_select(0, last_before.clamp(min=0)).long()
            self.pairs_before = torch.where(last_before >= 0, counted, 0)
        else:
            self.pairs_before = torch.zeros_like(last_before)
        pairs_per_window = self.pairs_before[1:] - self.pairs_before[:-1]
        return (pairs_per_window + BLOCK_WIDTH - 1) // BLOCK_WIDTH

    def count(self) -> tuple[torch.Tensor, torch.Tensor, HostCounts]:
        """int32 window and chunk offsets on the device, and the host copies."""
        blocks = self.blocks_per_window(for_fill=True)
        window_offsets = _exclusive_cumsum(blocks)
        chunk_offsets = _exclusive_cumsum((blocks + BALANCE_CHUNK - 1) // BALANCE_CHUNK)
        host_counts = _read_back_counts(window_offsets, chunk_offsets, blocks, self.csr.rowptr)
        return window_offsets.to(torch.int32), chunk_offsets.to(torch.int32), host_counts

    def fill(self, window_offsets: torch.Tensor, num_blocks: int):
        csr, device, nnz = self.csr, self.csr.col.device, self.csr.nnz
        # Entry of every nonzero in block_cols (block * 8 + lane): its pair's rank in its window
        # (pair id less the pairs before the window) past the window's first entry.
        entry_dtype = torch.int32 if num_blocks * BITMAP_BITS <= INT32_MAX else torch.int64
        shift = window_offsets.long()[:-1] * BLOCK_WIDTH - self.pairs_before[:-1] - 1
        entry = self.pair_ids.to(entry_dtype)
        self.pair_ids = None
        entry += packed.expand(shift.to(entry_dtype), self.window_starts[1:] - self.window_starts[:-1], nnz)
        # Entries of distinct pairs are distinct: adding column + 1 to zeros and 1 from all leaves
        # -1 for padding (index_add_ takes int32 indices as they are; assignment would copy them
        # to int64).
        block_cols = torch.zeros(num_blocks * BLOCK_WIDTH, dtype=torch.int32, device=device)
        block_cols.index_add_(0, compress(entry, self.is_first), self.pair_col.add_(1))
        block_cols -= 1
        self.pair_col = self.is_first = None

        # Bit of every nonzero in the bitmap, in place of its entry: block * 128 + local id (the
        # stride of 128 for either window puts its word at bit // 32). Bits are distinct, so adding
        # them is their OR, exact in int32 (no carry ever reaches the sign bit).
        words = torch.zeros(num_blocks * 4, dtype=torch.int32, device=device)
        entries, rows_in_window = packed.host(entry), packed.host(self.row_in_window)
        for start, stop in packed.slices(nnz):
            bit = entries[start:stop]
            bit += (bit >> _log2(BLOCK_WIDTH)) * (BITMAP_BITS - BLOCK_WIDTH)
            bit += packed.cast(rows_in_window[start:stop], entry_dtype) * BLOCK_WIDTH
            words.index_add_(0, packed.as_tensor(bit >> 5), packed.as_tensor(packed.cast(1 << (bit & 31), torch.int32)))
        self.row_in_window = rows_in_window = None
        # Place in block order: the bits before the nonzero's own, counted whole words at a time
        # (an exclusive prefix sum over the words, whose every fourth entry is a block's offset)
        # plus those below it in its word. Places and positions are distinct: adding onto zeros is
        # the assignment (and index_add_ takes int32 indices as they are).
        gather_dtype = index_dtype_for(csr.num_rows, csr.num_cols, nnz)
        before_word = torch.zeros(words.numel() + 1, dtype=gather_dtype, device=device)
        torch.cumsum(packed.popcount(words), 0, dtype=gather_dtype, out=before_word[1:])
        csr_gather = torch.zeros(nnz, dtype=gather_dtype, device=device)
        local_ids = torch.zeros(nnz, dtype=torch.uint8, device=device)
        word_bits, before, source = packed.host(words), packed.host(before_word), packed.host(self.source)
        for start, stop in packed.slices(nnz):
            bit = entries[start:stop]
            word = bit >> 5
            below = ~(-1 << (bit & 31))
            below &= packed.take(word_bits, word)
            place = packed.take(before, word)
            del word
            place += packed.popcount(below)
            del below
            place = packed.as_tensor(place)
            csr_gather.index_add_(0, packed.as_tensor(source[start:stop]), place)
            local_ids.index_add_(0, place, packed.as_tensor(packed.cast(bit & (BITMAP_BITS - 1), torch.uint8)))
        self.source = None
        return block_cols, words, before_word[::4].to(torch.int32), local_ids, csr_gather


class _KernelBuild:
    """The same layout with the conversion kernels: no sort and no int64 key per nonzero, one
    thread per nonzero (``csrc/metcf_convert.h`` says how), and the per-window prefix sums and
    the longest row in the same op, so one small copy is all the host reads."""

    def __init__(self, csr: CSR, window: int, row_perm: torch.Tensor | None):
        device = csr.col.device
        self.csr, self.window = csr, window
        self.num_windows = -(-csr.num_rows // window)
        perm = torch.empty(0, dtype=torch.long, device=device) if row_perm is None else row_perm.long().contiguous()
        row_map, slot_of_row = kernels.metcf_row_map(perm, csr.num_rows, window)
        self.row_map = row_map
        self.csr_args = (csr.rowptr.contiguous(), csr.col.contiguous(), row_map, slot_of_row)

    def _counts(self) -> torch.Tensor:
        """window_offsets, chunk_offsets and non-empty windows before each window (int64, windows
        + 1 each), then the longest row."""
        self.first_before, self.owners, self.narrow_base, counts = kernels.metcf_count(
            *self.csr_args, self.window, BALANCE_CHUNK
        )
        return counts

    def blocks_per_window(self) -> torch.Tensor:
        counts = self._counts()
        return counts[1 : self.num_windows + 1] - counts[: self.num_windows]

    def count(self) -> tuple[torch.Tensor, torch.Tensor, HostCounts]:
        counts = self._counts()
        stride = self.num_windows + 1
        window_offsets = counts[:stride].to(torch.int32)
        chunk_offsets = counts[stride : 2 * stride].to(torch.int32)
        host = counts.cpu().numpy()
        host_counts = HostCounts(host[:stride], host[stride : 2 * stride], host[2 * stride : 3 * stride], int(host[-1]))
        return window_offsets, chunk_offsets, host_counts

    def fill(self, window_offsets: torch.Tensor, num_blocks: int):
        csr = self.csr
        scratch = self.first_before, self.owners, self.narrow_base
        self.first_before = self.owners = self.narrow_base = None
        block_cols, bitmap, block_offsets, local_ids, csr_gather = kernels.metcf_fill(
            *self.csr_args, *scratch, window_offsets, num_blocks, self.window
        )
        gather_dtype = index_dtype_for(csr.num_rows, csr.num_cols, csr.nnz)
        return block_cols, bitmap, block_offsets, local_ids, csr_gather.to(gather_dtype)


class _NativeBuild:
    """The same layout on the CPU with the compiled pass of ``csrc/cpu_metcf.cpp``: the nonzeros
    of one window at a time sorted by column, no sort over every nonzero."""

    def __init__(self, csr: CSR, window: int, row_perm: torch.Tensor | None, lib):
        self.csr, self.window, self.lib = csr, window, lib
        self.row_map = _row_map(csr.num_rows, window, row_perm, csr.col.device)

    def _arguments(self):
        csr = self.csr
        return self.lib, csr.rowptr, csr.col, self.row_map, csr.num_rows, csr.num_cols, self.window

    def blocks_per_window(self) -> torch.Tensor:
        return native.metcf_blocks(*self._arguments())

    def count(self) -> tuple[torch.Tensor, torch.Tensor, HostCounts]:
        blocks = self.blocks_per_window()
        window_offsets = _exclusive_cumsum(blocks)
        chunk_offsets = _exclusive_cumsum((blocks + BALANCE_CHUNK - 1) // BALANCE_CHUNK)
        host_counts = _read_back_counts(window_offsets, chunk_offsets, blocks, self.csr.rowptr)
        return window_offsets.to(torch.int32), chunk_offsets.to(torch.int32), host_counts

    def fill(self, window_offsets: torch.Tensor, num_blocks: int):
        csr = self.csr
        gather_dtype = index_dtype_for(csr.num_rows, csr.num_cols, csr.nnz)
        return native.metcf_fill(*self._arguments(), window_offsets, num_blocks, gather_dtype)


def _read_back_counts(window_offsets, chunk_offsets, blocks_per_window, rowptr) -> HostCounts:
    """The host copies of ``HostCounts`` in one copy: the synchronization that sizing the block
    arrays needs, carrying what the kernel selector will ask for (prefix sums are cheap here and
    O(windows) passes on the host)."""
    row_lengths = rowptr[1:] - rowptr[:-1]
    longest = row_lengths.max().view(1) if row_lengths.numel() else rowptr.new_zeros(1)
    nonempty_before = _exclusive_cumsum((blocks_per_window > 0).long())
    parts = [window_offsets, chunk_offsets, nonempty_before, longest.long()]
    host = torch.cat(parts).cpu().numpy()
    offsets, chunks, nonempty, _ = np.split(host, np.cumsum([p.numel() for p in parts])[:-1])
    return HostCounts(offsets, chunks, nonempty, int(host[-1]))
