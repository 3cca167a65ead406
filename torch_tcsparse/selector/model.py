"""The cost model: predicted time of every path for a (matrix, N, dtype) on a device, the choice
between them, and its explanation."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from .. import csr_rows
from ..formats.csr import index_dtype_for
from ..formats.metcf import MetcfLayout
from ..paths import KERNEL_DTYPES
from .device import Calibration, DeviceModel, device_model
from .paths import CALIBRATED_CHOICES, CHOICES, KERNEL_CHOICES, n_bucket
from .shape import BalancedLaunch, BalancedWarps, MatrixShape, balanced_warps, base_makespan_units

# The share of the rows path's time that an order removes per unit of distinct-share removed
# (the package docstring).
ROWS_ORDER_GAIN = 0.2

# The grouped kernel's time: a fixed part (zeroing the fp32 sums, launch; for 16-bit types also
# rounding them into Y) and a cost per warp-step (one block of a chunk for one warp), whole GPU,
# by bytes per element of X. Fitted on an H200 (132 SMs), 2026-11-24 (session 8), by relative
# least squares on the grouped path's times at N = 32..256 (median of five selector runs) of
# every suite graph whose grouped layout leaves nothing to the rows kernel, 52 points in
# float32 and 88 in 16-bit, the layouts' block counts from the runs' shapes.npz or rebuilt on
# the CPU: within 11% (float32) and 14% (16-bit) RMS. The constants before (8.9 us + 0.606 ns in
# float32), fitted on four large layouts only, priced small layouts at half their time (PROTEINS
# in tca order 25.7 us predicted, 45-56 us run), and reorder="auto" took snap_ca-HepPh into tca
# order for a grouped path that ran 1.5x slower than the graph as given.
GROUPED_STEP_NS = {4: 0.498, 2: 0.320}
GROUPED_FIXED_US = {4: 17.7, 2: 21.1}
GROUPED_REFERENCE_SMS = 132
# A 16-bit Y where every group is one chunk and nothing is left to the rows kernel: the kernel
# writes Y alone, with no zeroing and no rounding launch (band 16384 on an H200, N = 128,
# float16: 14.3-14.5 us per call for 6,128 blocks, 2026-11-24). Its host side is then the rows
# path's: one allocation and one launch.
GROUPED_DIRECT_FIXED_US = 4.4


# Columns of X per warp of the grouped kernel (csrc/grouped_spmm.cu), in every dtype.
GROUPED_COLUMNS_PER_WARP = 32


def grouped_warps_per_chunk(n: int, dtype: torch.dtype) -> int:
    """Warps per chunk of the grouped kernel: one per ``GROUPED_COLUMNS_PER_WARP`` columns, each
    taking all 4 windows of the group."""
    return -(-n // GROUPED_COLUMNS_PER_WARP)


def grouped_writes_directly(shape: MatrixShape, dtype: torch.dtype) -> bool:
    """Whether the grouped kernel writes a 16-bit Y itself (``csrc/grouped_spmm.h``)."""
    return dtype.itemsize < 4 and shape.grouped_one_chunk and shape.grouped_rest_nnz == 0


def grouped_time_us(shape: MatrixShape, n: int, dtype: torch.dtype, sm_count: int) -> float:
    steps = shape.grouped_blocks * grouped_warps_per_chunk(n, dtype)
    size = 4 if dtype.itemsize >= 4 else 2
    fixed = GROUPED_DIRECT_FIXED_US if grouped_writes_directly(shape, dtype) else GROUPED_FIXED_US[size]
    return fixed + GROUPED_STEP_NS[size] * steps * GROUPED_REFERENCE_SMS / sm_count / 1e3


def grouped_path_us(shape: MatrixShape, n: int, dtype: torch.dtype, sm_count: int, rows_constants: dict,
                    miss: float) -> float:
    """The grouped kernel's time, plus the rows kernel's on the nonzeros its layout leaves out
    (none: no launch)."""
    kernel_us = grouped_time_us(shape, n, dtype, sm_count)
    if shape.grouped_rest_nnz == 0:
        return kernel_us
    return kernel_us + _rows_time_us(rows_constants, replace(shape, nnz=shape.grouped_rest_nnz), miss)


def grouped_split(sizes: dict, shape: MatrixShape, model: DeviceModel, n: int = 128) -> int:
    """The ``min_pair_nnz`` of ``sizes`` (threshold -> (grouped blocks, nonzeros left to the rows
    kernel), ``formats.grouped.split_sizes``) with the least predicted time at ``n`` columns of
    float32: the layout is built once per matrix, for the N of GCN hidden sizes."""
    rows = model.calibration.constants("rows", n, torch.float32)
    miss = l2_miss_fraction(shape.num_cols, n, 4, model.l2_bytes)

    def time_us(threshold: int) -> float:
        blocks, rest = sizes[threshold]
        split = replace(shape, grouped_blocks=blocks, grouped_rest_nnz=rest)
        return grouped_path_us(split, n, torch.float32, model.sm_count, rows, miss)

    return min(sizes, key=time_us)


def kernel_time_us(constants: dict, makespan: float, work: float, slots: int, miss: float = 0.0) -> float:
    """Launch, the work spread evenly over all slots at ``unit_us`` per unit (plus ``miss_unit_us``
    per unit times the fraction of X gathers that miss L2), and the imbalance tail (makespan beyond
    that) at ``tail_us``: blocks that run alone at the end of a launch share their SM with fewer
    others, so a unit of tail may cost less than a unit of full occupancy."""
    even = work / slots
    unit = constants["unit_us"] + constants.get("miss_unit_us", 0.0) * miss
    return constants["launch_us"] + unit * even + constants["tail_us"] * max(0.0, makespan - even)


def l2_miss_fraction(cols: int, n: int, value_bytes: int, l2_bytes: int) -> float:
    """The share of X that does not fit in L2: about the fraction of gathers of rows of X that go
    to memory when the column ids are spread (uniform or shuffled graphs; power-law hubs hit more
    often, which the fitted constants average over)."""
    x_bytes = cols * n * value_bytes
    return max(0.0, 1.0 - l2_bytes / x_bytes) if x_bytes else 0.0



@dataclass(frozen=True)
class Explanation:
    """Why a path was chosen for one (matrix, N bucket, dtype, device); ``str()`` reads it out."""

    choice: str
    reason: str
    n: int
    dtype: torch.dtype
    device: str
    calibration: str
    features: dict
    slots: dict
    makespans_us: dict
    ar: float
    ar_threshold: float
    costs_us: dict
    bytes_moved: dict
    candidates: tuple = field(default=CHOICES)
    measured_us: dict = field(default_factory=dict)  # median us per path, once the choice was measured

    @property
    def ar_kernel(self) -> str:
        """DTC-SpMM's choice between the Tensor-Core kernels: balanced when AR > threshold."""
        return "balanced" if self.ar > self.ar_threshold else "base"

    def __str__(self) -> str:
        def row(mapping, fmt):
            return ", ".join(f"{key}={fmt(value)}" for key, value in mapping.items())

        return "\n".join(
            [
                f"choice: {self.choice} ({self.reason})",
                f"N={self.n} dtype={self.dtype} device={self.device} calibration={self.calibration}",
                f"features: {row(self.features, _number)}",
                f"slots (SMs x resident blocks): {row(self.slots, str)}",
                f"simulated makespan (us): {row(self.makespans_us, lambda v: f'{v:.1f}')}",
                f"approximation ratio AR = {self.ar:.3f} (threshold {self.ar_threshold:.3f}) -> {self.ar_kernel}",
                f"predicted time (us): {row(self.costs_us, lambda v: f'{v:.1f}')}",
                f"bytes moved (MB): {row(self.bytes_moved, lambda v: f'{v / 1e6:.2f}')}",
                f"candidates: {', '.join(self.candidates)}",
            ]
            + ([f"measured (us, median of the first product's samples): {row(self.measured_us, lambda v: f'{v:.1f}')}"]
               if self.measured_us else [])
        )


