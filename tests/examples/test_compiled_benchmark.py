"""benchmarks/compiled.py on the CPU at a tiny size: it times eager and compiled products and
epochs (forward and loss compiled, and the whole step), the compiled product equals the eager
one, and the CSV appears; benchmarks/compiled_profile.py profiles them."""
import csv

from benchmarks import compiled, compiled_profile


def test_quick_run_on_generated_graph(tmp_path, capsys):
    rows = compiled.main(["--graphs", "absent_graph", "--fallback-nnz", "400", "--device", "cpu",
                          "--backend", "aot_eager", "--n", "4", "--features", "8", "--hidden", "8",
                          "--classes", "3", "--calls", "2", "--samples", "2", "--epochs", "2",
                          "--warmup", "1", "--out", str(tmp_path)])
    assert [r["graph"] for r in rows] == ["uniform_400"]
    row = rows[0]
    assert row["rel_error"] < 1e-6
    for key in ("product_eager_us", "product_compiled_us", "epoch_eager_ms", "epoch_compiled_ms",
                "epoch_whole_ms", "sage_epoch_whole_ms"):
        assert row[key] > 0, key
    with (tmp_path / "compiled_cpu.csv").open() as handle:
        written = list(csv.DictReader(handle))
    assert written[0]["graph"] == "uniform_400" and written[0]["path"] == "csr"
    assert "targets: compiled epoch" in capsys.readouterr().out


def test_profile_of_the_compiled_calls(capsys):
    compiled_profile.main(["--graph", "absent_graph", "--device", "cpu", "--backend", "aot_eager", "--n", "4",
                           "--calls", "2", "--rows", "3"])
    out = capsys.readouterr().out
    assert "the matrix enters the compiled product as" in out and "guards" in out
    for title in ("compiled product", "GCN epoch, eager", "GCN epoch, compiled", "GCN epoch, whole"):
        assert f"== {title}:" in out, title
