"""How good is the kernel selector? Measure every path (the oracle) and score the choice.

For each graph of the SpMM suite (``benchmarks/spmm.py``) and N in {32, 64, 128, 256}: time
``A.matmul(X, path=p)`` for every path (TF32, X rotated out of L2, as the SpMM benchmark times
them, in interleaved rounds); the oracle is the fastest. The shipped calibration's choice is
scored by hit rate (within 5% of the oracle), geomean loss against the oracle and worst ratio
against csr (cuSPARSE); so are a product's first choice (the C++ model with the device's own
launch shapes) and the measured choice (``torch_tcsparse.trials``), and the cost of a first
choice against one SpMM.

On the GPU (writes the run under $OUT, prints a table last)::

    python -m benchmarks.selector                        # all graphs
    python -m benchmarks.selector --graphs rmat18,gg_ --n 128 --repeat 10 --dtypes float32,float16

The run is what the calibration is fitted on, offline::

    python -m torch_tcsparse.selector.calibrate RUN [RUN ...] -o torch_tcsparse/calibration/<family>.json

The corpus's graphs instead of the suite's (``graph_data.corpus``; the calibration is fitted on
the "fit" families only, and scored on the "unseen" ones)::

    python -m benchmarks.selector --corpus fit --tier medium --dtypes float32,float16,bfloat16 --out runs/fit
    python -m benchmarks.selector --corpus unseen --tier medium --dtypes float32,float16,bfloat16 --out runs/unseen

Score the calibration in the package on runs already made (no GPU)::

    python -m benchmarks.selector --score RUN

Time only the first choice at each N bucket (the host cost a product pays the first time it meets
an N bucket and dtype), as the full run times it; with a GPU on the GPU, without one on the CPU,
the choice asked as for a CUDA device whose kernels are built (the launch shapes then are the
documented defaults), on Cora-sized and larger synthetic graphs and the suite's real graphs
present (``--graphs`` picks among both)::

    python -m benchmarks.selector --first-choice --dtypes float32,float16

Outputs: ``measurements.json`` (times, device, launch shapes), ``shapes.npz`` (TC blocks per
window of each graph, all the model reads) and ``summary.txt``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from benchmarks import spmm as spmm_suite
from benchmarks.common import (add_corpus_arguments, batch_for, corpus_table, rotation_count, settle,
                               split_of_name, time_cuda)
from graph_data import synthetic
from torch_tcsparse import TCSparseTensor, kernels, selector, trials
from torch_tcsparse.selector import CHOICES, KERNEL_CHOICES, Calibration, MatrixFeatures, SelectionCache, calibrate

N_VALUES = (32, 64, 128, 256)
LARGE_NNZ = 1_000_000
ROUNDS = 4  # interleaved timing rounds per (graph, N, dtype)

# Graphs --first-choice adds to the suite: Cora's size and larger, small enough to convert on a CPU.
FIRST_CHOICE_GRAPHS = {
    "sbm_2708_d4": lambda device: synthetic.sbm(2708, 4, 64, seed=1, device=device),
    "uniform_19717_d5": lambda device: synthetic.uniform(19717, 5, seed=1, device=device),
    "rmat16": lambda device: synthetic.rmat(16, seed=1, device=device),
    "uniform_200k_d10": lambda device: synthetic.uniform(200_000, 10, seed=1, device=device),
}
FIRST_CHOICE_DEFAULT = "sbm_2708_d4,uniform_19717_d5,rmat16,uniform_200k_d10,planetoid"


# Graphs: the SpMM suite (benchmarks/spmm.py).


def graph_loaders(args) -> dict:
    """name -> (load(device) -> (row, col, size), split): the suite's graphs, or with ``--corpus``
    the corpus's of that split and tier (its rectangular families included)."""
    if args.corpus:
        return corpus_table(args, rectangular=True)
    return {name: (load, split_of_name(name)) for name, load in spmm_suite.suite().items()}


def select_graphs(patterns: str | None, loaders: dict) -> list[str]:
    """Graphs of ``loaders`` whose name contains one of the comma-separated ``patterns``."""
    names = sorted(loaders)
    if not patterns:
        return names
    wanted = [p for p in patterns.split(",") if p]
    chosen = [name for name in names if any(p in name for p in wanted)]
    if not chosen:
        raise SystemExit(f"no graph matches {wanted}; known: {names}")
    return chosen


