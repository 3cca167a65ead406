"""The grouped Tensor-Core layout of the ``"grouped"`` path (``csrc/grouped_spmm.h``).

ME-TCF condenses the columns of each 16-row window; here they are condensed per group of
``GROUP_WINDOWS`` consecutive windows (64 rows in the row order of the matrix, reordered or not):
the group's distinct columns, ascending, cut into blocks of 8, and each block holds one 16 x 8
sub-block per window of the group (empty where that window has no nonzero in those columns).
A warp gathers the rows of X for a block once and multiplies them by several windows'
sub-blocks, so on dense-ish graphs X is read once per group instead of once per window.

============ ===== ============================= ===========================================
name         dtype shape                         meaning
============ ===== ============================= ===========================================
chunk_starts int32 [chunks + 1]                  first block of each chunk (a run of at most
                                                 ``chunk`` blocks of one group), then blocks;
                                                 every group has a chunk, an empty group's
                                                 holds no block
chunk_group  int32 [chunks]                      group of each chunk
block_cols   int32 [blocks * 8]                  original column ids, -1 for padding
sub_slots    int32 [blocks * GROUP_WINDOWS]      fragment slot of sub-block (block, window),
                                                 -1 where it is empty
row_map      int32 [groups * GROUP_ROWS]         original row of each slot, -1 past the end
gather       int32 [layout nnz]                  canonical CSR nonzero of each layout nonzero
slot_entry   int32 [layout nnz]                  its fragment slot * 128 + row * 8 + column
                                                 in the sub-block (int64 past 2^31)
============ ===== ============================= ===========================================

The values reach the kernel as fragments (``fragment_values``): per non-empty sub-block, per
lane of the warp, the lane's four entries of the mma's A operand, in X's dtype: the warp copies
a slot whole (16-byte pieces, 8 lanes per window) and each lane reads its entries in one word:
no popcounts over a bitmap and no scattered 4-byte copies, which runs the kernel faster than a
sparse sub-block would (docs/DECISIONS.md). The price is the zeros: 512 bytes per sub-block in
float32, 256 in 16-bit types, against 4 bytes per nonzero of plain values; the split below keeps
the sub-blocks 30-50% full on the graphs it pays for.

A (group, column) pair holding few nonzeros costs a whole gather of a row of X for them, while
a CUDA-core kernel pays one gather per nonzero: with ``min_pair_nnz`` those pairs stay out of the
layout, in ``rest`` (a CSR for the "rows" kernel, which adds the layout's sums before rounding).
On dense communities with scattered edges between them (the ordered SBM: 87% of the nonzeros in
pairs of 16 or more) the layout then holds a fifth of the blocks.

Built with torch ops on the matrix's device (one sort of the nonzeros by (group, column)).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .metcf import BLOCK_WIDTH

GROUP_WINDOWS = 4
WINDOW = 16
GROUP_ROWS = GROUP_WINDOWS * WINDOW
FRAGMENT_ENTRIES = WINDOW * BLOCK_WIDTH  # a sub-block's entries: 32 lanes x 4
# Blocks per chunk (one warp's run): the grid should fill the GPU a few times over at N = 128
# (ogbl-ddi: 67 groups of ~530 blocks, chunks of 32 give ~1,100 chunks and 4 warps each), while
# each output row takes one atomic add per chunk of its group (or, for 16-bit Y where every group
# is one chunk, one store: csrc/grouped_spmm.h).
MIN_CHUNK = 32
MAX_CHUNK = 512
TARGET_CHUNKS = 2048


# The values of ``min_pair_nnz`` a matrix's layout is priced with (``selector.grouped_split``):
# 1 keeps every nonzero in the layout. A split pays on dense communities with scattered edges
# between them (the ordered SBM runs faster split at 16), not on ogbl-ddi (docs/DECISIONS.md).
SPLIT_THRESHOLDS = (1, 8, 16)

# Mean nonzeros per ME-TCF block below which the grouped layout is not worth building: its work
# per block is four windows': ogbl-ddi, at 26 per block, runs fastest on it, while R-MAT 18, at 8,
# runs several times slower on it than on the rows path (docs/DECISIONS.md).
MIN_NNZ_PER_TC_BLOCK = 16


def may_pay(nnz: int, tc_blocks: int) -> bool:
    """Whether a matrix whose ME-TCF layout has ``tc_blocks`` blocks may gain from the grouped
    layout: its 16-row windows are dense enough that those of a group share columns."""
    return tc_blocks > 0 and nnz >= MIN_NNZ_PER_TC_BLOCK * tc_blocks


class RestCsr(NamedTuple):
    """The nonzeros left to the CUDA-core "rows" kernel: a CSR whose rows are the layout's slots
    (the matrix's row order), with original column ids; ``gather`` the canonical nonzero of each
    entry, ``row_map`` the row of Y of each slot (None where slots are rows)."""

    rowptr: torch.Tensor
    col: torch.Tensor
    gather: torch.Tensor
    row_map: torch.Tensor | None

    @property
    def nnz(self) -> int:
        return self.col.numel()


class GroupedLayout(NamedTuple):
    chunk_starts: torch.Tensor
    chunk_group: torch.Tensor
    block_cols: torch.Tensor
    sub_slots: torch.Tensor
    row_map: torch.Tensor
    gather: torch.Tensor
    slot_entry: torch.Tensor
    num_slots: int
    num_rows: int
    num_cols: int
    rest: RestCsr | None = None  # nonzeros of sparse (group, column) pairs, None: none left out

    @property
    def num_blocks(self) -> int:
        return self.block_cols.numel() // BLOCK_WIDTH

    @property
    def one_chunk_per_group(self) -> bool:
        """Whether every group is one chunk (every group has at least one): a 16-bit Y is then
        written by the kernel alone (``csrc/grouped_spmm.h``)."""
        return self.chunk_group.numel() == -(-self.num_rows // GROUP_ROWS)

    @property
    def rest_nnz(self) -> int:
        return 0 if self.rest is None else self.rest.nnz

    def kernel_arrays(self) -> list[torch.Tensor]:
        """The arrays in the order ``tcsparse_kernels::grouped_spmm`` takes them."""
        return [self.chunk_starts, self.chunk_group, self.block_cols, self.sub_slots, self.row_map]


class GroupPairs(NamedTuple):
    """Every nonzero's slot (row position in the matrix's order) and (group, column) pair, and
    per pair its group and nonzero count: what the layout and its split are built from."""

    slot: torch.Tensor
    pair_of: torch.Tensor
    pair_group: torch.Tensor
    pair_col: torch.Tensor
    pair_count: torch.Tensor
    groups: int


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(counts.numel() + 1, dtype=torch.long, device=counts.device)
    torch.cumsum(counts, 0, out=out[1:])
    return out


def chunk_size(num_blocks: int) -> int:
    """Blocks per chunk for a layout of ``num_blocks`` blocks."""
    return min(MAX_CHUNK, max(MIN_CHUNK, -(-num_blocks // TARGET_CHUNKS)))


def _slot_of_row(num_rows: int, row_perm: torch.Tensor | None, device) -> torch.Tensor:
    slot_of_row = torch.arange(num_rows, device=device)
    if row_perm is not None:
        slot_of_row = torch.empty_like(slot_of_row)
        slot_of_row[row_perm.long()] = torch.arange(num_rows, device=device)
    return slot_of_row


def group_pairs(rowptr: torch.Tensor, col: torch.Tensor, num_rows: int, num_cols: int,
                row_perm: torch.Tensor | None = None) -> GroupPairs:
    """The (group, column) pairs of the CSR (rowptr, col) (canonical) with its rows in the order
    ``row_perm`` (``row_perm[i]``: the row placed at slot i; None: as given): one sort."""
    device = col.device
    degree = (rowptr[1:] - rowptr[:-1]).long()
    row = torch.arange(num_rows, device=device).repeat_interleave(degree, output_size=col.numel())
    slot = row if row_perm is None else _slot_of_row(num_rows, row_perm, device)[row]
    del row
    pairs, pair_of, pair_count = torch.unique((slot // GROUP_ROWS) * num_cols + col.long(), sorted=True,
                                              return_inverse=True, return_counts=True)
    return GroupPairs(slot, pair_of, pairs // num_cols, pairs % num_cols, pair_count, -(-num_rows // GROUP_ROWS))


def _blocks(pair_group: torch.Tensor, groups: int) -> torch.Tensor:
    return (torch.bincount(pair_group, minlength=groups) + BLOCK_WIDTH - 1) // BLOCK_WIDTH


def split_sizes(pairs: GroupPairs, thresholds) -> dict[int, tuple[int, int]]:
    """Per threshold t: (blocks of the layout of the pairs holding t or more nonzeros, nonzeros
    of the other pairs), read back in one copy."""
    sizes = []
    for t in thresholds:
        dense = pairs.pair_count >= t
        sizes.append(_blocks(pairs.pair_group[dense], pairs.groups).sum())
        sizes.append(pairs.pair_count[~dense].sum())
    host = torch.stack(sizes).tolist() if sizes else []
    return {t: (int(host[2 * i]), int(host[2 * i + 1])) for i, t in enumerate(thresholds)}


def build_grouped(rowptr: torch.Tensor, col: torch.Tensor, num_rows: int, num_cols: int,
                  row_perm: torch.Tensor | None = None, chunk: int | None = None, min_pair_nnz: int = 1,
                  pairs: GroupPairs | None = None) -> GroupedLayout:
    """The grouped layout of the CSR (rowptr, col) (canonical: sorted, no duplicates) with its rows
    in the order ``row_perm`` (``row_perm[i]``: the row placed at slot i; None: as given).
    Pairs (a group's nonzeros in one column) of fewer than ``min_pair_nnz`` nonzeros are left to
    ``rest``: a block's gather pays for itself only when its columns hold enough nonzeros.
    ``pairs``: ``group_pairs`` of the same arguments, when already computed."""
    device = col.device
    if pairs is None:
        pairs = group_pairs(rowptr, col, num_rows, num_cols, row_perm)
    groups = pairs.groups
    kept = pairs.pair_count >= min_pair_nnz
    dense = kept[pairs.pair_of]
    rest = None if bool(dense.all()) else _rest_csr(pairs.slot, col, ~dense, num_rows, row_perm)
    nonzero = torch.nonzero(dense).flatten()  # canonical index of each nonzero the layout holds
    slot = pairs.slot[nonzero]
    # Pairs renumbered among those kept (still sorted by group, then column).
    pair_index = torch.cumsum(kept.long(), 0) - 1
    pair_of = pair_index[pairs.pair_of[nonzero]]
    pair_group, pair_col = pairs.pair_group[kept], pairs.pair_col[kept]
    pairs_per_group = torch.bincount(pair_group, minlength=groups)
    rank = torch.arange(pair_group.numel(), device=device) - _exclusive_cumsum(pairs_per_group)[pair_group]
    blocks_per_group = (pairs_per_group + BLOCK_WIDTH - 1) // BLOCK_WIDTH
    first_block = _exclusive_cumsum(blocks_per_group)
    num_blocks = int(first_block[-1])
    pair_block = first_block[pair_group] + rank // BLOCK_WIDTH
    pair_pos = rank % BLOCK_WIDTH
    block_cols = torch.full((num_blocks * BLOCK_WIDTH,), -1, dtype=torch.int32, device=device)
    block_cols[pair_block * BLOCK_WIDTH + pair_pos] = pair_col.int()
    del pair_col, rank

    block, pos = pair_block[pair_of], pair_pos[pair_of]
    del pair_of, pair_block, pair_pos
    sub = block * GROUP_WINDOWS + (slot // WINDOW) % GROUP_WINDOWS
    entry = (slot % WINDOW) * BLOCK_WIDTH + pos
    order = torch.argsort(sub * FRAGMENT_ENTRIES + entry)
    gather, sub, entry = nonzero[order], sub[order], entry[order]
    filled = torch.zeros(num_blocks * GROUP_WINDOWS, dtype=torch.bool, device=device)
    filled[sub] = True
    slot_of_sub = torch.cumsum(filled, 0) - 1
    num_slots = int(slot_of_sub[-1]) + 1 if num_blocks else 0
    sub_slots = torch.where(filled, slot_of_sub, -1).int()
    slot_entry = slot_of_sub[sub] * FRAGMENT_ENTRIES + entry
    if num_slots * FRAGMENT_ENTRIES < 2**31:
        slot_entry = slot_entry.int()
    del filled, slot_of_sub, sub, entry

    chunk = chunk or chunk_size(num_blocks)
    # An empty group keeps one chunk of no block: where every group is one chunk, its warps write
    # its rows (zeros, or the bias) and nothing is zeroed beforehand.
    chunks_per_group = ((blocks_per_group + chunk - 1) // chunk).clamp_min(1)
    chunk_group = torch.arange(groups, device=device).repeat_interleave(chunks_per_group)
    within = torch.arange(chunk_group.numel(), device=device) - _exclusive_cumsum(chunks_per_group)[chunk_group]
    starts = first_block[chunk_group] + within * chunk
    chunk_starts = torch.cat([starts, first_block[-1:]]).int()

    row_map = torch.full((groups * GROUP_ROWS,), -1, dtype=torch.int32, device=device)
    row_map[_slot_of_row(num_rows, row_perm, device)] = torch.arange(num_rows, dtype=torch.int32, device=device)
    return GroupedLayout(chunk_starts, chunk_group.int(), block_cols, sub_slots, row_map, gather.int(), slot_entry,
                         num_slots, num_rows, num_cols, rest)


def fragment_index(layout: GroupedLayout, element_size: int) -> torch.Tensor:
    """Where each of the layout's nonzeros goes among the fragments the kernel reads for values of
    ``element_size`` bytes: per fragment slot and lane (g, t) of the warp, the lane's four entries
    of the mma's A operand. Entry k is (row g + 8 (k % 2), column c(t, k // 2)) of the 16 x 8
    sub-block, as ``csrc/elements.cuh`` lays out the mma: c = t + 4h for float32 (TF32) and wider,
    kept in the order k = 0..3; c = 2t + h for 16-bit types, kept in the order 0, 2, 1, 3 so that
    each pair of a row is one 32-bit register of the operand."""
    entry = layout.slot_entry % FRAGMENT_ENTRIES  # in the slot_entry's dtype: int32 up to 2^31 entries
    row, col = entry // BLOCK_WIDTH, entry % BLOCK_WIDTH
    g, upper = row % 8, row // 8
    if element_size == 2:
        t, h = col // 2, col % 2
        position = 2 * upper + h
    else:
        t, h = col % 4, col // 4
        position = 2 * h + upper
    return layout.slot_entry - entry + (4 * g + t) * 4 + position


def fragment_values(layout: GroupedLayout, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The fragments of ``values`` (canonical CSR order) through ``fragment_index``'s ``index``,
    zero where a sub-block has no nonzero."""
    fragments = values.new_zeros(layout.num_slots * FRAGMENT_ENTRIES)
    return fragments.index_put_((index,), values.index_select(0, layout.gather))


def _rest_csr(slot: torch.Tensor, col: torch.Tensor, left: torch.Tensor, num_rows: int,
              row_perm: torch.Tensor | None) -> RestCsr:
    """The nonzeros ``left`` (a mask in canonical order) as a CSR over slots."""
    nonzero = torch.nonzero(left).flatten()
    rest_slot = slot[nonzero]
    if row_perm is not None:  # canonical order is by row: put it in slot order (stable: columns stay sorted)
        order = torch.sort(rest_slot, stable=True).indices
        nonzero, rest_slot = nonzero[order], rest_slot[order]
    rowptr = _exclusive_cumsum(torch.bincount(rest_slot, minlength=num_rows)).int()
    row_map = None if row_perm is None else row_perm.int()
    return RestCsr(rowptr, col[nonzero], nonzero.int(), row_map)
