"""The partitioner and the single-GPU rank emulation on a GPU (skipped without CUDA), and the
clusters route of ``partition_blocks`` and the benchmark's ``--rebalance`` across two GPUs
under NCCL (skipped with fewer)."""
import csv

import pytest
import torch

from benchmarks import distributed as benchmark
from benchmarks.distributed.graph import rmat_block
import processes
from test_block_coarsening import IMBALANCE, cut, own_block, rmat, whole_part
from torch_tcsparse.distributed import partition_blocks, partition_rows
from torch_tcsparse.distributed.weighted_graph import ordered_cumsum

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


def test_float_running_sums_repeat():
    """Millions of float64 ratios, as the partitioner's prices and shares: the same sums bit for
    bit run after run (torch.cumsum's single-pass scan groups them by which blocks finish first)."""
    values = torch.rand(1 << 23, dtype=torch.float64, device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(0)) / 7
    first = ordered_cumsum(values)
    for _ in range(20):
        assert torch.equal(ordered_cumsum(values), first)
    assert torch.allclose(first, torch.cumsum(values.cpu(), 0).cuda(), rtol=1e-12, atol=0)


def test_emulated_ranks_report_memory(tmp_path):
    benchmark.main(["--scales", "12", "--epochs", "1", "--features", "16", "--hidden", "32", "--emulate", "2",
                    "--out", str(tmp_path)])
    with open(tmp_path / "distributed_emulated.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["rank"]) for r in rows] == [0, 1]
    for row in rows:
        assert 0 < float(row["peak_gb"]) and 0 < float(row["predicted_peak_gb"]) and row["within_target"] in ("0", "1")


def check_clusters_on_gpus() -> None:
    """Each rank's block on its own GPU: the clusters route gives valid, balanced parts on the
    blocks' device, the same parts run after run, and a cut within 1.1x of the whole route's."""
    rowptr, col = rmat()
    bounds, block_rowptr, block_col = own_block(rowptr, col)
    device = torch.device("cuda", torch.cuda.current_device())
    block_rowptr, block_col = block_rowptr.to(device), block_col.to(device)
    clusters = partition_blocks(block_rowptr, block_col, bounds, seed=1, gather="clusters")
    assert clusters.device == device
    again = partition_blocks(block_rowptr, block_col, bounds, seed=1, gather="clusters")
    assert torch.equal(clusters, again)
    whole = whole_part(partition_blocks(block_rowptr, block_col, bounds, seed=1, gather="whole").cpu())
    clusters = whole_part(clusters.cpu())
    world = torch.distributed.get_world_size()
    weight = torch.bincount(clusters, weights=(rowptr.diff() + 1).double(), minlength=world)
    assert float(weight.max()) <= (1 + IMBALANCE) * float(weight.sum()) / world + 1, weight.tolist()
    assert cut(clusters, rowptr, col) <= 1.1 * cut(whole, rowptr, col)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL puts one rank on each)")
def test_clusters_route_on_two_gpus():
    processes.run(2, check_clusters_on_gpus, backend="nccl")


def check_benchmark_on_gpus(out) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    benchmark.measure(benchmark.parse_args(["--scales", "12", "--epochs", "1", "--features", "16", "--hidden", "32",
                                            "--configs", "plain", "--link-mb", "1", "--rebalance", "--out", str(out)]),
                      device)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL puts one rank on each)")
def test_benchmark_rebalances_on_two_gpus(tmp_path):
    """Each rank times its epoch alone (no collective), the time weight is fitted and the graph
    partitioned again: a one-GPU row and a two-GPU row, which keeps the one-GPU memory weight."""
    processes.run(2, check_benchmark_on_gpus, tmp_path, backend="nccl")
    with open(tmp_path / "distributed.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["gpus"] for r in rows] == ["1", "2"] and all(r["status"] == "ok" for r in rows)
    assert rows[1]["row_weight"].split(";")[1:] == rows[0]["row_weight"].split(";")[1:]
