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
                                                 ``chunk`` blocks of one group), then blocks
chunk_group  int32 [chunks]                      group of each chunk
block_cols   int32 [blocks * 8]                  original column ids, -1 for padding
bitmaps      int32 [blocks * GROUP_WINDOWS * 4]  occupancy of sub-block (block, window): bit
                                                 (r % 4) * 8 + c of word r // 4, as ME-TCF
sub_offsets  int32 [blocks * GROUP_WINDOWS + 1]  first value of each sub-block
row_map      int32 [groups * GROUP_ROWS]         original row of each slot, -1 past the end
gather       int32 [nnz]                         canonical CSR nonzero of each value position
============ ===== ============================= ===========================================

Built with torch ops on the matrix's device (one sort of the nonzeros by (group, column)).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .metcf import BLOCK_WIDTH

GROUP_WINDOWS = 4
WINDOW = 16
GROUP_ROWS = GROUP_WINDOWS * WINDOW
# Blocks per chunk (one warp's run): the grid should fill the GPU a few times over at N = 128
# (ogbl-ddi: 67 groups of ~530 blocks, chunks of 32 give ~1,100 chunks and 4 warps each), while
# each output row takes one atomic add per chunk of its group.
MIN_CHUNK = 32
MAX_CHUNK = 512
TARGET_CHUNKS = 2048


# Mean nonzeros per ME-TCF block below which the grouped layout is not worth building: its work
# per block is four windows' (H200, N = 128 float32: ogbl-ddi at 26 per block ran 1.5x faster than
# our other paths, R-MAT 18 at 8 per block 4x slower than the rows path).
MIN_NNZ_PER_TC_BLOCK = 16


def may_pay(nnz: int, tc_blocks: int) -> bool:
    """Whether a matrix whose ME-TCF layout has ``tc_blocks`` blocks may gain from the grouped
    layout: its 16-row windows are dense enough that those of a group share columns."""
    return tc_blocks > 0 and nnz >= MIN_NNZ_PER_TC_BLOCK * tc_blocks


class GroupedLayout(NamedTuple):
    chunk_starts: torch.Tensor
    chunk_group: torch.Tensor
    block_cols: torch.Tensor
    bitmaps: torch.Tensor
    sub_offsets: torch.Tensor
    row_map: torch.Tensor
    gather: torch.Tensor
    num_rows: int
    num_cols: int

    @property
    def num_blocks(self) -> int:
        return self.block_cols.numel() // BLOCK_WIDTH

    def kernel_arrays(self) -> list[torch.Tensor]:
        """The arrays in the order ``tcsparse_kernels::grouped_spmm`` takes them."""
        return [self.chunk_starts, self.chunk_group, self.block_cols, self.bitmaps, self.sub_offsets, self.row_map]


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(counts.numel() + 1, dtype=torch.long, device=counts.device)
    torch.cumsum(counts, 0, out=out[1:])
    return out


def chunk_size(num_blocks: int) -> int:
    """Blocks per chunk for a layout of ``num_blocks`` blocks."""
    return min(MAX_CHUNK, max(MIN_CHUNK, -(-num_blocks // TARGET_CHUNKS)))


def build_grouped(rowptr: torch.Tensor, col: torch.Tensor, num_rows: int, num_cols: int,
                  row_perm: torch.Tensor | None = None, chunk: int | None = None) -> GroupedLayout:
    """The grouped layout of the CSR (rowptr, col) (canonical: sorted, no duplicates) with its rows
    in the order ``row_perm`` (``row_perm[i]``: the row placed at slot i; None: as given)."""
    device = col.device
    nnz = col.numel()
    groups = -(-num_rows // GROUP_ROWS)
    degree = (rowptr[1:] - rowptr[:-1]).long()
    row = torch.arange(num_rows, device=device).repeat_interleave(degree, output_size=nnz)
    slot_of_row = torch.arange(num_rows, device=device)
    if row_perm is not None:
        slot_of_row = torch.empty_like(slot_of_row)
        slot_of_row[row_perm.long()] = torch.arange(num_rows, device=device)
    slot = row if row_perm is None else slot_of_row[row]
    del row
    group = slot // GROUP_ROWS
    # The group's distinct columns, ascending: block and position in it of every nonzero.
    pairs, pair_of = torch.unique(group * num_cols + col.long(), sorted=True, return_inverse=True)
    pair_group = pairs // num_cols
    pairs_per_group = torch.bincount(pair_group, minlength=groups)
    rank = torch.arange(pairs.numel(), device=device) - _exclusive_cumsum(pairs_per_group)[pair_group]
    blocks_per_group = (pairs_per_group + BLOCK_WIDTH - 1) // BLOCK_WIDTH
    first_block = _exclusive_cumsum(blocks_per_group)
    num_blocks = int(first_block[-1])
    pair_block = first_block[pair_group] + rank // BLOCK_WIDTH
    pair_pos = rank % BLOCK_WIDTH
    block_cols = torch.full((num_blocks * BLOCK_WIDTH,), -1, dtype=torch.int32, device=device)
    block_cols[pair_block * BLOCK_WIDTH + pair_pos] = (pairs % num_cols).int()
    del pairs, pair_group, rank

    block, pos = pair_block[pair_of], pair_pos[pair_of]
    del pair_of, pair_block, pair_pos
    sub = block * GROUP_WINDOWS + (slot // WINDOW) % GROUP_WINDOWS
    in_window = slot % WINDOW
    entry = in_window * BLOCK_WIDTH + pos  # bit order inside the sub-block
    gather = torch.argsort(sub * (WINDOW * BLOCK_WIDTH) + entry)
    sub_offsets = _exclusive_cumsum(torch.bincount(sub, minlength=num_blocks * GROUP_WINDOWS))
    words = torch.zeros(num_blocks * GROUP_WINDOWS * 4, dtype=torch.long, device=device)
    words.index_add_(0, sub * 4 + in_window // 4, torch.ones_like(entry) << (entry % 32))
    # Bit 31 set means a negative int32: wrap the unsigned word.
    bitmaps = torch.where(words >= 2**31, words - 2**32, words).int()

    chunk = chunk or chunk_size(num_blocks)
    chunks_per_group = (blocks_per_group + chunk - 1) // chunk
    chunk_group = torch.arange(groups, device=device).repeat_interleave(chunks_per_group)
    within = torch.arange(chunk_group.numel(), device=device) - _exclusive_cumsum(chunks_per_group)[chunk_group]
    starts = first_block[chunk_group] + within * chunk
    chunk_starts = torch.cat([starts, first_block[-1:]]).int()

    row_map = torch.full((groups * GROUP_ROWS,), -1, dtype=torch.int32, device=device)
    row_map[slot_of_row] = torch.arange(num_rows, dtype=torch.int32, device=device)
    return GroupedLayout(chunk_starts, chunk_group.int(), block_cols, bitmaps, sub_offsets.int(), row_map,
                         gather.int(), num_rows, num_cols)

