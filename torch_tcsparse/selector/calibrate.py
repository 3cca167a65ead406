"""Calibration of the selector's cost model: fit the constants of ``calibration/<family>.json``
on measured times of every path (the runs ``benchmarks/selector.py`` writes), with the C++ model
(``native``) simulating each measured matrix.

Per N bucket and dtype, each path's host floor is its fastest measured call, and the device-time
model is fitted on the calls clearly above it by nonnegative least squares on relative error
(scipy), the kernels' unit costs (``block_units``; ``segment_units`` and ``split_units``) by grid
search; then the AR threshold, one csr margin per kernel and the rows margin, for each kernel rule
("ar", DTC-SpMM's threshold, or "cost", the lower predicted time), keeping the rule of least loss.
Several runs of one device are merged (geometric mean of each path's times), since the timing
noise of host-bound calls differs from run to run::

    python -m torch_tcsparse.selector.calibrate RUN [RUN ...] -o calibration.json
    python -m torch_tcsparse.selector.calibrate RUN1 RUN2 RUN3 --leave-one-run-out

Without RUN it reads the run ``python -m benchmarks.selector`` writes by default ($OUT, else
selector_out/), and without ``-o`` it writes ``calibration.json`` into the first run folder.

The first fits on all the runs' graphs (written to ``-o``) and on half of them (alternate ones by
nonzeros) to estimate, on the other half, how the model does on graphs it has not seen; the
second fits on all runs but one and scores the one left out, for each run. A run folder holds
``measurements.json`` (times, device, launch shapes), ``shapes.npz`` (TC blocks per window of
each graph, all the simulation reads) and optionally ``stale.json``, ``{"stale": [{"path": "rows",
"n": 256, "why": "..."}]}``: times of a path measured before a change of its kernel, left out of
the fit and the scores.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from .. import csr_rows
from . import native
from .calibration import DEFAULT_L2_BYTES, KERNEL_RULES, Calibration, calibration_path
from .choice import rank
from .device import DeviceModel
from .native import MatrixFeatures
from .paths import BUCKETS, CALIBRATED_CHOICES, CHOICES, KERNEL_CHOICES

HIT_TOLERANCE = 1.05
# X's dtypes whose kernels are one code moving the same bytes: every path's float16 and bfloat16
# times agree within 1-4% (median over the suite and fit runs at N = 128), so each one's buckets
# are fitted on the records of both, twice the points for one set of prices.
SIXTEEN_BIT = ("float16", "bfloat16")
BLOCK_UNITS_GRID = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)
SPLIT_UNITS_GRID = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
# Margins per kernel tried by the fit (0: the kernel whenever predicted faster than csr).
CSR_MARGINS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
# The margin is fitted to keep the fit half this close to csr, leaving room for unseen graphs.
FIT_WORST_VS_CSR = 1.05
# The device-time model is fitted on calls at least this much slower than the path's fastest
# (host-bound) call, and on all calls when fewer than MIN_ABOVE_FLOOR are.
FLOOR_MARGIN = 1.1
MIN_ABOVE_FLOOR = 4
TARGETS = "targets: hit rate >= 90%, geomean loss <= 3%, worst vs csr <= 1.10"
# The slot of a shapes.npz meta row that older runs used; written as -1, never read.
UNUSED_META = -1


def record_dtype(record: dict) -> torch.dtype:
    return getattr(torch, record.get("dtype", "float32"))


# Runs on disk.


def save(out: Path, records, shapes: dict, info: dict) -> None:
    """Write a run: ``records`` (graph, n, dtype, times_us per path, launch shapes, and whatever
    else the benchmark measured), ``shapes`` (graph -> ``MatrixFeatures``) and ``info`` (the
    device: name, family, sm_count, l2_bytes, occupancy)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "measurements.json").write_text(json.dumps({"device": info, "records": records}, indent=1))
    arrays = {}
    for name, shape in shapes.items():
        arrays[f"{name}/window_blocks"] = shape.window_blocks
        arrays[f"{name}/meta"] = np.array(
            [shape.window, shape.rows, shape.nnz, shape.max_row_nnz, shape.num_cols, UNUSED_META,
             -1 if shape.grouped_blocks is None else shape.grouped_blocks, shape.grouped_rest_nnz,
             int(shape.grouped_one_chunk)], dtype=np.int64
        )
        arrays[f"{name}/rows_share_ratio"] = np.array([shape.rows_share_ratio], dtype=np.float64)
    np.savez_compressed(out / "shapes.npz", **arrays)


