"""benchmarks/layers.py on tiny inputs: every layer and route gives a row in layers.csv, rows of a
route match PyG's output, real graphs are used where present, arguments are checked."""
import csv

import pytest
import torch

pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
from benchmarks import layers  # noqa: E402
from graph_data import npz, synthetic  # noqa: E402

TINY = ["--device", "cpu", "--scale", "6", "--features", "8", "--warmup", "0", "--reps", "1"]


def test_every_layer_and_route_writes_a_row(tmp_path, capsys):
    rows = layers.main([*TINY, "--real", "no_such_graph", "--out", str(tmp_path)])
    assert {(row["layer"], row["route"]) for row in rows} == {(l, r) for l in layers.LAYERS for r in layers.ROUTES}
    with open(tmp_path / "layers.csv") as handle:
        written = list(csv.DictReader(handle))
    assert len(written) == len(rows) and set(written[0]) == set(layers.FIELDS)
    assert all(float(row["epoch_ms"]) > 0 and row["peak_mib"] == "" for row in written)
    assert "no_such_graph: not in" in capsys.readouterr().out


@pytest.mark.parametrize("layer_name", list(layers.LAYERS))
def test_routes_compute_the_same_layer(layer_name):
    row, col, num_nodes = synthetic.rmat(5)
    edge_index = torch.stack([row, col])
    factory, pyg_class, normalized = layers.LAYERS[layer_name]
    x = torch.randn(num_nodes, 4)
    outputs = []
    for route in layers.ROUTES:
        torch.manual_seed(0)
        layer = factory(pyg_class, 4, 3)
        outputs.append(layer(x, *layers.prepare(route, edge_index, num_nodes, normalized)))
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0], rtol=1e-4, atol=1e-5)


def test_a_real_graph_where_present(tmp_path):
    names = {path.stem for path in npz.list_graphs()}
    if "planetoid_cora" not in names:
        pytest.skip(f"planetoid_cora.npz is not in {npz.graph_dir()} (set TCSPARSE_DATA)")
    rows = layers.main([*TINY, "--scale", "0", "--real", "planetoid_cora", "--layers", "GCNConv",
                        "--routes", "ours", "--out", str(tmp_path)])
    assert [(row["graph"], row["nodes"]) for row in rows] == [("planetoid_cora", 2708)]


@pytest.mark.parametrize("argv", [["--reps", "0"], ["--scale", "1"], ["--features", "0"], ["--layers", "GATConv"]])
def test_bad_arguments_are_named(argv, capsys):
    with pytest.raises(SystemExit):
        layers.parse_args(argv)
    assert argv[0] in capsys.readouterr().err
