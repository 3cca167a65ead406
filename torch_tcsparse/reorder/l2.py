"""How many bytes of X the CUDA-core rows kernel fetches from DRAM in a given row order.

The rows kernel gathers one row of X per nonzero, rows taken in the matrix's order (a reordered
matrix runs on its row-permuted CSR). Where X is larger than L2, the bytes it fetches from DRAM
depend on how soon a row of X is needed again: the column stream's locality, which is what a
row order changes. ``XTraffic`` estimates it with a cache model of the stream:

- The stream: the column of every nonzero, rows in the kernel's order, each row's columns in
  CSR order. Warps run side by side, so the stream is interleaved at the scale of the resident
  warps; at the scale of L2 (tens of thousands of rows of X) that changes little, and the model
  takes the stream in order.
- The cache: fully associative LRU over rows of X, holding ``L2_SHARE`` of the device's L2 (the
  rest holds the streamed A and Y). Its miss ratio at every capacity at once comes from the
  stream's average footprint (Xiang et al., "HOTL: a higher order theory of locality",
  ASPLOS'13): fp(w), the mean number of distinct columns in a window of w accesses, follows in
  linear time from the histogram of reuse times and first/last access times; a cache of c rows
  misses at the rate fp(w + 1) - fp(w) where fp(w) = c. One pass prices every N.
- The sample: at most ``SAMPLE_NNZ`` accesses, in ``SEGMENTS`` evenly spaced contiguous
  segments of the stream (footprints averaged), so the cost is one sort of the sample whatever
  the matrix's size: a few milliseconds on a GPU, a fraction of a second on a CPU core
  (``SAMPLE_NNZ`` on a CPU is an eighth of the GPU's). Where a segment is too short to fill the
  cache, the rate of new columns over the last reliable windows (w up to half the segment)
  stands for the steady state: an over-estimate of misses, alike for every order.

A product's traffic is then A (column index and value per nonzero, row pointers), Y, the X rows
fetched from DRAM, and the X rows served by L2 at ``HIT_COST`` of a DRAM byte (L2 bandwidth is a
few times HBM's, not infinite). ``rows_time_ratio`` scales the rows kernel's predicted time by
the traffic in an order over the traffic as given: the kernel streams at bandwidth where X
exceeds L2 (the regime where the order matters).

The constants are to be fitted on the corpus's "fit" families only (``graph_data.corpus.SPLIT``),
never on "unseen" ones, so that "unseen" stays a test of them; ``benchmarks/reorder.py`` prints
the estimate next to the measured time per order for that fit. The values below are the
hardware's ratios before any fit: half of L2 for X, an L2 hit at a third of a DRAM byte.
"""
from __future__ import annotations

import torch

L2_SHARE = 0.5
HIT_COST = 0.3
SAMPLE_NNZ = {"cuda": 1 << 23, "cpu": 1 << 20}
SEGMENTS = 4


def _positions(rowptr: torch.Tensor, perm: torch.Tensor | None, starts: list, length: int) -> torch.Tensor:
    """Index (into ``col``) of the nonzeros at stream positions [start, start + length) of every
    segment, rows in the order ``perm``: [segments, length]."""
    degree = (rowptr[1:] - rowptr[:-1]).long()
    order = torch.arange(degree.numel(), device=rowptr.device) if perm is None else perm.long()
    stream_ptr = torch.zeros(degree.numel() + 1, dtype=torch.long, device=rowptr.device)
    torch.cumsum(degree[order], 0, out=stream_ptr[1:])
    at = torch.tensor(starts, device=rowptr.device)[:, None] + torch.arange(length, device=rowptr.device)
    slot = torch.searchsorted(stream_ptr, at, right=True) - 1
    return rowptr.long()[order[slot]] + at - stream_ptr[slot]