def load_graph(load, reorder: str = "none") -> TCSparseTensor:
    row, col, size = load("cuda")
    shape = size if isinstance(size, tuple) else (size, size)
    gen = torch.Generator(device="cuda").manual_seed(7)
    values = torch.rand(row.numel(), device="cuda", generator=gen) + 0.5
    return TCSparseTensor.from_coo(row.cuda(), col.cuda(), values, shape=shape, reorder=reorder)


# Measurements.


def measure(loaders: dict, names, n_values, dtypes, repeat: int, out: Path, info: dict, reorder: str = "none"):
    """Times of every path, the selector's own cost, the kernels' launch shapes, and the matrix
    shapes, for each graph, N and dtype; saved after each graph, so a run cut short can still be
    refitted offline."""
    records, shapes = [], {}
    model = selector.device_model(torch.device("cuda"))
    subjects = {}  # record index -> what first_choice_rounds times for it
    for graph in names:
        load, split = loaders[graph]
        a32 = load_graph(load, reorder)
        # A reordered graph is its own matrix to the fit: its name says the order kept.
        name = graph if reorder == "none" else f"{graph}@{a32.reorder_method}"
        layout = a32._structure.layout
        blocks, rest, one_chunk = a32._structure.grouped_size() or (None, 0, False)
        shapes[name] = MatrixFeatures.of_layout(layout, rows_share_ratio=a32._structure.selection.rows_share_ratio,
                                                grouped_blocks=blocks, grouped_rest_nnz=rest,
                                                grouped_one_chunk=one_chunk)
        windows = layout.num_windows
        for dtype in dtypes:
            a = a32 if dtype == torch.float32 else a32.to(dtype)
            for n in n_values:
                xs = [(torch.randn(a.shape[1], n, device="cuda", dtype=dtype),)
                      for _ in range(rotation_count(a.shape[1] * n * dtype.itemsize))]
                times = measure_paths(a, xs, repeat)
                subject = (layout, n, dtype, a32._structure.selection.rows_share_ratio, a32._structure.grouped_size)
                cold_features, cold_choice, first_path = first_choice_sample(*subject)
                settled, measured, trial_calls = measured_choice(a, xs[0][0])
                launch = {path: list(model.launch(path, n, dtype, windows)) for path in KERNEL_CHOICES}
                subjects[len(records)] = subject
                records.append({"graph": name, "split": split, "n": n, "dtype": selector.dtype_name(dtype),
                                "times_us": times,
                                "cold_features_us": cold_features, "cold_choice_us": cold_choice,
                                "first_choice": first_path,
                                "settled": settled, "trial_us": measured, "trial_calls": trial_calls,
                                "launch": launch})
                print(f"{name:>24} N={n:<4} {selector.dtype_name(dtype):<9}"
                      + " ".join(f"{p}={t:9.1f}" for p, t in times.items())
                      + f"  first choice {first_path} (cold {cold_choice:.1f} us + features {cold_features:.1f} us); "
                      + f"measured choice {settled} (trial: {', '.join(f'{p}={t:.1f}' for p, t in measured.items())})",
                      flush=True)
        del a
        torch.cuda.empty_cache()
        calibrate.save(out, records, shapes, info)
    for index, (features, choice) in first_choice_rounds(subjects).items():
        records[index].update(features_us=features, choice_us=choice)
    calibrate.save(out, records, shapes, info)
    return records, shapes


def first_choice_sample(layout, n: int, dtype: torch.dtype, rows_share_ratio: float, grouped_size, device=None):
    """One first choice at an N bucket on a fresh cache (trials are opt-in and off here): the
    microseconds of the matrix's features (built once per matrix, with its conversion on a GPU,
    from the conversion's host copies; the grouped layout's size from ``grouped_size``, built once
    and then kept), of the choice itself (what a first product at each N bucket and dtype pays),
    and the path chosen. ``device``: X's (None: the layout's)."""
    cache = SelectionCache(rows_share_ratio, grouped_size)
    start = time.perf_counter()
    cache.prepare(layout)
    prepared = time.perf_counter()
    path, _ = cache.choose(layout, n, dtype, layout.device if device is None else device)
    return (prepared - start) * 1e6, (time.perf_counter() - prepared) * 1e6, path


def first_choice_rounds(subjects: dict, rounds: int = 9) -> dict:
    """Median microseconds (features, choice) of ``first_choice_sample`` for each key of
    ``subjects`` (its arguments), over ``rounds`` rounds of one sample per key. Like the paths'
    interleaved rounds: a slow spell of the host then costs every key one sample, where samples
    taken back to back had all fallen in it."""
    samples = {key: [] for key in subjects}
    for _ in range(rounds):
        for key, subject in subjects.items():
            samples[key].append(first_choice_sample(*subject)[:2])
    return {key: tuple(statistics.median(part) for part in zip(*values)) for key, values in samples.items()}


