"""The benchmark's single-GPU rank emulation (here on the CPU), its R-MAT blocks, and its errors:
one line, once, with the same exit code from every rank under torchrun."""
import csv
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import distributed as benchmark
from benchmarks.distributed import cli
from benchmarks.distributed.graph import rmat_block, scramble
from torch_tcsparse.distributed import EmulatedPeers
from torch_tcsparse.distributed.model import Measured, PartShape, predict

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--device", "cpu", "--scales", "8", "--epochs", "1", "--features", "8", "--hidden", "8"]


def test_blocks_make_the_whole_graph():
    """Blocks of rows drawn apart are the rows of the whole graph; the graph is symmetric."""
    rowptr, col = rmat_block(9, 8, 0, 512, "cpu", chunk_edges=1000)
    first = rmat_block(9, 8, 0, 200, "cpu", chunk_edges=1000)
    second = rmat_block(9, 8, 200, 512, "cpu", chunk_edges=1000)
    assert torch.equal(torch.cat([first[1], second[1]]), col)
    assert torch.equal(torch.cat([first[0][:-1], second[0] + first[0][-1]]), rowptr)
    row = torch.repeat_interleave(torch.arange(512), rowptr.diff())
    assert torch.equal(torch.sort(row * 512 + col).values, torch.sort(col * 512 + row).values)
    assert not bool((row == col).any())
    assert torch.equal(torch.sort(scramble(torch.arange(1 << 9), 9)).values, torch.arange(1 << 9))


def test_emulated_ranks_cover_the_graph(tmp_path):
    benchmark.main(SMALL + ["--emulate", "2,3", "--out", str(tmp_path)])
    with open(tmp_path / "distributed.csv", newline="") as handle:
        single = next(csv.DictReader(handle))
    with open(tmp_path / "distributed_emulated.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(int(r["gpus"]), int(r["rank"])) for r in rows] == [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
    for parts in (2, 3):
        ranks = [r for r in rows if int(r["gpus"]) == parts]
        assert sum(int(r["rows"]) for r in ranks) == 256
        assert sum(int(r["nnz"]) for r in ranks) == int(single["nnz"])
        assert sum(int(r["halo_in"]) for r in ranks) == sum(int(r["halo_out"]) for r in ranks) > 0
        assert all(float(r["compute_ms"]) > 0 for r in ranks)


def test_emulated_peers_check_their_arguments():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\) and requested must hold 2 id lists, got rank 2"):
        EmulatedPeers(2, 2, [torch.zeros(0), torch.zeros(0)])


def test_predict_without_a_run_says_what_to_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["--predict", str(tmp_path / "distributed.csv")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0] and "--emulate" in lines[0]


def test_imbalance_is_given_per_row_weight(capsys):
    args = cli.parse_args(["--row-weight", "100,143,20"])
    cli.set_row_weight(args, None)
    assert args.current_imbalance == (0.03, 0.15, 0.15)
    args = cli.parse_args(["--row-weight", "100", "--imbalance", "0.05"])
    cli.set_row_weight(args, None)
    assert args.current_imbalance == (0.05,)
    with pytest.raises(SystemExit):
        cli.parse_args(["--imbalance", "0.03,1.2"])
    assert "--imbalance entries must be in (0, 1), got (0.03, 1.2)" in capsys.readouterr().err


