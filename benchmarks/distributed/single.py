"""The one-GPU run: the whole graph in one process, its epoch, sparse products and peak memory."""
from __future__ import annotations

import statistics
import time

import torch

from torch_tcsparse.distributed import EmulatedPeers, gcn_part

from benchmarks.common import copy_bandwidth

from .graph import node_features, node_labels, rmat_block
from .training import (WARMUP, allocated_gb, epochs, loss_curve, make_model, peak_gb, products_time, reset_peak,
                       synchronize)


def gb_needed(args) -> float | None:
    """The one-GPU peak of this scale by the last one-GPU run's bytes per nonzero (the graph)
    and per row (the rest), its nonzeros scaled with the drawn edges; None before any."""
    reference = args.reference
    if reference is None:
        return None
    growth = (args.num_nodes / reference["nodes"]) * (args.edge_factor / reference["edge_factor"])
    graph = reference["graph_gb"] * growth
    rest = (reference["peak_gb"] - reference["graph_gb"]) * args.num_nodes / reference["nodes"]
    return graph + rest


def single_gpu(args, device) -> dict:
    """Trains on the whole graph alone (a part of one rank is the whole matrix). Skipped, and
    said so, where a smaller scale's bytes per nonzero and per row say it cannot fit."""
    needed = gb_needed(args)
    if device.type == "cuda" and needed is not None:
        capacity = torch.cuda.get_device_properties(device).total_memory / 2**30
        if needed > capacity:
            return {"status": f"does not fit one GPU ({needed:.0f} GB needed, {capacity:.0f} GB)",
                    "single_gb_needed": needed, "peak_gb": float("nan")}
    # The device's copy bandwidth prices the passes over memory a split into ranks adds (the model's).
    copy_gbps = copy_bandwidth() / 1e9 if device.type == "cuda" else ""
    reset_peak(device)
    start = time.perf_counter()
    try:
        rowptr, col = rmat_block(args.scale, args.edge_factor, 0, args.num_nodes, device)
        whole = EmulatedPeers(0, 1, [torch.zeros(0, dtype=torch.long)])
        matrix = gcn_part(rowptr, col, None, (0, args.num_nodes), group=whole).interior
        del rowptr, col
        synchronize(device)
        build_s, build_peak = time.perf_counter() - start, peak_gb(device)
        graph_gb = allocated_gb(device)
        sparse_s = products_time(matrix, args, device)
        reset_peak(device)
        nodes = torch.arange(args.num_nodes, device=device)
        x, y = node_features(nodes, args.features, 0), node_labels(nodes, args.classes, 0)
        times, losses = epochs(make_model(args, device), x, y, matrix, nodes, args, device, 1)
        epoch_s = statistics.median(times[WARMUP:])
    except torch.cuda.OutOfMemoryError:
        return {"status": "out of memory", "single_gb_needed": needed, "peak_gb_per_rank": f"{peak_gb(device):.2f}",
                "peak_gb": peak_gb(device)}
    row = {"status": "ok", "losses": loss_curve(losses), "epoch_ms": 1000 * epoch_s, "compute_ms": 1000 * epoch_s, "exchange_ms": 0.0,
           "halo_rows": 0, "cut_nonzeros": 0, "halo_bytes_per_epoch": 0, "cut_x_feature_bytes": 0,
           "rows_per_rank": str(args.num_nodes), "nnz_per_rank": str(matrix.nnz), "halo_per_rank": "0",
           "nnz": matrix.nnz, "build_s": build_s, "sparse_ms": 1000 * sparse_s, "graph_gb": graph_gb,
           "build_peak_gb_per_rank": f"{build_peak:.2f}", "peak_gb_per_rank": f"{peak_gb(device):.2f}",
           "peak_gb": peak_gb(device), "copy_gbps": copy_gbps}
    if device.type == "cuda":
        args.reference = {"nodes": args.num_nodes, "edge_factor": args.edge_factor, "graph_gb": graph_gb,
                          "peak_gb": row["peak_gb"]}
    return row


def measured_row_weights(row: dict) -> tuple[int, int]:
    """A row's time and memory in nonzeros on one GPU: the time per row of what is not the
    sparse products over the products' time per nonzero, and the training bytes per row over
    the graph's bytes per nonzero (0 where unmeasured)."""
    sparse_s, epoch_s = row["sparse_ms"] / 1e3, row["epoch_ms"] / 1e3
    per_row = max(epoch_s - sparse_s, 0.0) / row["nodes"]
    per_nonzero = sparse_s / row["nnz"]
    time_weight = round(per_row / per_nonzero) if per_nonzero > 0 else 0
    graph_per_nonzero = row["graph_gb"] / row["nnz"]
    train_per_row = (row["peak_gb"] - row["graph_gb"]) / row["nodes"]
    memory_weight = round(train_per_row / graph_per_nonzero) if graph_per_nonzero > 0 else 0
    return time_weight, memory_weight
