"""The rows kernel's cache model: footprint miss ratios against an exact LRU simulation, and the
traffic ratio an order earns."""
from collections import OrderedDict

import pytest
import torch

from graph_data import corpus
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.reorder import l2, reorder


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


def stream_of(csr, perm):
    return torch.cat([csr.col[csr.rowptr[i]:csr.rowptr[i + 1]] for i in perm.tolist()]).tolist()


@pytest.mark.parametrize("family, method", [("mesh2d", "none"), ("mesh2d", "community"), ("sbm", "none"),
                                            ("powerlaw", "degree")])
def test_miss_ratio_matches_exact_lru(family, method):
    csr = graph(family)
    perm = reorder(csr, method)
    traffic = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, perm)
    stream = stream_of(csr, perm)
    for capacity in (csr.num_cols // 32, csr.num_cols // 8, csr.num_cols // 2):
        assert traffic.miss_ratio(capacity) == pytest.approx(lru_miss_ratio(stream, capacity), abs=0.04)


def test_sampled_segments_stay_close(monkeypatch):
    csr = graph("mesh2d", 60_000)
    perm = reorder(csr, "community")
    full = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, perm)
    expected = [full.miss_ratio(c) for c in (200, 1000)]
    monkeypatch.setitem(l2.SAMPLE_NNZ, "cpu", 16_000)
    sampled = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, perm)
    assert sampled.fp.numel() == 16_000 // l2.SEGMENTS + 1
    assert [sampled.miss_ratio(c) for c in (200, 1000)] == pytest.approx(expected, abs=0.05)


def test_x_within_cache_costs_compulsory_misses_only():
    csr = graph("uniform")
    shuffled = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, torch.randperm(csr.num_rows))
    assert shuffled.miss_ratio(csr.num_cols) == pytest.approx(csr.num_cols / csr.nnz)
    given = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, None)
    assert l2.rows_time_ratio(given, shuffled, 128, 4, l2_bytes=1 << 30) == 1.0


def test_locality_order_lowers_the_rows_traffic():
    csr = graph("mesh2d", 60_000)
    given = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, None)
    ordered = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, reorder(csr, "community"))
    small_l2 = 2 * 128 * 4 * csr.num_cols // 20  # X is 10x the cache at N = 128
    assert l2.rows_time_ratio(given, ordered, 128, 4, small_l2) < 0.7
    assert given.miss_ratio(csr.num_cols / 10) > 3 * ordered.miss_ratio(csr.num_cols / 10)


def test_empty_matrix():
    empty = from_coo(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, 5, 5)
    traffic = l2.XTraffic(empty.rowptr, empty.col, 5, None)
    assert traffic.miss_ratio(1) == 0.0
    assert l2.rows_time_ratio(traffic, traffic, 32, 4, 1 << 20) == 1.0
