"""GCN end to end: our GCNConv against PyG's, for speed (epoch time, peak memory) and accuracy.

    python -m benchmarks.gcn                 # GPU: R-MAT scale 21 + every real graph, 10 accuracy seeds
    python -m benchmarks.gcn --quick         # CPU smoke test: tiny sizes, 2 seeds, few epochs

Without a GPU the GPU sizes (7 GB and hours on a CPU) are refused unless asked for with --scale
or --seeds: the benchmark points to --quick instead.
    python -m benchmarks.gcn --parts timing --graphs rmat,ogbl_ddi --tf32 off

Timing: a 2-layer GCN with ogbn-products shapes (100 -> 256 -> 47, ReLU, dropout 0.5), an epoch
being forward, cross-entropy over all nodes, backward and an Adam step; median over epochs after
warm-up (CUDA events on GPU). Three propagation modes, each given the graph normalized once
beforehand (what ``cached=True`` does), layers built from the same seed so the weights are equal:

- ``tcsparse``: torch_tcsparse.nn.GCNConv on a TCSparseTensor;
- ``pyg_edge_index``: torch_geometric.nn.GCNConv on (edge_index, edge_weight), gather-scatter;
- ``pyg_csr``: torch_geometric.nn.GCNConv on a torch sparse CSR ``adj_t`` (torch.sparse.mm).

The first forward of every mode is checked against the first mode's before anything is timed.
Preprocessing (normalization and conversion) is timed apart, after the CUDA extension is loaded. Peak GPU memory covers the mode's
preprocessing, graph, model and training (features and labels, shared by all modes, included);
the training peak leaves out the preprocessing's temporaries (what the graph holds stays in). The TF32
flag sets torch's dense matmuls alike for all modes; our CUDA SpMM kernel is TF32 by design.

Accuracy: ``examples.gcn.train`` with each backend over ``--seeds`` seeds: Cora and CiteSeer
(test accuracy at the last epoch, Kipf & Welling's setup), ogbl-ddi (Hits@20, OGB's setup), read
from ``--data-root``. ``--parallel P`` trains each dataset, backend and seed in a process of its
own, P at once (a run of ogbl-ddi is host-bound: 20 in a row take over an hour); epoch times then
come from runs sharing the device and host, marked by the ``concurrent_runs`` column.
Results: a table on stdout, CSV and PNG files in $OUT (default ./out).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import out_dir, write_csv
from examples.gcn.models import GCN, prepare_graph
from graph_data import npz, synthetic
from graph_data.folders import data_root
from torch_tcsparse import kernels

MODES = ("tcsparse", "pyg_edge_index", "pyg_csr")
IN_CHANNELS, HIDDEN, CLASSES = 100, 256, 47  # ogbn-products
REPO = Path(__file__).resolve().parents[1]
TRAIN_MODULE = "examples.gcn.train"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a CPU smoke test")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--parts", default="timing,accuracy", help="comma list of: timing, accuracy")
    parser.add_argument("--graphs", default=None,
                        help="comma list: 'rmat' and/or real graph names (default: rmat and every real graph)")
    parser.add_argument("--scale", type=int, default=None, help="R-MAT scale (default 21, --quick 12)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma list of {MODES}; the first one is the correctness reference")
    parser.add_argument("--tf32", choices=("on", "off"), default="on")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None, help="timed epochs per mode")
    parser.add_argument("--profile", action="store_true",
                        help="after timing, profile one epoch per mode: GPU kernels by time to $OUT/gcn_profile_*.txt")
    parser.add_argument("--seeds", type=int, default=None, help="accuracy runs per backend (default 10)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds run are first-seed .. first-seed + seeds - 1 (split long runs over commands)")
    parser.add_argument("--backends", default="tcsparse,pyg", help="backends of the accuracy runs")
    parser.add_argument("--accuracy-datasets", default="Cora,CiteSeer,ogbl-ddi")
    parser.add_argument("--data-root", default=None,
                        help="folder holding ogb/ogbl_ddi and planetoid/<name>, only read "
                             "(default: $TCSPARSE_DATA, else data/ in the repository)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="accuracy runs at once, one process per dataset, backend and seed (1: in this process)")
    args = parser.parse_args(argv)
    quick = args.quick
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu" and not quick and args.scale is None and args.seeds is None:
        raise SystemExit("benchmarks.gcn: the default sizes are a GPU's (R-MAT scale 21, 10 seeds per dataset: "
                         "7 GB and hours on a CPU), and no CUDA device is here.\n"
                         "On a CPU run: python -m benchmarks.gcn --quick   (or choose sizes with --scale and --seeds)")
    args.scale = args.scale if args.scale is not None else (12 if quick else 21)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 3)
    args.epochs = args.epochs if args.epochs is not None else (2 if quick else 10)
    args.seeds = args.seeds if args.seeds is not None else (2 if quick else 10)
    if args.parallel < 1 or args.seeds < 1:
        raise SystemExit(f"--parallel and --seeds must be at least 1, got {args.parallel} and {args.seeds}")
    args.modes = args.modes.split(",")
    unknown = set(args.modes) - set(MODES)
    if unknown:
        raise SystemExit(f"--modes takes {MODES}, got {sorted(unknown)}")
    return args


# Graphs.

def benchmark_graphs(args):
    """(name, edge_index, num_nodes) for every graph asked for; the real ones symmetrized."""
    wanted = None if args.graphs is None else set(args.graphs.split(","))
    if wanted is None or "rmat" in wanted:
        row, col, num_nodes = synthetic.rmat(args.scale, device=args.device)
        yield f"rmat{args.scale}", torch.stack([col, row]), num_nodes
    paths = npz.list_graphs()
    if args.quick and wanted is None:
        paths = [p for p in paths if p.stem in ("planetoid_cora", "planetoid_citeseer")]
    for path in paths:
        if wanted is not None and path.stem not in wanted:
            continue
        adj = npz.load_adjacency(path, symmetrize=True).tocoo()
        edge_index = torch.stack([torch.from_numpy(adj.col), torch.from_numpy(adj.row)]).long()
        yield path.stem, edge_index.to(args.device), adj.shape[0]


def graph_input(mode: str, edge_index, num_nodes: int):
    """What the layers of ``mode`` receive: (graph, edge_weight), normalized once."""
    if mode == "tcsparse":
        return prepare_graph("tcsparse", edge_index, num_nodes)
    return prepare_graph("pyg", edge_index, num_nodes, pyg_format="edge_index" if mode == "pyg_edge_index" else "csr")


# Timing.

def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, warmup: int, reps: int, device) -> float:
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(reps):
        if torch.device(device).type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def time_mode(graph_name, mode, edge_index, num_nodes, x, y, args, reference):
    """One mode on one graph: preprocessing, correctness against ``reference`` (the first mode's
    output, on the host), epoch time, peak; returns the results and this mode's output (host)."""
    device = args.device
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    synchronize(device)
    start = time.perf_counter()
    graph, edge_weight = graph_input(mode, edge_index, num_nodes)
    synchronize(device)
    preprocess_ms = 1000 * (time.perf_counter() - start)
    if cuda:  # the training peak apart: what is allocated now (graph, inputs) plus training's own
        preprocess_peak_gb = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()

    backend = "tcsparse" if mode == "tcsparse" else "pyg"
    torch.manual_seed(0)
    model = GCN(backend, IN_CHANNELS, HIDDEN, CLASSES, num_layers=2, dropout=0.5).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.eval()
    with torch.no_grad():
        out = model(x, graph, edge_weight)
    out = out.cpu()  # kept on the host, so no mode's peak memory holds another mode's output
    error = 0.0 if reference is None else float((out - reference).norm() / reference.norm())
    model.train()

    def epoch():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x, graph, edge_weight), y)
        loss.backward()
        optimizer.step()

    epoch_ms = median_ms(epoch, args.warmup, args.epochs, device)
    train_peak_gb = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    if args.profile and cuda:
        profile_epoch(epoch, f"{graph_name}_{mode}")
    peak_gb = max(preprocess_peak_gb, train_peak_gb) if cuda else float("nan")
    return {"preprocess_ms": preprocess_ms, "epoch_ms": epoch_ms, "peak_gb": peak_gb, "train_peak_gb": train_peak_gb,
            "rel_error": error}, out


