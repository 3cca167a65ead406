"""``reorder="auto"``: try candidate methods and keep one only when it makes ``A @ X`` faster.

Fewer ME-TCF Tensor-Core blocks (``count_blocks``) is what a reordering buys, but fewer blocks
alone did not make ``A @ X`` faster: where cuSPARSE (the ``"csr"`` path, which a row order does
not change) already beats the kernels, or where the gain is small, a permutation changed nothing
or cost L2 locality. A reordering also speeds up the CUDA-core "rows" kernel, which runs the rows
in the new order: rows that share columns side by side find their rows of X in L2
(``locality``). So each candidate's blocks per window and its locality go through the selector's
cost model (``selector.predict_costs``, the same C++ model that picks the path at run time) and a
method is kept only when a Tensor-Core kernel (the grouped path too, where its layout may pay: an
order that gathers dense communities into groups of 64 rows shrinks it most) or the rows kernel
on the reordered matrix is predicted at least ``min_gain`` faster than every path without
reordering. Otherwise rows stay in the user's order; in particular "auto" never adds blocks
(SMaT saw Jaccard clustering add blocks on band matrices, where the given order is already near
optimal).
"""
from __future__ import annotations

import time
import torch

from ..formats.csr import CSR
from ..formats import grouped as grouped_format
from ..formats.grouped import group_pairs, may_pay, split_sizes
from ..formats.metcf import count_blocks
from .. import selector
from .locality import distinct_share, share_ratio

# "tca" wins on every real graph measured; "degree" costs one sort and wins on R-MAT, whose
# hubs share columns; "shuffle" is the third opinion. "rcm" is left out: it runs in scipy on the
# CPU and never won.
DEFAULT_CANDIDATES = ("tca", "degree", "shuffle")
# Below this predicted gain the model's error can exceed the gain: a small predicted gain on the
# balanced kernel has run slower than cuSPARSE.
MIN_GAIN = 0.08
# The N the prediction is made for: GCN hidden sizes (the SpMM benchmark's middle value).
PREDICT_N = 128


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _predictor(csr: CSR, window: int, n: int):
    """A function of a row permutation (None: rows as given) returning the matrix's TC blocks,
    the order's ``rows_share_ratio`` and the selector's predicted microseconds of every path
    times an operand of ``n`` columns, on the matrix's device. Row lengths and the given order's locality do not depend on the
    permutation: computed once."""
    row_nnz = csr.rowptr[1:] - csr.rowptr[:-1]
    max_row = int(row_nnz.max()) if row_nnz.numel() else 0
    given_share = distinct_share(csr.rowptr, csr.col, csr.num_cols, None)
    model = selector.device_model(csr.col.device)

    def predict(perm) -> tuple[int, float, dict]:
        per_window = count_blocks(csr, window, perm).cpu().numpy()
        ratio = 1.0 if perm is None else share_ratio(csr.rowptr, csr.col, csr.num_cols, perm, given_share)
        features = selector.MatrixFeatures.of_window_blocks(window, per_window, csr.num_rows, csr.nnz, max_row,
                                                            csr.num_cols, rows_share_ratio=ratio)
        blocks = int(per_window.sum())
        if may_pay(csr.nnz, blocks) and csr.col.dtype == torch.int32:
            # The grouped layout the matrix would build in this order (Structure.grouped).
            sizes = split_sizes(group_pairs(csr.rowptr, csr.col, csr.num_rows, csr.num_cols, perm),
                                grouped_format.SPLIT_THRESHOLDS)
            grouped_blocks, rest = sizes[selector.grouped_split(sizes, features, model)]
            features = features.replace(grouped_blocks=grouped_blocks, grouped_rest_nnz=rest)
        return blocks, ratio, selector.predict_costs(features, n, model)

    return predict


def _reordered_us(costs: dict) -> float:
    """The fastest path a reordering can change: the Tensor-Core kernels (fewer blocks), the
    grouped path where it may run, and the rows kernel (which runs the rows in the new order);
    cuSPARSE's "csr" runs as given."""
    return min(costs[path] for path in (*selector.KERNEL_CHOICES, "rows", "grouped") if path in costs)


def choose(csr: CSR, window: int = 16, candidates=DEFAULT_CANDIDATES, seed: int = 0,
           symmetric: bool | None = None, min_gain: float = MIN_GAIN, n: int = PREDICT_N):
    """(method, perm, report): the candidate whose reordered matrix has the fastest predicted
    Tensor-Core or rows kernel, kept if that is at least ``min_gain`` faster than the best path
    without reordering (cuSPARSE included); otherwise "none".

    ``symmetric=None`` means symmetric for square matrices. ``report`` holds the blocks and
    predicted times without reordering, and per tried method its blocks, MeanNnzTC, predicted
    time and seconds.
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
    predict = _predictor(csr, window, n)
    baseline, _, costs_none = predict(None)
    tried = {}
    best_method, best_perm, best_blocks = "none", torch.arange(csr.num_rows, device=device), baseline
    best_us = _reordered_us(costs_none)
    for method in candidates:
        if method == "none":
            continue
        _synchronize(device)
        start = time.perf_counter()
        perm = reorder(csr, method, symmetric=symmetric, window=window, seed=seed)
        _synchronize(device)
        seconds = time.perf_counter() - start
        blocks, ratio, costs = predict(perm)
        predicted_us = _reordered_us(costs)
        tried[method] = {
            "blocks": blocks,
            "mean_nnz_per_block": csr.nnz / blocks if blocks else 0.0,
            "predicted_us": predicted_us,
            "rows_share_ratio": ratio,
            "seconds": seconds,
        }
        if blocks < baseline and predicted_us < best_us:
            best_method, best_perm, best_blocks, best_us = method, perm, blocks, predicted_us
    if best_us > (1 - min_gain) * min(costs_none.values()):
        best_method, best_perm, best_blocks = "none", torch.arange(csr.num_rows, device=device), baseline
    report = {
        "chosen": best_method,
        "window": window,
        "min_gain": min_gain,
        "predicted_for_n": n,
        "blocks_none": baseline,
        "mean_nnz_per_block_none": csr.nnz / baseline if baseline else 0.0,
        "predicted_us_none": costs_none,
        "blocks_chosen": best_blocks,
        "methods": tried,
    }
    return best_method, best_perm, report
