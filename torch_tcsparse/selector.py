"""Kernel selector: simulate the GPU's thread-block scheduling and pick the fastest SpMM path.

DTC-SpMM (ASPLOS'24, section 4.5.2) decides between its base kernel (one thread block per row
window) and its balanced kernel (fixed chunks of TC blocks, partial rows combined with atomics)
by simulating how thread blocks land on the SMs: the approximation ratio AR is the makespan of
base divided by the makespan of balanced, and balanced runs when AR exceeds a threshold (1.2,
fitted on an RTX 4090). We keep that rule, with the threshold calibrated per GPU family, and add
a cost model in microseconds for every path so that the chosen Tensor-Core kernel is also ranked
against ``"csr"`` (torch.sparse, cuSPARSE): ``A @ X`` should never be meaningfully slower than it.

The launch shapes simulated are those of ``csrc/metcf_spmm.cuh``, whose unit of work is a warp
(the scheduling slots are ``SMs x resident warps per SM``):

- base: one warp per (window, column slice), the slices of a window adjacent, issued in window
  order; the hardware gives each warp to the first slot that frees (list scheduling; warps are
  in fact placed four at a time, as thread blocks, which the model ignores). A warp costs
  ``block_units + tc_blocks of its window`` units;
- balanced: a persistent grid of ``G = min(items, slots)`` warps over (slice, chunk) items,
  slice-major; warp i takes the contiguous items [i * per, (i + 1) * per) and handles the
  consecutive chunks of one window as one segment: it costs ``segment_units`` per segment, its TC
  blocks, and ``split_units`` per segment whose window crosses its range boundary (the atomic
  adds). All warps are co-resident, so the makespan is exact. A small kernel first zeroes the
  rows of empty and cut windows (``zero_us`` per row);
- a kernel's time is ``launch_us + (unit_us + miss_unit_us * miss) * work / slots + tail_us *
  (makespan - work / slots)`` (``kernel_time_us``): the evenly spread work, then the imbalance
  tail; ``miss`` is the share of X beyond L2 (``l2_miss_fraction``), which prices gathers that go
  to memory (uniform 1M: X is 10x L2) against those served by L2 (the small real graphs);
- csr: ``launch_us + nnz_us * nnz + row_us * rows + max_row_us * longest row + miss_nnz_us * nnz
  * miss`` (the gather of X per nonzero, the write of Y per row, the row-split imbalance of the
  longest row);
- rows (our CUDA-core CSR kernel): the same form with its own constants, the
  longest row capped at a piece (``csr_rows.PIECE_NNZ``: longer rows are split), plus
  ``split_launch_us`` when any row is split: the kernel that first sets those rows of Y is a launch
  of its own, and the split pieces run last, with atomics (fitted 4-8 us on an H200, more than a
  launch; it decides between rows and csr on small power-law graphs, where they are close);
- every path costs at least its ``floor_us``: the host-side cost of one call (Python, dispatch,
  launch), which is what a call on a small graph costs when calls run back to back;
- a reordered matrix runs the rows path in its order; the order's ``rows_share_ratio``
  (``reorder.locality.share_ratio``: distinct columns per group of rows against the given order)
  scales the rows time by ``1 - ROWS_ORDER_GAIN * (1 - ratio)``. On an H200 the time saved per
  unit of share removed was 0.09-0.26 on R-MAT 18/21 (degree, tca, rcm, shuffle orders), 0.23-0.33
  on ogbl-ddi, 0.4-0.5 on the shuffled SBM (tca), 0.85 on the uniform graph (where the share
  moved 6%); orders that raised the share (tca on gg_flickr) cost time in the same proportion.
  0.2 sits in the R-MAT range, where the choice to reorder is close.

On a GPU, resident blocks per SM and column slices come from the compiled kernels
(``kernels.occupancy(path, n)``, ``kernels.column_slices(path, n)``); without one (tests, CPU
explanations) from the documented defaults. Not modelled: the deterministic balanced variant
(``torch.use_deterministic_algorithms``: a grid-stride loop and a workspace sum) and the cost of
3xTF32 when TF32 is disallowed; the calibration is measured with TF32, as the SpMM benchmark.
For float16/bfloat16 the launch shapes are those of the 16-bit kernels (wider column slices,
which also depend on the window count), the bytes moved count 2-byte elements, and the constants
are the dtype's own buckets where the calibration has them (``dtype_buckets``), else float32's.

Constants live in ``calibration/<family>.json`` (one per GPU family, ``default.json`` when the
family has none), per N bucket; ``benchmarks/selector.py --calibrate`` fits them on measurements.

Simulation cost (a choice must cost at most half an SpMM). The conversion leaves the per-window
prefix sums on the host (``MetcfLayout.host_counts``), so nothing is read from the device and no
O(windows) prefix is recomputed here. A launch that fits in one wave (every warp resident at
once, the small graphs) has a closed form, exact: base's makespan is its largest window, the
balanced grid gives each warp one chunk. Beyond one wave, ``list_schedule_makespan`` is exact
(vectorized in batches of up to one job per slot) up to ``EXACT_JOBS_PER_SLOT`` jobs per slot,
and a fluid estimate beyond, in a few O(windows) numpy passes (``_fluid_schedule``: within 5% of
heapq list scheduling on random costs, half a job high on equal ones); the balanced grid is
exact, from the prefix sums at its warp boundaries. ``select`` (what a product pays on its first
call at an N bucket) builds no explanation; ``rank`` and ``explain`` do.

Choice: the calibration's ``kernel_rule`` picks the kernel, either DTC-SpMM's (balanced when AR >
``ar_threshold``) or the kernel with the lower predicted time (the rule that fitted the measured
oracle better on that GPU); it runs unless ``"csr"`` is predicted faster, or the kernel is
predicted less than its ``csr_margin`` faster (a calibrated safety margin per kernel: a wrong
kernel must not cost more than cuSPARSE; the balanced kernel's extra zeroing launch and atomics
make its prediction the less certain on small graphs). Where it may run, ``"rows"`` then replaces
that choice when predicted at least ``rows_margin`` faster than it. Where other paths are predicted
within ``trials.MARGIN`` of that choice, ``SelectionCache`` measures them on the matrix's first
product and keeps the fastest (``trials``).
"""
from __future__ import annotations