def profile_epoch(epoch, label: str, top: int = 25):
    """GPU time of one epoch by kernel, largest first, to $OUT/gcn_profile_<label>.txt: where an
    epoch's time goes, for both backends alike."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        epoch()
        torch.cuda.synchronize()
    kernels_us = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels_us[event.name] = kernels_us.get(event.name, 0.0) + event.time_range.elapsed_us()
    total = sum(kernels_us.values())
    lines = [f"{label}: one epoch, GPU kernel time {total / 1000:.2f} ms; kernels (ms, share):"]
    for name, us in sorted(kernels_us.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"  {us / 1000:8.2f} {us / total:6.1%}  {name[:110]}")
    (out_dir() / f"gcn_profile_{label}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:9]), flush=True)


def run_timing(args):
    """TF32 set alike for every mode while timing, and restored after (tests call this in-process)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    try:
        return _time_every_mode(args)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _time_every_mode(args):
    if torch.device(args.device).type == "cuda":
        # Load (or build) the CUDA extension once up front: a one-time cost of the process, not
        # of any graph's preprocessing (the conversion runs on its kernels).
        kernels.available()
    rows = []
    for name, edge_index, num_nodes in benchmark_graphs(args):
        generator = torch.Generator(device=args.device).manual_seed(0)
        x = torch.randn(num_nodes, IN_CHANNELS, device=args.device, generator=generator)
        y = torch.randint(0, CLASSES, (num_nodes,), device=args.device, generator=generator)
        reference = None
        for mode in args.modes:
            row = {"graph": name, "nodes": num_nodes, "nnz": edge_index.size(1), "mode": mode, "tf32": args.tf32,
                   "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
            try:
                result, out = time_mode(name, mode, edge_index, num_nodes, x, y, args, reference)
                reference = out if reference is None else reference
                row |= result
            except torch.cuda.OutOfMemoryError:
                row |= {"preprocess_ms": float("nan"), "epoch_ms": float("nan"), "peak_gb": float("nan"),
                        "train_peak_gb": float("nan"), "rel_error": float("nan"), "note": "out of memory"}
            gc.collect()
            rows.append(row)
            print(format_timing_row(row), flush=True)
        del x, y, edge_index, reference
        gc.collect()
    return rows


def format_timing_row(row) -> str:
    note = row.get("note", "")
    # TF32 rounding in either product leaves a relative error near 1e-3; beyond 1e-2 is a bug.
    if row["rel_error"] == row["rel_error"] and row["rel_error"] > 1e-2:
        note = "MISMATCH against the first mode"
    return (f"| {row['graph']} | {row['nodes']:,} | {row['nnz']:,} | {row['mode']} | {row['preprocess_ms']:.1f} | "
            f"{row['epoch_ms']:.2f} | {row['peak_gb']:.2f} | {row['train_peak_gb']:.2f} | {row['rel_error']:.1e} | "
            f"{note} |")


def speedups(rows):
    """Per graph: PyG's epoch time over ours, per PyG mode."""
    lines = []
    for graph in dict.fromkeys(r["graph"] for r in rows):
        by_mode = {r["mode"]: r for r in rows if r["graph"] == graph}
        ours = by_mode.get("tcsparse", {}).get("epoch_ms", float("nan"))
        parts = [f"{mode}: {by_mode[mode]['epoch_ms'] / ours:.2f}x" for mode in MODES[1:] if mode in by_mode]
        lines.append(f"{graph}: speed-up (PyG epoch / ours) " + ", ".join(parts))
    return lines


# Accuracy.

def accuracy_options(args):
    """(dataset, train.py options short of backend and seeds) for every dataset found under
    --data-root; a dataset not found is skipped with a line saying so."""
    from examples.gcn import data as gcn_data

    root = Path(data_root() if args.data_root is None else args.data_root).resolve()
    for dataset in args.accuracy_datasets.split(","):
        options = ["--dataset", dataset, "--device", args.device, "--quiet"]
        family = "planetoid" if dataset in gcn_data.PLANETOID else "ogb"
        missing = gcn_data.missing_files(dataset, root / family)
        if missing:
            print(f"skipping {dataset}: no {missing[0]}")
            continue
        options += ["--root", str(root / family)]
        if args.quick and family == "ogb":
            options += ["--epochs", "1", "--hidden", "8", "--batch-size", "2000000"]
        elif args.quick:
            options += ["--epochs", "20"]
        yield dataset, options


def run_accuracy(args):
    """Summary rows (mean and std per dataset and backend) and one row per run, to merge runs
    split over several commands with --first-seed."""
    from examples.gcn import train

    datasets = dict(accuracy_options(args))
    backends = args.backends.split(",")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    concurrency = min(args.parallel, len(datasets) * len(backends) * len(seeds))
    if concurrency > 1:
        finished = runs_in_subprocesses(datasets, backends, seeds, args.parallel, out_dir() / "accuracy_runs")
    rows, run_rows = [], []
    for dataset, options in datasets.items():
        for backend in backends:
            if concurrency > 1:
                runs = [finished[dataset, backend, seed] for seed in seeds]
            else:
                runs = train.run(options + ["--backend", backend, "--runs", str(args.seeds),
                                            "--seed", str(args.first_seed)])["runs"]
            summary = train.summarize(runs)
            run_rows += [{"dataset": dataset, "backend": backend, "metric": summary["metric"], "seed": seed,
                          "test": r["test"], "valid": r["valid"], "epoch": r["epoch"]} for seed, r in zip(seeds, runs)]
            row = {"dataset": dataset, "backend": backend, "metric": summary["metric"], "seeds": args.seeds,
                   "test_mean": summary["test_mean"], "test_std": summary["test_std"],
                   "epoch_ms_median": summary["epoch_ms_median"], "preprocess_ms": 1000 * summary["preprocess_s"],
                   "concurrent_runs": concurrency}
            rows.append(row)
            print(f"| {dataset} | {backend} | {row['metric']} | {100 * row['test_mean']:.2f} ± "
                  f"{100 * row['test_std']:.2f} | {row['seeds']} | {row['epoch_ms_median']:.2f} | {concurrency} |",
                  flush=True)
    if concurrency > 1:
        print(f"epoch ms of {concurrency} concurrent runs sharing the device and host: not comparable to runs alone")
    return rows, run_rows


def runs_in_subprocesses(datasets, backends, seeds, parallel: int, folder: Path) -> dict:
    """{(dataset, backend, seed): that run's result}, each run train.py in a process of its own,
    at most ``parallel`` at once: a run of ogbl-ddi is bound by its host thread, so runs alone
    leave the device idle. Every failed run is reported with the end of its stderr. Each result
    is also left in ``folder`` as it finishes, so runs cut short by a time limit keep theirs."""
    from examples.gcn import train

    for options in datasets.values():
        # ogb and PyG write a dataset's processed/ folder on first load: once here, not racing.
        train.load_task(train.parse_args(options))
    jobs = [(dataset, backend, seed) for dataset in datasets for backend in backends for seed in seeds]
    threads = max(1, len(os.sched_getaffinity(0)) // min(parallel, len(jobs)))
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}  # the host's cores shared, not oversubscribed
    folder.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(parallel) as pool:
        futures = {job: pool.submit(run_one, datasets[job[0]], *job[1:], folder / f"{'_'.join(map(str, job))}.json", env)
                   for job in jobs}
    failures = [f"{'/'.join(map(str, job))}: {future.exception()}" for job, future in futures.items()
                if future.exception() is not None]
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(jobs)} accuracy runs failed:\n" + "\n".join(failures))
    return {job: future.result() for job, future in futures.items()}