def load_saved(folder: Path):
    """(records, shapes, device info) of one run folder, stale times left out."""
    data = json.loads((folder / "measurements.json").read_text())
    shapes = {}
    with np.load(folder / "shapes.npz") as arrays:
        for key in arrays.files:
            name, field = key.rsplit("/", 1)
            if field == "meta":
                # window, rows, nnz, longest row, then (in runs that record them) cols, an unused
                # slot, grouped blocks (-1: none), the grouped rest's nonzeros and whether every
                # group is one chunk
                window, rows, nnz, max_row, *later = (int(v) for v in arrays[key])
                cols = later[0] if later else None
                grouped = later[2] if len(later) > 2 and later[2] >= 0 else None
                rest = later[3] if len(later) > 3 else 0
                one_chunk = bool(later[4]) if len(later) > 4 else False
                # A reordered matrix's rows share ratio (runs that record none: the given order's)
                share = f"{name}/rows_share_ratio"
                shapes[name] = MatrixFeatures.of_window_blocks(
                    window, arrays[f"{name}/window_blocks"], rows, nnz, max_row, cols,
                    rows_share_ratio=float(arrays[share][0]) if share in arrays.files else 1.0,
                    grouped_blocks=grouped, grouped_rest_nnz=rest, grouped_one_chunk=one_chunk)
    return drop_stale(data["records"], folder), shapes, data["device"]


def drop_stale(records, folder: Path):
    """``records`` without the times that ``folder/stale.json`` marks as measured before a change
    of their path's kernel (the module docstring)."""
    path = folder / "stale.json"
    if not path.exists():
        return records
    stale = {(entry["path"], entry["n"]) for entry in json.loads(path.read_text())["stale"]}
    return [{**r, "times_us": {p: t for p, t in r["times_us"].items() if (p, r["n"]) not in stale}} for r in records]


def load_runs(folders):
    """``load_saved`` of one run, or of several runs of the same device merged: every (graph, N,
    dtype) any run measured, with the geometric mean of each path's times over the runs that
    measured it (the timing noise of host-bound calls differs from run to run; the mean fits the
    model, not one run's noise). Runs may measure different graphs (the suite in one, the corpus's
    fit families in another)."""
    runs = [load_saved(folder) for folder in folders]
    _, _, info = runs[0]
    for _, _, other in runs[1:]:
        if (other["family"], other["sm_count"]) != (info["family"], info["sm_count"]):
            raise SystemExit(f"runs of different devices: {info['name']} and {other['name']}")
    if len(runs) == 1:
        return runs[0]

    def key(record):
        return record["graph"], record["n"], record.get("dtype", "float32")

    same: dict = {}
    for run_records, _, _ in runs:
        for record in run_records:
            same.setdefault(key(record), []).append(record)
    merged = []
    for records in same.values():
        times = {path: float(np.exp(np.mean([np.log(r["times_us"][path]) for r in records if path in r["times_us"]])))
                 for path in CHOICES if any(path in r["times_us"] for r in records)}
        merged.append({**records[0], "times_us": times})
    shapes = {name: shape for _, run_shapes, _ in runs for name, shape in run_shapes.items()}
    return merged, shapes, info


# Models of the measured device.


def launch_of(info: dict, record: dict) -> tuple[dict, dict]:
    """(column slices, slots) of each kernel path for one record: its own launch shapes (queried
    per matrix and dtype), or else the device's float32 shapes per N."""
    if "launch" in record:
        shapes = {path: record["launch"][path] for path in KERNEL_CHOICES}
    else:
        shapes = {path: [info["occupancy"][path][str(record["n"])], info["slices"][path][str(record["n"])]]
                  for path in KERNEL_CHOICES}
    slices = {path: int(shape[1]) for path, shape in shapes.items()}
    slots = {path: info["sm_count"] * int(shape[0]) for path, shape in shapes.items()}
    return slices, slots


