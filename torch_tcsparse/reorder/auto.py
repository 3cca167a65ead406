"""``reorder="auto"``: try candidate methods and keep one only when it removes enough blocks.

The measure is the number of ME-TCF Tensor-Core blocks (``count_blocks``), which is what the
kernels iterate over. A reordering is kept only when it removes at least ``min_gain`` of the
blocks; otherwise rows stay in the user's order. So "auto" never returns more blocks than no
reordering (SMaT saw Jaccard clustering add blocks on band matrices, where the given order is
already near optimal).
"""
from __future__ import annotations

import time

import torch

from ..formats.csr import CSR
from ..formats.metcf import count_blocks

# "tca" wins on every real graph measured; "degree" costs one sort and wins on R-MAT, whose
# hubs share columns (scale 18: MeanNnzTC 1.31x against tca's 1.27x); "shuffle" is the third
# opinion. "rcm" is left out: it runs in scipy on the CPU and never won here.
DEFAULT_CANDIDATES = ("tca", "degree", "shuffle")
# 5% fewer blocks is about 5% less Tensor-Core work: below that, the change in L2 locality a
# permutation brings can cost as much as it saves.
MIN_GAIN = 0.05


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def choose(csr: CSR, window: int = 16, candidates=DEFAULT_CANDIDATES, seed: int = 0,
           symmetric: bool | None = None, min_gain: float = MIN_GAIN):
    """(method, perm, report): the candidate with the fewest blocks if it saves ``min_gain``.

    ``symmetric=None`` means symmetric for square matrices. ``report`` holds the blocks
    without reordering, and per tried method its blocks, MeanNnzTC and seconds.
    """
    from . import METHODS, check_inputs, reorder

    if symmetric is None:
        symmetric = isinstance(csr, CSR) and csr.num_rows == csr.num_cols
    check_inputs(csr, window, seed, symmetric)
    if isinstance(candidates, str) or not all(isinstance(m, str) and m in METHODS for m in candidates):
        raise ValueError(f"candidates must be a sequence of methods from {METHODS}, got {candidates!r}")
    if not 0 <= min_gain < 1:
        raise ValueError(f"min_gain must lie in [0, 1), got {min_gain!r}")

    device = csr.col.device
    baseline = int(count_blocks(csr, window).sum())
    tried = {}
    best_method, best_perm, best_blocks = "none", torch.arange(csr.num_rows, device=device), baseline
    for method in candidates:
        if method == "none":
            continue
        _synchronize(device)
        start = time.perf_counter()
        perm = reorder(csr, method, symmetric=symmetric, window=window, seed=seed)
        _synchronize(device)
        seconds = time.perf_counter() - start
        blocks = int(count_blocks(csr, window, perm).sum())
        tried[method] = {
            "blocks": blocks,
            "mean_nnz_per_block": csr.nnz / blocks if blocks else 0.0,
            "seconds": seconds,
        }
        if blocks < best_blocks:
            best_method, best_perm, best_blocks = method, perm, blocks
    if best_blocks > (1 - min_gain) * baseline:
        best_method, best_perm, best_blocks = "none", torch.arange(csr.num_rows, device=device), baseline
    report = {
        "chosen": best_method,
        "window": window,
        "min_gain": min_gain,
        "blocks_none": baseline,
        "mean_nnz_per_block_none": csr.nnz / baseline if baseline else 0.0,
        "blocks_chosen": best_blocks,
        "methods": tried,
    }
    return best_method, best_perm, report
