"""How many bytes of X the CUDA-core rows kernel fetches from DRAM in a given row order.

The rows kernel gathers one row of X per nonzero, rows taken in the matrix's order (a reordered
matrix runs on its row-permuted CSR). Where X is larger than L2, the bytes it fetches from DRAM
depend on how soon a row of X is needed again: the column stream's locality, which is what a
row order changes. ``XTraffic`` estimates it with a cache model of the stream:

- The stream, in the kernel's time order. Rows longer than the piece size (``csr_rows``) run
  first as pieces, every long row's first piece, then every second piece, ...; then the other
  rows in order. Thousands of warps run at once (``RESIDENT_WARPS_PER_SM`` per SM, each on
  ``32 / lanes`` rows at a time), each walking its row's columns in CSR order at about the same
  pace, so the k-th column of the i-th row or piece is read at about ``start_i + k * P``, with
  ``start_i`` the nonzeros before it (``P`` rows in flight, one access per unit of time in
  all). Rows running side by side thus read their columns together: two rows of equal length
  reach a column they share at the same time, ascending column ids, and find it in L2 (degree
  order lines up the hubs' lists, which share the hub columns); a short row beside a long one
  passes its shared columns long before the long one gets there. A stream taken one row after
  another sees neither.
- The cache: fully associative LRU over rows of X, holding ``L2_SHARE`` of the device's L2 (the
  rest holds the streamed A and Y, and the partitioned, set-associative L2 keeps less than LRU
  would). Its miss ratio at every capacity at once comes from the stream's average footprint
  (Xiang et al., "HOTL: a higher order theory of locality", ASPLOS'13): fp(w), the mean number
  of distinct columns in a window of w accesses, follows in linear time from the histogram of
  reuse times and first/last access times; a cache of c rows misses at the rate
  fp(w + 1) - fp(w) where fp(w) = c. One pass prices every N with the same rows in flight.
- The sample: at most ``SAMPLE_NNZ`` accesses, in ``SEGMENTS`` evenly spaced windows of time
  (footprints averaged), so the cost is two sorts of the sample whatever the matrix's size: a
  few milliseconds on a GPU, a fraction of a second on a CPU core (``SAMPLE_NNZ`` on a CPU is an
  eighth of the GPU's). Where a segment is too short to fill the cache, the rate of new columns
  over the last reliable windows (w up to half the segment) stands for the steady state: an
  over-estimate of misses, alike for every order.

A product's traffic is then A (column index and value per nonzero, row pointers), Y, the X rows
fetched from DRAM, and the X rows served by L2 at ``HIT_COST`` of a DRAM byte (L2 bandwidth is a
few times HBM's, not infinite, and a gather crosses the L2's partitions). ``rows_time_ratio``
scales the rows kernel's predicted time by the traffic in an order over the traffic as given
(the kernel streams at bandwidth where X exceeds L2, the regime where the order matters), and by
the slots it holds idle: a block of 8 warps keeps its slots until its longest row or piece ends,
so rows of mixed lengths side by side leave fewer gathers in flight (``IDLE_COST`` per unit of
idle over busy slot time; degree order leaves none).

``L2_SHARE``, ``HIT_COST`` and ``IDLE_COST`` are fitted on the corpus's "fit" families only
(``graph_data.corpus.SPLIT``), never on "unseen" ones, so that "unseen" stays a test of them: the
rows kernel's times on an H200 at N = 128 in the orders measured there (R-MAT scales 18 and 21 in
degree order, R-MAT 18 and a uniform graph in TCA order, the shuffled SBM in its planted order
and in degree order), within 1.3% rms of the seven ratios (docs/DECISIONS.md). The kernel's
resident warps and slots are its own, not fitted. ``benchmarks/reorder.py`` prints the estimate
next to the measured time per order.
"""
from __future__ import annotations

import torch

from .. import csr_rows

L2_SHARE = 0.3
HIT_COST = 0.55
IDLE_COST = 0.03
SAMPLE_NNZ = {"cuda": 1 << 23, "cpu": 1 << 20}
SEGMENTS = 4
# csr_rows_spmm.cu launches 8 warps per block with at least 5 blocks resident per SM (its
# launch bounds for float32 and packs of 16-bit elements).
RESIDENT_WARPS_PER_SM = 40
WARPS_PER_BLOCK = 8
# Bytes of a row of X each lane reads per nonzero, and lanes per warp (csr_rows_spmm.cu).
LANE_BYTES = 16
WARP_LANES = 32