def model_for(info: dict, calibration: Calibration, record: dict) -> DeviceModel:
    """The measured device with the launch shapes of ``record``'s matrix, N and dtype."""
    slices, slots = launch_of(info, record)

    class Measured(DeviceModel):
        def launch(self, path: str, n: int, dtype=None, windows=None):
            return slots[path] // info["sm_count"], slices[path]

    l2_bytes = int(info.get("l2_bytes", DEFAULT_L2_BYTES))
    return Measured(info["name"], info["family"], info["sm_count"], calibration, None, l2_bytes)


def choose(info: dict, calibration: Calibration, shapes: dict, record: dict):
    """The selector's explanation for one record, as the package would give it on that device
    (among the paths the record measured: runs before the rows kernel lack it)."""
    model = model_for(info, calibration, record)
    candidates = tuple(p for p in CHOICES if p in record["times_us"])
    return rank(shapes[record["graph"]], record["n"], model, candidates, dtype=record_dtype(record))


# Fitting.


def _nnls_relative(features: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, float]:
    """Nonnegative coefficients minimizing the squared relative error, and that error."""
    from scipy.optimize import nnls

    coefficients, _ = nnls(features / times[:, None], np.ones_like(times))
    residual = features @ coefficients / times - 1.0
    return coefficients, float(residual @ residual)


