"""The GraphSAGE example end to end on a tiny OGB-format folder: both backends and aggregations
learn and ours matches PyG's on the same seed, full-batch and on the same sampled blocks; a block
step equals PyG's in outputs and gradients; the products-shaped task."""
import pytest
import torch

pytest.importorskip("ogb", reason="ogb is not installed")
pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
from converted_blocks import record_converted_blocks  # noqa: E402
from examples.sage import blocks, models, products, train  # noqa: E402
from graph_data import ogb_format  # noqa: E402
from torch_tcsparse.loader import NeighborSampler  # noqa: E402

TINY = dict(num_nodes=300, num_classes=4, num_features=16, avg_degree=8.0, homophily=0.8, feature_signal=0.5)
SMALL_RUN = ["--epochs", "4", "--hidden", "16", "--layers", "2", "--dropout", "0", "--device", "cpu"]


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def tiny_folder(tmp_path):
    folder = tmp_path / "tiny"
    ogb_format.write_node_dataset(ogb_format.planted_partition(**TINY, seed=1), folder, name="ogbn-tiny")
    return str(folder)


@pytest.mark.parametrize("aggr", models.AGGRS)
def test_backends_agree_and_learn(tiny_folder, aggr, capsys):
    runs = {backend: train.main(["--dataset", tiny_folder, "--backend", backend, "--aggr", aggr, *SMALL_RUN])
            for backend in models.BACKENDS}
    ours, pyg = runs["ours"], runs["pyg"]
    assert len(ours) == 4 and all(row["seconds"] > 0 for row in ours)
    assert ours[-1]["loss"] < ours[0]["loss"]
    for a, b in zip(ours, pyg):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    printed = capsys.readouterr().out
    assert printed.count("epoch ") == 8 and "valid" in printed


def test_adjacency_formats_give_the_same_layer_output():
    edge_index = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 1, 0]])
    x = torch.randn(4, 3)
    for aggr in models.AGGRS:
        torch.manual_seed(0)
        layer = models.SAGE("pyg", 3, 5, 2, 1, 0.0, aggr)
        outs = [layer(x, models.prepare_adjacency(backend, edge_index, 4, fmt))
                for backend, fmt in (("ours", "csr"), ("pyg", "csr"), ("pyg", "edge_index"))]
        for out in outs[1:]:
            torch.testing.assert_close(out, outs[0])


