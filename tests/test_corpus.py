"""The corpus: every family generates canonical, deterministic graphs of about the asked size,
and the fit/unseen split is fixed and disjoint."""
import pytest
import torch

from graph_data import corpus, npz


def assert_canonical(row, col, n, self_loops=False):
    """``n``: the node count of a square graph, or (rows, columns) of a rectangular one (where a
    row and a column of one id are different nodes: no self loops to check)."""
    rows, cols = n if isinstance(n, tuple) else (n, n)
    assert row.dtype == torch.long and col.dtype == torch.long and row.numel() == col.numel() > 0
    assert int(row.min()) >= 0 and int(row.max()) < rows and int(col.min()) >= 0 and int(col.max()) < cols
    key = row * cols + col
    assert bool((key[1:] > key[:-1]).all()), "sorted by (row, col) without duplicates"
    if not self_loops and not isinstance(n, tuple):
        assert bool((row != col).all())


@pytest.mark.parametrize("family", corpus.FAMILIES)
def test_family_canonical_sized_and_deterministic(family):
    nnz = corpus.TIERS["small"][0]
    row, col, n = corpus.generate(family, nnz, seed=3)
    assert isinstance(n, tuple) == (family in corpus.RECTANGULAR)
    assert_canonical(row, col, n, self_loops=family == "band")
    assert 0.5 * nnz <= row.numel() <= 2 * nnz
    again = corpus.generate(family, nnz, seed=3)
    assert torch.equal(row, again[0]) and torch.equal(col, again[1]) and n == again[2]


@pytest.mark.parametrize("family", [f for f in corpus.FAMILIES if f != "band"])
def test_seed_changes_the_graph(family):
    first, second = corpus.generate(family, 20_000, seed=0), corpus.generate(family, 20_000, seed=1)
    assert first[0].numel() != second[0].numel() or not torch.equal(first[1], second[1])


@pytest.mark.parametrize("family", ["rmat", "kron", "mesh3d", "mesh2d", "road", "powerlaw", "blocks_noise", "geometric"])
def test_undirected_families_are_symmetric(family):
    row, col, n = corpus.generate(family, 20_000, seed=2)
    assert torch.equal(torch.sort(row * n + col).values, torch.sort(col * n + row).values)


def test_families_differ_in_degree_spread():
    spread = {}
    for family in ("powerlaw", "rmat", "mesh3d", "road", "uniform"):
        row, _, n = corpus.generate(family, 50_000, seed=0)
        degree = torch.bincount(row, minlength=n).float()
        spread[family] = float(degree.max() / degree.mean())
    assert spread["powerlaw"] > 10 and spread["rmat"] > 10
    assert max(spread["mesh3d"], spread["road"], spread["uniform"]) < 3


def test_rectangular_families_on_both_sides_of_the_split():
    """Bipartite matrices (more columns than rows) are in "fit" and in "unseen", with hub rows in
    one and nearly uniform rows in the other; benchmarks that permute rows and columns alike can
    leave them out."""
    assert {corpus.split_of(f) for f in corpus.RECTANGULAR} == set(corpus.SPLITS)
    spread = {}
    for family in corpus.RECTANGULAR:
        row, _, (rows, cols) = corpus.generate(family, 50_000, seed=0)
        assert cols > rows
        degree = torch.bincount(row, minlength=rows).float()
        spread[family] = float(degree.max() / degree.mean())
    assert spread["bipartite"] > 10 and spread["sampled"] < 1.5
    square = corpus.entries("all", "small", real=False, rectangular=False)
    assert {e.family for e in square} == set(corpus.FAMILIES) - set(corpus.RECTANGULAR)


def test_split_is_fixed_disjoint_and_covers_every_family():
    fit, unseen = set(corpus.SPLIT["fit"]), set(corpus.SPLIT["unseen"])
    assert not fit & unseen
    assert fit | unseen == set(corpus.FAMILIES)
    assert len(corpus.FAMILIES) >= 8 and fit and unseen
    assert corpus.SPLIT_REASON
    assert all(corpus.split_of(f) == "fit" for f in fit)
    assert all(corpus.split_of(f) == "unseen" for f in unseen)


def test_real_sources_split():
    assert corpus.split_of(corpus.real_family("planetoid_cora")) == "fit"
    assert corpus.split_of(corpus.real_family("newsource_graph")) == "unseen"
    assert not set(corpus.REAL_FIT_SOURCES) & set(corpus.FAMILIES)


def test_entries_per_split_and_tier():
    fit = corpus.entries("fit", "medium", real=False)
    unseen = corpus.entries("unseen", "medium", real=False)
    assert {e.split for e in fit} == {"fit"} and {e.split for e in unseen} == {"unseen"}
    assert not {e.name for e in fit} & {e.name for e in unseen}
    assert len(fit) + len(unseen) == len(corpus.FAMILIES) * len(corpus.TIERS["medium"])
    assert max(corpus.TIERS["large"]) >= 60_000_000
    entry = corpus.entries("unseen", "small", real=False)[0]
    row, col, n = entry.load("cpu")
    assert entry.family in corpus.SPLIT["unseen"] and 0.5 * entry.nnz_target <= row.numel()


def test_entries_include_real_graphs():
    if not npz.list_graphs():
        pytest.skip(f"no real graphs in {npz.graph_dir()}")
    real = [e for e in corpus.entries("all", "small") if e.nnz_target is None]
    assert len(real) == len(npz.list_graphs())
    assert all(e.split == corpus.split_of(e.family) for e in real)
    row, col, n = real[0].load("cpu")
    assert row.numel() == col.numel() > 0 and int(row.max()) < n


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: corpus.generate("lattice", 100), ValueError, "'lattice'"),
        (lambda: corpus.generate("rmat", 0), ValueError, "0"),
        (lambda: corpus.generate("rmat", 100, seed=-2), ValueError, "-2"),
        (lambda: corpus.entries("train"), ValueError, "'train'"),
        (lambda: corpus.entries("fit", "huge"), ValueError, "'huge'"),
        (lambda: corpus.split_of(3), TypeError, "int"),
    ],
)
def test_validation(call, error, message):
    with pytest.raises(error, match=message):
        call()
