"""Single-GPU rank emulation: each rank of a P-way run built and trained alone on this device, its
halo exchange replaced by copies of rows it holds (``EmulatedPeers``), so that the device's peak
memory and compute time are those of that rank; only the transfers are missing.

The whole graph's structure lives on the host (the rows of every rank are cut from it there);
the partition runs on the device, as on rank 0 of a real run, and is freed before the ranks are
built. Rows are reported per rank with the model's prediction of its memory and the target of a
rank's peak: 1.2 times the one-GPU peak over P, plus its halo buffers.
"""
from __future__ import annotations

import statistics
import time

import torch

from torch_tcsparse.distributed import EmulatedPeers, NodePartition, gcn_part, partition_rows
from torch_tcsparse.distributed.model import Measured, graph_bytes, part_shape, predict_ranks, product_widths

from .graph import node_features, node_labels, rmat_block
from .prediction import measured_of
from .training import WARMUP, allocated_gb, epochs, make_model, network, peak_gb, reset_peak, synchronize

# The target's allowance over an even split of the one-GPU peak.
TARGET_FACTOR = 1.2


def host_graph(args, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole graph's CSR on the host, drawn on ``device`` (the same draws as the ranks')."""
    rowptr, col = rmat_block(args.scale, args.edge_factor, 0, args.num_nodes, device)
    return rowptr.cpu(), col.cpu()


def partition_on_device(args, rowptr, col, parts: int, device) -> tuple[NodePartition, float, float]:
    """The partition of the host graph, computed on ``device``; its seconds and peak GB there."""
    reset_peak(device)
    start = time.perf_counter()
    index = torch.int32 if args.num_nodes <= torch.iinfo(torch.int32).max else torch.int64
    partition = partition_rows(rowptr.to(device), col.to(device, index), parts, args.partitioner,
                               row_weight=args.current_row_weight, imbalance=args.current_imbalance)
    synchronize(device)
    return partition, time.perf_counter() - start, peak_gb(device)


def rank_rows(partition: NodePartition, rowptr, col) -> tuple[list, list[list[torch.Tensor]]]:
    """Every rank's rows (columns in partition positions) and, per rank, the ids each other
    rank requests from it: what the real ranks exchange when they build their parts."""
    parts = partition.num_parts
    rows = [partition.rows(rowptr, col, None, rank) for rank in range(parts)]
    inner = torch.tensor(partition.bounds[1:-1], dtype=torch.long)
    requested = [[None] * parts for _ in range(parts)]
    for rank, (_, columns, _) in enumerate(rows):
        first, end = partition.bounds[rank], partition.bounds[rank + 1]
        halo = torch.unique(columns[(columns < first) | (columns >= end)])
        counts = torch.bincount(torch.searchsorted(inner, halo, right=True), minlength=parts).tolist()
        for owner, ids in enumerate(torch.split(halo, counts)):
            requested[owner][rank] = ids
    return rows, requested


def emulate(args, device, single: dict) -> list[dict]:
    """One row per rank of each P of ``args.emulate``: its part's shape, build and training peak,
    compute time per epoch, the model's memory for it and the target."""
    rowptr, col = host_graph(args, device)
    measured = measured_from(single, args)
    widths = product_widths(args.features, args.hidden, args.classes, args.layers)
    widest = max(width for width, _ in widths)
    results = []
    for parts in args.emulate:
        partition, partition_s, partition_peak = partition_on_device(args, rowptr, col, parts, device)
        shape = part_shape(partition, rowptr, col)
        predicted = predict_ranks(shape, measured, network(args), emulated=True) if measured else None
        graphs = graph_bytes(shape, measured) if measured else None
        rows, requested = rank_rows(partition, rowptr, col)
        for rank in range(parts):
            results.append(_emulated_rank(args, device, partition, rows[rank], requested[rank], rank, widest)
                           | {"partition_s": partition_s, "partition_peak_gb": partition_peak})
            row = results[-1]
            if predicted is not None:
                row["predicted_peak_gb"] = float(predicted.memory_bytes[rank]) / 2**30
                row["predicted_graph_gb"] = float(graphs[rank]) / 2**30
                row["predicted_compute_ms"] = 1000 * float(predicted.compute_s[rank])
            if single.get("status") == "ok" and device.type == "cuda":
                row["target_gb"] = TARGET_FACTOR * single["peak_gb"] / parts + row["halo_gb"]
                row["within_target"] = int(row["peak_gb"] <= row["target_gb"])
            print(format_emulated(row), flush=True)
            rows[rank] = None
    return results


def _emulated_rank(args, device, partition: NodePartition, rows, requested: list[torch.Tensor], rank: int,
                   widest: int) -> dict:
    parts = partition.num_parts
    own_rowptr, own_col, _ = rows
    reset_peak(device)
    start = time.perf_counter()
    part = gcn_part(own_rowptr.to(device), own_col.to(device), None, partition.bounds,
                    group=EmulatedPeers(rank, parts, requested))
    synchronize(device)
    build_s, build_peak, graph_gb = time.perf_counter() - start, peak_gb(device), allocated_gb(device)
    reset_peak(device)
    nodes = partition.nodes(rank).to(device)
    x, y = node_features(nodes, args.features, 0), node_labels(nodes, args.classes, 0)
    part.fix_features(x)
    epoch_s = statistics.median(epochs(make_model(args, device), x, y, part, nodes, args, device, parts)[0][WARMUP:])
    send = sum(part.send_counts)
    row = {"mode": "emulated", "graph": f"rmat{args.scale}", "nodes": args.num_nodes, "gpus": parts, "rank": rank,
           "partitioner": partition.method, "rows": part.num_own, "nnz": part.nnz,
           "boundary_nnz": part.boundary.nnz, "halo_in": part.num_halo, "halo_out": send,
           "halo_gb": (part.num_halo + send) * widest * 4 / 2**30, "build_s": build_s, "build_peak_gb": build_peak,
           "graph_gb": graph_gb, "compute_ms": 1000 * epoch_s, "peak_gb": peak_gb(device)}
    del part, x, y
    return row


def measured_from(single: dict, args) -> Measured | None:
    """The model's one-GPU inputs from the one-GPU row (None if it did not run or holds no
    memory figures); the link is not used for memory and compute."""
    if single.get("status") != "ok" or single.get("graph_gb") != single.get("graph_gb"):
        return None
    return measured_of(single | {"nodes": args.num_nodes}, float("inf"))


def format_emulated(row: dict) -> str:
    line = (f"{row['graph']} rank {row['rank']} of {row['gpus']} (emulated) [{row['partitioner']}]: "
            f"{row['rows']} rows, {row['nnz']} nnz ({row['boundary_nnz']} in halo columns), halo {row['halo_in']} in / "
            f"{row['halo_out']} out; build {row['build_s']:.1f} s, peak {row['build_peak_gb']:.2f} GB; "
            f"compute {row['compute_ms']:.1f} ms/epoch, peak {row['peak_gb']:.2f} GB")
    if "predicted_peak_gb" in row:
        line += (f" (model {row['predicted_peak_gb']:.2f} GB, graph {row['predicted_graph_gb']:.2f} GB against "
                 f"{row['graph_gb']:.2f}, {row['predicted_compute_ms']:.1f} ms)")
    if "target_gb" in row:
        line += f", target {row['target_gb']:.2f} GB: {'met' if row['within_target'] else 'MISSED'}"
    return line
