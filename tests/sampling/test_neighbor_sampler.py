"""NeighborSampler: each node a hop expands keeps min(degree, fan-out) distinct true neighbours,
drawn uniformly; batch ids are consistent (seeds first, each node once, edges mapping back to
graph edges); the per-layer blocks compute what the whole sampled subgraph computes for the
seeds; a seeded generator repeats a batch; bad inputs are named."""
import math
from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from graph_data import synthetic
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.loader import NeighborSampler

from .batches import check_batch


def rmat_sampler(fanout, scale=9, edge_factor=8, seed=1):
    row, col, num_nodes = synthetic.rmat(scale, edge_factor, seed=seed)
    return NeighborSampler.from_edge_index(torch.stack([col, row]), fanout, num_nodes), row, col


@pytest.mark.parametrize("fanout", [[5, 3], [15, 10, 5], [-1, 2], [1]])
def test_a_batch_keeps_min_degree_fanout_distinct_neighbours(fanout):
    sampler, _, _ = rmat_sampler(fanout)
    seeds = torch.randperm(sampler.num_nodes, generator=torch.Generator().manual_seed(0))[:24]
    check_batch(sampler, sampler.sample(seeds, torch.Generator().manual_seed(1)), seeds)


@given(num_nodes=st.integers(1, 40), num_edges=st.integers(0, 200), fanout=st.lists(
    st.sampled_from([-1, 1, 2, 3, 7]), min_size=1, max_size=3), num_seeds=st.integers(0, 10),
    seed=st.integers(0, 2**31 - 1))
def test_batches_of_random_graphs_keep_every_invariant(num_nodes, num_edges, fanout, num_seeds, seed):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=g)  # repeats and self loops
    sampler = NeighborSampler.from_edge_index(edge_index, fanout, num_nodes)
    seeds = torch.randperm(num_nodes, generator=g)[:num_seeds]
    check_batch(sampler, sampler.sample(seeds, g), seeds)


def star_sampler(num_stars, degree, fanout):
    """num_stars centres 0.. num_stars - 1, each with its own `degree` leaves."""
    centre = torch.arange(num_stars).repeat_interleave(degree)
    leaf = num_stars + torch.arange(num_stars * degree)
    return NeighborSampler.from_edge_index(torch.stack([leaf, centre]), [fanout], num_stars * (degree + 1))


def chi_square(observed: Counter, cells: int, draws: int) -> float:
    expected = draws / cells
    return sum((observed.get(cell, 0) - expected) ** 2 / expected for cell in range(cells))


def test_every_subset_of_neighbours_is_equally_likely():
    """6 leaves, 2 drawn: 15 subsets, 6000 draws; chi-square with 14 degrees of freedom stays under
    its 0.999 quantile (36.12) for a uniform draw."""
    num_stars, degree = 6000, 6
    sampler = star_sampler(num_stars, degree, 2)
    batch = sampler.sample(torch.arange(num_stars), torch.Generator().manual_seed(7))
    source, target = batch.nodes[batch.edge_index]
    subsets = {pair: i for i, pair in enumerate((a, b) for a in range(degree) for b in range(a + 1, degree))}
    position = (source - num_stars) % degree
    picks = torch.sort(position.view(num_stars, 2), dim=1).values  # edges grouped by target
    assert torch.equal(target.view(num_stars, 2)[:, 0], torch.arange(num_stars))
    counts = Counter(subsets[tuple(pair)] for pair in picks.tolist())
    assert chi_square(counts, len(subsets), num_stars) < 36.12


def test_a_hub_draws_each_neighbour_equally_often():
    """A hub of 1000 neighbours, 10 drawn, 2000 batches: each neighbour is drawn about 20 times;
    chi-square over the 1000 neighbours (999 degrees of freedom) under its 0.999 quantile (1143)."""
    sampler = star_sampler(1, 1000, 10)
    g = torch.Generator().manual_seed(3)
    drawn = torch.cat([sampler.sample(torch.tensor([0]), g).nodes[1:] for _ in range(2000)]) - 1
    assert drawn.numel() == 20_000
    assert chi_square(Counter(drawn.tolist()), 1000, drawn.numel()) < 1143


