"""benchmarks/gcn.py on CPU at tiny sizes: the three modes agree and every output file appears."""
import csv
import math

import pytest

pytest.importorskip("ogb", reason="ogb is not installed")
from benchmarks import gcn as gcn_benchmark  # noqa: E402
from graph_data.folders import data_root  # noqa: E402

DATA = data_root()


def needs(name: str, family: str):
    """Skips unless the data root holds every file the dataset's loader reads."""
    from examples.gcn import data

    missing = data.missing_files(name, DATA / family)
    return pytest.mark.skipif(bool(missing), reason=f"{name}: no {missing[0] if missing else ''} (set TCSPARSE_DATA)")


def test_quick_timing_on_rmat(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    gcn_benchmark.main(["--quick", "--parts", "timing", "--graphs", "rmat", "--scale", "8", "--device", "cpu"])
    with (tmp_path / "gcn_timing.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["mode"] for r in rows] == list(gcn_benchmark.MODES)
    for row in rows:
        assert row["graph"] == "rmat8" and int(row["nodes"]) == 256
        assert float(row["epoch_ms"]) > 0 and float(row["preprocess_ms"]) > 0
        assert float(row["rel_error"]) < 1e-5, row
    assert (tmp_path / "gcn_timing.png").stat().st_size > 0
    assert "speed-up (PyG epoch / ours)" in capsys.readouterr().out
    assert all(math.isnan(float(r["peak_gb"])) for r in rows), "no GPU memory on CPU"


def quick_accuracy(out, monkeypatch, *options, suffix=""):
    """The accuracy part with --quick on the CPU, results in ``out``: its per-run and summary rows
    (the CSV names carry ``suffix``, e.g. ``_seed5`` for --first-seed 5)."""
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("TCSPARSE_CACHE", str(out / "cache"))
    gcn_benchmark.main(["--quick", "--parts", "accuracy", "--device", "cpu", *options])
    rows = []
    for name in (f"gcn_accuracy_runs{suffix}.csv", f"gcn_accuracy{suffix}.csv"):
        with (out / name).open() as handle:
            rows.append(list(csv.DictReader(handle)))
    return rows


@needs("Cora", "planetoid")
def test_quick_accuracy_rows_per_run(tmp_path, monkeypatch):
    runs, summary = quick_accuracy(tmp_path, monkeypatch, "--accuracy-datasets", "Cora", "--seeds", "2",
                                   "--first-seed", "5", suffix="_seed5")
    assert [(r["backend"], r["seed"]) for r in runs] == [("tcsparse", "5"), ("tcsparse", "6"), ("pyg", "5"), ("pyg", "6")]
    summary = {row["backend"]: float(row["test_mean"]) for row in summary}
    # Same seeds give both backends the same initial weights, so the same accuracy up to rounding.
    assert abs(summary["tcsparse"] - summary["pyg"]) < 0.02


@needs("Cora", "planetoid")
def test_quick_accuracy_parallel_matches_in_process(tmp_path, monkeypatch, capsys):
    """Runs in subprocesses, two at once, give the per-run rows of the same seeds in one process."""
    tests = {}
    for parallel in ("1", "2"):
        runs, summary = quick_accuracy(tmp_path / parallel, monkeypatch, "--accuracy-datasets", "Cora", "--seeds", "2",
                                       "--parallel", parallel, "--data-root", str(DATA))
        tests[parallel] = {(r["backend"], r["seed"]): float(r["test"]) for r in runs}
        assert [r["concurrent_runs"] for r in summary] == [parallel, parallel]
    assert list(tests["2"]) == [("tcsparse", "0"), ("tcsparse", "1"), ("pyg", "0"), ("pyg", "1")]
    # Thread counts differ (a process's share of the cores), so summation order may too.
    assert tests["2"] == pytest.approx(tests["1"], abs=0.01)
    assert "2 concurrent runs sharing the device and host" in capsys.readouterr().out


@needs("ogbl-ddi", "ogb")
def test_quick_accuracy_in_parallel_subprocesses(tmp_path, monkeypatch):
    """ogbl-ddi, the dataset --parallel is for (read-only root, ogb's loader): one epoch per run."""
    runs, summary = quick_accuracy(tmp_path, monkeypatch, "--accuracy-datasets", "ogbl-ddi", "--seeds", "2",
                                   "--first-seed", "3", "--parallel", "2", "--data-root", str(DATA),
                                   suffix="_seed3")
    assert [(r["backend"], r["seed"]) for r in runs] == [("tcsparse", "3"), ("tcsparse", "4"), ("pyg", "3"), ("pyg", "4")]
    assert all(r["metric"] == "hits@20" and 0 <= float(r["test"]) <= 1 for r in runs)
    assert [(r["backend"], r["seeds"], r["concurrent_runs"]) for r in summary] == [("tcsparse", "2", "2"), ("pyg", "2", "2")]
    assert all(float(r["epoch_ms_median"]) > 0 for r in summary)


def test_failed_parallel_run_fails_the_stage(tmp_path, monkeypatch):
    """A run that exits non-zero is reported with its stderr, never dropped from the means."""
    pytest.importorskip("ogb", reason="the example's train module reads OGB datasets")
    monkeypatch.setattr("examples.gcn.train.load_task", lambda args: None)  # no dataset: the runs themselves fail
    monkeypatch.setattr(gcn_benchmark, "TRAIN_MODULE", "examples.gcn.missing_train")
    with pytest.raises(RuntimeError, match="(?s)2 of 2 accuracy runs failed.*exit status 1.*missing_train"):
        gcn_benchmark.runs_in_subprocesses({"none": []}, ["tcsparse"], [0, 1], parallel=2, folder=tmp_path / "runs")
