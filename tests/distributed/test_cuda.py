"""The partitioner and the single-GPU rank emulation on a GPU (skipped without CUDA)."""
import csv

import pytest
import torch

from benchmarks import distributed as benchmark
from benchmarks.distributed.graph import rmat_block
from torch_tcsparse.distributed import partition_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_partitioner_runs_on_the_graph_device():
    rowptr, col = rmat_block(12, 16, 0, 1 << 12, "cuda")
    partition = partition_rows(rowptr, col.int(), 4, row_weight=(0, 64))
    assert partition.bounds[-1] == 1 << 12
    assert torch.equal(torch.sort(partition.order).values, torch.arange(1 << 12))
    again = partition_rows(rowptr, col.int(), 4, row_weight=(0, 64))
    assert torch.equal(again.order, partition.order), "integer weights: the same partition run after run"
    contiguous = partition_rows(rowptr, col, 4, "contiguous")
    assert partition.cut_nonzeros(rowptr.cpu(), col.cpu()) < contiguous.cut_nonzeros(rowptr.cpu(), col.cpu())


def test_emulated_ranks_report_memory(tmp_path):
    benchmark.main(["--scales", "12", "--epochs", "1", "--features", "16", "--hidden", "32", "--emulate", "2",
                    "--out", str(tmp_path)])
    with open(tmp_path / "distributed_emulated.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["rank"]) for r in rows] == [0, 1]
    for row in rows:
        assert 0 < float(row["peak_gb"]) and 0 < float(row["predicted_peak_gb"]) and row["within_target"] in ("0", "1")
