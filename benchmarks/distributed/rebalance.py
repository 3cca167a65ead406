"""``--rebalance``: the time weight of a row re-derived from the ranks of a first partition.

The one-GPU run prices a row's products by the graph's average cost per nonzero. A part of many
short rows costs more per nonzero than a part of hubs, whose repeated columns stay in L2, so a
partition balanced on the one-GPU weights leaves the rank of short rows last at every exchange.
Each rank times its epoch alone (its exchange replaced by copies of its own rows, no gradient
all-reduce): in a joint epoch a rank waits for the others inside collectives no meter sees
(DDP's all-reduce), so one partition's epoch split differently between compute and exchange
from run to run (docs/DECISIONS.md). The ranks' times are fitted as ``a * nonzeros + b * rows``;
the time weight becomes b / a and the partition is made again. The memory weights stay the
one-GPU run's.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist

from torch_tcsparse.distributed import EmulatedPeers

from .graph import node_features, node_labels
from .training import WARMUP, epochs, make_model

# Epochs timed for the fit after the warm-up: the ranks' compute differs by a few percent, and
# an epoch varies by under one.
FIT_EPOCHS = 3


def alone_compute_ms(args, device, built: dict) -> float:
    """This rank's median epoch with its part's exchange replaced by copies of its own rows and
    a model of its own (no DDP): its compute, waiting for no other rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    alone = built["part"].exchanging(False, None, EmulatedPeers(rank, world, [built["nodes"][:0]] * world))
    nodes = built["nodes"]
    x, y = node_features(nodes, args.features, 0), node_labels(nodes, args.classes, 0)
    alone.fix_features(x)
    short = argparse.Namespace(**(vars(args) | {"epochs": FIT_EPOCHS}))
    times, _ = epochs(make_model(args, device), x, y, alone, nodes, short, device, world)
    return 1000 * statistics.median(times[WARMUP:])


def fitted_time_weight(nnz: list[int], rows: list[int], compute_ms: list[float]) -> int | None:
    """b / a of the least-squares fit ``compute = a * nnz + b * rows`` over the ranks, rounded;
    None where the ranks do not tell a and b apart or the fit gives either a negative value."""
    design = torch.tensor([nnz, rows], dtype=torch.float64).T
    if int(torch.linalg.matrix_rank(design)) < 2:
        return None
    solution = torch.linalg.lstsq(design, torch.tensor(compute_ms, dtype=torch.float64).unsqueeze(1)).solution
    per_nonzero, per_row = float(solution[0]), float(solution[1])
    if per_nonzero <= 0 or per_row < 0:
        return None
    return round(per_row / per_nonzero)


def rebalanced_weights(args, device, built: dict, progress) -> tuple[int, ...]:
    """The row weights for the next partition of this graph (every rank gets the same)."""
    compute = [None] * dist.get_world_size()
    dist.all_gather_object(compute, alone_compute_ms(args, device, built))
    progress("ranks timed alone: " + ";".join(f"{ms:.1f}" for ms in compute) + " ms")
    ranks = built["ranks"]
    weight = fitted_time_weight([r["nnz"] for r in ranks], [r["rows"] for r in ranks], compute)
    if weight is None:
        return args.current_row_weight
    return (weight, *args.current_row_weight[1:])