def _slots(n: int, value_bytes: int) -> int:
    """Rows a warp walks at once at width ``n``: ``32 / L`` slots, ``L`` the fewest lanes (a
    power of two) whose 16 bytes cover a row of X."""
    lanes = 1
    while lanes < WARP_LANES and lanes * LANE_BYTES < n * value_bytes:
        lanes *= 2
    return WARP_LANES // lanes


def rows_in_flight(n: int, value_bytes: int, sm_count: int) -> int:
    """Rows (or pieces) the rows kernel walks at once at width ``n``."""
    return sm_count * RESIDENT_WARPS_PER_SM * _slots(n, value_bytes)


def _work_items(rowptr: torch.Tensor, perm: torch.Tensor | None, piece_nnz: int):
    """(first nonzero, length) of every piece and row, in the order the kernel starts them:
    the pieces of the rows longer than ``piece_nnz`` by rank (every long row's first piece, then
    every second piece, ...; ``csr_rows.row_pieces``), then the other rows in the order ``perm``."""
    device = rowptr.device
    degree = (rowptr[1:] - rowptr[:-1]).long()
    order = torch.arange(degree.numel(), device=device) if perm is None else perm.long()
    length, first = degree[order], rowptr.long()[order]
    split = length > piece_nnz
    if not bool(split.any()):
        return first, length
    long_length, long_first = length[split], first[split]
    count = (long_length + piece_nnz - 1) // piece_nnz
    slot = torch.arange(long_length.numel(), device=device).repeat_interleave(count)
    rank = torch.arange(slot.numel(), device=device) - (torch.cumsum(count, 0) - count).repeat_interleave(count)
    by_rank = torch.argsort(rank * long_length.numel() + slot)
    slot, rank = slot[by_rank], rank[by_rank]
    piece_first = long_first[slot] + rank * piece_nnz
    piece_length = (long_length[slot] - rank * piece_nnz).clamp_(max=piece_nnz)
    short = ~split
    return torch.cat([piece_first, first[short]]), torch.cat([piece_length, length[short]])


