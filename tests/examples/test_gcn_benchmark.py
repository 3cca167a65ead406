"""benchmarks/gcn.py on CPU at tiny sizes: the three modes agree and every output file appears."""
import csv
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import gcn as gcn_benchmark  # noqa: E402

SHARED_DATA = REPO.parent / "shared" / "data"


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


@pytest.mark.skipif(not (SHARED_DATA / "planetoid" / "Cora" / "raw").is_dir(),
                    reason=f"Planetoid raw files not found under {SHARED_DATA / 'planetoid'}")
def test_quick_accuracy_rows_per_run(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("TCSPARSE_CACHE", str(tmp_path / "cache"))
    gcn_benchmark.main(["--quick", "--parts", "accuracy", "--accuracy-datasets", "Cora", "--seeds", "2",
                        "--first-seed", "5", "--device", "cpu"])
    with (tmp_path / "gcn_accuracy_runs_seed5.csv").open() as handle:
        runs = list(csv.DictReader(handle))
    assert [(r["backend"], r["seed"]) for r in runs] == [("tcsparse", "5"), ("tcsparse", "6"), ("pyg", "5"), ("pyg", "6")]
    with (tmp_path / "gcn_accuracy_seed5.csv").open() as handle:
        summary = {row["backend"]: float(row["test_mean"]) for row in csv.DictReader(handle)}
    # Same seeds give both backends the same initial weights, so the same accuracy up to rounding.
    assert abs(summary["tcsparse"] - summary["pyg"]) < 0.02
