""""auto" prices the rows kernel's L2 reuse of X, and rejects an order that slows any N."""
import torch

from graph_data import corpus
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.reorder import auto, choose, l2


def shuffled_mesh():
    row, col, n = corpus.generate("mesh2d", 60_000, seed=torch.initial_seed() % 2**31)
    return from_coo(row, col, None, n, n)


def test_auto_reorders_for_the_rows_kernel_where_x_exceeds_l2(monkeypatch):
    # A cache a hundredth of the device's: X of this 10k-node mesh exceeds it at every N.
    monkeypatch.setattr(l2, "L2_SHARE", 0.005)
    method, perm, report = choose(shuffled_mesh(), candidates=("community", "degree"))
    assert method == "community"
    assert report["methods"]["community"]["rows_time_ratio"] < 0.88
    assert report["methods"]["degree"]["rows_time_ratio"] > 0.97
    assert report["methods"]["community"]["within_guard"]


def test_auto_rejects_an_order_slower_at_another_n(monkeypatch):
    monkeypatch.setattr(l2, "L2_SHARE", 0.005)
    real = auto.rows_time_ratio

    def faster_at_128_only(given, ordered, n, value_bytes, l2_bytes):
        ratio = real(given, ordered, n, value_bytes, l2_bytes)
        return ratio if n == 128 or ordered is given else 1.3

    monkeypatch.setattr(auto, "rows_time_ratio", faster_at_128_only)
    csr = shuffled_mesh()
    method, perm, report = choose(csr, candidates=("community",))
    assert not report["methods"]["community"]["within_guard"]
    assert method == "none" and torch.equal(perm, torch.arange(csr.num_rows))