def _timed_stream(col: torch.Tensor, items: tuple, in_flight: int, starts: list, length: int) -> torch.Tensor:
    """The columns the kernel reads, of the work ``items`` (``_work_items``), in the windows of
    time [start, start + length) (units: one access of all the rows in flight together), in time
    order: [segments, accesses]."""
    device = col.device
    first, size = items
    begin = torch.cumsum(size, 0) - size
    longest = int(size.max()) if size.numel() else 0
    streams = []
    for start in starts:
        # Items reading in the window began before its end and less than a whole item before it.
        low = int(torch.searchsorted(begin, torch.tensor(start - longest * in_flight, device=device)))
        high = int(torch.searchsorted(begin, torch.tensor(start + length, device=device)))
        b, f, s = begin[low:high], first[low:high], size[low:high]
        # The k-th access of an item is at b + k * in_flight: its accesses inside the window.
        k_low = torch.div(start - b + in_flight - 1, in_flight, rounding_mode="floor").clamp_(min=0)
        k_high = torch.minimum(s, torch.div(start + length - b + in_flight - 1, in_flight, rounding_mode="floor"))
        count = (k_high - k_low).clamp_(min=0)
        item = torch.arange(count.numel(), device=device).repeat_interleave(count)
        k = torch.arange(item.numel(), device=device) - (torch.cumsum(count, 0) - count)[item] + k_low[item]
        order = torch.argsort(b[item] + k * in_flight, stable=True)
        streams.append(col.long()[(f[item] + k)[order]])
    shortest = min(stream.numel() for stream in streams)
    return torch.stack([stream[:shortest] for stream in streams])


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
    """The footprints of one row order's stream in the kernel's time order, priced for any N and
    value size; ``sm_count`` is the device's."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, num_cols: int, perm: torch.Tensor | None,
                 sm_count: int):
        self.rowptr, self.col, self.perm = rowptr, col, perm
        self.nnz, self.num_rows, self.num_cols = col.numel(), rowptr.numel() - 1, num_cols
        self.sm_count = sm_count
        degree = rowptr[1:] - rowptr[:-1]
        longest = int(degree.max()) if degree.numel() else 0
        # The kernel's piece size for float32 X: the orders are priced in float32 (auto.VALUE_BYTES).
        self.piece_nnz = csr_rows.split_piece_nnz(self.nnz, longest, torch.float32)
        self._fp, self._idle, self._items = {}, {}, None

    @property
    def items(self) -> tuple:
        """The kernel's work items in this order (``_work_items``), built once."""
        if self._items is None:
            self._items = _work_items(self.rowptr, self.perm, self.piece_nnz)
        return self._items

    def fp(self, in_flight: int) -> torch.Tensor:
        """The sampled stream's average footprint with ``in_flight`` rows at once, built on first
        need: only where X exceeds the cache at some N does the order matter."""
        if in_flight not in self._fp:
            budget = SAMPLE_NNZ["cuda" if self.col.is_cuda else "cpu"]
            segments = 1 if self.nnz <= budget else SEGMENTS
            length = min(self.nnz, budget // segments)
            starts = [k * (self.nnz - length) // max(segments - 1, 1) for k in range(segments)]
            if segments == 1:
                # Every access: the last item starts before time nnz and reads at most nnz columns.
                length = (self.nnz + 1) * (in_flight + 1)
            stream = _timed_stream(self.col, self.items, in_flight, starts, length)
            self._fp[in_flight] = _footprints(stream).cpu()
        return self._fp[in_flight]

    def miss_ratio(self, capacity_rows: float, in_flight: int = 1) -> float:
        """Share of the gathers that miss a fully associative LRU cache of ``capacity_rows`` rows
        of X, ``in_flight`` rows walked at once (1: one row after another)."""
        if self.nnz == 0:
            return 0.0
        compulsory = min(self.num_cols, self.nnz) / self.nnz
        if self.num_cols <= capacity_rows:
            return compulsory
        fp = self.fp(in_flight)
        # fp(w) averages the L - w + 1 windows of a segment: near w = L it rests on a handful of
        # windows and its steps are noise. Past the half, where at least L / 2 windows agree, the
        # rate of new columns over the last reliable quarter of windows stands for the steady state.
        reliable = (fp.numel() - 1) // 2
        w = int(torch.searchsorted(fp[:reliable + 1], torch.tensor([capacity_rows], dtype=torch.float64)))
        if w < reliable:
            return max(compulsory, float(fp[w + 1] - fp[w]))
        span = max(reliable // 4, 1)
        return max(compulsory, float(fp[reliable] - fp[reliable - span]) / span)

    def idle_share(self, slots_per_block: int) -> float:
        """Slot time held idle over busy: a block keeps its slots until its longest row or piece
        ends, so ``slots_per_block`` consecutive items cost the longest one's length each."""
        if slots_per_block not in self._idle:
            _, size = self.items
            busy = int(size.sum())
            if busy == 0:
                self._idle[slots_per_block] = 0.0
            else:
                padded = torch.nn.functional.pad(size, (0, (-size.numel()) % slots_per_block))
                held = int(padded.view(-1, slots_per_block).amax(1).sum()) * slots_per_block
                self._idle[slots_per_block] = held / busy - 1
        return self._idle[slots_per_block]

    def cost(self, n: int, value_bytes: int, l2_bytes: int) -> float:
        """``bytes``, raised by ``IDLE_COST`` per unit of ``idle_share``: slots held idle leave
        fewer gathers in flight."""
        idle = self.idle_share(WARPS_PER_BLOCK * _slots(n, value_bytes))
        return self.bytes(n, value_bytes, l2_bytes) * (1 + IDLE_COST * idle)

    def bytes(self, n: int, value_bytes: int, l2_bytes: int) -> float:
        """Bytes a product with ``n`` columns of ``value_bytes`` moves, L2 hits at ``HIT_COST``."""
        row_bytes = n * value_bytes
        miss = self.miss_ratio(L2_SHARE * l2_bytes / row_bytes, rows_in_flight(n, value_bytes, self.sm_count))
        a_bytes = self.nnz * (4 + value_bytes) + (self.num_rows + 1) * 4
        y_bytes = self.num_rows * row_bytes
        gathered = self.nnz * row_bytes
        return a_bytes + y_bytes + gathered * (miss + HIT_COST * (1 - miss))


def rows_time_ratio(given: XTraffic, ordered: XTraffic, n: int, value_bytes: int, l2_bytes: int) -> float:
    """The rows kernel's time in the order of ``ordered`` over its time as given."""
    base = given.cost(n, value_bytes, l2_bytes)
    return ordered.cost(n, value_bytes, l2_bytes) / base if base > 0 else 1.0
