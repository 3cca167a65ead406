"""Every reordering method: valid permutations, determinism, validation, and unchanged products."""
import pytest
import torch

from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.formats.metcf import build_metcf, count_blocks
from torch_tcsparse.reorder import METHODS, reorder
from torch_tcsparse.tensor import TCSparseTensor

from .graphs import band, random_rectangular, sbm


@pytest.fixture
def seed():
    """The suite's per-run seed (conftest), so each run draws fresh graphs that can be replayed."""
    return torch.initial_seed() % 2**31


@pytest.fixture
def graph(seed):
    return sbm(600, 20, 0.3, 3.0, seed=seed, shuffle=True)


def dense_of(csr):
    dense = torch.zeros(csr.num_rows, csr.num_cols, dtype=torch.float64)
    dense[csr.row_indices(), csr.col.long()] = csr.values.double()
    return dense


def assert_permutation(perm, size):
    assert perm.dtype == torch.int64 and perm.shape == (size,)
    assert torch.equal(torch.sort(perm).values, torch.arange(size))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("window", [8, 16])
def test_valid_and_deterministic(graph, method, window):
    first = reorder(graph, method, window=window, seed=3)
    assert_permutation(first, graph.num_rows)
    assert torch.equal(first, reorder(graph, method, window=window, seed=3))


@pytest.mark.parametrize("method", ["tca", "jaccard", "shuffle"])
def test_seed_changes_randomized_methods(graph, method):
    assert not torch.equal(reorder(graph, method, seed=0), reorder(graph, method, seed=1))


@pytest.mark.parametrize("method", METHODS)
def test_row_only_on_rectangular(method, seed):
    csr = random_rectangular(77, 300, 900, seed=seed)
    assert_permutation(reorder(csr, method, symmetric=False), 77)


@pytest.mark.parametrize("method", METHODS)
def test_layout_of_reordered_rows_holds_the_same_matrix(graph, method):
    perm = reorder(graph, method, seed=5)
    layout, values = build_metcf(graph, 16, perm)
    _, row, col = layout.nonzero_coordinates()
    rebuilt = torch.zeros(graph.num_rows, graph.num_cols, dtype=torch.float64)
    rebuilt.index_put_((row, col), values.double(), accumulate=True)
    assert torch.equal(rebuilt, dense_of(graph))


@pytest.mark.parametrize("method", [m for m in METHODS if m != "none"] + ["auto"])
def test_product_unchanged_through_tensor(method, seed):
    csr = random_rectangular(130, 130, 1500, seed=seed)
    row, col = csr.row_indices(), csr.col.long()
    a = TCSparseTensor.from_coo(row, col, csr.values, shape=(130, 130), reorder=method)
    x = torch.randn(130, 24, dtype=torch.float64).float()
    expected = dense_of(csr) @ x.double()
    # torch's own float32 product on the same data sets the bar; a little slack for another summation order
    torch_error = (dense_of(csr).float() @ x).double().sub(expected).abs().max().item()
    scale = (dense_of(csr).abs() @ x.double().abs()).max().item()
    assert (a @ x).double().sub(expected).abs().max().item() <= 4 * torch_error + 1e-6 * scale


def test_empty_rows_and_empty_matrix():
    csr = from_coo(torch.tensor([0, 5]), torch.tensor([3, 3]), None, 40, 40)
    for method in METHODS:
        assert_permutation(reorder(csr, method), 40)
    empty = from_coo(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), None, 0, 0)
    for method in METHODS:
        assert reorder(empty, method).numel() == 0


def test_band_matrix_order_kept_by_rcm():
    csr = band(256, 3)
    perm = reorder(csr, "rcm")
    assert int(count_blocks(csr, 16, perm).sum()) <= int(count_blocks(csr).sum())


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(method="metis"), ValueError, "'metis'"),
        (dict(method=None), ValueError, "None"),
        (dict(method="tca", window=32), ValueError, "32"),
        (dict(method="tca", seed=-1), ValueError, "-1"),
        (dict(method="tca", symmetric="yes"), TypeError, "str"),
    ],
)
def test_validation(graph, kwargs, error, message):
    with pytest.raises(error, match=message):
        reorder(graph, **kwargs)


def test_symmetric_needs_square():
    with pytest.raises(ValueError, match="40 x 90"):
        reorder(random_rectangular(40, 90, 100, seed=0), "rcm", symmetric=True)


def test_rejects_non_csr():
    with pytest.raises(TypeError, match="Tensor"):
        reorder(torch.eye(3), "tca")
