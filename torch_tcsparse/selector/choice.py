"""The selector's questions to the C++ model: the paths that may run, the choice with every
path's predicted time, its explanation, and the grouped layout's split."""
from __future__ import annotations

import torch

from .. import kernels
from ..formats.metcf import MetcfLayout
from . import native
from .device import DeviceModel, device_model
from .explanation import Explanation
from .native import MatrixFeatures
from .paths import CHOICES, KERNEL_CHOICES, candidate_bits, matrix_paths, n_bucket


def runnable_paths(dtype: torch.dtype, device: torch.device, features, deterministic: bool | None = None) -> tuple:
    """Every path that can run: where the kernels are built for the dtype, those the matrix may
    take (``paths.matrix_paths``: "rows" with int32 indices, "grouped" with a grouped layout and
    without deterministic algorithms; ``deterministic``: None for torch's current setting), else
    "csr" alone. ``features``: anything with ``rows``, ``num_cols``, ``nnz`` and ``grouped_blocks``."""
    if not kernels.usable_for(dtype, device):
        return ("csr",)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    return matrix_paths(features.rows, features.num_cols, features.nnz, features.grouped_blocks is not None,
                        deterministic)


def predicted_choice(features: MatrixFeatures, n: int, model: DeviceModel, candidates=CHOICES,
                     dtype: torch.dtype = torch.float32, all_costs: bool = False):
    """(the chosen path, the predicted us of every path priced, or None unless ``all_costs``)."""
    query, bits = model.query(n, dtype, features.num_windows), candidate_bits(candidates)
    if all_costs:
        return native.choose_with_costs(features, query, bits)
    return native.choose(features, query, bits), None


def predict_costs(features: MatrixFeatures, n: int, model: DeviceModel, dtype: torch.dtype = torch.float32) -> dict:
    """The predicted us of every path priced ("grouped" only with a grouped layout)."""
    return predicted_choice(features, n, model, CHOICES, dtype, all_costs=True)[1]


def rank(features: MatrixFeatures, n: int, model: DeviceModel, candidates=CHOICES,
         dtype: torch.dtype = torch.float32) -> Explanation:
    """Price every path for ``features`` times an [K, n] operand on ``model``'s device and explain
    the choice among ``candidates`` (those priced)."""
    query = model.query(n, dtype, features.num_windows)
    raw = native.explain(features, query, candidate_bits(candidates))
    costs = {path: cost for path, cost in zip(CHOICES, raw.costs_us) if cost == cost}
    summary = features.summary
    blocks, windows = summary["tc_blocks"], features.num_windows
    feature_values = {
        "rows": features.rows,
        "nnz": features.nnz,
        "windows": windows,
        "tc_blocks": blocks,
        "mean_nnz_per_tc_block": features.nnz / blocks if blocks else 0.0,
        "blocks_per_window_mean": blocks / windows if windows else 0.0,
        "blocks_per_window_max": summary["max_blocks"],
        "windows_over_32_blocks": summary["split_windows"],
        "balanced_zeroed_windows": raw.zeroed_windows,
        "max_row_nnz": features.max_row_nnz,
        "rows_piece_nnz": features.piece_nnz[query.value_bytes < 4],
        "rows_share_ratio": features.rows_share_ratio,
        "grouped_blocks": features.grouped_blocks,
        "grouped_rest_nnz": features.grouped_rest_nnz,
        "column_slices": raw.slices[0],
        "x_share_beyond_l2": raw.miss,
    }
    calibration = model.calibration
    return Explanation(
        choice=CHOICES[raw.path], reason=raw.reason.decode(), n=n, dtype=dtype, device=model.name,
        calibration=calibration.source, features=feature_values,
        slots=dict(zip(KERNEL_CHOICES, raw.slots)),
        makespans_us=dict(zip(("base", "balanced", "base_perfect_balance"), raw.makespans_us)),
        ar=raw.ar, ar_threshold=calibration.ar_threshold, costs_us=costs,
        bytes_moved=dict(zip(("base", "balanced", "csr", "rows"), raw.bytes_moved)),
        candidates=tuple(p for p in candidates if p in costs),
    )


def explain_features(features: MatrixFeatures, n: int, dtype: torch.dtype, device: torch.device) -> Explanation:
    """The explanation at ``n_bucket(n)`` (the N a choice is cached for) on ``device``."""
    return rank(features, n_bucket(n), device_model(device), runnable_paths(dtype, device, features), dtype)


def explain(layout: MetcfLayout, n: int, dtype: torch.dtype = torch.float32, device=None) -> Explanation:
    """Features, simulated makespans, predicted costs and the choice for ``layout`` at N = ``n``
    (computed at ``n_bucket(n)``), uncached (see ``SelectionCache``)."""
    if not isinstance(layout, MetcfLayout):
        raise TypeError(f"layout must be a MetcfLayout, got {type(layout).__name__}")
    return explain_features(MatrixFeatures.of_layout(layout), n, dtype,
                            torch.device(layout.device if device is None else device))


def choose(layout: MetcfLayout, n: int, dtype: torch.dtype, device) -> tuple[str, Explanation]:
    """The path for ``layout @ X`` with X of N = ``n`` columns, and why (uncached)."""
    explanation = explain(layout, n, dtype, device)
    return explanation.choice, explanation


def grouped_split(sizes: dict, features: MatrixFeatures, model: DeviceModel, n: int = 128) -> int:
    """The ``min_pair_nnz`` of ``sizes`` (threshold -> (grouped blocks, nonzeros left to the rows
    kernel), ``formats.grouped.split_sizes``) with the least predicted time at ``n`` columns of
    float32: the layout is built once per matrix, for the N of GCN hidden sizes."""
    if not sizes:
        raise ValueError("sizes must name at least one split")
    thresholds = list(sizes)
    index = native.grouped_split(features, model.prices(n, torch.float32), n, 4, [sizes[t] for t in thresholds])
    return thresholds[index]