def test_neighbor_loader_trains_both_backends_on_the_same_blocks(tiny_folder, capsys):
    runs = {backend: train.main(["--dataset", tiny_folder, "--neighbor-loader", "--fanout", "5", "3",
                                 "--batch-size", "64", "--backend", backend, *SMALL_RUN])
            for backend in models.BACKENDS}
    assert len(runs["ours"]) == 4 and runs["ours"][-1]["loss"] < runs["ours"][0]["loss"]
    for a, b in zip(runs["ours"], runs["pyg"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    printed = capsys.readouterr().out
    sampler = "PyG's NeighborLoader" if train.pyg_sampler_available() else "torch_tcsparse.loader"
    assert printed.count(f"sampled by {sampler}") == 2


def test_synthetic_is_products_shaped(capsys):
    history = train.main(["--synthetic", "--nodes", "300", *SMALL_RUN[:2], "--hidden", "8", "--layers", "1",
                          "--device", "cpu"])
    assert len(history) == 4
    assert "300 nodes" in capsys.readouterr().out


def test_products_task_has_ogb_shapes_and_split():
    task = products.products_task(2000, seed=3)
    assert task.x.shape == (2000, products.NUM_FEATURES) and task.num_outputs == products.NUM_CLASSES
    assert {part: index.numel() for part, index in task.split.items()} == {"train": 160, "valid": 32, "test": 1808}
    assert torch.unique(torch.cat(list(task.split.values()))).numel() == 2000
    assert float(torch.bincount(task.edge_index[1], minlength=2000).double().mean()) > 0.8 * products.AVG_DEGREE
    y = task.y[:10].view(-1, 1)
    assert task.evaluator.eval({"y_true": y, "y_pred": y})["acc"] == 1.0
    assert task.evaluator.eval({"y_true": y, "y_pred": y + 1})["acc"] == 0.0
    with pytest.raises(ValueError, match="num_nodes"):
        products.products_task(1)


@pytest.mark.parametrize("argv, message", [
    (["--neighbor-loader", "--fanout", "5"], "--fanout"),
    (["--epochs", "0"], "--epochs"),
    (["--synthetic", "--dataset", "Cora"], "--synthetic"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    assert message in capsys.readouterr().err


def test_models_validate_their_arguments():
    with pytest.raises(ValueError, match="backend"):
        models.SAGE("dgl", 3, 4, 2, 2, 0.0)
    with pytest.raises(ValueError, match="aggr"):
        models.SAGE("ours", 3, 4, 2, 2, 0.0, aggr="lstm")
    with pytest.raises(ValueError, match="pyg_format"):
        models.prepare_adjacency("pyg", torch.zeros(2, 0, dtype=torch.long), 3, "coo")


def sampled_batch(num_nodes=60, fanout=(4, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, 400), generator=g)
    sampler = NeighborSampler.from_edge_index(edge_index, list(fanout), num_nodes)
    return sampler.sample(torch.randperm(num_nodes, generator=g)[:8], g)


@pytest.mark.parametrize("pyg_format", models.PYG_FORMATS)
@pytest.mark.parametrize("aggr", models.AGGRS)
def test_a_block_step_equals_pyg_in_outputs_and_gradients(aggr, pyg_format):
    """The same batch's blocks: ours (from_batch) against PyG's CSR or edge_index."""
    batch = sampled_batch()
    x = torch.randn(60, 6)
    results = {}
    for backend in models.BACKENDS:
        torch.manual_seed(0)
        model = models.SAGE(backend, 6, 8, 3, 2, 0.0, aggr)
        features = x[batch.nodes].requires_grad_()
        out = model.forward_blocks(features, blocks.block_adjacencies(backend, batch, pyg_format))
        assert out.shape == (batch.batch_size, 3)
        (out * torch.arange(out.numel(), dtype=out.dtype).view_as(out).cos()).sum().backward()
        results[backend] = [out, features.grad] + [p.grad for p in model.parameters()]
    for ours, theirs in zip(results["ours"], results["pyg"]):
        torch.testing.assert_close(ours, theirs)


def test_a_step_converts_each_block_light(monkeypatch):
    from torch_tcsparse.structure import CsrStructure

    made = record_converted_blocks(monkeypatch)
    batch = sampled_batch(fanout=(4, 3, 2))
    torch.manual_seed(0)
    model = models.SAGE("ours", 6, 8, 3, 3, 0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(60, 6), torch.randint(0, 3, (60,))
    loss = blocks.train_step(model, optimizer, batch, x, y, "ours")
    assert loss.dim() == 0 and not loss.requires_grad
    assert [tuple(a.shape) for a in made] == [(t, s) for _, (s, t) in batch.layer_edges()]
    assert all(isinstance(a._structure, CsrStructure) for a in made)


def test_pyg_loader_batches_read_as_sampled_batches():
    from torch_geometric.data import Data

    batch = sampled_batch()
    data = Data(n_id=batch.nodes, edge_index=batch.edge_index, num_nodes=batch.nodes.numel(),
                num_sampled_nodes=list(batch.num_sampled_nodes), num_sampled_edges=list(batch.num_sampled_edges))
    read = blocks.from_pyg_batch(data)
    assert torch.equal(read.nodes, batch.nodes) and torch.equal(read.edge_index, batch.edge_index)
    assert read.num_sampled_nodes == batch.num_sampled_nodes and read.num_sampled_edges == batch.num_sampled_edges
    del data.num_sampled_edges
    with pytest.raises(ValueError, match="num_sampled"):
        blocks.from_pyg_batch(data)


def test_forward_blocks_needs_a_block_per_layer():
    model = models.SAGE("ours", 6, 8, 3, 3, 0.0)
    with pytest.raises(ValueError, match="one block per layer"):
        model.forward_blocks(torch.randn(5, 6), [])


def test_batch_adjacency_checks_its_arguments():
    edge_index = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="backend"):
        models.batch_adjacency("dgl", edge_index, 2)
    with pytest.raises(ValueError, match="pyg_format"):
        models.batch_adjacency("pyg", edge_index, 2, "coo")
    torch.testing.assert_close(models.batch_adjacency("ours", edge_index, 2).to_dense(),
                               models.batch_adjacency("pyg", edge_index, 2).to_dense())
    block = torch.tensor([[0, 4, 2], [1, 0, 1]])
    ours, theirs = (models.batch_adjacency(backend, block, (5, 2)) for backend in models.BACKENDS)
    assert ours.shape == theirs.shape == (2, 5)
    torch.testing.assert_close(ours.to_dense(), theirs.to_dense())
