"""benchmarks/batch.py on a tiny products-shaped graph: every matrix and route gives a row of
batch.csv, --train writes the epoch and accuracy tables with both backends on the same batches,
--quick scales the defaults, arguments are checked."""
import csv

import pytest
import torch

pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
from benchmarks import batch  # noqa: E402

TINY = ["--device", "cpu", "--nodes", "600", "--batch-size", "16", "--fanout", "4", "3", "--batches", "1",
        "--reps", "2"]


def read(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_every_matrix_and_route_writes_a_row(tmp_path):
    rows = batch.main([*TINY, "--out", str(tmp_path)])
    assert {(row["matrix"], row["route"]) for row in rows} == {
        (m, r) for m in ("subgraph", "layer1", "layer2") for r in batch.ROUTES
        if (m, r) != ("subgraph", "ours-sampled")}
    written = read(tmp_path / "batch.csv")
    assert len(written) == len(rows) and tuple(written[0]) == batch.FIELDS
    assert all(float(row[key]) > 0 for row in written for key in ("convert_us", "spmm_us", "host_us"))
    # layer blocks: [targets, sources], the first layer's sources all the batch's nodes
    by_matrix = {row["matrix"]: row for row in rows if row["route"] == "ours-batch"}
    assert by_matrix["layer1"]["cols"] == by_matrix["subgraph"]["cols"]
    assert by_matrix["layer2"]["rows"] == 16 and by_matrix["layer2"]["cols"] == by_matrix["layer1"]["rows"]
    assert by_matrix["subgraph"]["nnz"] == by_matrix["layer1"]["nnz"]
    assert all(row["layout_pays_after"] == "" for row in rows if row["route"] != "ours-batch")
    # A block the batch converts itself is the block from_batch converts, in the same shape.
    sampled = {row["matrix"]: row for row in rows if row["route"] == "ours-sampled"}
    assert all((sampled[m]["rows"], sampled[m]["nnz"]) == (by_matrix[m]["rows"], by_matrix[m]["nnz"]) for m in sampled)


def test_the_layout_pays_after_its_extra_conversion_over_the_products_saved():
    light = {"convert_us": 100.0, "spmm_us": 30.0}
    assert batch.layout_pays_after(light, {"convert_us": 500.0, "spmm_us": 10.0}) == 20.0
    assert batch.layout_pays_after(light, {"convert_us": 500.0, "spmm_us": 40.0}) == ""


def test_training_tables_over_the_same_batches(tmp_path):
    rows = batch.main([*TINY, "--routes", "ours-batch", "--train", "--epochs", "1", "--epoch-batches", "2",
                       "--seeds", "2", "--accuracy-epochs", "1", "--full-accuracy-epochs", "1", "--hidden", "8",
                       "--out", str(tmp_path)])
    epochs = read(tmp_path / "batch_epoch.csv")
    assert tuple(epochs[0]) == batch.EPOCH_FIELDS
    assert {(row["mode"], row["backend"], row["aggr"]) for row in epochs} == {
        ("mini-batch", "ours", "mean"), ("mini-batch", "pyg-csr", "mean"), ("mini-batch", "ours", "max"),
        ("mini-batch", "pyg-csr", "max"), ("full-batch", "ours", "mean"), ("full-batch", "pyg-csr", "mean")}
    assert all(float(row["epoch_ms"]) > 0 and float(row["convert_ms"]) > 0 for row in epochs)
    assert all((row["speedup"] != "") == (row["backend"] == "ours") for row in epochs)
    assert all(row["batches"] == "2" for row in epochs if row["mode"] == "mini-batch")
    accuracy = read(tmp_path / "batch_accuracy.csv")
    assert tuple(accuracy[0]) == batch.ACCURACY_FIELDS and len(accuracy) == 4
    by_run = {(row["mode"], row["backend"]): row for row in accuracy}
    for mode in ("mini-batch", "full-batch"):
        # the same seeds, batches and initial weights: the same function, the same accuracy
        assert by_run[(mode, "ours")]["test_acc_mean"] == by_run[(mode, "pyg")]["test_acc_mean"]
        assert by_run[(mode, "ours")]["seeds"] == "2"
    assert len([row for row in rows if "test_acc_mean" in row]) == 4


def test_quick_scales_the_defaults_and_explicit_values_win():
    quick = batch.parse_args(["--quick"])
    assert (quick.batches, quick.epochs, quick.epoch_batches, quick.seeds) == (2, 5, 32, 2)
    full = batch.parse_args([])
    assert (full.seeds, full.epoch_batches, full.accuracy_epochs) == (10, None, 5)
    assert batch.parse_args(["--quick", "--seeds", "5"]).seeds == 5


def test_epochs_are_timed_in_interleaved_rounds_after_one_warm_up_each():
    calls = []
    medians = batch.interleaved_epoch_ms({"ours": lambda: calls.append("ours"), "pyg": lambda: calls.append("pyg")},
                                         torch.device("cpu"), rounds=3)
    assert calls == ["ours", "pyg"] * 4
    assert set(medians) == {"ours", "pyg"} and all(ms >= 0 for ms in medians.values())


@pytest.mark.parametrize("argument, value", [("--batches", "0"), ("--n", "0"), ("--nodes", "1"),
                                             ("--fanout", "0"), ("--epoch-batches", "0"), ("--seeds", "-1"),
                                             ("--dropout", "1.0")])
def test_arguments_are_checked(argument, value, capsys):
    with pytest.raises(SystemExit):
        batch.parse_args([argument, value])
    assert argument.lstrip("-").split("-")[0] in capsys.readouterr().err


def test_runs_where_ogb_is_not_installed():
    """The benchmark's graph is generated: nothing it imports needs ogb (a GPU machine may lack it)."""
    import subprocess
    import sys

    code = "import sys; sys.modules['ogb'] = None; import benchmarks.batch, examples.sage.train"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