import functools
import heapq
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from . import csr_rows, trials
from .formats.csr import index_dtype_for
from .formats.metcf import BALANCE_CHUNK, MetcfLayout
from .ops import KERNEL_DTYPES

CHOICES = ("base", "balanced", "csr", "rows")
KERNEL_CHOICES = ("base", "balanced")
# The share of the rows path's time that an order removes per unit of distinct-share removed
# (module docstring).
ROWS_ORDER_GAIN = 0.2
BUCKETS = (32, 64, 128, 256)

EXACT_JOBS_PER_SLOT = 4

CALIBRATION_DIR = Path(__file__).parent / "calibration"


# Scheduling.


def list_schedule_exact(costs, slots: int) -> float:
    """Makespan of list scheduling with a heap: each job, in order, to the slot that frees first.
    The reference the fast simulator is tested against."""
    free = [0.0] * slots
    for cost in np.asarray(costs, dtype=np.float64).tolist():
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def list_schedule_makespan(costs, slots: int) -> float:
    """Makespan of list scheduling ``costs`` (in launch order) on ``slots`` identical slots."""
    costs = np.asarray(costs, dtype=np.float64)
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    if costs.size == 0:
        return 0.0
    if costs.size <= slots:
        return float(costs.max())
    if costs.size <= EXACT_JOBS_PER_SLOT * slots:
        return _batched_schedule(np.zeros(slots), costs)
    return _fluid_schedule(costs, slots)


def _batched_schedule(free: np.ndarray, costs: np.ndarray) -> float:
    """Exact list scheduling from slot free times ``free``, many jobs per numpy step.

    With the slots sorted by free time, job j of a batch goes to the j-th slot as long as none of
    the slots taken by jobs 0..j-1 of the batch frees before it; the batch ends at the first job
    for which that fails (so every step places at least one job)."""
    free = np.sort(free)
    slots, start = free.size, 0
    while start < costs.size:
        size = min(slots, costs.size - start)
        ends = free[:size] + costs[start : start + size]
        fits = np.minimum.accumulate(ends[:-1]) >= free[1:size]
        placed = size if fits.all() else int(np.argmin(fits)) + 1
        free[:placed] = ends[:placed]
        free.sort()
        start += placed
    return float(free[-1])


