"""``reorder="auto"``: try candidate methods and keep one only when it makes ``A @ X`` faster.

Fewer ME-TCF Tensor-Core blocks (``count_blocks``) is what a reordering buys the Tensor-Core
kernels, but fewer blocks alone did not make ``A @ X`` faster: where cuSPARSE (the ``"csr"``
path, which a row order does not change) already beats the kernels, or where the gain is small,
a permutation changed nothing or cost L2 locality. The CUDA-core "rows" kernel, which wins on
most large graphs, gains from an order in another way: rows that share columns side by side
find their rows of X in L2. So each candidate is priced for every path:

- the Tensor-Core kernels and the grouped path: its blocks per window through the selector's
  cost model (``selector.predict_costs``, the same C++ model that picks the path at run time);
- the rows kernel: its time as given scaled by the bytes it moves in the new order over those as
  given, the X part from a sampled cache model of its column stream in the kernel's time order,
  and by the warp slots its blocks hold idle (``l2.XTraffic``);
- cuSPARSE: unchanged.

A method is kept only when its fastest path is predicted at least ``min_gain`` faster than every
path as given at ``PREDICT_N``, and at no N of ``GUARD_NS`` more than ``MAX_LOSS`` slower (an
order kept for one width must not cost another). Otherwise rows stay in the user's order; "auto"
never adds blocks either (SMaT saw Jaccard clustering add blocks on band matrices, where the
given order is already near optimal).

Cost: the candidates' own orders, then per candidate one count of blocks, one share of distinct
columns per row group and, per count of rows in flight among ``GUARD_NS`` (three: N = 32, 64 and
128 on), one cache model of at most ``l2.SAMPLE_NNZ`` sampled nonzeros (two sorts of the sample),
and a few calls of the C++ model. The thresholds are fitted on the corpus's "fit"
families only (``graph_data.corpus.SPLIT``), so that its "unseen" families test them.
"""
from __future__ import annotations

import time
import torch

from ..formats.csr import CSR
from ..formats import grouped as grouped_format
from ..formats.grouped import group_pairs, may_pay, split_sizes
from ..formats.metcf import count_blocks
from .. import selector
from .l2 import XTraffic, rows_time_ratio
from .locality import distinct_share, share_ratio

# "tca" wins where Tensor-Core blocks densify (communities); "community" where rows sharing
# columns are scattered (shuffled meshes, communities: the rows kernel's L2 reuse); "degree" and
# "hub" cost a sort and win on Kronecker graphs, whose hubs share columns. "shuffle" never won
# over tca; "rcm" runs in scipy on the CPU.
DEFAULT_CANDIDATES = ("tca", "community", "degree", "hub")
# Below this predicted gain the model's error can exceed the gain: a small predicted gain on the
# balanced kernel has run slower than cuSPARSE.
MIN_GAIN = 0.08
# The N the gain is predicted for: GCN hidden sizes (the SpMM benchmark's middle value).
PREDICT_N = 128
# The widths an order must not slow down: the SpMM benchmark's range.
GUARD_NS = (32, 64, 128, 256)
MAX_LOSS = 0.03
# Auto prices float32 products (the calibration's reference); 16-bit X halves the bytes of X
# and A alike, so the order's ratio changes little.
VALUE_BYTES = 4


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _predictor(csr: CSR, window: int):
    """A function of a row permutation (None: rows as given) returning the matrix's TC blocks,
    the order's ``rows_share_ratio``, its rows-kernel time ratio at ``PREDICT_N`` and the
    predicted microseconds of every path per N of ``GUARD_NS``, on the matrix's device. Row
    lengths and the given order's locality do not depend on the permutation: computed once."""
    row_nnz = csr.rowptr[1:] - csr.rowptr[:-1]
    max_row = int(row_nnz.max()) if row_nnz.numel() else 0
    given_share = distinct_share(csr.rowptr, csr.col, csr.num_cols, None)
    model = selector.device_model(csr.col.device)
    given_traffic = XTraffic(csr.rowptr, csr.col, csr.num_cols, None, model.sm_count)

    def predict(perm) -> tuple[int, float, float, dict]:
        per_window = count_blocks(csr, window, perm).cpu().numpy()
        ratio = 1.0 if perm is None else share_ratio(csr.rowptr, csr.col, csr.num_cols, perm, given_share)
        # The rows kernel is priced as given and scaled by the cache model: the selector's
        # share-ratio term would count the order's effect twice.
        features = selector.MatrixFeatures.of_window_blocks(window, per_window, csr.num_rows, csr.nnz, max_row,
                                                            csr.num_cols, rows_share_ratio=1.0)
        blocks = int(per_window.sum())
        if may_pay(csr.nnz, blocks) and csr.col.dtype == torch.int32:
            # The grouped layout the matrix would build in this order (Structure.grouped).
            sizes = split_sizes(group_pairs(csr.rowptr, csr.col, csr.num_rows, csr.num_cols, perm),
                                grouped_format.SPLIT_THRESHOLDS)
            grouped_blocks, rest = sizes[selector.grouped_split(sizes, features, model)]
            features = features.replace(grouped_blocks=grouped_blocks, grouped_rest_nnz=rest)
        traffic = given_traffic if perm is None else XTraffic(csr.rowptr, csr.col, csr.num_cols, perm, model.sm_count)
        costs = {}
        for n in GUARD_NS:
            costs[n] = selector.predict_costs(features, n, model)
            if "rows" in costs[n]:
                costs[n]["rows"] *= rows_time_ratio(given_traffic, traffic, n, VALUE_BYTES, model.l2_bytes)
        rows_ratio = rows_time_ratio(given_traffic, traffic, PREDICT_N, VALUE_BYTES, model.l2_bytes)
        return blocks, ratio, rows_ratio, costs

    return predict


