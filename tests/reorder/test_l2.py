"""The rows kernel's cache model: the stream in the kernel's time order, footprint miss ratios
against an exact LRU simulation of it, and the traffic ratio an order earns."""
from collections import OrderedDict

import pytest
import torch

from graph_data import corpus
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.reorder import l2, reorder

SMS = 132


def lru_miss_ratio(stream, capacity):
    cache, misses = OrderedDict(), 0
    for x in stream:
        if x in cache:
            cache.move_to_end(x)
        else:
            misses += 1
            cache[x] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return misses / len(stream)


def graph(family, nnz=20_000):
    row, col, n = corpus.generate(family, nnz, seed=torch.initial_seed() % 2**31)
    return from_coo(row, col, None, n, n)


def kernel_stream(csr, perm, piece_nnz, in_flight):
    """Written out one access at a time: the rows longer than ``piece_nnz`` as pieces first (every
    first piece, then every second, ...), then the other rows in the order ``perm``; the k-th
    column of the i-th of these read at (nonzeros before it) + k * in_flight, ties in start order."""
    lengths = [int(csr.rowptr[r + 1] - csr.rowptr[r]) for r in perm.tolist()]
    long_rows = [(r, d) for r, d in zip(perm.tolist(), lengths) if d > piece_nnz]
    items = []
    for rank in range(max((d for _, d in long_rows), default=0) // piece_nnz + 1):
        for r, d in long_rows:
            if rank * piece_nnz < d:
                start = int(csr.rowptr[r]) + rank * piece_nnz
                items.append((start, min(piece_nnz, d - rank * piece_nnz)))
    items += [(int(csr.rowptr[r]), d) for r, d in zip(perm.tolist(), lengths) if d <= piece_nnz]
    accesses, begin = [], 0
    for index, (start, size) in enumerate(items):
        accesses += [(begin + k * in_flight, index, int(csr.col[start + k])) for k in range(size)]
        begin += size
    return [column for _, _, column in sorted(accesses)]


def test_stream_follows_the_kernel_order():
    # Rows 0 and 2 are longer than the 32-nonzero pieces of a small graph: their pieces go first.
    lengths = [70, 3, 40, 5]
    rows = torch.arange(4).repeat_interleave(torch.tensor(lengths))
    cols = torch.cat([torch.arange(d) for d in lengths])
    csr = from_coo(rows, cols, None, 4, 100)
    perm = torch.tensor([3, 2, 1, 0])
    for in_flight in (1, 3):
        traffic = l2.XTraffic(csr.rowptr, csr.col, 100, perm, SMS)
        assert traffic.piece_nnz == 32
        stream = l2._timed_stream(csr.col, traffic.items, in_flight, [0], 10**6)
        assert stream.flatten().tolist() == kernel_stream(csr, perm, 32, in_flight)


@pytest.mark.parametrize("family, method", [("mesh2d", "none"), ("mesh2d", "community"), ("sbm", "none"),
                                            ("powerlaw", "degree"), ("rmat", "none")])
@pytest.mark.parametrize("in_flight", [1, 64])
def test_miss_ratio_matches_exact_lru(family, method, in_flight):
    csr = graph(family)
    perm = reorder(csr, method)
    traffic = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, perm, SMS)
    stream = kernel_stream(csr, perm, traffic.piece_nnz, in_flight)
    for capacity in (csr.num_cols // 32, csr.num_cols // 8, csr.num_cols // 2):
        expected = lru_miss_ratio(stream, capacity)
        assert traffic.miss_ratio(capacity, in_flight) == pytest.approx(expected, abs=0.04)


def test_sampled_segments_stay_close(monkeypatch):
    csr = graph("mesh2d", 60_000)
    perm = reorder(csr, "community")
    full = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, perm, SMS)
    expected = [full.miss_ratio(c, 16) for c in (200, 1000)]
    monkeypatch.setitem(l2.SAMPLE_NNZ, "cpu", 16_000)
    sampled = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, perm, SMS)
    # A window of time holds about its length in accesses (fewer where rows start, at time 0).
    assert 0.95 * 16_000 // l2.SEGMENTS <= sampled.fp(16).numel() - 1 <= 16_000 // l2.SEGMENTS
    assert [sampled.miss_ratio(c, 16) for c in (200, 1000)] == pytest.approx(expected, abs=0.05)