def first_choices(patterns: str, n_values, dtypes, out: Path) -> str:
    """``--first-choice``: median microseconds of ``first_choice_sample`` (interleaved rounds, as
    the full run) per graph, dtype and N bucket, into ``first_choice.csv``; the table as text.
    Without a GPU the matrices stay on the CPU and the choice is asked for ``cuda:0`` with the
    kernels counted as built, so that the model is asked as on a GPU."""
    on_gpu = kernels.available()
    loaders = {**{name: (lambda device, load=load: load(device=device)) for name, load in spmm_suite.suite().items()},
               **FIRST_CHOICE_GRAPHS}
    wanted = patterns.split(",")
    names = [name for name in loaders if any(p in name for p in wanted)]
    if not names:
        raise SystemExit(f"no graph matches {wanted}; known: {sorted(loaders)}")
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cuda", 0)
    built = contextlib.nullcontext() if on_gpu else mock.patch.object(kernels, "available", lambda: True)
    records, subjects = [], {}
    with built:
        kernels.usable_for.cache_clear()  # kept per process: the patch changes its answer
        for name in names:
            row, col, size = loaders[name]("cuda" if on_gpu else "cpu")
            a = TCSparseTensor.from_coo(row, col, None, size if isinstance(size, tuple) else (size, size))
            s = a._structure
            for dtype in dtypes:
                for n in n_values:
                    subjects[len(records)] = (s.layout, n, dtype, s.selection.rows_share_ratio, s.grouped_size, device)
                    records.append({"graph": name, "nnz": s.nnz, "dtype": selector.dtype_name(dtype), "n": n})
        for index, (features_us, choice_us) in first_choice_rounds(subjects).items():
            records[index].update(choice_us=choice_us, features_us=features_us,
                                  path=first_choice_sample(*subjects[index])[2])
        kernels.usable_for.cache_clear()
    where = torch.cuda.get_device_name() if on_gpu else "CPU (no GPU: launch shapes are the documented defaults)"
    lines = [f"first choice at an N bucket on a fresh cache, features built (median us), {where}",
             f"{'graph':<22} {'nnz':>9} {'dtype':<9} {'N':>4} {'choice':>8} {'features':>9}  path"]
    lines += [f"{r['graph']:<22} {r['nnz']:>9} {r['dtype']:<9} {r['n']:>4} {r['choice_us']:>8.1f} "
              f"{r['features_us']:>9.1f}  {r['path']}" for r in records]
    for dtype in dict.fromkeys(r["dtype"] for r in records):
        choices = [r["choice_us"] for r in records if r["dtype"] == dtype]
        lines.append(f"{dtype}: median {statistics.median(choices):.1f} us, max {max(choices):.1f} us")
    out.mkdir(parents=True, exist_ok=True)
    columns = ("graph", "nnz", "dtype", "n", "choice_us", "features_us", "path")
    (out / "first_choice.csv").write_text("\n".join([",".join(columns)] + [
        ",".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in columns) for r in records]) + "\n")
    return "\n".join(lines)


def measured_choice(a: TCSparseTensor, x: torch.Tensor) -> tuple[str, dict, dict]:
    """The path ``A @ X`` settles on from a fresh cache (``torch_tcsparse.trials``), the
    trial's median microseconds per candidate and its calls per candidate (both empty when the
    prediction stood alone)."""
    s = a._structure
    s.selection = SelectionCache(s.selection.rows_share_ratio, s.grouped_size)
    trials.set_enabled(True)  # opt-in in the library
    try:
        settled = settle(a, x)
    finally:
        trials.set_enabled(False)
    explanation = a.explain(x.shape[1])
    calls = {path: trials.UNTIMED_CALLS + trials.TIMED_ROUNDS * trials.sample_calls(explanation.costs_us[path])
             for path in explanation.measured_us}
    return settled, explanation.measured_us, calls


def trial_cost(record: dict) -> float:
    """What a trial costs beyond running the fastest path all along, in SpMMs of that path (by the
    benchmark's times of each path)."""
    times = record["times_us"]
    best = min(times.values())
    return sum(calls * (times[path] - best) for path, calls in record.get("trial_calls", {}).items()) / best


