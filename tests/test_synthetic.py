import pytest
import torch

from graph_data import synthetic


def assert_canonical(row, col, n):
    assert row.dtype == torch.long and col.dtype == torch.long
    assert row.numel() == col.numel() > 0
    assert int(row.min()) >= 0 and int(row.max()) < n and int(col.min()) >= 0 and int(col.max()) < n
    key = row * n + col
    assert bool((key[1:] > key[:-1]).all()), "sorted by (row, col) without duplicates"


def test_rmat_is_symmetric_canonical_and_skewed():
    row, col, n = synthetic.rmat(10, edge_factor=8, seed=1)
    assert n == 1024
    assert_canonical(row, col, n)
    assert bool((row != col).all())
    forward = set(zip(row.tolist(), col.tolist()))
    assert all((c, r) in forward for r, c in forward)
    degree = torch.bincount(row, minlength=n).float()
    assert degree.max() > 8 * degree.mean()  # power-law hubs


def test_rmat_seed_reproducible_and_different():
    a = synthetic.rmat(8, seed=3)
    b = synthetic.rmat(8, seed=3)
    c = synthetic.rmat(8, seed=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not (a[0].numel() == c[0].numel() and torch.equal(a[1], c[1]))


def test_rmat_rejects_bad_probabilities():
    with pytest.raises(ValueError):
        synthetic.rmat(4, a=0.6, b=0.3, c=0.2)


def test_uniform_degree():
    row, col, n = synthetic.uniform(2000, 10, seed=0)
    assert_canonical(row, col, n)
    degree = torch.bincount(row, minlength=n)
    assert int(degree.max()) <= 10 and float(degree.float().mean()) > 9.9


@pytest.mark.parametrize("shuffled", [False, True])
def test_sbm_edges_mostly_inside_blocks(shuffled):
    n, block = 3000, 100
    row, col, _ = synthetic.sbm(n, 40, block, shuffled=False, seed=2)
    assert_canonical(row, col, n)
    inside = (row // block == col // block).float().mean()
    assert inside > 0.85
    srow, scol, _ = synthetic.sbm(n, 40, block, shuffled=shuffled, seed=2)
    assert srow.numel() == row.numel()
    if shuffled:
        assert (srow // block == scol // block).float().mean() < 0.2


def test_band_exact():
    row, col, n = synthetic.band(50, 3)
    assert_canonical(row, col, n)
    dense = torch.zeros(n, n)
    dense[row, col] = 1
    i = torch.arange(n)
    expected = ((i[:, None] - i[None, :]).abs() <= 3).float()
    assert torch.equal(dense, expected)
