"""What the simulation knows of a matrix (``MatrixShape``: TC blocks per window, CSR sizes) and
the simulated launches of the two Tensor-Core kernels (makespans in TC-block units)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from ..formats.metcf import BALANCE_CHUNK, MetcfLayout
from .schedule import EXACT_JOBS_PER_SLOT, batched_schedule, fluid_schedule


# The launch shapes of csrc/metcf_spmm.cuh.


def default_column_slices(n: int, dtype: torch.dtype = torch.float32) -> int:
    """Warps per window along N without a CUDA device to ask (tests, explanations on the
    CPU): the dispatch rule of csrc/metcf_spmm.cuh. A step is the columns of one 16-byte copy per
    lane group (32 for fp32, 64 for 16-bit types); slices are two steps wide when N >= 2 steps and
    the last slice is more than half full, else one step. On a GPU ``kernels.column_slices``
    answers for the compiled kernels."""
    step = 32 if dtype.itemsize >= 4 else 64
    columns = 2 * step if n >= 2 * step and (n % (2 * step) == 0 or n % (2 * step) > step) else step
    return -(-n // columns)



@dataclass(frozen=True)
class MatrixShape:
    """What the simulation needs of a layout, on the host: TC blocks per window and CSR sizes."""

    window: int
    window_blocks: np.ndarray  # int64 [windows]
    rows: int
    nnz: int
    max_row_nnz: int
    cols: int | None = None  # columns of A (rows of X); None: as many as rows
    rows_share_ratio: float = 1.0  # the rows path's order against the given one (package docstring)
    grouped_blocks: int | None = None  # blocks of the grouped layout; None: the path cannot pay
    grouped_rest_nnz: int = 0  # nonzeros the grouped path leaves to the rows kernel
    grouped_one_chunk: bool = False  # every group of the grouped layout is one chunk (band matrices)
    # (chunks, TC blocks, non-empty windows) before each window, when already known (the
    # conversion's host copies); else computed on first need.
    prefixes: tuple | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, layout: MetcfLayout, **features) -> "MatrixShape":
        """From the host copies the conversion made; a layout without them (rebuilt from its
        tensors) is read back from the device once. ``features``: the fields the layout does not
        know (``rows_share_ratio``, ``grouped_blocks``, ``grouped_rest_nnz``, ``grouped_one_chunk``)."""
        counts = layout.host_counts
        if counts is not None:
            offsets = counts.window_offsets
            return cls(layout.window, np.diff(offsets), layout.num_rows, layout.nnz, counts.max_row_nnz,
                       layout.num_cols, prefixes=counts.prefixes, **features)
        offsets, rowptr = layout.window_offsets, layout.csr_rowptr
        blocks = offsets[1:] - offsets[:-1]
        longest = (rowptr[1:] - rowptr[:-1]).max().view(1) if layout.num_rows else rowptr.new_zeros(1)
        host = torch.cat([blocks, longest.to(blocks.dtype)]).cpu().numpy().astype(np.int64)
        return cls(layout.window, host[:-1], layout.num_rows, layout.nnz, int(host[-1]), layout.num_cols, **features)

    @property
    def num_cols(self) -> int:
        return self.rows if self.cols is None else self.cols

    @property
    def num_windows(self) -> int:
        return self.window_blocks.size

    @functools.cached_property
    def summary(self) -> "ShapeSummary":
        """The scalars that decide a launch of one wave (every warp resident at once)."""
        blocks = self.window_blocks
        if blocks.size == 0:
            return ShapeSummary(0, 0, 0, 0, 0, 0, 0)
        chunk_start, block_start, nonempty_before = self._chunk_prefixes
        chunks, empty = int(chunk_start[-1]), blocks.size - int(nonempty_before[-1])
        split = blocks > BALANCE_CHUNK
        split_windows = int(np.count_nonzero(split))
        single_chunk = blocks.size - empty - split_windows
        return ShapeSummary(
            tc_blocks=int(block_start[-1]),
            max_blocks=int(blocks.max()),
            max_single_chunk_blocks=int(np.where(split, 0, blocks).max()),
            empty_windows=empty,
            chunks=chunks,
            split_windows=split_windows,
            chunks_of_split_windows=chunks - single_chunk,
        )

    @property
    def tc_blocks(self) -> int:
        return self.summary.tc_blocks

    @property
    def empty_windows(self) -> int:
        return self.summary.empty_windows

    @property
    def nonempty_windows(self) -> int:
        return self.num_windows - self.summary.empty_windows

    @property
    def block_prefix(self) -> np.ndarray:
        """TC blocks before each window (length windows + 1)."""
        return self._chunk_prefixes[1]

    @property
    def num_chunks(self) -> int:
        return self.summary.chunks

    @functools.cached_property
    def chunks(self) -> tuple[np.ndarray, np.ndarray]:
        """TC blocks of every balanced chunk (``BALANCE_CHUNK`` blocks, the last of a window
        shorter) in chunk order, and whether it is the first chunk of its window: the chunks
        spelled out, which ``before_chunks`` answers for from prefix sums (the tests check one
        against the other)."""
        per_window = -(-self.window_blocks // BALANCE_CHUNK)
        total = int(per_window.sum())
        sizes = np.full(total, BALANCE_CHUNK, dtype=np.int64)
        occupied = per_window > 0
        end = np.cumsum(per_window)[occupied]
        sizes[end - 1] = self.window_blocks[occupied] - (per_window[occupied] - 1) * BALANCE_CHUNK
        first = np.zeros(total, dtype=bool)
        first[end - per_window[occupied]] = True
        return sizes, first

    @functools.cached_property
    def _chunk_prefixes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per window (length windows + 1): chunks, TC blocks and non-empty windows before it."""
        if self.prefixes is not None:
            return self.prefixes
        per_window = (self.window_blocks + BALANCE_CHUNK - 1) // BALANCE_CHUNK
        zero = np.zeros(1, dtype=np.int64)
        return (
            np.concatenate([zero, np.cumsum(per_window)]),
            np.concatenate([zero, np.cumsum(self.window_blocks)]),
            np.concatenate([zero, np.cumsum(per_window > 0)]),
        )

    def before_chunks(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For chunk indices ``c`` in [0, num_chunks]: the TC blocks of the chunks before c, the
        first chunks of a window among them, and whether c is the first chunk of its window.
        From per-window prefix sums, so the cost is that of the queries, not of all the chunks
        (a few thousand warp boundaries against 10^5..10^6 chunks)."""
        chunk_start, block_start, nonempty_before = self._chunk_prefixes
        w = np.searchsorted(chunk_start, c, side="right") - 1  # c's window (non-empty), or the end
        inside = c - chunk_start[w]  # chunks of w before c, all full
        first = (inside == 0) & (c < chunk_start[-1])
        return block_start[w] + inside * BALANCE_CHUNK, nonempty_before[w] + (inside > 0), first


class ShapeSummary(NamedTuple):
    tc_blocks: int
    max_blocks: int  # of any window
    max_single_chunk_blocks: int  # of the windows of one balanced chunk
    empty_windows: int
    chunks: int  # balanced chunks, all windows
    split_windows: int  # windows of more than one chunk
    chunks_of_split_windows: int


def base_makespan_units(shape: MatrixShape, slices: int, slots: int, block_units: float) -> tuple[float, float]:
    """(makespan, total work) of the base kernel in TC-block units, list-scheduled on ``slots``."""
    windows = shape.num_windows
    work = slices * (windows * block_units + shape.tc_blocks)
    if windows == 0:
        return 0.0, 0.0
    if windows * slices <= slots:  # one wave: every warp starts at once
        return block_units + shape.summary.max_blocks, work
    costs = block_units + shape.window_blocks
    if windows * slices <= EXACT_JOBS_PER_SLOT * slots:
        return batched_schedule(np.zeros(slots), np.repeat(costs, slices)), work
    before = block_units * np.arange(windows) + shape.block_prefix[:-1]
    return fluid_schedule(costs, slots, slices, before), work


class BalancedLaunch(NamedTuple):
    makespan: float  # TC-block units
    work: float  # TC-block units, all warps
    zeroed_windows: int  # cleared first: empty windows plus range boundaries inside a window


def balanced_makespan_units(
    shape: MatrixShape, slices: int, slots: int, segment_units: float, split_units: float
) -> BalancedLaunch:
    """The balanced kernel's persistent grid, exactly as ``metcf_balanced_kernel`` splits it, at
    ``segment_units`` per segment and ``split_units`` per cut segment (``balanced_warps``)."""
    return balanced_warps(shape, slices, slots).launch(segment_units, split_units)


@dataclass(frozen=True)
class BalancedWarps:
    """What each warp of the balanced grid does, whatever a unit costs: per warp its segments,
    TC blocks and cut segments; or, for a grid of one chunk per warp, the summary that decides it
    in closed form. The prediction prices it twice (the kernel's constants, and AR's block costs
    without atomics) from one pass over the warp boundaries."""

    segments: np.ndarray | None
    blocks: np.ndarray | None
    cut: np.ndarray | None
    zeroed_windows: int
    one_item: ShapeSummary | None = None  # the summary, when every warp takes a single chunk
    slices: int = 1

    def launch(self, segment_units: float, split_units: float) -> BalancedLaunch:
        if self.one_item is not None:
            return _balanced_one_item_per_warp(self.one_item, self.slices, segment_units, split_units,
                                               self.zeroed_windows)
        if self.segments is None:
            return BalancedLaunch(0.0, 0.0, self.zeroed_windows)
        costs = segment_units * self.segments + self.blocks + split_units * self.cut
        return BalancedLaunch(float(costs.max()), float(costs.sum()), self.zeroed_windows)


def balanced_warps(shape: MatrixShape, slices: int, slots: int) -> BalancedWarps:
    """The balanced kernel's persistent grid, exactly as ``metcf_balanced_kernel`` splits it.

    Items are (slice, chunk) pairs, slice-major; the grid has ``G = min(upper bound of the items,
    slots)`` warps and warp i takes the contiguous items [i * per, (i + 1) * per) with
    per = ceil(items / G). Inside its range a warp handles each window's consecutive chunks as one
    segment (a pipeline start and store); a segment whose window crosses the range boundary adds
    atomically (a cut segment). All warps are co-resident, so the makespan is the largest warp."""
    summary = shape.summary
    chunks = summary.chunks
    items = chunks * slices
    if items == 0:
        return BalancedWarps(None, None, None, summary.empty_windows)
    if items <= slots:
        # Every chunk of a split window but its last continues into the next warp's range.
        continued = slices * (summary.chunks_of_split_windows - summary.split_windows)
        return BalancedWarps(None, None, None, summary.empty_windows + continued, one_item=summary, slices=slices)
    upper = (shape.num_windows + summary.tc_blocks // BALANCE_CHUNK + 1) * slices
    per = -(-items // min(upper, slots))
    bounds = np.append(np.arange(0, items, per), items)  # warp i takes [bounds[i], bounds[i + 1])
    ends = bounds[1:]

    def before(item: np.ndarray):  # TC blocks and first chunks over the items < item; is item a first chunk
        blocks, firsts, first = shape.before_chunks(item % chunks)
        laps = item // chunks  # whole slices before item
        return laps * summary.tc_blocks + blocks, laps * shape.nonempty_windows + firsts, first

    at_bounds = before(bounds)
    start_blocks, start_firsts, start_first = (part[:-1] for part in at_bounds)
    end_blocks, end_firsts, end_first = (part[1:] for part in at_bounds)
    starts_inside = ~start_first  # the range begins in the middle of a window
    ends_inside = (ends < items) & ~end_first  # the next item continues the last window
    segments = end_firsts - start_firsts + starts_inside
    cut = np.where(segments == 1, starts_inside | ends_inside, starts_inside.astype(np.int64) + ends_inside)
    return BalancedWarps(segments, end_blocks - start_blocks, cut, summary.empty_windows + int(ends_inside.sum()))


def _balanced_one_item_per_warp(summary: ShapeSummary, slices: int, segment_units: float, split_units: float,
                                zeroed_windows: int) -> BalancedLaunch:
    """``balanced_makespan_units`` when every warp takes a single chunk (items <= slots, so
    per = 1): each chunk is one segment, cut exactly when its window has several chunks."""
    full_split = BALANCE_CHUNK + split_units if summary.split_windows else 0.0
    makespan = segment_units + max(summary.max_single_chunk_blocks, full_split)
    work = slices * (segment_units * summary.chunks + summary.tc_blocks + split_units * summary.chunks_of_split_windows)
    return BalancedLaunch(makespan, work, zeroed_windows)
