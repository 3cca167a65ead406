"""RoDe's binding (benchmarks/peers) on the GPU against a float64 reference, where its module
serves here (prebuilt, or built from a local clone): rows shorter than a 32-nonzero block, rows
of several 512-nonzero segments starting off the 4-element alignment, empty rows; every width
its kernels come in; the binding's range check agreeing with the Python one; and the guarded
comparison (benchmarks/peers/compare.py) on two small graphs of the corpus."""
import csv

import pytest
import torch

from benchmarks.peers import compare, rode
from torch_tcsparse.formats.csr import from_coo

from .kernel_data import relative_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or rode.unavailable() is not None,
                                reason=f"needs a CUDA device and RoDe's module ({rode.unavailable()})")


def mixed_rows(m, k, seed):
    """COO of m rows of lengths 0 to 1500 (most short, some of several segments), random columns."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lengths = torch.randint(0, 40, (m,), device="cuda", generator=gen)
    long_rows = torch.rand(m, device="cuda", generator=gen) < 0.05
    lengths = torch.where(long_rows, torch.randint(400, 1500, (m,), device="cuda", generator=gen), lengths)
    lengths[torch.rand(m, device="cuda", generator=gen) < 0.1] = 0
    row = torch.arange(m, device="cuda").repeat_interleave(lengths)
    col = torch.randint(0, k, (row.numel(),), device="cuda", generator=gen)
    values = torch.randn(row.numel(), device="cuda", generator=gen)
    return row, col, values


@pytest.mark.parametrize("n", [32, 64, 128, 256])
@pytest.mark.parametrize("m,k", [(1, 50), (333, 2000), (5000, 70000)])
def test_rode_matches_float64(m, k, n):
    row, col, values = mixed_rows(m, k, seed=m + n)
    csr = from_coo(row, col, values, m, k)
    op = rode.RoDe(csr.rowptr, csr.col, csr.values, k)
    x = torch.randn(k, n, device="cuda")
    expected = torch.zeros(m, n, dtype=torch.float64, device="cuda")
    expected.index_add_(0, csr.row_indices(), csr.values.double()[:, None] * x.double()[csr.col.long()])
    got = op(x)
    assert relative_error(got, expected) < 1e-5
    # Zeroed at every call: a second product is the same, not twice it.
    assert relative_error(op(x), expected) < 1e-5


def test_rode_takes_rows_all_shorter_than_a_block():
    row, col, values = mixed_rows(100, 100, seed=1)
    keep = torch.cat([torch.zeros(1, dtype=torch.bool, device="cuda"), row[1:] != row[:-1]])  # one per row
    csr = from_coo(row[keep], col[keep], values[keep], 100, 100)
    x = torch.randn(100, 32, device="cuda")
    got = rode.RoDe(csr.rowptr, csr.col, csr.values, 100)(x)
    expected = torch.sparse.mm(torch.sparse_csr_tensor(csr.rowptr, csr.col, csr.values.double(), (100, 100)),
                               x.double())
    assert relative_error(got, expected) < 1e-5


def test_the_binding_and_python_agree_on_rodes_range():
    module = rode.extension()
    for rows, cols, n in [(10, 2**21, 256), (10, 2**21 + 1, 256), (10, 2**24 + 1, 32), (2**23 + 1, 10, 256),
                          (2**23, 10, 256), (5_331_481, 5_331_481, 64), (5_331_481, 5_331_481, 128)]:
        assert (module.out_of_range(cols, rows, n) == "") == (rode.out_of_range(rows, cols, n) is None)


def test_the_binding_refuses_a_product_past_its_range():
    csr = from_coo(torch.tensor([0], device="cuda"), torch.tensor([0], device="cuda"), torch.ones(1, device="cuda"), 1,
                   2**20 + 1)
    op = rode.RoDe(csr.rowptr, csr.col, csr.values, 2**20 + 1)
    assert "2 GiB" in op.refusal(512)
    x = torch.zeros(2**20 + 1, 512, device="cuda")  # 2 GiB and a row
    with pytest.raises(RuntimeError, match="offsets into X"):
        op(x)


def test_the_guarded_comparison_on_small_graphs(tmp_path):
    rows = compare.main(["--tier", "small", "--no-real", "--graphs", "kron_20k,sampled_20k", "--n", "32,256",
                         "--reps", "3", "--out", str(tmp_path)])
    assert len(rows) == 4
    for row in rows:
        assert row["ours_status"] == "ok" and row["rode_status"] == "ok", row
        assert row["ours_err"] < 1e-5 and row["rode_err"] < 1e-5 and row["over_rode"] > 0
    with open(tmp_path / "rode_compare_summary.csv") as handle:
        summary = list(csv.DictReader(handle))
    assert {(s["split"], s["N"]) for s in summary} == {("unseen", "32"), ("unseen", "256"), ("unseen", "all")}
