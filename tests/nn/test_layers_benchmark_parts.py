"""benchmarks/layers.py as a CPU smoke test: the sum of parts beside each of our rows (the sparse
products recorded during one forward, one per propagation, and the pass without them), the
attention layers on every route, the corpus's graphs with their split reported apart."""
import csv

import pytest
import torch

pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
from benchmarks import layers  # noqa: E402
from graph_data import synthetic  # noqa: E402

TINY = ["--device", "cpu", "--scale", "5", "--features", "16", "--warmup", "0", "--reps", "1", "--real"]


def test_parts_beside_our_rows(tmp_path, capsys):
    chosen = ["APPNP", "GATConv-h8", "TransformerConv-h8", "SAGEConv-max"]
    rows = layers.main([*TINY, "--layers", *chosen, "--out", str(tmp_path)])
    assert {(row["layer"], row["route"]) for row in rows} == {(l, r) for l in chosen for r in layers.ROUTES}
    for row in rows:
        assert row["split"] == "fit" and float(row["epoch_ms"]) > 0
        if row["route"] == "ours":
            products, dense = float(row["products_ms"]), float(row["dense_ms"])
            assert products > 0 and dense > 0
            assert float(row["overhead"]) == pytest.approx(float(row["epoch_ms"]) / (products + dense), rel=1e-2)
        else:
            assert row["products_ms"] == row["dense_ms"] == row["overhead"] == ""
    with open(tmp_path / "layers.csv") as handle:
        assert list(csv.DictReader(handle))[0].keys() == set(layers.FIELDS)
    out = capsys.readouterr().out
    assert "fit families" in out and "unseen families" not in out and "GATConv-h8" in out


@pytest.mark.parametrize("name, sparse_calls", [("APPNP", 10), ("SGConv", 2), ("TAGConv", 3), ("GATConv-h8", 2),
                                                ("TransformerConv-h8", 2), ("GCNConv-normalize", 1)])
def test_recorded_products_are_the_propagations(name, sparse_calls):
    row, col, num_nodes = synthetic.rmat(5)
    factory, pyg_class, normalized = layers.LAYERS[name]
    layer = factory(layers.fused(pyg_class), 16, 16)
    graph_args = layers.prepare("ours", torch.stack([row, col]), num_nodes, normalized)
    x = torch.randn(num_nodes, 16, requires_grad=True)
    assert len(layers.recorded_products(layer, x, graph_args)) == sparse_calls
    products, dense = layers.parts_ms(layer, x, graph_args, torch.device("cpu"), 0, 1)
    assert products > 0 and dense > 0


def test_the_dense_pass_keeps_the_layer_differentiable():
    """With the products replaced, the pass still reaches every parameter and the input."""
    row, col, num_nodes = synthetic.rmat(5)
    factory, pyg_class, normalized = layers.LAYERS["GATConv-h8"]
    layer = factory(layers.fused(pyg_class), 16, 16)
    graph_args = layers.prepare("ours", torch.stack([row, col]), num_nodes, normalized)
    x = torch.randn(num_nodes, 16, requires_grad=True)
    with layers._replaced(lambda name, original: layers._free_call(name)):
        layers.training_step(layer, x, graph_args)()
    assert all(p.grad is not None for p in layer.parameters()) and x.grad.shape == x.shape


def test_corpus_split_reported_apart(tmp_path, capsys):
    rows = layers.main(["--device", "cpu", "--features", "8", "--warmup", "0", "--reps", "1", "--corpus", "unseen",
                        "--tier", "small", "--no-real", "--layers", "LGConv", "--routes", "ours", "--out",
                        str(tmp_path)])
    assert rows and {row["split"] for row in rows} == {"unseen"}
    assert "unseen families" in capsys.readouterr().out