def run_one(options, backend: str, seed: int, path: Path, env) -> dict:
    """One seed of train.py in a subprocess: its result; a failure raises with its stderr's end."""
    path = path.resolve()  # the run's working directory is the repository root
    command = [sys.executable, "-m", TRAIN_MODULE, *options, "--backend", backend, "--seed", str(seed), "--runs", "1",
               "--json", str(path)]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-20:])
        raise RuntimeError(f"exit status {done.returncode}\n{tail}")
    return json.loads(path.read_text())["runs"][0]


# Output.

def plot_timing(path: Path, rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(graphs) * len(MODES)), 4))
    width = 0.8 / len(MODES)
    for i, mode in enumerate(MODES):
        times = [next((r["epoch_ms"] for r in rows if r["graph"] == g and r["mode"] == mode), float("nan"))
                 for g in graphs]
        ax.bar([g + i * width for g in range(len(graphs))], times, width, label=mode)
    ax.set_xticks([g + width for g in range(len(graphs))], graphs, rotation=45, ha="right")
    ax.set_ylabel("epoch time (ms)")
    ax.set_yscale("log")
    ax.set_title(f"2-layer GCN {IN_CHANNELS}-{HIDDEN}-{CLASSES}, {rows[0]['device']}, TF32 {rows[0]['tf32']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    parts = set(args.parts.split(","))
    unknown = parts - {"timing", "accuracy"}
    if unknown:
        raise SystemExit(f"--parts takes timing and/or accuracy, got {sorted(unknown)}")
    folder = out_dir()
    print(f"device {args.device}, torch {torch.__version__}, TF32 {args.tf32}")
    if "timing" in parts:
        print("| graph | nodes | nnz | mode | preprocess ms | epoch ms | peak GB | training peak GB | rel. error | note |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        rows = run_timing(args)
        print("\n".join(speedups(rows)))
        write_csv(folder / "gcn_timing.csv", rows)
        if rows:
            plot_timing(folder / "gcn_timing.png", rows)
    if "accuracy" in parts:
        print("| dataset | backend | metric | test (mean ± std, %) | seeds | epoch ms | concurrent runs |")
        print("|---|---|---|---|---|---|---|")
        rows, run_rows = run_accuracy(args)
        suffix = f"_seed{args.first_seed}" if args.first_seed else ""
        write_csv(folder / f"gcn_accuracy{suffix}.csv", rows)
        write_csv(folder / f"gcn_accuracy_runs{suffix}.csv", run_rows)
    print(f"CSV and PNG files in {folder}")


if __name__ == "__main__":
    main()
