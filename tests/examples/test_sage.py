"""The GraphSAGE example end to end on a tiny OGB-format folder: both backends and aggregations
learn, ours matches PyG's on the same seed, and --neighbor-loader samples or says why not."""
import pytest
import torch

pytest.importorskip("ogb", reason="ogb is not installed")
pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
from examples.sage import models, train  # noqa: E402
from graph_data import ogb_format  # noqa: E402

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


def test_neighbor_loader_trains_or_falls_back(tiny_folder, capsys):
    history = train.main(["--dataset", tiny_folder, "--neighbor-loader", "--fanout", "5", "3",
                          "--batch-size", "64", *SMALL_RUN])
    assert len(history) == 4
    printed = capsys.readouterr().out
    fell_back = "training full-batch instead" in printed
    assert fell_back != train.neighbor_sampling_available()


def test_synthetic_is_products_shaped(capsys):
    history = train.main(["--synthetic", "--nodes", "300", *SMALL_RUN[:2], "--hidden", "8", "--layers", "1"])
    assert len(history) == 4
    assert "300 nodes" in capsys.readouterr().out


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


def sampled_batches(num_batches=3, num_nodes=40, batch_size=8, seed=0):
    """Subgraph batches as NeighborLoader yields them (the seeds first), without pyg-lib."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        edge_index = torch.unique(torch.randint(0, num_nodes, (2, 160), generator=g), dim=1)
        batches.append(Data(x=torch.randn(num_nodes, 6, generator=g), y=torch.randint(0, 3, (num_nodes,), generator=g),
                            edge_index=edge_index, num_nodes=num_nodes, batch_size=batch_size))
    return batches


@pytest.mark.parametrize("aggr", models.AGGRS)
def test_sampled_epoch_converts_each_batch_light_and_matches_pyg(aggr, monkeypatch):
    from torch_tcsparse.structure import CsrStructure

    made = []
    convert = models.TCSparseTensor.from_batch
    monkeypatch.setattr(models.TCSparseTensor, "from_batch",
                        lambda *args, **kwargs: made.append(convert(*args, **kwargs)) or made[-1])
    losses = {}
    for backend in models.BACKENDS:
        torch.manual_seed(0)
        model = models.SAGE(backend, 6, 8, 3, 2, 0.0, aggr)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        args = train.parse_args(["--backend", backend, "--aggr", aggr, "--layers", "2", "--fanout", "5", "3"])
        losses[backend] = train.sampled_epoch(model, optimizer, sampled_batches(), args, torch.device("cpu"))
    assert len(made) == 3 and all(isinstance(a._structure, CsrStructure) for a in made)
    assert losses["ours"] == pytest.approx(losses["pyg"], rel=1e-5)


def test_batch_adjacency_checks_its_arguments():
    edge_index = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="backend"):
        models.batch_adjacency("dgl", edge_index, 2)
    with pytest.raises(ValueError, match="pyg_format"):
        models.batch_adjacency("pyg", edge_index, 2, "coo")
    torch.testing.assert_close(models.batch_adjacency("ours", edge_index, 2).to_dense(),
                               models.batch_adjacency("pyg", edge_index, 2).to_dense())