def test_rows_in_flight_follow_the_warp_slots():
    # float32: 4 rows a warp at N = 32, 2 at 64, 1 from 128 on; 16-bit halves the bytes of a row.
    warps = SMS * l2.RESIDENT_WARPS_PER_SM
    assert [l2.rows_in_flight(n, 4, SMS) for n in (16, 32, 64, 128, 256)] == [8 * warps, 4 * warps, 2 * warps,
                                                                             warps, warps]
    assert l2.rows_in_flight(64, 2, SMS) == 4 * warps


def test_degree_order_reads_hub_columns_together():
    # On a Kronecker graph the rows of equal length, side by side in degree order, reach the hub
    # columns they share at about the same time: with many rows in flight, degree order misses
    # less than the shuffled ids.
    csr = graph("rmat", 1_000_000)
    given = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, None, SMS)
    ordered = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, reorder(csr, "degree"), SMS)
    capacity = csr.num_cols / 16
    assert ordered.miss_ratio(capacity, 1024) < 0.85 * given.miss_ratio(capacity, 1024)


def test_x_within_cache_costs_compulsory_misses_only():
    csr = graph("uniform")
    shuffled = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, torch.randperm(csr.num_rows), SMS)
    assert shuffled.miss_ratio(csr.num_cols) == pytest.approx(csr.num_cols / csr.nnz)
    given = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, None, SMS)
    assert shuffled.bytes(128, 4, l2_bytes=1 << 30) == given.bytes(128, 4, l2_bytes=1 << 30)
    # The time differs only by the slots a row order holds idle, which a random order of
    # near-equal rows moves by a few parts per million.
    assert l2.rows_time_ratio(given, shuffled, 128, 4, l2_bytes=1 << 30) == pytest.approx(1.0, rel=1e-4)


def test_locality_order_lowers_the_rows_traffic():
    csr = graph("mesh2d", 60_000)
    given = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, None, SMS)
    ordered = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, reorder(csr, "community"), SMS)
    # X is 10x the cache at N = 128, and a small device keeps few rows in flight.
    small_l2 = int(128 * 4 * csr.num_cols / 10 / l2.L2_SHARE)
    small = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, None, 2)
    small_ordered = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, ordered.perm, 2)
    assert l2.rows_time_ratio(small, small_ordered, 128, 4, small_l2) < 0.8
    assert given.miss_ratio(csr.num_cols / 10) > 3 * ordered.miss_ratio(csr.num_cols / 10)


def test_empty_matrix():
    empty = from_coo(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, 5, 5)
    traffic = l2.XTraffic(empty.rowptr, empty.col, 5, None, SMS)
    assert traffic.miss_ratio(1) == 0.0
    assert l2.rows_time_ratio(traffic, traffic, 32, 4, 1 << 20) == 1.0


def test_idle_slots_of_mixed_lengths():
    # Blocks of 2 slots: lengths (1, 3) hold 6 slot-steps for 4 busy ones; sorted by length,
    # (3, 3) and (1, 1) hold none idle.
    rows = torch.tensor([0, 1, 1, 1, 2, 3, 3, 3])
    csr = from_coo(rows, torch.arange(8), None, 4, 8)
    given = l2.XTraffic(csr.rowptr, csr.col, 8, None, SMS)
    assert given.idle_share(2) == pytest.approx(0.5)
    ordered = l2.XTraffic(csr.rowptr, csr.col, 8, reorder(csr, "degree", symmetric=False), SMS)
    assert ordered.idle_share(2) == 0.0