def test_a_seeded_generator_repeats_the_batch():
    sampler, _, _ = rmat_sampler([10, 5])
    seeds = torch.arange(0, 400, 7)
    first, again = (sampler.sample(seeds, torch.Generator().manual_seed(5)) for _ in range(2))
    other = sampler.sample(seeds, torch.Generator().manual_seed(6))
    assert torch.equal(first.nodes, again.nodes) and torch.equal(first.edge_index, again.edge_index)
    assert first.num_sampled_nodes == again.num_sampled_nodes
    assert not torch.equal(first.edge_index, other.edge_index)


def test_layer_blocks_compute_what_the_subgraph_computes_for_the_seeds():
    """Three mean aggregations over the per-layer blocks equal three over the whole sampled
    subgraph (PyG's NeighborLoader output), read at the seeds."""
    sampler, _, _ = rmat_sampler([6, 4, 3])
    batch = sampler.sample(torch.arange(0, 300, 11), torch.Generator().manual_seed(2))
    x = torch.randn(batch.nodes.numel(), 5, dtype=torch.float64)
    whole = TCSparseTensor.from_edge_index(batch.edge_index, num_nodes=batch.nodes.numel(), dtype=torch.float64)
    expected = x
    for _ in range(3):
        expected = whole.matmul(expected, reduce="mean") + expected
    blocks = batch.blocks(dtype=torch.float64)
    sizes = [sizes for _, sizes in batch.layer_edges()]
    assert [tuple(block.shape) for block in blocks] == [(t, s) for s, t in sizes]
    assert sizes[0][0] == batch.nodes.numel() and sizes[-1][1] == batch.batch_size
    got = x
    for block in blocks:
        got = block.matmul(got, reduce="mean") + got[: block.size(0)]
    torch.testing.assert_close(got, expected[: batch.batch_size])


def test_the_csr_of_an_adjacency_samples_as_its_edge_index():
    row, col, num_nodes = synthetic.rmat(8, 6, seed=2)
    adj_t = TCSparseTensor.from_edge_index(torch.stack([col, row]), num_nodes=num_nodes)
    from_csr = NeighborSampler(adj_t.csr.rowptr, adj_t.csr.col, [4, 2])
    from_edges = NeighborSampler.from_edge_index(torch.stack([col, row]), [4, 2], num_nodes)
    assert torch.equal(from_csr.rowptr, from_edges.rowptr) and torch.equal(from_csr.col.long(), from_edges.col)
    seeds = torch.arange(10)
    a, b = (s.sample(seeds, torch.Generator().manual_seed(0)) for s in (from_csr, from_edges))
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.nodes, b.nodes)


def test_edge_cases_no_seeds_isolated_seeds_and_a_graph_without_edges():
    sampler, _, _ = rmat_sampler([3, 2])
    empty = sampler.sample(torch.zeros(0, dtype=torch.long))
    assert empty.num_sampled_nodes == (0, 0, 0) and empty.edge_index.shape == (2, 0)
    assert [tuple(block.shape) for block in empty.blocks()] == [(0, 0), (0, 0)]
    bare = NeighborSampler.from_edge_index(torch.zeros(2, 0, dtype=torch.long), [3, 2], num_nodes=5)
    batch = bare.sample(torch.tensor([4, 1]))
    assert batch.num_sampled_nodes == (2, 0, 0) and torch.equal(batch.nodes, torch.tensor([4, 1]))
    out = batch.blocks()[-1] @ torch.ones(2, 3)
    assert torch.equal(out, torch.zeros(2, 3))


def test_batches_move_between_devices_unchanged():
    sampler, _, _ = rmat_sampler([3])
    batch = sampler.sample(torch.arange(5), torch.Generator().manual_seed(0))
    moved = batch.to("cpu")
    assert moved.num_sampled_nodes == batch.num_sampled_nodes and torch.equal(moved.nodes, batch.nodes)


