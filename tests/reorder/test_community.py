"""The community and hub orders: planted communities found, hubs first, the rest kept in order."""
import torch

from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.formats.metcf import count_blocks
from torch_tcsparse.reorder import reorder
from torch_tcsparse.reorder.locality import distinct_share

from .graphs import random_rectangular, sbm


def test_community_finds_planted_communities():
    seed = torch.initial_seed() % 2**31
    ordered = sbm(4096, 32, 0.3, 1.0, seed=seed, shuffle=False)
    shuffled = sbm(4096, 32, 0.3, 1.0, seed=seed, shuffle=True)
    perm = reorder(shuffled, "community")
    share = distinct_share(shuffled.rowptr, shuffled.col, shuffled.num_cols, perm)
    assert share <= 1.2 * distinct_share(ordered.rowptr, ordered.col, ordered.num_cols, None)
    assert int(count_blocks(shuffled, 16, perm).sum()) < 0.75 * int(count_blocks(shuffled).sum())


def test_community_row_only_groups_rows_sharing_columns():
    # Rows 0..99 use columns 0..9, rows 100..199 columns 10..19, interleaved in the given order.
    rows = torch.arange(200).repeat_interleave(5)
    cols = (rows % 2) * 10 + torch.randint(0, 10, (1000,), generator=torch.Generator().manual_seed(1))
    csr = from_coo(rows, cols, None, 200, 20)
    perm = reorder(csr, "community", symmetric=False)
    halves = (perm % 2).view(2, 100)
    assert bool((halves[0] == halves[0, 0]).all()) and bool((halves[1] == halves[1, 0]).all())


def test_community_seed_changes_and_rectangular():
    graph = sbm(600, 20, 0.3, 3.0, seed=1, shuffle=True)
    assert not torch.equal(reorder(graph, "community", seed=0), reorder(graph, "community", seed=1))
    perm = reorder(random_rectangular(50, 400, 800, seed=2), "community", symmetric=False)
    assert torch.equal(torch.sort(perm).values, torch.arange(50))


def test_hub_order_moves_only_hubs():
    # Row 3 and row 7 are hubs; the other rows keep their order.
    rows = torch.cat([torch.arange(10), torch.full((8,), 3), torch.full((5,), 7)])
    cols = torch.cat([torch.arange(10), torch.arange(10, 18), torch.arange(10, 15)])
    csr = from_coo(rows, cols, None, 10, 20)
    perm = reorder(csr, "hub", symmetric=False)
    assert perm.tolist() == [3, 7, 0, 1, 2, 4, 5, 6, 8, 9]
