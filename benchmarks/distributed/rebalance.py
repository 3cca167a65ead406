"""``--rebalance``: the time weight of a row re-derived from the ranks of a first partition.

The one-GPU run prices a row's products by the graph's average cost per nonzero. A part of many
short rows costs more per nonzero than a part of hubs, whose repeated columns stay in L2, so a
partition balanced on the one-GPU weights leaves the rank of short rows last at every exchange.
Each rank's compute (its epoch less its own exchange time, which holds its waits for the
others) is fitted as ``a * nonzeros + b * rows`` over the ranks; the time weight becomes b / a
and the partition is made again. The memory weights stay the one-GPU run's.
"""
from __future__ import annotations

import argparse

import torch

from .ranks import train_config

# Epochs timed for the fit after the warm-up: the ranks' compute differs by a few percent, and
# an epoch varies by under one.
FIT_EPOCHS = 3


def rank_compute_ms(row: dict) -> list[float]:
    """Each rank's compute: the instrumented epoch (compute + the longest exchange) less its own
    exchange."""
    instrumented = row["compute_ms"] + row["exchange_ms"]
    return [instrumented - float(own) for own in row["exchange_ms_per_rank"].split(";")]


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
    short = argparse.Namespace(**(vars(args) | {"epochs": FIT_EPOCHS}))
    row = train_config(short, device, built, "plain", progress)
    ranks = built["ranks"]
    weight = fitted_time_weight([r["nnz"] for r in ranks], [r["rows"] for r in ranks], rank_compute_ms(row))
    if weight is None:
        return args.current_row_weight
    return (weight, *args.current_row_weight[1:])