def measure_paths(a: TCSparseTensor, xs, repeat: int, rounds: int = ROUNDS) -> dict:
    """Microseconds per call of every path: the median of ``rounds`` interleaved rounds, each
    the median of ``repeat / rounds`` samples, so that a drift of the machine (clocks, host
    load) falls on all paths alike instead of on whichever was timed during it."""
    calls = {path: (lambda x, p=path: a.matmul(x, path=p)) for path in CHOICES}
    batches = {path: batch_for(call, xs) for path, call in calls.items()}
    per_round = max(5, repeat // rounds)
    samples = {path: [] for path in CHOICES}
    for round_index in range(rounds):
        warmup_ms = 25.0 if round_index == 0 else 5.0  # later rounds follow a warm GPU
        for path, call in calls.items():
            samples[path].append(1e3 * time_cuda(call, xs, reps=per_round, batch=batches[path], warmup_ms=warmup_ms))
    return {path: statistics.median(values) for path, values in samples.items()}


def device_info(n_values) -> dict:
    model = selector.device_model(torch.device("cuda"))
    return {
        "name": model.name,
        "family": model.family,
        "sm_count": model.sm_count,
        "l2_bytes": model.l2_bytes,
        "occupancy": {path: {str(n): model.launch(path, n)[0] for n in n_values} for path in KERNEL_CHOICES},
        "slices": {path: {str(n): model.launch(path, n)[1] for n in n_values} for path in KERNEL_CHOICES},
        "calibration_in_package": model.calibration.source,
    }


# Scores.


def report(records, shapes, info) -> str:
    """Per pair the measured times, the oracle and the shipped calibration's choice; the cost of
    first choices and trials; the scores of the shipped calibration, of products' first choices
    and of measured choices."""
    shipped = Calibration.load(info["family"])
    # "fit" and "unseen" apart: only the second says whether the calibration holds beyond its fit.
    splits = sorted({r["split"] for r in records if "split" in r})
    sets = {split: [r for r in records if r.get("split") == split] for split in splits}
    if len(sets) != 1 or len(sets[splits[0]]) != len(records):
        sets = {"all": records, **sets}
    calibrations = {f"shipped ({shipped.source})": (shipped, sets)}

    lines = ["", f"per (graph, N): measured us of each path, oracle, choice ({' / '.join(calibrations)})"]
    choices = {label: calibrate.score(records, shapes, info, c)["rows"] for label, (c, _) in calibrations.items()}
    for i, r in enumerate(records):
        picks = " / ".join(f"{rows[i][2]} x{rows[i][4]:.2f}" for rows in choices.values())
        times = " ".join(f"{p}={t:.1f}" for p, t in r["times_us"].items())
        lines.append(f"{r['graph']:>24} N={r['n']:<4} {r.get('dtype', 'float32'):<9} {times:<48} "
                     f"oracle={choices[next(iter(choices))][i][3]:<9} {picks}")
    for dtype in sorted({r.get("dtype", "float32") for r in records}):
        at_128 = [r for r in records if r["n"] == 128 and "choice_us" in r and r.get("dtype", "float32") == dtype]
        if not at_128:
            continue
        parts = (("first choice", ("choice_us",)), ("first choice + features", ("choice_us", "features_us")),
                 ("first choice, cold", ("cold_choice_us",)),
                 ("first choice + features, cold", ("cold_choice_us", "cold_features_us")))
        for label, keys in parts:
            cost = {r["graph"]: sum(r[key] for key in keys) / min(r["times_us"].values())
                    for r in at_128 if all(key in r for key in keys)}
            if not cost:
                continue
            large = [ratio for graph, ratio in cost.items() if shapes[graph].nnz >= LARGE_NNZ]
            lines.append(f"{label} / fastest SpMM at N=128 ({dtype}): median {np.median(list(cost.values())):.2f}, "
                         f"max {max(cost.values()):.2f} ({max(cost, key=cost.get)}), at most 0.5 on "
                         f"{sum(c <= 0.5 for c in cost.values())} of {len(cost)}; graphs of 1M+ nonzeros: median "
                         f"{np.median(large) if large else float('nan'):.2f}, max {max(large, default=float('nan')):.2f}")
    shipped_choices = choices[f"shipped ({shipped.source})"]
    products = [(r, shipped_choices[i][2]) for i, r in enumerate(records) if "first_choice" in r]
    if products:
        disagree = [f"{r['graph']} N={r['n']} {r.get('dtype', 'float32')}: {r['first_choice']} vs {predicted}"
                    for r, predicted in products if r["first_choice"] != predicted]
        lines.append(f"products' first choices (C++ model on the GPU) equal to the shipped calibration's prediction "
                     f"here on {len(products) - len(disagree)} of {len(products)} pairs"
                     + (f"; differ on {'; '.join(disagree)}" if disagree else ""))
    for dtype in sorted({r.get("dtype", "float32") for r in records}):
        costs = [trial_cost(r) for r in records if r.get("trial_calls") and r.get("dtype", "float32") == dtype]
        if costs:
            lines.append(f"trials ({dtype}): {len(costs)} pairs measured; cost beyond the fastest path all along, in "
                         f"SpMMs: median {np.median(costs):.1f}, max {max(costs):.1f}")
    lines += ["", f"device: {info['name']} (family {info['family']}, {info['sm_count']} SMs), occupancy {info['occupancy']}"]
    dtypes = sorted({r.get("dtype", "float32") for r in records})
    lines.append(f"{'calibration':<28} {'set':<14} {'dtype':<9} {'pairs':>5} {'hit<=5%':>8} {'geo loss':>9} "
                 f"{'worst/csr':>10}")
    for label, (calibration, sets) in calibrations.items():
        for set_name, subset in sets.items():
            for dtype in dtypes + (["all"] if len(dtypes) > 1 else []):
                part = [r for r in subset if dtype in ("all", r.get("dtype", "float32"))]
                s = calibrate.score(part, shapes, info, calibration)
                lines.append(f"{label:<28} {set_name:<14} {dtype:<9} {s['pairs']:>5} {s['hit_rate']:>8.1%} "
                             f"{s['geomean_loss']:>9.2%} {s['worst_vs_csr']:>10.3f}")
    for label, key in (("product (C++ model)", "first_choice"), ("measured choice (trials)", "settled")):
        chosen = [r for r in records if key in r]
        for dtype in dtypes if chosen else []:
            part = [r for r in chosen if r.get("dtype", "float32") == dtype]
            s = calibrate.score_paths(part, [r[key] for r in part])
            lines.append(f"{label:<28} {'all':<14} {dtype:<9} {s['pairs']:>5} {s['hit_rate']:>8.1%} "
                         f"{s['geomean_loss']:>9.2%} {s['worst_vs_csr']:>10.3f}")
    lines.append(calibrate.TARGETS)
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", help="comma-separated substrings of graph names (default: the whole SpMM suite, "
                        "or with --corpus the corpus's graphs of that split and tier)")
    parser.add_argument("--n", default=",".join(map(str, N_VALUES)), help="comma-separated N values")
    parser.add_argument("--dtypes", default="float32", help="comma-separated dtypes of X (float32, float16, bfloat16)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per measurement (median)")
    parser.add_argument("--out", default=os.environ.get("OUT", "selector_out"), help="output folder (default $OUT)")
    parser.add_argument("--score", help="run folder(s), comma-separated: score the package's calibration on them "
                        "without a GPU (several runs of one device are merged)")
    parser.add_argument("--first-choice", action="store_true",
                        help="time only the first choice at each N bucket (with or without a GPU); --graphs picks "
                        f"among the suite and {', '.join(FIRST_CHOICE_GRAPHS)} (default {FIRST_CHOICE_DEFAULT})")
    parser.add_argument("--reorder", default="none",
                        help='the matrices\' row order ("none", "auto" or a method of torch_tcsparse.reorder): '
                        "the fit then sees the order's rows share ratio")
    add_corpus_arguments(parser)
    args = parser.parse_args(argv)
    out = Path(args.out)

    if args.first_choice:
        n_values = [int(v) for v in args.n.split(",")]
        dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
        print(first_choices(args.graphs or FIRST_CHOICE_DEFAULT, n_values, dtypes, out))
        return
    if args.score:
        records, shapes, info = calibrate.load_runs([Path(folder) for folder in args.score.split(",")])
    else:
        if not kernels.available():
            raise SystemExit("benchmarks/selector.py measures on a CUDA device with the kernels built; "
                             "use --score to score saved runs offline")
        torch.set_float32_matmul_precision("high")  # TF32, as benchmarks/spmm.py measures the kernels
        loaders = graph_loaders(args)
        names = select_graphs(args.graphs, loaders)
        n_values = [int(v) for v in args.n.split(",")]
        if any(n != selector.n_bucket(n) for n in n_values):
            raise SystemExit(f"N values must be N buckets (powers of two from 32), got {n_values}")
        info = device_info(n_values)
        dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
        records, shapes = measure(loaders, names, n_values, dtypes, args.repeat, out, info, args.reorder)

    text = report(records, shapes, info)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