def _footprints(stream: torch.Tensor) -> torch.Tensor:
    """fp(w) for w = 0..L of every segment (rows of ``stream``, [segments, L]), averaged: [L + 1]."""
    segments, length = stream.shape
    device = stream.device
    time = torch.arange(length, device=device).expand(segments, length)
    segment = torch.arange(segments, device=device)[:, None].expand(segments, length)
    width = int(stream.max()) + 1 if stream.numel() else 1
    key = (segment * width + stream) * length + time
    order = torch.argsort(key.flatten())
    column_key = (segment * width + stream).flatten()[order]
    t = time.flatten()[order]
    seg = segment.flatten()[order]
    first = torch.ones(t.numel(), dtype=torch.bool, device=device)
    first[1:] = column_key[1:] != column_key[:-1]
    last = torch.ones_like(first)
    last[:-1] = first[1:]
    # Reuse times, first access times (1-based) and reverse last access times, one histogram per
    # segment: every term of the footprint sums (x - w) over the entries x > w.
    reuse = torch.where(first, torch.zeros_like(t), t - torch.roll(t, 1))
    values = torch.cat([reuse[~first], t[first] + 1, length - t[last]])
    owner = torch.cat([seg[~first], seg[first], seg[last]])
    hist = torch.bincount(owner * (length + 1) + values, minlength=segments * (length + 1))
    hist = hist.view(segments, length + 1).double()
    x = torch.arange(length + 1, device=device, dtype=torch.float64)
    # Suffix sums over x > w of count(x) and of x * count(x).
    above_count = hist.flip(1).cumsum(1).flip(1) - hist
    above_sum = (hist * x).flip(1).cumsum(1).flip(1) - hist * x
    distinct = torch.bincount(seg[first], minlength=segments)
    windows = (length - x + 1).clamp_min(1)
    fp = distinct[:, None].double() - (above_sum - x * above_count) / windows
    return fp.mean(0)


class XTraffic:
    """The footprint of one row order's column stream, priced for any N and value size."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, num_cols: int, perm: torch.Tensor | None):
        self.rowptr, self.col, self.perm = rowptr, col, perm
        self.nnz, self.num_rows, self.num_cols = col.numel(), rowptr.numel() - 1, num_cols
        self._fp = None

    @property
    def fp(self) -> torch.Tensor:
        """The sampled stream's average footprint, built on first need: only where X exceeds the
        cache at some N does the order matter."""
        if self._fp is None:
            budget = SAMPLE_NNZ["cuda" if self.col.is_cuda else "cpu"]
            segments = 1 if self.nnz <= budget else SEGMENTS
            length = min(self.nnz, budget // segments)
            starts = [k * (self.nnz - length) // max(segments - 1, 1) for k in range(segments)]
            stream = self.col.long()[_positions(self.rowptr, self.perm, starts, length)]
            self._fp = _footprints(stream).cpu()
        return self._fp

    def miss_ratio(self, capacity_rows: float) -> float:
        """Share of the gathers that miss a fully associative LRU cache of ``capacity_rows`` rows of X."""
        if self.nnz == 0:
            return 0.0
        compulsory = min(self.num_cols, self.nnz) / self.nnz
        if self.num_cols <= capacity_rows:
            return compulsory
        fp = self.fp
        # fp(w) averages the L - w + 1 windows of a segment: near w = L it rests on a handful of
        # windows and its steps are noise. Past the half, where at least L / 2 windows agree, the
        # rate of new columns over the last reliable quarter of windows stands for the steady state.
        reliable = (fp.numel() - 1) // 2
        w = int(torch.searchsorted(fp[:reliable + 1], torch.tensor([capacity_rows], dtype=torch.float64)))
        if w < reliable:
            return max(compulsory, float(fp[w + 1] - fp[w]))
        span = max(reliable // 4, 1)
        return max(compulsory, float(fp[reliable] - fp[reliable - span]) / span)

    def bytes(self, n: int, value_bytes: int, l2_bytes: int) -> float:
        """Bytes a product with ``n`` columns of ``value_bytes`` moves, L2 hits at ``HIT_COST``."""
        row_bytes = n * value_bytes
        miss = self.miss_ratio(L2_SHARE * l2_bytes / row_bytes)
        a_bytes = self.nnz * (4 + value_bytes) + (self.num_rows + 1) * 4
        y_bytes = self.num_rows * row_bytes
        gathered = self.nnz * row_bytes
        return a_bytes + y_bytes + gathered * (miss + HIT_COST * (1 - miss))


def rows_time_ratio(given: XTraffic, ordered: XTraffic, n: int, value_bytes: int, l2_bytes: int) -> float:
    """The rows kernel's time in the order of ``ordered`` over its time as given."""
    base = given.bytes(n, value_bytes, l2_bytes)
    return ordered.bytes(n, value_bytes, l2_bytes) / base if base > 0 else 1.0
