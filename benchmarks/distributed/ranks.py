"""The run on P ranks under torchrun: each rank generates its block of rows, the blocks are
partitioned on rank 0 (partition_blocks) and placed (Placement), every rank builds its part and
trains under each exchange configuration."""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torch_tcsparse.distributed import Placement, block_bounds, gcn_part, partition_blocks

from .graph import node_features, node_labels, rmat_block
from .training import (
    CONFIGS,
    WARMUP,
    ExchangeMeter,
    allocated_gb,
    epochs,
    loss_curve,
    make_model,
    peak_gb,
    reset_peak,
    synchronize,
)


def link_bandwidth(device, nbytes: int) -> float:
    """Bytes per second one rank sends in an all_to_all_single of about ``nbytes`` per rank."""
    world = dist.get_world_size()
    send = torch.ones(max(1, nbytes // 4 // world) * world, device=device)
    nbytes = send.numel() * 4
    receive = torch.empty_like(send)
    dist.all_to_all_single(receive, send)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(5):
        dist.all_to_all_single(receive, send)
    synchronize(device)
    # Of each rank's buffer, the share addressed to itself does not cross a link.
    return 5 * nbytes * (world - 1) / world / (time.perf_counter() - start)


def build_parts(args, device, progress) -> dict:
    """Generates this rank's block, partitions the blocks, places the rows and builds this
    rank's part; gathers every rank's shape and the time and peak memory of each step.
    ``progress`` (a ``progress.Progress``) reports each step as every rank ends it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    block = block_bounds(args.num_nodes, world)
    steps = {}

    def step(name, done, fn):
        reset_peak(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        steps[name] = (time.perf_counter() - start, peak_gb(device))
        progress(done)
        return result

    rowptr, col = step("generate", "graph generated",
                       lambda: rmat_block(args.scale, args.edge_factor, block[rank], block[rank + 1], device))
    part_of_rows = step("partition", "partitioned",
                        lambda: partition_blocks(rowptr, col, block, method=args.partitioner,
                                                 row_weight=args.current_row_weight, imbalance=args.current_imbalance,
                                                 gather=args.gather))
    placement = Placement(part_of_rows, block)
    rowptr, col, _ = step("place", "rows placed", lambda: placement.move_csr(rowptr, col))
    nodes = placement.move(torch.arange(block[rank], block[rank + 1], device=device))
    first, end = placement.bounds[rank], placement.bounds[rank + 1]
    cut = int(((col < first) | (col >= end)).sum())
    part = step("build", "part built", lambda: gcn_part(rowptr, col, None, placement.bounds,
                                                        progress=lambda stage: progress(f"{stage} built")))
    del rowptr, col
    shape = dict(rows=part.num_own, halo=part.num_halo, send=sum(part.send_counts), nnz=part.nnz, cut=cut,
                 graph_gb=allocated_gb(device), **{f"{name}_s": s for name, (s, _) in steps.items()},
                 **{f"{name}_peak": p for name, (_, p) in steps.items()})
    gathered = [None] * world
    dist.all_gather_object(gathered, shape)
    return {"part": part, "nodes": nodes, "bounds": placement.bounds, "ranks": gathered}


def train_config(args, device, built: dict, config: str, progress) -> dict:
    """Trains on this rank's part under one exchange; the row of the measurement. ``progress``
    reports the first epoch's forward and backward passes, every timed epoch, and the end of the
    instrumented ones (the same epochs again)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    overlap, halo_dtype = CONFIGS[config]
    part = built["part"].exchanging(overlap, halo_dtype)
    reset_peak(device)
    nodes = built["nodes"]
    x, y = node_features(nodes, args.features, 0), node_labels(nodes, args.classes, 0)
    part.fix_features(x)
    ddp = DistributedDataParallel(make_model(args, device), device_ids=[device.index] if device.type == "cuda" else None)
    progress(f"{config}: model and features ready")
    times, losses = epochs(ddp, x, y, part, nodes, args, device, world, progress.epochs(config))
    epoch_s = statistics.median(times[WARMUP:])
    train_peak = peak_gb(device)
    dist.all_reduce(losses)
    # Exchange and compute: means over the instrumented epochs, warm-up included on both sides.
    meter = ExchangeMeter(part, device)
    instrumented_s = statistics.mean(epochs(ddp, x, y, part, nodes, args, device, world)[0])
    meter.detach()
    progress(f"{config}: instrumented epochs done")
    exchange_s = meter.clock.seconds() / (WARMUP + args.epochs)
    width = sum(meter.widths) // (WARMUP + args.epochs)
    gathered = [None] * world
    dist.all_gather_object(gathered, dict(exchange_s=exchange_s, peak=train_peak))
    ranks = built["ranks"]
    halo_rows, cut = sum(r["halo"] for r in ranks), sum(r["cut"] for r in ranks)
    exchange_s = max(g["exchange_s"] for g in gathered)
    element = x.element_size() if halo_dtype is None else halo_dtype.itemsize
    root = ranks[0]
    method = "multilevel" if args.partitioner == "auto" else args.partitioner
    if args.gather == "clusters":
        method += "-clusters"
    return {"status": "ok", "partitioner": method, "row_weight": args.current_row_weight_text,
            "config": config, "losses": loss_curve(losses), "overlap": int(overlap), "halo_bits": 8 * element, "epoch_ms": 1000 * epoch_s,
            "exchange_ms": 1000 * exchange_s,
            "exchange_ms_per_rank": ";".join(f"{1000 * g['exchange_s']:.2f}" for g in gathered),
            "compute_ms": 1000 * (instrumented_s - exchange_s),
            "halo_rows": halo_rows, "cut_nonzeros": cut, "exchanged_width": width,
            "halo_bytes_per_epoch": halo_rows * width * element, "cut_x_feature_bytes": cut * width * element,
            "nnz": sum(r["nnz"] for r in ranks), "rows_per_rank": _joined(ranks, "rows"),
            "nnz_per_rank": _joined(ranks, "nnz"), "cut_per_rank": _joined(ranks, "cut"),
            "halo_per_rank": _joined(ranks, "halo"),
            "send_per_rank": _joined(ranks, "send"), "graph_gb_per_rank": _joined(ranks, "graph_gb", "{:.2f}"),
            "generate_s": max(r["generate_s"] for r in ranks), "partition_s": root["partition_s"],
            "partition_peak_gb": f"{root['partition_peak']:.2f}",
            "build_s": max(r["place_s"] + r["build_s"] for r in ranks),
            "build_peak_gb_per_rank": _joined(ranks, "build_peak", "{:.2f}"),
            "peak_gb_per_rank": ";".join(f"{g['peak']:.2f}" for g in gathered),
            "peak_gb": max(g["peak"] for g in gathered)}


def _joined(ranks: list[dict], key: str, form: str = "{}") -> str:
    return ";".join(form.format(r[key]) for r in ranks)