def fit_bucket(records, shapes, n: int, info: dict, defaults: Calibration) -> dict:
    """Constants of every path for one N and dtype from the records of that N and dtype: each
    path's host floor (its fastest measured call), then the device-time model fitted on the calls
    clearly above it; ``defaults``' constants for a CSR path the records did not measure or whose
    fit comes out all zero."""
    dtype = record_dtype(records[0])
    graph_shapes = [shapes[r["graph"]] for r in records]
    launches = [launch_of(info, r) for r in records]
    misses = np.array([choose(info, defaults, shapes, r).features["x_share_beyond_l2"] for r in records])
    measured = [path for path in CHOICES if all(path in r["times_us"] for r in records)]
    floors = {path: min(r["times_us"][path] for r in records) for path in measured}

    def fit(path, features):
        times = np.array([r["times_us"][path] for r in records])
        above = times > FLOOR_MARGIN * floors[path]
        if above.sum() < MIN_ABOVE_FLOOR:
            above = np.ones_like(above)
        coefficients, _ = _nnls_relative(features[above], times[above])
        predicted = np.maximum(floors[path], features @ coefficients)
        return coefficients, float(np.sum((predicted / times - 1.0) ** 2))

    best = None
    for block_units in BLOCK_UNITS_GRID:
        spans = [s.base_launch(slices["base"], slots["base"], block_units) + (slots["base"],)
                 for s, (slices, slots) in zip(graph_shapes, launches)]
        even = np.array([work / slots for _, work, slots in spans])
        tail = np.array([max(0.0, span - work / slots) for span, work, slots in spans])
        (launch, unit, tail_us, miss_unit), error = fit("base", np.stack([np.ones_like(even), even, tail, even * misses], 1))
        if best is None or error < best[0]:
            best = (error, {"launch_us": launch, "unit_us": unit, "tail_us": tail_us, "miss_unit_us": miss_unit,
                            "block_units": block_units, "floor_us": floors["base"]})
    base = best[1]

    best = None
    for segment_units in BLOCK_UNITS_GRID:
        for split_units in SPLIT_UNITS_GRID:
            runs = [
                (s.balanced_launch(slices["balanced"], slots["balanced"], segment_units, split_units), slots["balanced"])
                for s, (slices, slots) in zip(graph_shapes, launches)
            ]
            even = np.array([work / slots for (_, work, _), slots in runs])
            tail = np.array([max(0.0, makespan - work / slots) for (makespan, work, _), slots in runs])
            zeroed = np.array([zeroed * s.window for ((_, _, zeroed), _), s in zip(runs, graph_shapes)], dtype=float)
            features = np.stack([np.ones_like(even), even, tail, zeroed, even * misses], 1)
            (launch_us, unit, tail_us, zero, miss_unit), error = fit("balanced", features)
            if best is None or error < best[0]:
                best = (error, {"launch_us": launch_us, "unit_us": unit, "tail_us": tail_us, "miss_unit_us": miss_unit,
                                "segment_units": segment_units, "split_units": split_units, "zero_us": zero,
                                "floor_us": floors["balanced"]})
    balanced = best[1]

    fitted = {"base": _rounded(base), "balanced": _rounded(balanced)}
    csr_names = ("launch_us", "nnz_us", "row_us", "max_row_us", "miss_nnz_us")
    # rows walks pieces of its own size per graph and dtype, and pays a launch that sets the rows
    # it splits.
    pieces = [csr_rows.split_piece_nnz(s.nnz, s.max_row_nnz, record_dtype(r)) for s, r in zip(graph_shapes, records)]
    split_launch = [float(s.max_row_nnz > piece) for s, piece in zip(graph_shapes, pieces)]
    for path, capped, extra in (("csr", False, {}), ("rows", True, {"split_launch_us": split_launch})):
        if path not in measured:
            fitted[path] = dict(defaults.constants(path, n, dtype))
            continue
        nnz = np.array([s.nnz for s in graph_shapes], dtype=float)
        longest = [min(s.max_row_nnz, piece) if capped else s.max_row_nnz for s, piece in zip(graph_shapes, pieces)]
        # The rows kernel's per-row price is a warp's, shared by the rows it packs.
        per_warp = native.rows_per_warp(n, dtype.itemsize) if path == "rows" else 1
        rows = [-(-s.rows // per_warp) for s in graph_shapes]
        features = np.stack([np.ones_like(nnz), nnz, rows, longest, nnz * misses], 1)
        if path == "rows":
            # The model scales the rows kernel's time by its row order's sharing: the prices are
            # those of the kernel before that factor, or a fit on reordered matrices counts the
            # order's gain twice.
            features *= np.array([[native.rows_in_order(miss, s.rows_share_ratio, dtype.itemsize)]
                                  for miss, s in zip(misses, graph_shapes)])
        features = np.column_stack([features, *extra.values()])
        coefficients, _ = fit(path, features.astype(float))
        constants = dict(zip(csr_names + tuple(extra), coefficients.tolist()))
        if not any(constants.values()):
            constants = dict(defaults.constants(path, n, dtype))
        constants["floor_us"] = floors[path]
        fitted[path] = _rounded(constants)
    return fitted


def _rounded(constants: dict) -> dict:
    return {key: float(f"{value:.5g}") for key, value in constants.items()}


def fit_threshold(records, shapes, info, calibration: Calibration) -> float:
    """The AR threshold that loses least (geomean of the chosen kernel against the better one)."""
    points = []
    for r in records:
        ar = choose(info, calibration, shapes, r).ar
        base, balanced = r["times_us"]["base"], r["times_us"]["balanced"]
        points.append((ar, math.log(base / min(base, balanced)), math.log(balanced / min(base, balanced))))
    ars = sorted({p[0] for p in points})
    candidates = [1.2] + [ars[0] - 1e-6] + [(a + b) / 2 for a, b in zip(ars, ars[1:])] + [ars[-1] + 1e-6]

    def loss(threshold):
        return sum(balanced_loss if ar > threshold else base_loss for ar, base_loss, balanced_loss in points)

    return round(min(candidates, key=lambda t: (round(loss(t), 9), abs(t - 1.2))), 4)


def fit_buckets(records, shapes, info, defaults: Calibration, dtype: torch.dtype) -> dict:
    """Constants per N bucket for X of ``dtype`` from its records (buckets it lacks: the defaults)."""
    buckets = {}
    for n in sorted({r["n"] for r in records}):
        at_n = [r for r in records if r["n"] == n]
        buckets[str(n)] = fit_bucket(at_n, shapes, n, info, defaults)
    for n in BUCKETS:  # keep every bucket present: unmeasured ones from the defaults
        buckets.setdefault(str(n), {path: defaults.constants(path, n, dtype) for path in CALIBRATED_CHOICES})
    return buckets


def records_for(records, name: str) -> list:
    """The records the buckets of dtype ``name`` are fitted on: its own, and for a 16-bit dtype
    those of both 16-bit dtypes."""
    names = SIXTEEN_BIT if name in SIXTEEN_BIT else (name,)
    return [r for r in records if r.get("dtype", "float32") in names]


def records_by_dtype(records) -> dict:
    """``records_for`` of each dtype the records measured."""
    return {name: records_for(records, name) for name in dict.fromkeys(r.get("dtype", "float32") for r in records)}


def fit_calibration(records, shapes, info, defaults: Calibration) -> dict:
    """Buckets per dtype measured (float32's are the ``buckets``, the others ``dtype_buckets``),
    then the AR threshold and the csr margin on all records."""
    fitted = {name: fit_buckets(rs, shapes, info, defaults, getattr(torch, name))
              for name, rs in records_by_dtype(records).items()}
    buckets = fitted.pop("float32", None) or {str(n): {path: defaults.constants(path, n) for path in CALIBRATED_CHOICES}
                                              for n in BUCKETS}
    data = {
        "family": info["family"],
        "about": f"Fitted by python -m torch_tcsparse.selector.calibrate on measurements of {info['name']}.",
        "fitted_on": sorted({r["graph"] for r in records}),
        "sm_count": info["sm_count"],
        "occupancy": {path: int(values[max(values, key=int)]) for path, values in info["occupancy"].items()},
        "ar_threshold": defaults.ar_threshold,
        "csr_margin": defaults.csr_margin,
        "l2_bytes": int(info.get("l2_bytes", DEFAULT_L2_BYTES)),
        "buckets": buckets,
        "dtype_buckets": fitted,
    }
    data["ar_threshold"] = fit_threshold(records, shapes, info, Calibration.from_dict(data, "fit"))
    candidates = []
    for rule in KERNEL_RULES:
        ruled = {**data, "kernel_rule": rule, "rows_margin": 0.0}
        ruled["csr_margin"] = fit_csr_margin(records, shapes, info, ruled)
        ruled["rows_margin"] = fit_rows_margin(records, shapes, info, ruled)
        candidates.append((score(records, shapes, info, Calibration.from_dict(ruled, "fit"))["geomean_loss"], ruled))
    return min(candidates, key=lambda candidate: candidate[0])[1]


def refit_buckets(records, shapes, info, shipped: dict, wanted) -> dict:
    """``shipped`` (a calibration's data) with only the buckets ``wanted`` ((dtype name, N) pairs)
    fitted anew on ``records``: new runs that measure a few dtypes and N values leave the other
    constants, the AR threshold and the margins as they were fitted."""
    data = json.loads(json.dumps(shipped))
    defaults = Calibration.from_dict(shipped, "shipped")
    for name, n in wanted:
        at_n = [r for r in records_for(records, name) if r["n"] == n]
        if not at_n:
            raise SystemExit(f"--buckets {name}:{n}: the runs hold no record of that dtype and N")
        table = data["buckets"] if name == "float32" else data.setdefault("dtype_buckets", {}).setdefault(name, {})
        table[str(n)] = fit_bucket(at_n, shapes, n, info, defaults)
    data["about"] = f"{shipped.get('about', '')} Buckets {', '.join(f'{d}:{n}' for d, n in wanted)} refitted on " \
                    f"measurements of {info['name']}."
    data["fitted_on"] = sorted(set(shipped.get("fitted_on", [])) | {r["graph"] for r in records})
    return data


def parse_buckets(text: str) -> list[tuple[str, int]]:
    """``"float16:128,bfloat16:128"`` -> [("float16", 128), ("bfloat16", 128)]."""
    wanted = []
    for item in filter(None, text.split(",")):
        name, _, n = item.partition(":")
        if name not in ("float32", *SIXTEEN_BIT) or not n.isdigit() or int(n) not in BUCKETS:
            raise SystemExit(f"--buckets: expected DTYPE:N with DTYPE float32, float16 or bfloat16 and N one of "
                             f"{BUCKETS}, got {item!r}")
        wanted.append((name, int(n)))
    return wanted


def fit_csr_margin(records, shapes, info, data: dict) -> dict:
    """The margin by which each kernel must beat csr's prediction: the pair with the least
    geomean loss among those keeping every fit pair within FIT_WORST_VS_CSR of csr (else the
    safest). One margin per kernel: the balanced kernel's prediction is the less certain one on
    small graphs (its zeroing launch and atomics), and a margin costs hits wherever it applies."""
    pairs = [{"base": b, "balanced": c} for b in CSR_MARGINS for c in CSR_MARGINS]
    scores = [score(records, shapes, info, Calibration.from_dict({**data, "csr_margin": m}, "fit")) for m in pairs]
    safe = [i for i, s in enumerate(scores) if s["worst_vs_csr"] <= FIT_WORST_VS_CSR]
    if safe:
        best = min(safe, key=lambda i: (scores[i]["geomean_loss"], sum(pairs[i].values())))
    else:
        best = min(range(len(pairs)), key=lambda i: (scores[i]["worst_vs_csr"], sum(pairs[i].values())))
    return pairs[best]


def fit_rows_margin(records, shapes, info, data: dict) -> float:
    """The margin by which "rows" must beat the prediction of the other choice: least geomean loss
    among the margins keeping the fit within FIT_WORST_VS_CSR, or among all margins when none
    does. Unlike the csr margins, not the least worst: a single pair whose rows time is mispredicted
    by a third (snap_email-Enron at N = 64) then set a margin of 0.2, which kept rows off most of the
    graphs it wins on (fitted on three runs, 57-68% hit on the fourth, against 83-88%)."""
    scores = [score(records, shapes, info, Calibration.from_dict({**data, "rows_margin": m}, "fit")) for m in CSR_MARGINS]
    safe = [i for i, s in enumerate(scores) if s["worst_vs_csr"] <= FIT_WORST_VS_CSR] or range(len(CSR_MARGINS))
    return CSR_MARGINS[min(safe, key=lambda i: (scores[i]["geomean_loss"], CSR_MARGINS[i]))]


# Scoring.


def score(records, shapes, info, calibration: Calibration) -> dict:
    return score_paths(records, [choose(info, calibration, shapes, r).choice for r in records])


def score_paths(records, choices) -> dict:
    """Hit rate, geomean loss against the oracle and worst ratio to csr of ``choices``."""
    ratios_oracle, ratios_csr, rows = [], [], []
    for r, choice in zip(records, choices):
        times = r["times_us"]
        oracle = min(times, key=times.get)
        ratios_oracle.append(times[choice] / times[oracle])
        ratios_csr.append(times[choice] / times["csr"])
        rows.append((r["graph"], r["n"], choice, oracle, ratios_oracle[-1]))
    ratios_oracle = np.array(ratios_oracle)
    return {
        "pairs": len(records),
        "hit_rate": float((ratios_oracle <= HIT_TOLERANCE).mean()) if records else float("nan"),
        "geomean_loss": float(np.exp(np.log(ratios_oracle).mean()) - 1) if records else float("nan"),
        "worst_vs_csr": float(max(ratios_csr)) if records else float("nan"),
        "rows": rows,
    }


def split_graphs(shapes: dict, names):
    """Alternate graphs by nonzeros (so both halves span small to large): even positions fit,
    odd positions evaluate."""
    names = sorted(names, key=lambda name: (shapes[name].nnz, name))
    return names[0::2], names[1::2]


def leave_one_run_out(folders, shipped: Calibration) -> str:
    """For each run: the shipped calibration and one fitted on all the other runs merged, scored
    on that run."""
    lines = [f"{'held-out run':<56} {'calibration':<22} {'pairs':>5} {'hit<=5%':>8} {'geo loss':>9} {'worst/csr':>10}"]
    for held in folders:
        records, shapes, info = load_runs([folder for folder in folders if folder != held])
        fitted = Calibration.from_dict(fit_calibration(records, shapes, info, shipped), "fitted on the others")
        held_records, held_shapes, held_info = load_saved(held)
        for calibration in (shipped, fitted):
            s = score(held_records, held_shapes, held_info, calibration)
            lines.append(f"{str(held)[-56:]:<56} {calibration.source:<22} {s['pairs']:>5} {s['hit_rate']:>8.1%} "
                         f"{s['geomean_loss']:>9.2%} {s['worst_vs_csr']:>10.3f}")
    lines.append(TARGETS)
    return "\n".join(lines)


def scores(records, shapes, info, fits: dict) -> str:
    """Scores of the calibrations fitted on half the graphs (on that half and the other) and on
    all of them (in-sample), per dtype."""
    fit_names, eval_names = split_graphs(shapes, {r["graph"] for r in records})
    sets = {
        "fitted on half": {"fit half": [r for r in records if r["graph"] in fit_names],
                           "held-out half": [r for r in records if r["graph"] in eval_names]},
        "fitted on all": {"all": records},
    }
    dtypes = sorted({r.get("dtype", "float32") for r in records})
    lines = [f"{'calibration':<16} {'set':<14} {'dtype':<9} {'pairs':>5} {'hit<=5%':>8} {'geo loss':>9} {'worst/csr':>10}"]
    for label, subsets in sets.items():
        calibration = Calibration.from_dict(fits[label], label)
        for set_name, subset in subsets.items():
            for dtype in dtypes + (["all"] if len(dtypes) > 1 else []):
                part = [r for r in subset if dtype in ("all", r.get("dtype", "float32"))]
                s = score(part, shapes, info, calibration)
                lines.append(f"{label:<16} {set_name:<14} {dtype:<9} {s['pairs']:>5} {s['hit_rate']:>8.1%} "
                             f"{s['geomean_loss']:>9.2%} {s['worst_vs_csr']:>10.3f}")
    lines.append(TARGETS)
    return "\n".join(lines)


# The run folder ``python -m benchmarks.selector`` writes by default.
DEFAULT_RUN = Path(os.environ.get("OUT", "selector_out"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     usage="python -m torch_tcsparse.selector.calibrate [RUN ...] [options]")
    parser.add_argument("runs", nargs="*", type=Path, default=[DEFAULT_RUN],
                        help="run folders of one device (measurements.json, shapes.npz); default: the one "
                             f"python -m benchmarks.selector writes, $OUT or {DEFAULT_RUN}")
    parser.add_argument("-o", "--output", type=Path,
                        help="where to write the calibration fitted on all the runs (default: calibration.json in the "
                             "first run folder)")
    parser.add_argument("--leave-one-run-out", action="store_true",
                        help="for each run: fit on the others, score on it (needs at least two runs)")
    parser.add_argument("--buckets", metavar="DTYPE:N,...",
                        help="fit only these buckets (e.g. float16:128,bfloat16:128) and keep the shipped "
                             "calibration's other constants, threshold and margins")
    args = parser.parse_args(argv)
    missing = [str(run) for run in args.runs if not (run / "measurements.json").is_file()]
    if missing:
        parser.error(f"not a run folder (no measurements.json): {', '.join(missing)}\n"
                     f"Measure a run first, on the GPU to calibrate: python -m benchmarks.selector (it writes $OUT, "
                     f"default {DEFAULT_RUN}), then: python -m torch_tcsparse.selector.calibrate RUN")
    defaults = Calibration.load("default")
    if args.leave_one_run_out:
        if len(args.runs) < 2:
            parser.error("--leave-one-run-out needs at least two runs")
        print(leave_one_run_out(args.runs, defaults))
        return
    if args.output is None:
        args.output = args.runs[0] / "calibration.json"
    records, shapes, info = load_runs(args.runs)
    fit_names, _ = split_graphs(shapes, {r["graph"] for r in records})
    if args.buckets:
        wanted = parse_buckets(args.buckets)
        shipped = json.loads(calibration_path("default").read_text())

        def fit(subset):
            return refit_buckets(subset, shapes, info, shipped, wanted)
    else:
        def fit(subset):
            return fit_calibration(subset, shapes, info, defaults)
    fits = {"fitted on half": fit([r for r in records if r["graph"] in fit_names]), "fitted on all": fit(records)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(fits["fitted on all"], indent=2) + "\n")
    print(scores(records, shapes, info, fits))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
