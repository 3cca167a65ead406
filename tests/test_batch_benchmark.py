"""benchmarks/batch.py on a tiny graph: the sampler draws NeighborLoader-shaped batches, every
route gives a row of batch.csv, arguments are checked."""
import csv

import pytest
import torch

pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
from benchmarks import batch  # noqa: E402
from graph_data import synthetic  # noqa: E402

TINY = ["--device", "cpu", "--scale", "8", "--batch-size", "16", "--batches", "1", "--reps", "2", "--calls", "3"]


def test_every_matrix_and_route_writes_a_row(tmp_path):
    rows = batch.main([*TINY, "--out", str(tmp_path)])
    assert {(row["matrix"], row["route"]) for row in rows} == {
        (m, r) for m in ("subgraph", "hop1", "hop2") for r in batch.ROUTES}
    with open(tmp_path / "batch.csv") as handle:
        written = list(csv.DictReader(handle))
    assert len(written) == len(rows) and tuple(written[0]) == batch.FIELDS
    assert all(float(row[key]) > 0 for row in written for key in ("convert_us", "spmm_us", "host_us"))


def test_sampled_batches_have_neighbor_loader_shape():
    row, col, num_nodes = synthetic.rmat(9, 8, seed=1)
    graph = batch.Graph(row, col, num_nodes)
    graph_edges = set(zip(row.tolist(), col.tolist()))  # (target, source)
    seeds = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(0))[:20]
    nodes, matrices = batch.sample(graph, seeds, [5, 3], torch.Generator().manual_seed(1))
    assert [m[0] for m in matrices] == ["subgraph", "hop1", "hop2"]
    assert bool((graph.slot == -1).all())
    assert torch.equal(nodes[:20], seeds) and torch.unique(nodes).numel() == nodes.numel()
    (_, subgraph, num_all, _), (_, hop1, src1, dst1), (_, hop2, src2, dst2) = matrices
    assert dst1 == 20 and src1 == dst2 and src2 == num_all == nodes.numel()
    assert subgraph.size(1) == hop1.size(1) + hop2.size(1)
    frontier = seeds.tolist()
    for edges, num_sources, num_targets, fanout in ((hop1, src1, dst1, 5), (hop2, src2, dst2, 3)):
        assert int(edges[0].max()) < num_sources and int(edges[1].max()) < num_targets
        assert torch.unique(edges, dim=1).size(1) == edges.size(1)  # without replacement
        counts = torch.bincount(edges[1], minlength=num_targets)
        degree = torch.bincount(row, minlength=num_nodes)[nodes[:num_targets]]
        # each node of the hop's frontier keeps min(fanout, degree) neighbours, other targets none
        in_frontier = torch.isin(nodes[:num_targets], torch.tensor(frontier))
        assert torch.equal(counts, torch.where(in_frontier, degree.clamp(max=fanout), 0))
        for s, t in zip(nodes[edges[0]].tolist(), nodes[edges[1]].tolist()):
            assert (t, s) in graph_edges
        frontier = nodes[num_targets:num_sources].tolist()


@pytest.mark.parametrize("argument, value", [("--batches", "0"), ("--n", "0"), ("--scale", "40"), ("--fanout", "0")])
def test_arguments_are_checked(argument, value, capsys):
    with pytest.raises(SystemExit):
        batch.parse_args([argument, value])
    assert argument.lstrip("-").split("-")[0] in capsys.readouterr().err


def test_training_epochs_over_the_same_batches(tmp_path):
    rows = batch.main([*TINY, "--routes", "ours-batch", "--train", "--epochs", "1", "--features", "4",
                       "--hidden", "4", "--classes", "3", "--out", str(tmp_path)])
    epochs = [row for row in rows if "epoch_ms" in row]
    assert {(row["route"], row["aggr"]) for row in epochs} == {
        (route, aggr) for route in ("ours", "pyg-csr") for aggr in ("mean", "max")}
    with open(tmp_path / "batch_epoch.csv") as handle:
        written = list(csv.DictReader(handle))
    assert tuple(written[0]) == batch.EPOCH_FIELDS and len(written) == 4
    assert all(float(row["epoch_ms"]) > 0 and float(row["convert_ms"]) > 0 for row in written)