def _reordered_us(costs: dict) -> float:
    """The fastest path a reordering can change: the Tensor-Core kernels (fewer blocks), the
    grouped path where it may run, and the rows kernel (which runs the rows in the new order);
    cuSPARSE's "csr" runs as given."""
    return min(costs[path] for path in (*selector.KERNEL_CHOICES, "rows", "grouped") if path in costs)


def choose(csr: CSR, window: int = 16, candidates=DEFAULT_CANDIDATES, seed: int = 0,
           symmetric: bool | None = None, min_gain: float = MIN_GAIN, n: int = PREDICT_N):
    """(method, perm, report): the candidate whose reordered matrix has the fastest predicted
    path at N = ``n``, kept if that is at least ``min_gain`` faster than the best path without
    reordering (cuSPARSE included) and at no N of ``GUARD_NS`` more than ``MAX_LOSS`` slower;
    otherwise "none".

    ``symmetric=None`` means symmetric for square matrices. ``report`` holds the blocks and
    predicted times without reordering, and per tried method its blocks, MeanNnzTC, predicted
    time, the rows kernel's predicted time ratio, the guard's verdict and seconds.
    """
    from . import METHODS, check_inputs, reorder

    if symmetric is None:
        symmetric = isinstance(csr, CSR) and csr.num_rows == csr.num_cols
    check_inputs(csr, window, seed, symmetric)
    if isinstance(candidates, str) or not all(isinstance(m, str) and m in METHODS for m in candidates):
        raise ValueError(f"candidates must be a sequence of methods from {METHODS}, got {candidates!r}")
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not 0 <= min_gain < 1:
        raise ValueError(f"min_gain must lie in [0, 1), got {min_gain!r}")
    if n not in GUARD_NS:
        raise ValueError(f"n must be one of {GUARD_NS}, got {n!r}")

    device = csr.col.device
    predict = _predictor(csr, window)
    baseline, _, _, costs_none = predict(None)
    best_none = {width: min(costs.values()) for width, costs in costs_none.items()}
    tried = {}
    best_method, best_perm, best_blocks = "none", torch.arange(csr.num_rows, device=device), baseline
    best_us = _reordered_us(costs_none[n])
    for method in candidates:
        if method == "none":
            continue
        _synchronize(device)
        start = time.perf_counter()
        perm = reorder(csr, method, symmetric=symmetric, window=window, seed=seed)
        _synchronize(device)
        seconds = time.perf_counter() - start
        blocks, ratio, rows_ratio, costs = predict(perm)
        predicted_us = _reordered_us(costs[n])
        safe = all(_reordered_us(costs[width]) <= (1 + MAX_LOSS) * best_none[width] for width in GUARD_NS)
        tried[method] = {
            "blocks": blocks,
            "mean_nnz_per_block": csr.nnz / blocks if blocks else 0.0,
            "predicted_us": predicted_us,
            "rows_share_ratio": ratio,
            "rows_time_ratio": rows_ratio,
            "within_guard": safe,
            "seconds": seconds,
        }
        if blocks <= baseline and safe and predicted_us < best_us:
            best_method, best_perm, best_blocks, best_us = method, perm, blocks, predicted_us
    if best_us > (1 - min_gain) * best_none[n]:
        best_method, best_perm, best_blocks = "none", torch.arange(csr.num_rows, device=device), baseline
    report = {
        "chosen": best_method,
        "window": window,
        "min_gain": min_gain,
        "predicted_for_n": n,
        "blocks_none": baseline,
        "mean_nnz_per_block_none": csr.nnz / baseline if baseline else 0.0,
        "predicted_us_none": costs_none[n],
        "blocks_chosen": best_blocks,
        "methods": tried,
    }
    return best_method, best_perm, report