@pytest.mark.parametrize("make, error, words", [
    (lambda: NeighborSampler([0, 1], torch.tensor([0]), [2]), TypeError, "rowptr"),
    (lambda: NeighborSampler(torch.tensor([0, 1.0]), torch.tensor([0]), [2]), TypeError, "rowptr"),
    (lambda: NeighborSampler(torch.tensor([0, 1]), torch.tensor([True]), [2]), TypeError, "col"),
    (lambda: NeighborSampler(torch.tensor([], dtype=torch.long), torch.tensor([0]), [2]), ValueError, "rowptr"),
    (lambda: NeighborSampler(torch.tensor([0, 2]), torch.tensor([0]), [2]), ValueError, "rowptr"),
    (lambda: NeighborSampler(torch.tensor([0, 2, 1, 2]), torch.tensor([0, 1]), [2]), ValueError, "decrease"),
    (lambda: NeighborSampler(torch.tensor([0, 1]), torch.tensor([1]), [2]), ValueError, "col"),
    (lambda: NeighborSampler(torch.tensor([0, 2, 2]), torch.tensor([1, 0]), [2]), ValueError, "ascending"),
    (lambda: NeighborSampler(torch.tensor([0, 2, 2]), torch.tensor([1, 1]), [2]), ValueError, "ascending"),
    (lambda: NeighborSampler(torch.tensor([0, 1]), torch.tensor([0]), 5), TypeError, "num_neighbors"),
    (lambda: NeighborSampler(torch.tensor([0, 1]), torch.tensor([0]), []), ValueError, "num_neighbors"),
    (lambda: NeighborSampler(torch.tensor([0, 1]), torch.tensor([0]), [0]), ValueError, "num_neighbors"),
    (lambda: NeighborSampler(torch.tensor([0, 1]), torch.tensor([0]), [2.5]), ValueError, "num_neighbors"),
    (lambda: NeighborSampler(torch.tensor([0, 1]), torch.tensor([0]), [True]), ValueError, "num_neighbors"),
    (lambda: NeighborSampler.from_edge_index(torch.zeros(3, 2, dtype=torch.long), [2]), ValueError, "edge_index"),
    (lambda: NeighborSampler.from_edge_index(torch.tensor([[0], [5]]), [2], num_nodes=3), ValueError,
     "edge_index"),
    (lambda: NeighborSampler.from_edge_index(torch.tensor([[0], [-1]]), [2], num_nodes=3), ValueError,
     "edge_index"),
    (lambda: NeighborSampler.from_edge_index(torch.tensor([[0], [1]]), [2], num_nodes=2.0), ValueError,
     "num_nodes"),
])
def test_bad_graphs_and_fanouts_are_named(make, error, words):
    with pytest.raises(error, match=words):
        make()


@pytest.mark.parametrize("seeds, generator, error, words", [
    ([0, 1], None, TypeError, "seeds"),
    (torch.tensor([0.0]), None, TypeError, "seeds"),
    (torch.tensor([[0, 1]]), None, ValueError, "one-dimensional"),
    (torch.tensor([0, 512]), None, ValueError, "seeds must lie"),
    (torch.tensor([-1]), None, ValueError, "seeds must lie"),
    (torch.tensor([3, 4, 3]), None, ValueError, "distinct"),
    (torch.tensor([3]), 7, TypeError, "generator"),
])
def test_bad_seeds_are_named_and_leave_the_sampler_clean(seeds, generator, error, words):
    sampler, _, _ = rmat_sampler([3])
    with pytest.raises(error, match=words):
        sampler.sample(seeds, generator)
    assert bool((sampler._slot == -1).all())
    check_batch(sampler, sampler.sample(torch.tensor([3, 4])), torch.tensor([3, 4]))


def test_offsets_cover_the_whole_range_of_a_huge_degree():
    """Floyd's draw reads float64 randoms: offsets near 2**40 are reached and stay in range."""
    from torch_tcsparse.loader.neighbor_choice import floyd_offsets

    degree = torch.full((2000,), 2**40, dtype=torch.long)
    picks = floyd_offsets(degree, 3, torch.Generator().manual_seed(0))
    assert bool((picks >= 0).all()) and bool((picks < 2**40).all())
    assert float(picks.double().mean()) == pytest.approx(2**39, rel=0.05)
    assert math.isclose(float((picks < 2**39).double().mean()), 0.5, abs_tol=0.05)