def _fluid_schedule(costs: np.ndarray, slots: int, copies: int = 1, before: np.ndarray | None = None) -> float:
    """Many jobs per slot: each job's start estimated in O(1), the whole in a few numpy passes;
    every cost stands for ``copies`` consecutive jobs (a window's column slices).

    The first ``slots`` jobs start at once. A later job starts when a slot frees: by then the
    work before it, ``P``, is done except what the running jobs have left, about half a job each
    (the mean residual of desynchronized jobs), so it starts near ``P / slots - mean / 2``; the
    makespan is the latest end (of each cost's last copy), at least the work spread evenly.
    Against exact list scheduling (``tests/test_selector.py``): within 5% on random costs beyond
    ``EXACT_JOBS_PER_SLOT`` jobs per slot. Equal costs keep the slots in lockstep, with nothing
    left running when a wave ends: the estimate is then up to half a job high (10% at 5 jobs per
    slot, 2.5% at 20). ``before``: the exclusive prefix sums of ``costs``, when known."""
    if before is None:
        before = np.cumsum(costs) - costs
    total = (float(before[-1]) + float(costs[-1])) * copies
    last_copy_before = before * copies + costs * (copies - 1)
    start = np.maximum(0.0, last_copy_before / slots - float(costs.mean()) / 2)
    start[: -(-slots // copies)] = 0.0  # the costs whose copies all fit in the first wave
    return max(float((start + costs).max()), total / slots)


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


def n_bucket(n: int) -> int:
    """The N a choice is computed and cached for: the next power of two, at least 32."""
    if n < 1:
        raise ValueError(f"N must be positive, got {n}")
    return max(BUCKETS[0], 1 << (n - 1).bit_length())


@dataclass(frozen=True)
class MatrixShape:
    """What the simulation needs of a layout, on the host: TC blocks per window and CSR sizes."""

    window: int
    window_blocks: np.ndarray  # int64 [windows]
    rows: int
    nnz: int
    max_row_nnz: int
    cols: int | None = None  # columns of A (rows of X); None: as many as rows
    split_rows: int = 0  # rows longer than csr_rows.PIECE_NNZ (split into pieces by "rows")
    rows_share_ratio: float = 1.0  # the rows path's order against the given one (module docstring)
    # (chunks, TC blocks, non-empty windows) before each window, when already known (the
    # conversion's host copies); else computed on first need.
    prefixes: tuple | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, layout: MetcfLayout) -> "MatrixShape":
        """From the host copies the conversion made; a layout without them (rebuilt from its
        tensors) is read back from the device once."""
        counts = layout.host_counts
        if counts is not None:
            offsets = counts.window_offsets
            return cls(layout.window, np.diff(offsets), layout.num_rows, layout.nnz, counts.max_row_nnz,
                       layout.num_cols, counts.split_rows,
                       prefixes=(counts.chunk_offsets, offsets, counts.nonempty_before))
        offsets, rowptr = layout.window_offsets, layout.csr_rowptr
        blocks = offsets[1:] - offsets[:-1]
        longest = (rowptr[1:] - rowptr[:-1]).max().view(1) if layout.num_rows else rowptr.new_zeros(1)
        split = csr_rows.split_row_count(rowptr)
        host = torch.cat([blocks, longest.to(blocks.dtype), split.to(blocks.dtype)]).cpu().numpy().astype(np.int64)
        return cls(layout.window, host[:-2], layout.num_rows, layout.nnz, int(host[-2]), layout.num_cols, int(host[-1]))

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
        return _batched_schedule(np.zeros(slots), np.repeat(costs, slices)), work
    before = block_units * np.arange(windows) + shape.block_prefix[:-1]
    return _fluid_schedule(costs, slots, slices, before), work


class BalancedLaunch(NamedTuple):
    makespan: float  # TC-block units
    work: float  # TC-block units, all warps
    zeroed_windows: int  # cleared first: empty windows plus range boundaries inside a window


def balanced_makespan_units(
    shape: MatrixShape, slices: int, slots: int, segment_units: float, split_units: float
) -> BalancedLaunch:
    """The balanced kernel's persistent grid, exactly as ``metcf_balanced_kernel`` splits it.

    Items are (slice, chunk) pairs, slice-major; the grid has ``G = min(upper bound of the items,
    slots)`` warps and warp i takes the contiguous items [i * per, (i + 1) * per) with
    per = ceil(items / G). Inside its range a warp handles each window's consecutive chunks as one
    segment (``segment_units`` for its pipeline start and store); a segment whose window crosses
    the range boundary adds atomically (``split_units``). All warps are co-resident, so the
    makespan is the largest warp."""
    summary = shape.summary
    chunks = summary.chunks
    items = chunks * slices
    if items == 0:
        return BalancedLaunch(0.0, 0.0, summary.empty_windows)
    if items <= slots:
        return _balanced_one_item_per_warp(summary, slices, segment_units, split_units)
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
    blocks = end_blocks - start_blocks
    starts_inside = ~start_first  # the range begins in the middle of a window
    ends_inside = (ends < items) & ~end_first  # the next item continues the last window
    segments = end_firsts - start_firsts + starts_inside
    cut = np.where(segments == 1, starts_inside | ends_inside, starts_inside.astype(np.int64) + ends_inside)
    costs = segment_units * segments + blocks + split_units * cut
    return BalancedLaunch(float(costs.max()), float(costs.sum()), summary.empty_windows + int(ends_inside.sum()))


def _balanced_one_item_per_warp(summary: ShapeSummary, slices: int, segment_units: float, split_units: float):
    """``balanced_makespan_units`` when every warp takes a single chunk (items <= slots, so
    per = 1): each chunk is one segment, cut exactly when its window has several chunks."""
    full_split = BALANCE_CHUNK + split_units if summary.split_windows else 0.0
    makespan = segment_units + max(summary.max_single_chunk_blocks, full_split)
    work = slices * (segment_units * summary.chunks + summary.tc_blocks + split_units * summary.chunks_of_split_windows)
    # Every chunk of a split window but its last continues into the next warp's range.
    continued = slices * (summary.chunks_of_split_windows - summary.split_windows)
    return BalancedLaunch(makespan, work, summary.empty_windows + continued)


def kernel_time_us(constants: dict, makespan: float, work: float, slots: int, miss: float = 0.0) -> float:
    """Launch, the work spread evenly over all slots at ``unit_us`` per unit (plus ``miss_unit_us``
    per unit times the fraction of X gathers that miss L2), and the imbalance tail (makespan beyond
    that) at ``tail_us``: blocks that run alone at the end of a launch share their SM with fewer
    others, so a unit of tail may cost less than a unit of full occupancy."""
    even = work / slots
    unit = constants["unit_us"] + constants.get("miss_unit_us", 0.0) * miss
    return constants["launch_us"] + unit * even + constants["tail_us"] * max(0.0, makespan - even)


def l2_miss_fraction(cols: int, n: int, value_bytes: int, l2_bytes: int) -> float:
    """The share of X that does not fit in L2: about the fraction of gathers of rows of X that go
    to memory when the column ids are spread (uniform or shuffled graphs; power-law hubs hit more
    often, which the fitted constants average over)."""
    x_bytes = cols * n * value_bytes
    return max(0.0, 1.0 - l2_bytes / x_bytes) if x_bytes else 0.0


# Calibration and the device.

# Constants that are per column of X (the rest are per warp or per launch): the kernels'
# per-job constants do not scale since wider N means more slices, already simulated.
SCALE_WITH_N = ("nnz_us", "row_us", "max_row_us", "zero_us", "miss_nnz_us")
DEFAULT_L2_BYTES = 50 << 20


@dataclass(frozen=True)
class Calibration:
    """Constants of one GPU family (``calibration/<family>.json``)."""

    source: str
    ar_threshold: float
    buckets: dict  # N bucket -> path -> constants, for float32 (TF32) and any dtype not listed below
    sm_count: int  # used only without a CUDA device
    occupancy: dict  # path -> resident warps per SM, used only without a CUDA device
    # kernel path -> a kernel is chosen only when predicted this fraction faster than csr
    csr_margin: dict = field(default_factory=lambda: dict.fromkeys(KERNEL_CHOICES, 0.0))
    l2_bytes: int = DEFAULT_L2_BYTES  # used only without a CUDA device
    dtype_buckets: dict = field(default_factory=dict)  # "float16" / "bfloat16" -> buckets of their own
    kernel_rule: str = "ar"  # between the kernels: "ar" (DTC-SpMM's threshold) or "cost" (predicted time)
    rows_margin: float = 0.0  # "rows" replaces the choice only when predicted this fraction faster
    # (path, n, dtype) -> constants, filled by ``constants`` (a first choice looks up all four)
    _resolved: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    def load(cls, family: str) -> "Calibration":
        path = CALIBRATION_DIR / f"{family}.json"
        if not path.exists():
            path = CALIBRATION_DIR / "default.json"
        return cls.from_dict(json.loads(path.read_text()), path.name)

    @classmethod
    def from_dict(cls, data: dict, source: str) -> "Calibration":
        def buckets(table: dict) -> dict:
            return {int(n): constants for n, constants in table.items()}

        return cls(
            source,
            float(data["ar_threshold"]),
            buckets(data["buckets"]),
            int(data["sm_count"]),
            dict(data["occupancy"]),
            csr_margins(data.get("csr_margin", 0.0)),
            int(data.get("l2_bytes", DEFAULT_L2_BYTES)),
            {name: buckets(table) for name, table in data.get("dtype_buckets", {}).items()},
            str(data.get("kernel_rule", "ar")),
            float(data.get("rows_margin", 0.0)),
        )

    def constants(self, path: str, n: int, dtype: torch.dtype = torch.float32) -> dict:
        """The constants of ``path`` for N = ``n`` and X of ``dtype`` (its own buckets if it has
        some, else float32's): those of the nearest bucket at or below, the per-column ones
        scaled by n / bucket. Shared between calls: read, do not modify."""
        key = (path, n, dtype)
        constants = self._resolved.get(key)
        if constants is None:
            table = self.dtype_buckets.get(dtype_name(dtype), self.buckets)
            known = sorted(table)
            bucket = max([b for b in known if b <= n], default=known[0])
            constants = dict(table[bucket][path])
            for name in SCALE_WITH_N:
                if name in constants:
                    constants[name] *= n / bucket
            self._resolved[key] = constants
        return constants


def csr_margins(margin) -> dict:
    """Per kernel margins from a calibration's ``csr_margin``: one number for both kernels (the
    files before 2026-11-22's fifth session) or one per kernel."""
    if isinstance(margin, dict):
        return {path: float(margin[path]) for path in KERNEL_CHOICES}
    return dict.fromkeys(KERNEL_CHOICES, float(margin))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def gpu_family(name: str, capability: tuple[int, int]) -> str:
    """Calibration key of a GPU: its model ("h100", "a100", "rtx4090", ...) or ``sm<cc>``."""
    match = re.search(r"\b(h\d{3}|gh\d{3}|b\d{3}|a\d{2,3}|l40s?|l4|v100|t4|rtx\s?\d{4})\b", name.lower())
    if match:
        return match.group(1).replace(" ", "")
    return f"sm{capability[0]}{capability[1]}"


@dataclass(frozen=True)
class DeviceModel:
    """SM count and occupancy of the kernels on one device, with its family's calibration."""

    name: str
    family: str
    sm_count: int
    calibration: Calibration
    cuda_index: int | None  # None: no CUDA device, occupancy from the calibration's defaults
    l2_bytes: int = DEFAULT_L2_BYTES

    def launch(self, path: str, n: int, dtype: torch.dtype = torch.float32, windows: int | None = None):
        """(warps of ``path``'s kernel resident per SM, warps per row window or chunk along N) at
        N = ``n`` for X of ``dtype`` on a matrix of ``windows`` row windows (None: a large one)."""
        if self.cuda_index is None:
            return int(self.calibration.occupancy[path]), default_column_slices(n, dtype)
        return _launch_shape(self.cuda_index, path, n, dtype, windows, _tf32_allowed())

    def resident(self, path: str, n: int, dtype: torch.dtype = torch.float32, windows: int | None = None) -> int:
        return self.launch(path, n, dtype, windows)[0]

    def slices(self, path: str, n: int, dtype: torch.dtype = torch.float32, windows: int | None = None) -> int:
        return self.launch(path, n, dtype, windows)[1]


def _tf32_allowed() -> bool:
    from . import kernels

    return kernels.tf32_allowed()


@functools.lru_cache(maxsize=4096)
def _launch_shape(cuda_index: int, path: str, n: int, dtype: torch.dtype, windows: int | None, tf32: bool):
    """(resident warps per SM, column slices) of the compiled kernel, asked once per shape: the
    query is an op call under a device guard, too slow to repeat for every candidate of every
    choice. ``tf32`` is part of the key because the exact fp32 variant has its own shape."""
    from . import kernels

    windows = windows or kernels.MANY_WINDOWS
    with torch.cuda.device(cuda_index):
        return (int(kernels.occupancy(path, n, dtype, windows)), int(kernels.column_slices(path, n, dtype, windows)))


@functools.lru_cache(maxsize=None)
def _device_model(device: torch.device) -> DeviceModel:
    if device.type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device() if device.index is None else device.index
        props = torch.cuda.get_device_properties(index)
        family = gpu_family(props.name, (props.major, props.minor))
        l2_bytes = int(getattr(props, "L2_cache_size", 0)) or DEFAULT_L2_BYTES
        return DeviceModel(props.name, family, props.multi_processor_count, Calibration.load(family), index, l2_bytes)
    calibration = Calibration.load("default")
    return DeviceModel(
        "no CUDA device (documented defaults)", "default", calibration.sm_count, calibration, None, calibration.l2_bytes
    )


def device_model(device=None) -> DeviceModel:
    """The model of ``device`` (a CUDA device, or the defaults of ``calibration/default.json``)."""
    return _device_model(torch.device("cpu" if device is None else device))


# Ranking.


@dataclass(frozen=True)
class Explanation:
    """Why a path was chosen for one (matrix, N bucket, dtype, device); ``str()`` reads it out."""

    choice: str
    reason: str
    n: int
    dtype: torch.dtype
    device: str
    calibration: str
    features: dict
    slots: dict
    makespans_us: dict
    ar: float
    ar_threshold: float
    costs_us: dict
    bytes_moved: dict
    candidates: tuple = field(default=CHOICES)
    measured_us: dict = field(default_factory=dict)  # median us per path, once the choice was measured

    @property
    def ar_kernel(self) -> str:
        """DTC-SpMM's choice between the Tensor-Core kernels: balanced when AR > threshold."""
        return "balanced" if self.ar > self.ar_threshold else "base"

    def __str__(self) -> str:
        def row(mapping, fmt):
            return ", ".join(f"{key}={fmt(value)}" for key, value in mapping.items())

        return "\n".join(
            [
                f"choice: {self.choice} ({self.reason})",
                f"N={self.n} dtype={self.dtype} device={self.device} calibration={self.calibration}",
                f"features: {row(self.features, _number)}",
                f"slots (SMs x resident blocks): {row(self.slots, str)}",
                f"simulated makespan (us): {row(self.makespans_us, lambda v: f'{v:.1f}')}",
                f"approximation ratio AR = {self.ar:.3f} (threshold {self.ar_threshold:.3f}) -> {self.ar_kernel}",
                f"predicted time (us): {row(self.costs_us, lambda v: f'{v:.1f}')}",
                f"bytes moved (MB): {row(self.bytes_moved, lambda v: f'{v / 1e6:.2f}')}",
                f"candidates: {', '.join(self.candidates)}",
            ]
            + ([f"measured (us, median of the first product's samples): {row(self.measured_us, lambda v: f'{v:.1f}')}"]
               if self.measured_us else [])
        )


def _number(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


class Prediction(NamedTuple):
    """The simulated launches and predicted time of every path for one (matrix, N, dtype)."""

    slices: dict  # kernel path -> warps per window along N
    slots: dict  # kernel path -> SMs x resident warps
    base: tuple  # (makespan, work) in TC-block units
    balanced: BalancedLaunch
    miss: float  # share of X beyond L2
    device_us: dict  # path -> predicted device time
    costs_us: dict  # path -> predicted time of a call, at least its host floor
    constants: dict  # path -> the calibration's constants used


def predict(shape: MatrixShape, n: int, model: DeviceModel, dtype=torch.float32) -> Prediction:
    """Simulate both kernels' launches for ``shape`` times an [K, n] operand on ``model``'s device
    and predict the time of every path (see the module docstring for the model)."""
    calibration = model.calibration
    constants = {path: calibration.constants(path, n, dtype) for path in CHOICES}
    base, balanced, csr = constants["base"], constants["balanced"], constants["csr"]
    kernel_dtype = dtype if dtype in KERNEL_DTYPES else torch.float32
    windows = shape.num_windows
    launches = {path: model.launch(path, n, kernel_dtype, windows) for path in KERNEL_CHOICES}
    slices = {path: max(1, launch[1]) for path, launch in launches.items()}
    slots = {path: model.sm_count * max(1, launch[0]) for path, launch in launches.items()}

    base_units, base_work = base_makespan_units(shape, slices["base"], slots["base"], base["block_units"])
    launch = balanced_makespan_units(
        shape, slices["balanced"], slots["balanced"], balanced["segment_units"], balanced["split_units"]
    )
    miss = l2_miss_fraction(shape.num_cols, n, torch.finfo(dtype).bits // 8, model.l2_bytes)
    device_us = {
        "base": kernel_time_us(base, base_units, base_work, slots["base"], miss),
        "balanced": kernel_time_us(balanced, launch.makespan, launch.work, slots["balanced"], miss)
        + balanced["zero_us"] * launch.zeroed_windows * shape.window,
        "csr": _csr_time_us(csr, shape, shape.max_row_nnz, miss),
        "rows": _rows_time_us(constants["rows"], shape, miss),
    }
    # A call never costs less than its host-side floor (Python, dispatch, launch), which is all
    # that small graphs cost: back-to-back calls then run at the rate the host issues them.
    costs = {path: max(constants[path].get("floor_us", 0.0), us) for path, us in device_us.items()}
    return Prediction(slices, slots, (base_units, base_work), launch, miss, device_us, costs, constants)


def _csr_time_us(constants: dict, shape: MatrixShape, longest: int, miss: float) -> float:
    return (
        constants["launch_us"]
        + constants["nnz_us"] * shape.nnz
        + constants["row_us"] * shape.rows
        + constants["max_row_us"] * longest
        + constants.get("miss_nnz_us", 0.0) * shape.nnz * miss
    )


def _rows_time_us(constants: dict, shape: MatrixShape, miss: float) -> float:
    split_launch = constants.get("split_launch_us", 0.0) if shape.split_rows else 0.0
    in_order = 1.0 - ROWS_ORDER_GAIN * (1.0 - shape.rows_share_ratio)
    return _csr_time_us(constants, shape, min(shape.max_row_nnz, csr_rows.PIECE_NNZ), miss) * in_order + split_launch


def approximation_ratio(shape: MatrixShape, prediction: Prediction) -> float:
    """DTC-SpMM's AR: base's makespan over balanced's with the same per-block costs for both, so it
    measures only what balancing does to the schedule; the threshold accounts for the atomics and
    the extra zeroing pass."""
    block_units = prediction.constants["base"]["block_units"]
    slices, slots = prediction.slices["balanced"], prediction.slots["balanced"]
    same_cost = balanced_makespan_units(shape, slices, slots, block_units, 0.0).makespan
    return prediction.base[0] / same_cost if same_cost > 0 else 1.0


def select(shape: MatrixShape, n: int, model: DeviceModel, candidates=CHOICES, dtype=torch.float32) -> str:
    """The path ``rank`` would choose, without building its explanation."""
    return predicted_choice(shape, n, model, candidates, dtype)[0]


def predicted_choice(shape: MatrixShape, n: int, model: DeviceModel, candidates=CHOICES, dtype=torch.float32):
    """``select``'s path and the predicted cost of every path (what a product pays for on its
    first call at an N bucket)."""
    prediction = predict(shape, n, model, dtype)
    ar = approximation_ratio(shape, prediction) if model.calibration.kernel_rule == "ar" else None
    return _decide(candidates, prediction.costs_us, ar, shape.tc_blocks, model.calibration)[0], prediction.costs_us


def rank(shape: MatrixShape, n: int, model: DeviceModel, candidates=CHOICES, dtype=torch.float32) -> Explanation:
    """Simulate and cost every path for ``shape`` times an [K, n] operand on ``model``'s device,
    restricted to ``candidates``, and explain the choice."""
    prediction = predict(shape, n, model, dtype)
    ar = approximation_ratio(shape, prediction)
    base, slices, slots, launch = prediction.constants["base"], prediction.slices, prediction.slots, prediction.balanced
    base_units, base_work = prediction.base
    balanced = prediction.constants["balanced"]
    zeroed_rows = launch.zeroed_windows * shape.window
    makespans = {
        "base": prediction.device_us["base"] - base["launch_us"],
        "balanced": prediction.device_us["balanced"] - balanced["launch_us"] - balanced["zero_us"] * zeroed_rows,
        "base_perfect_balance": base["unit_us"] * base_work / slots["base"],
    }

    windows, blocks = shape.num_windows, shape.tc_blocks
    value_bytes = torch.finfo(dtype).bits // 8
    # Each column slice reads the sparse data again (fp32 values; per block its columns and bitmap).
    gather = blocks * 8 * n * value_bytes + slices["base"] * (shape.nnz * 4 + blocks * (8 * 4 + 16))
    write = windows * shape.window * n * value_bytes
    bytes_moved = {
        "base": gather + write,
        "balanced": gather + write + 2 * zeroed_rows * n * value_bytes,
        "csr": shape.nnz * (n * value_bytes + 4 + value_bytes) + shape.rows * n * value_bytes,
    }
    bytes_moved["rows"] = bytes_moved["csr"]
    features = {
        "rows": shape.rows,
        "nnz": shape.nnz,
        "windows": windows,
        "tc_blocks": blocks,
        "mean_nnz_per_tc_block": shape.nnz / blocks if blocks else 0.0,
        "blocks_per_window_mean": blocks / windows if windows else 0.0,
        "blocks_per_window_max": shape.summary.max_blocks,
        "windows_over_32_blocks": shape.summary.split_windows,
        "balanced_zeroed_windows": launch.zeroed_windows,
        "max_row_nnz": shape.max_row_nnz,
        "split_rows": shape.split_rows,
        "rows_share_ratio": shape.rows_share_ratio,
        "column_slices": slices["base"],
        "x_share_beyond_l2": prediction.miss,
    }
    calibration = model.calibration
    choice, reason = _decide(candidates, prediction.costs_us, ar, blocks, calibration)
    return Explanation(
        choice=choice, reason=reason, n=n, dtype=dtype, device=model.name, calibration=calibration.source,
        features=features, slots=slots, makespans_us=makespans, ar=ar, ar_threshold=calibration.ar_threshold,
        costs_us=prediction.costs_us, bytes_moved=bytes_moved, candidates=tuple(candidates),
    )


def _decide(candidates, costs: dict, ar: float | None, blocks: int, calibration: Calibration) -> tuple[str, str]:
    """``_decide_tc_or_csr``'s choice, or "rows" where it may run and is predicted at least the
    calibration's ``rows_margin`` faster."""
    choice, reason = _decide_tc_or_csr(candidates, costs, ar, blocks, calibration)
    if "rows" in candidates and costs["rows"] < (1.0 - calibration.rows_margin) * costs[choice]:
        return "rows", f"{reason}; rows predicted faster still ({costs['rows']:.1f} us)"
    return choice, reason


def _decide_tc_or_csr(candidates, costs: dict, ar: float | None, blocks: int, calibration: Calibration):
    """The calibration's kernel rule between the kernels, then csr unless the kernel is predicted
    at least its ``csr_margin`` faster. ``ar`` may be None when the rule does not need it."""
    ar_text = "" if ar is None else f" (AR {ar:.2f})"
    if calibration.kernel_rule == "cost":
        kernel = min(KERNEL_CHOICES, key=costs.get)
        rule_reason = f"{kernel} predicted faster of the kernels{ar_text}"
    else:
        threshold = calibration.ar_threshold
        kernel = "balanced" if ar > threshold else "base"
        rule_reason = f"AR {ar:.2f} {'>' if kernel == 'balanced' else '<='} {threshold:.2f}"
    if blocks == 0:
        return "csr", "the matrix has no TC blocks"
    if kernel not in candidates:
        return "csr", "the Tensor-Core kernels cannot run on this device and dtype"
    margin = calibration.csr_margin[kernel]
    if "csr" in candidates and costs[kernel] > (1.0 - margin) * costs["csr"]:
        return "csr", (
            f"{rule_reason} picks {kernel}, but csr is predicted faster or too close "
            f"({costs['csr']:.1f} vs {costs[kernel]:.1f} us, margin {margin:.0%})"
        )
    return kernel, f"{rule_reason}; predicted {costs[kernel]:.1f} us vs csr {costs['csr']:.1f} us"


def _kernels_usable(dtype: torch.dtype, device: torch.device) -> bool:
    if device.type != "cuda" or dtype not in KERNEL_DTYPES:
        return False
    from . import kernels

    return kernels.available()


def explain(layout: MetcfLayout, n: int, dtype: torch.dtype = torch.float32, device=None) -> Explanation:
    """Features, simulated makespans, predicted costs and the choice for ``layout`` at N = ``n``
    (computed at ``n_bucket(n)``, the N the choice is cached for)."""
    return explain_shape(MatrixShape.of(layout), n, dtype, torch.device(layout.device if device is None else device))


def explain_shape(shape: MatrixShape, n: int, dtype: torch.dtype, device: torch.device) -> Explanation:
    """``explain`` from a shape already on the host (what a cached choice reuses)."""
    return rank(shape, n_bucket(n), device_model(device), _candidates(dtype, device, shape), dtype)


def _candidates(dtype: torch.dtype, device: torch.device, shape: MatrixShape) -> tuple:
    """Every path that can run: the kernels where built for the dtype, "rows" with them where
    the indices are int32 (under 2^31 rows, columns and nonzeros), always "csr"."""
    if not _kernels_usable(dtype, device):
        return ("csr",)
    int32_indices = index_dtype_for(shape.rows, shape.num_cols, shape.nnz) == torch.int32
    return CHOICES if int32_indices else tuple(c for c in CHOICES if c != "rows")


def choose(layout: MetcfLayout, n: int, dtype: torch.dtype, device) -> tuple[str, Explanation]:
    """The path for ``layout @ X`` with X of N = ``n`` columns, and why (uncached: see
    ``SelectionCache``). Call it where the TC kernels may run; off CUDA or for other dtypes it
    answers ``"csr"``."""
    explanation = explain(layout, n, dtype, device)
    return explanation.choice, explanation


class SelectionCache:
    """Choices for one matrix, computed once per (N bucket, dtype, device), and measured on its
    first product where the prediction leaves close candidates (``trials``); explanations built
    only when asked for. A ``Structure`` holds one; the matrix's block counts come from the host
    copies its conversion made; a reordered matrix's ``rows_share_ratio`` comes from the
    ``Structure``, which knows the order."""

    def __init__(self, rows_share_ratio: float = 1.0):
        self.rows_share_ratio = rows_share_ratio
        self._shape: MatrixShape | None = None
        self._explanations: dict = {}
        self._by_bucket: dict = {}  # (N bucket, dtype, device) -> path, or the Trial measuring it
        self._measured: dict = {}  # (N bucket, dtype, device) -> path -> median us of its trial
        self._choices: dict = {}  # (n, dtype, device) as the caller gives them -> settled path

    def _shape_of(self, layout: MetcfLayout) -> MatrixShape:
        if self._shape is None:
            self._shape = replace(MatrixShape.of(layout), rows_share_ratio=self.rows_share_ratio)
        return self._shape

    def explain(self, layout: MetcfLayout, n: int, dtype: torch.dtype, device=None) -> Explanation:
        """The prediction's explanation, with the measured times and the settled path once the
        choice has been measured."""
        device = torch.device(layout.device if device is None else device)
        key = (n_bucket(n), dtype, device)
        if key not in self._explanations:
            self._explanations[key] = self._outside_graphs(explain_shape, layout, n, dtype, device)
        explanation = self._explanations[key]
        state = self._by_bucket.get(key)
        if isinstance(state, trials.Trial):
            return replace(explanation, reason=f"{explanation.reason}; to be measured: {', '.join(state.paths)}")
        if key in self._measured:
            measured = self._measured[key]
            return replace(
                explanation, choice=state, measured_us=measured,
                reason=f"measured fastest of {', '.join(measured)} on the first product; "
                f"predicted {explanation.choice} ({explanation.reason})",
            )
        return explanation

    def choose(self, layout: MetcfLayout, n: int, dtype: torch.dtype, device=None):
        """(path, trial) of one product: the ``trials.Trial`` to run it through (``measure``)
        when this product is to measure the choice, else None."""
        # Called on every product: one dict lookup on the caller's own arguments, no bucketing
        # or device normalisation once the choice for an N has settled.
        key = (n, dtype, device)
        choice = self._choices.get(key)
        if choice is not None:
            return choice, None
        normalized = torch.device(layout.device if device is None else device)
        bucket = (n_bucket(n), dtype, normalized)
        state = self._by_bucket.get(bucket)
        if state is None:
            state = self._by_bucket[bucket] = self._outside_graphs(_first_choice, layout, n, dtype, normalized)
        if isinstance(state, trials.Trial):
            return state.paths[0], state if trials.allowed(normalized) else None
        self._choices[key] = state
        return state, None

    def measure(self, trial: trials.Trial, product):
        """Run ``trial`` on ``product(path)`` (the caller's product on each path), settle its
        bucket on the fastest path, and return the product."""
        measured, output = trial.run(product)
        self._measured[trial.key] = measured
        self._by_bucket[trial.key] = trials.fastest(measured)
        return output

    def settled(self, n: int, dtype: torch.dtype, device) -> str | None:
        """The path products with these arguments run for good, or None while it is being measured
        (or before the first product)."""
        return self._choices.get((n, dtype, device))

    def _outside_graphs(self, compute, layout: MetcfLayout, n: int, dtype: torch.dtype, device: torch.device):
        """``compute(shape, n, dtype, device)``; a layout without host copies is read back,
        outside any compiled graph (a cache hit is traceable). Decorating lazily keeps
        torch._dynamo out of the import."""
        def run():
            return compute(self._shape_of(layout), n, dtype, device)

        return torch.compiler.disable(run)() if torch.compiler.is_compiling() else run()

    def __len__(self) -> int:
        return len(self._by_bucket.keys() | self._explanations.keys())


def _first_choice(shape: MatrixShape, n: int, dtype: torch.dtype, device: torch.device):
    """The predicted path, or the ``trials.Trial`` that measures it against its close
    candidates."""
    candidates = _candidates(dtype, device, shape)
    choice, costs = predicted_choice(shape, n_bucket(n), device_model(device), candidates, dtype)
    if trials.allowed(device):
        paths = trials.shortlist(choice, costs, candidates)
        if len(paths) > 1:
            calls = tuple(trials.sample_calls(costs[path]) for path in paths)
            return trials.Trial(paths, calls, key=(n_bucket(n), dtype, device))
    return choice
