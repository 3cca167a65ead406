"""benchmarks/compare.py: medians over rounds, after / before per cell."""
import csv

from benchmarks import compare

FIELDS = ["graph", "nnz", "N", "dtype", "base_ms", "balanced_ms", "rows_ms", "grouped_ms", "us_per_call"]


def write_round(folder, fastest_ms, per_call_us):
    folder.mkdir()
    with open(folder / "spmm.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerow({"graph": "g", "nnz": 10, "N": 32, "dtype": "float32", "base_ms": 1.0,
                         "balanced_ms": fastest_ms, "rows_ms": "nan", "grouped_ms": 2.0,
                         "us_per_call": per_call_us})


def test_spmm_medians_over_rounds(tmp_path, capsys):
    before = [tmp_path / f"b{i}" for i in range(3)]
    after = [tmp_path / f"a{i}" for i in range(3)]
    for folder, fastest in zip(before, (0.010, 0.012, 0.100)):
        write_round(folder, fastest, 10.0)
    for folder, fastest in zip(after, (0.011, 0.013, 0.009)):
        write_round(folder, fastest, 12.0)
    compare.main(["spmm", *map(str, before), "--after", *map(str, after)])
    out = capsys.readouterr().out
    assert "fastest_us small: after / before geomean 0.917" in out  # medians 11 / 12 us
    assert "per_call_us small: after / before geomean 1.200" in out


def test_host_tables_meet_across_path_names(tmp_path, capsys):
    log = "host us per call, N = 128, GPU\ncora float32\n  A @ X (path {})    {}\n  first choice 0.050 ms, one SpMM 0.010 ms: 5.00x\n"
    (tmp_path / "b.log").write_text(log.format("rows", 10.0))
    (tmp_path / "a.log").write_text(log.format("base", 9.0))
    compare.main(["host", str(tmp_path / "b.log"), "--after", str(tmp_path / "a.log")])
    out = capsys.readouterr().out
    assert "us A @ X: after / before geomean 0.900" in out
    assert "us first choice: after / before geomean 1.000" in out