def _number(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


class Prediction(NamedTuple):
    """The simulated launches and predicted time of every path for one (matrix, N, dtype)."""

    slices: dict  # kernel path -> warps per window along N
    slots: dict  # kernel path -> SMs x resident warps
    base: tuple  # (makespan, work) in TC-block units
    balanced: BalancedLaunch
    balanced_warps: BalancedWarps  # the balanced grid, for pricing it at other unit costs (AR)
    miss: float  # share of X beyond L2
    device_us: dict  # path -> predicted device time
    costs_us: dict  # path -> predicted time of a call, at least its host floor
    constants: dict  # path -> the calibration's constants used


def predict(shape: MatrixShape, n: int, model: DeviceModel, dtype=torch.float32) -> Prediction:
    """Simulate both kernels' launches for ``shape`` times an [K, n] operand on ``model``'s device
    and predict the time of every path (see the package docstring for the model)."""
    calibration = model.calibration
    constants = {path: calibration.constants(path, n, dtype) for path in CALIBRATED_CHOICES}
    base, balanced, csr = constants["base"], constants["balanced"], constants["csr"]
    kernel_dtype = dtype if dtype in KERNEL_DTYPES else torch.float32
    windows = shape.num_windows
    launches = {path: model.launch(path, n, kernel_dtype, windows) for path in KERNEL_CHOICES}
    slices = {path: max(1, launch[1]) for path, launch in launches.items()}
    slots = {path: model.sm_count * max(1, launch[0]) for path, launch in launches.items()}

    base_units, base_work = base_makespan_units(shape, slices["base"], slots["base"], base["block_units"])
    warps = balanced_warps(shape, slices["balanced"], slots["balanced"])
    launch = warps.launch(balanced["segment_units"], balanced["split_units"])
    miss = l2_miss_fraction(shape.num_cols, n, torch.finfo(dtype).bits // 8, model.l2_bytes)
    device_us = {
        "base": kernel_time_us(base, base_units, base_work, slots["base"], miss),
        "balanced": kernel_time_us(balanced, launch.makespan, launch.work, slots["balanced"], miss)
        + balanced["zero_us"] * launch.zeroed_windows * shape.window,
        "csr": _csr_time_us(csr, shape, shape.max_row_nnz, miss),
        "rows": _rows_time_us(constants["rows"], shape, miss, rows_piece_nnz(shape, kernel_dtype)),
    }
    if shape.grouped_blocks is not None:
        device_us["grouped"] = grouped_path_us(shape, n, kernel_dtype, model.sm_count, constants["rows"], miss)
        # Its host side is balanced's (a zeroed fp32 output, the kernel, for 16-bit X a rounding
        # launch), or the rows path's where the kernel writes Y alone.
        host_like = constants["rows"] if grouped_writes_directly(shape, kernel_dtype) else balanced
        constants["grouped"] = {"floor_us": host_like.get("floor_us", 0.0)}
    # A call never costs less than its host-side floor (Python, dispatch, launch), which is all
    # that small graphs cost: back-to-back calls then run at the rate the host issues them.
    costs = {path: max(constants[path].get("floor_us", 0.0), us) for path, us in device_us.items()}
    return Prediction(slices, slots, (base_units, base_work), launch, warps, miss, device_us, costs, constants)


def _csr_time_us(constants: dict, shape: MatrixShape, longest: int, miss: float) -> float:
    return (
        constants["launch_us"]
        + constants["nnz_us"] * shape.nnz
        + constants["row_us"] * shape.rows
        + constants["max_row_us"] * longest
        + constants.get("miss_nnz_us", 0.0) * shape.nnz * miss
    )


def _rows_time_us(constants: dict, shape: MatrixShape, miss: float, piece_nnz: int = csr_rows.PIECE_NNZ) -> float:
    """The rows kernel's time with rows split into pieces of ``piece_nnz`` nonzeros: the longest
    piece, and a launch of its own when any row is split."""
    split_launch = constants.get("split_launch_us", 0.0) if shape.max_row_nnz > piece_nnz else 0.0
    in_order = 1.0 - ROWS_ORDER_GAIN * (1.0 - shape.rows_share_ratio)
    return _csr_time_us(constants, shape, min(shape.max_row_nnz, piece_nnz), miss) * in_order + split_launch


def rows_piece_nnz(shape: MatrixShape, dtype: torch.dtype) -> int:
    """The pieces the rows path splits ``shape``'s rows into for X of ``dtype``."""
    return csr_rows.split_piece_nnz(shape.nnz, shape.max_row_nnz, dtype)


def approximation_ratio(prediction: Prediction) -> float:
    """DTC-SpMM's AR: base's makespan over balanced's with the same per-block costs for both, so it
    measures only what balancing does to the schedule; the threshold accounts for the atomics and
    the extra zeroing pass."""
    same_cost = prediction.balanced_warps.launch(prediction.constants["base"]["block_units"], 0.0).makespan
    return prediction.base[0] / same_cost if same_cost > 0 else 1.0


def select(shape: MatrixShape, n: int, model: DeviceModel, candidates=CHOICES, dtype=torch.float32) -> str:
    """The path ``rank`` would choose, without building its explanation."""
    return predicted_choice(shape, n, model, candidates, dtype)[0]


def predicted_choice(shape: MatrixShape, n: int, model: DeviceModel, candidates=CHOICES, dtype=torch.float32):
    """``select``'s path and the predicted cost of every path (what a product pays for on its
    first call at an N bucket)."""
    prediction = predict(shape, n, model, dtype)
    ar = approximation_ratio(prediction) if model.calibration.kernel_rule == "ar" else None
    candidates = _priced(candidates, prediction.costs_us)
    return _decide(candidates, prediction.costs_us, ar, shape.tc_blocks, model.calibration)[0], prediction.costs_us


def rank(shape: MatrixShape, n: int, model: DeviceModel, candidates=CHOICES, dtype=torch.float32) -> Explanation:
    """Simulate and cost every path for ``shape`` times an [K, n] operand on ``model``'s device,
    restricted to ``candidates``, and explain the choice."""
    prediction = predict(shape, n, model, dtype)
    ar = approximation_ratio(prediction)
    base, slices, slots, launch = prediction.constants["base"], prediction.slices, prediction.slots, prediction.balanced
    base_units, base_work = prediction.base
    balanced = prediction.constants["balanced"]
    zeroed_rows = launch.zeroed_windows * shape.window
    makespans = {
        "base": prediction.device_us["base"] - base["launch_us"],
        "balanced": prediction.device_us["balanced"] - balanced["launch_us"] - balanced["zero_us"] * zeroed_rows,
        "base_perfect_balance": base["unit_us"] * base_work / slots["base"],
    }

    windows, blocks = shape.num_windows, shape.tc_blocks
    value_bytes = torch.finfo(dtype).bits // 8
    # Each column slice reads the sparse data again (fp32 values; per block its columns and bitmap).
    gather = blocks * 8 * n * value_bytes + slices["base"] * (shape.nnz * 4 + blocks * (8 * 4 + 16))
    write = windows * shape.window * n * value_bytes
    bytes_moved = {
        "base": gather + write,
        "balanced": gather + write + 2 * zeroed_rows * n * value_bytes,
        "csr": shape.nnz * (n * value_bytes + 4 + value_bytes) + shape.rows * n * value_bytes,
    }
    bytes_moved["rows"] = bytes_moved["csr"]
    features = {
        "rows": shape.rows,
        "nnz": shape.nnz,
        "windows": windows,
        "tc_blocks": blocks,
        "mean_nnz_per_tc_block": shape.nnz / blocks if blocks else 0.0,
        "blocks_per_window_mean": blocks / windows if windows else 0.0,
        "blocks_per_window_max": shape.summary.max_blocks,
        "windows_over_32_blocks": shape.summary.split_windows,
        "balanced_zeroed_windows": launch.zeroed_windows,
        "max_row_nnz": shape.max_row_nnz,
        "rows_piece_nnz": rows_piece_nnz(shape, dtype if dtype in KERNEL_DTYPES else torch.float32),
        "rows_share_ratio": shape.rows_share_ratio,
        "grouped_blocks": shape.grouped_blocks,
        "grouped_rest_nnz": shape.grouped_rest_nnz,
        "column_slices": slices["base"],
        "x_share_beyond_l2": prediction.miss,
    }
    calibration = model.calibration
    candidates = _priced(candidates, prediction.costs_us)
    choice, reason = _decide(candidates, prediction.costs_us, ar, blocks, calibration)
    return Explanation(
        choice=choice, reason=reason, n=n, dtype=dtype, device=model.name, calibration=calibration.source,
        features=features, slots=slots, makespans_us=makespans, ar=ar, ar_threshold=calibration.ar_threshold,
        costs_us=prediction.costs_us, bytes_moved=bytes_moved, candidates=tuple(candidates),
    )


def _priced(candidates, costs: dict) -> tuple:
    """The candidates the model predicted a time for ("grouped" only for a matrix with a grouped
    layout)."""
    return tuple(p for p in candidates if p in costs)


def _decide(candidates, costs: dict, ar: float | None, blocks: int, calibration: Calibration) -> tuple[str, str]:
    """``_decide_tc_or_csr``'s choice, or "rows" where it may run and is predicted at least the
    calibration's ``rows_margin`` faster, or "grouped" where it may run and is predicted faster
    than that."""
    choice, reason = _decide_tc_or_csr(candidates, costs, ar, blocks, calibration)
    if "rows" in candidates and costs["rows"] < (1.0 - calibration.rows_margin) * costs[choice]:
        choice, reason = "rows", f"{reason}; rows predicted faster still ({costs['rows']:.1f} us)"
    if "grouped" in candidates and costs["grouped"] < costs[choice]:
        choice, reason = "grouped", f"{reason}; grouped predicted faster still ({costs['grouped']:.1f} us)"
    return choice, reason


def _decide_tc_or_csr(candidates, costs: dict, ar: float | None, blocks: int, calibration: Calibration):
    """The calibration's kernel rule between the kernels, then csr unless the kernel is predicted
    at least its ``csr_margin`` faster. ``ar`` may be None when the rule does not need it."""
    ar_text = "" if ar is None else f" (AR {ar:.2f})"
    if calibration.kernel_rule == "cost":
        kernel = min(KERNEL_CHOICES, key=costs.get)
        rule_reason = f"{kernel} predicted faster of the kernels{ar_text}"
    else:
        threshold = calibration.ar_threshold
        kernel = "balanced" if ar > threshold else "base"
        rule_reason = f"AR {ar:.2f} {'>' if kernel == 'balanced' else '<='} {threshold:.2f}"
    if blocks == 0:
        return "csr", "the matrix has no TC blocks"
    if kernel not in candidates:
        return "csr", "the Tensor-Core kernels cannot run on this device and dtype"
    margin = calibration.csr_margin[kernel]
    if "csr" in candidates and costs[kernel] > (1.0 - margin) * costs["csr"]:
        return "csr", (
            f"{rule_reason} picks {kernel}, but csr is predicted faster or too close "
            f"({costs['csr']:.1f} vs {costs[kernel]:.1f} us, margin {margin:.0%})"
        )
    return kernel, f"{rule_reason}; predicted {costs[kernel]:.1f} us vs csr {costs['csr']:.1f} us"


def _kernels_usable(dtype: torch.dtype, device: torch.device) -> bool:
    if device.type != "cuda" or dtype not in KERNEL_DTYPES:
        return False
    from .. import kernels

    return kernels.available()


def explain(layout: MetcfLayout, n: int, dtype: torch.dtype = torch.float32, device=None) -> Explanation:
    """Features, simulated makespans, predicted costs and the choice for ``layout`` at N = ``n``
    (computed at ``n_bucket(n)``, the N the choice is cached for)."""
    return explain_shape(MatrixShape.of(layout), n, dtype, torch.device(layout.device if device is None else device))


def explain_shape(shape: MatrixShape, n: int, dtype: torch.dtype, device: torch.device) -> Explanation:
    """``explain`` from a shape already on the host (what a cached choice reuses)."""
    return rank(shape, n_bucket(n), device_model(device), runnable_paths(dtype, device, shape), dtype)


def runnable_paths(dtype: torch.dtype, device: torch.device, shape, deterministic: bool | None = None) -> tuple:
    """Every path that can run: the kernels where built for the dtype, "rows" with them where
    the indices are int32 (under 2^31 rows, columns and nonzeros), "grouped" where the matrix may
    gain from it (``Structure.grouped_blocks``) and results need not be deterministic (its chunks
    add atomically; ``deterministic``: None for torch's current setting), always "csr".
    ``shape``: a ``MatrixShape`` or a ``native.NativeMatrix`` (their ``rows``, ``num_cols``,
    ``nnz`` and ``grouped_blocks``)."""
    if not _kernels_usable(dtype, device):
        return ("csr",)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    excluded = set()
    if index_dtype_for(shape.rows, shape.num_cols, shape.nnz) != torch.int32:
        excluded.add("rows")
    if shape.grouped_blocks is None or deterministic:
        excluded.add("grouped")
    return tuple(c for c in CHOICES if c not in excluded)


def choose(layout: MetcfLayout, n: int, dtype: torch.dtype, device) -> tuple[str, Explanation]:
    """The path for ``layout @ X`` with X of N = ``n`` columns, and why (uncached: see
    ``SelectionCache``). Call it where the TC kernels may run; off CUDA or for other dtypes it
    answers ``"csr"``."""
    explanation = explain(layout, n, dtype, device)
    return explanation.choice, explanation