def test_predict_checks_every_run_on_its_own_partition(tmp_path):
    """A run recorded with its ranks' shapes is modelled on that partition; a graph with no
    one-GPU row scales from the largest graph of the same network, and one of another network
    is said and left out."""
    benchmark.main(SMALL + ["--emulate", "2", "--out", str(tmp_path / "one")])
    with open(tmp_path / "one" / "distributed.csv", newline="") as handle:
        one = next(csv.DictReader(handle))
    run = one | {"graph": "rmat9", "nodes": "512", "nnz": "9000", "gpus": "2", "partitioner": "multilevel-clusters",
                 "config": "plain", "epoch_ms": "3.0", "rows_per_rank": "300;212", "nnz_per_rank": "6000;3000",
                 "cut_per_rank": "900;700", "halo_per_rank": "150;120", "send_per_rank": "120;150",
                 "partition_s": "0.5", "link_gbps": "4.0", "peak_gb": "1.5"}
    other = run | {"graph": "rmat10", "hidden": "16"}
    (tmp_path / "runs").mkdir()
    with open(tmp_path / "runs" / "distributed.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(run))
        writer.writeheader()
        writer.writerows([run, other])
    benchmark.main(["--predict", f"{tmp_path / 'one' / 'distributed.csv'},{tmp_path / 'runs' / 'distributed.csv'}",
                    "--parts", "2", "--out", str(tmp_path / "model")])
    with open(tmp_path / "model" / "distributed_model.csv", newline="") as handle:
        results = list(csv.DictReader(handle))
    assert [(r["graph"], r["partition"], r["calibrated_on"]) for r in results] == [
        ("rmat8", "afresh", "rmat8"), ("rmat9", "run", "rmat8")]
    shape = PartShape(*(torch.tensor([int(v) for v in run[key].split(";")]) for key in
                        ("rows_per_rank", "nnz_per_rank", "halo_per_rank", "send_per_rank", "cut_per_rank")))
    # On a CPU the products, timed apart, can take longer than the epoch: the rest is then 0.
    dense_s = max(float(one["epoch_ms"]) - float(one["sparse_ms"]), 0.0) / 1e3
    measured = Measured(256, int(one["nnz"]), float(one["sparse_ms"]) / 1e3, dense_s, float("nan"), 4e9)
    expected = predict(shape, measured, (8, 8, 16, 2), 4 * (8 * 8 + 8 + 8 * 16 + 16))
    assert float(results[1]["predicted_epoch_ms"]) == pytest.approx(1000 * expected.epoch_s)
    assert float(results[1]["measured_epoch_ms"]) == 3.0
    table = (tmp_path / "model" / "distributed_model.md").read_text()
    assert "| rmat9 | 2 | rmat8 |" in table and "rmat10" not in table
    # Only the runs' own partitions: no graph generated, the same row for the run.
    benchmark.main(["--predict", f"{tmp_path / 'one' / 'distributed.csv'},{tmp_path / 'runs' / 'distributed.csv'}",
                    "--parts", "none", "--out", str(tmp_path / "runs_only")])
    with open(tmp_path / "runs_only" / "distributed_model.csv", newline="") as handle:
        assert list(csv.DictReader(handle)) == results[1:]
    # A copy bandwidth prices the passes over memory the split adds (a CPU run measures none).
    benchmark.main(["--predict", f"{tmp_path / 'one' / 'distributed.csv'},{tmp_path / 'runs' / 'distributed.csv'}",
                    "--parts", "none", "--copy-gbps", "2", "--out", str(tmp_path / "priced")])
    with open(tmp_path / "priced" / "distributed_model.csv", newline="") as handle:
        priced = next(csv.DictReader(handle))
    priced_measured = dataclasses.replace(measured, copy_bytes_per_s=2e9)
    expected = predict(shape, priced_measured, (8, 8, 16, 2), 4 * (8 * 8 + 8 + 8 * 16 + 16))
    assert float(priced["predicted_epoch_ms"]) == pytest.approx(1000 * expected.epoch_s)
    assert float(priced["predicted_epoch_ms"]) > float(results[1]["predicted_epoch_ms"])


def test_errors_under_torchrun_are_one_line(tmp_path):
    """Every rank exits with an error; the line is printed once, before torchrun's own report of
    the failed ranks, and no rank prints a traceback."""
    environment = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "benchmarks.distributed",
               "--device", "cpu", "--predict", str(tmp_path / "absent.csv")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "benchmarks.distributed: error:" in line]
    assert len(errors) == 1 and "absent.csv does not exist" in errors[0], result.stderr
    before_report = result.stderr.split("ChildFailedError")[0]
    assert "benchmarks.distributed: error:" in before_report and "benchmarks/distributed" not in before_report
