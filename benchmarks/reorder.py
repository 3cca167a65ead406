"""Reordering benchmark: per graph and method, ME-TCF Tensor-Core blocks, MeanNnzTC (nonzeros
per block), blocks-per-window spread, reorder time, and, when the CUDA kernels are available,
SpMM time of ``A @ X`` before and after (the kernel the library picks; the original and every
reordered matrix timed in interleaved rounds). The "auto" row is
``choose``: what ``reorder="auto"`` keeps, with its time per 10M nonzeros. Every order also
gets the rows kernel's predicted time ratio from the cache model (``reorder.l2``) next to its
measured one, the numbers its constants are fitted on ("fit" graphs only). Graphs carry their
corpus split (``graph_data.corpus``) and the summary prints "fit" and "unseen" apart. Writes
reorder.csv into --out (default $OUT, else ./out) and prints the table last.

    python -m benchmarks.reorder                                  # every graph, every method
    python -m benchmarks.reorder --graphs real --methods tca,auto # the real graphs only
    python -m benchmarks.reorder --graphs rmat21,uniform_10M --methods tca,shuffle --n 0
    python -m benchmarks.reorder --corpus all --tier large --methods community,degree,hub,tca,auto
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import batch_for, out_dir, rotation_count, settle, time_cuda, write_csv
from benchmarks.common import add_corpus_arguments, corpus_table, geomean, split_of_name
from graph_data import corpus, npz, synthetic
from torch_tcsparse import kernels, selector
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.formats.metcf import build_metcf
from torch_tcsparse.reorder import METHODS, choose, l2, reorder

SYNTHETIC = {
    "sbm_132k_shuffled": lambda d: synthetic.sbm(132_000, 600, 1000, shuffled=True, seed=1, device=d),
    "sbm_132k_ordered": lambda d: synthetic.sbm(132_000, 600, 1000, shuffled=False, seed=1, device=d),
    "rmat18": lambda d: synthetic.rmat(18, seed=1, device=d),
    "rmat21": lambda d: synthetic.rmat(21, seed=1, device=d),
    "uniform_10M": lambda d: synthetic.uniform(625_000, 16, seed=1, device=d),
    "band_16384_b64": lambda d: synthetic.band(16384, 64, device=d),
}


def real_graphs() -> dict:
    return {path.stem: corpus.real_loader(path) for path in npz.list_graphs()}


def graph_table(selection: str) -> dict:
    real = real_graphs()
    everything = {**real, **SYNTHETIC}
    if selection == "all":
        return everything
    names = []
    for item in selection.split(","):
        names += list(real) if item == "real" else list(SYNTHETIC) if item == "synthetic" else [item]
    unknown = [n for n in names if n not in everything]
    if unknown:
        raise SystemExit(f"unknown graphs {unknown}; known: real, synthetic, {sorted(everything)}")
    return {n: everything[n] for n in names}


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats: int):
    """(result, median seconds) over ``repeats`` calls."""
    times, result = [], None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


# Interleaved timing rounds per graph: the original and every reordered matrix are timed in turn,
# so that a drift of the machine (clocks, host load) falls on all of them alike: timed one after
# the other, two products of the very same matrix drift further apart than reorderings differ.
ROUNDS = 4


def product(csr, perm, n: int, device) -> tuple:
    """(call, operands, batch, path) of ``A @ X`` through TCSparseTensor with the given row
    permutation (None: no reordering): X rotated out of L2, small graphs timed over back-to-back
    calls (``batch_for``), the path the library settled on on the first product."""
    from torch_tcsparse.tensor import TCSparseTensor

    row = csr.row_indices()
    a = TCSparseTensor.from_coo(row, csr.col.long(), csr.values, shape=(csr.num_rows, csr.num_cols),
                                reorder="none" if perm is None else perm)
    xs = [(torch.randn(csr.num_cols, n, device=device),) for _ in range(rotation_count(csr.num_cols * n * 4))]
    path = settle(a, xs[0][0])  # the choice measured on the first product (torch_tcsparse.trials)
    call = lambda x: a @ x  # noqa: E731
    return call, xs, batch_for(call, xs), path


def interleaved_ms(products: dict, rounds: int = ROUNDS) -> dict:
    """Median ms per call of each of ``products`` (key -> ``product``) over ``rounds`` rounds,
    each timing every product in turn."""
    samples = {key: [] for key in products}
    for _ in range(rounds):
        for key, (call, xs, batch, _) in products.items():
            samples[key].append(time_cuda(call, xs, reps=5, batch=batch))
    return {key: statistics.median(values) for key, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="all", help="comma list of names, 'real', 'synthetic', or 'all'")
    parser.add_argument("--methods", default="tca,shuffle,jaccard,rcm,community,degree,hub,auto")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, default=128, help="SpMM width for before/after timing; 0 skips it")
    parser.add_argument("--repeats", type=int, default=1, help="reorder timings per method (median)")
    parser.add_argument("--max-nnz", type=float, default=None,
                        help="skip larger graphs (default: none on CUDA, 20M on the CPU)")
    parser.add_argument("--rcm-max-nnz", type=float, default=float("inf"),
                        help="skip rcm (scipy, on the CPU) above this many nonzeros (default: never)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else ./out)")
    add_corpus_arguments(parser)
    args = parser.parse_args()

    device = torch.device(args.device)
    methods = args.methods.split(",")
    bad = [m for m in methods if m not in METHODS + ("auto",)]
    if bad:
        raise SystemExit(f"unknown methods {bad}; known: {METHODS + ('auto',)}")
    max_nnz = args.max_nnz if args.max_nnz is not None else (float("inf") if device.type == "cuda" else 20e6)
    with_spmm = args.n > 0 and device.type == "cuda" and kernels.available()
    folder = out_dir(args.out)
    folder.mkdir(parents=True, exist_ok=True)

    # Warm-up: the first CUDA sorts and scatters pay for context and kernel loading, and the
    # first choice of "auto" for building the selector's C++ model (once per install).
    warm = from_coo(*[t.to(device) for t in (torch.arange(64), torch.arange(64).flip(0))], None, 64, 64)
    reorder(warm, "tca", window=args.window)
    choose(warm, args.window)

    rows = []
    table = corpus_table(args) if args.corpus else {n: (load, split_of_name(n)) for n, load in graph_table(args.graphs).items()}
    l2_bytes, sm_count = selector.device_model(device).l2_bytes, selector.device_model(device).sm_count
    for name, (load, split) in table.items():
        row, col, num_nodes = load(device)
        if row.numel() > max_nnz:
            print(f"skip {name}: {row.numel():,} nonzeros > --max-nnz", flush=True)
            continue
        csr = from_coo(row, col, None, num_nodes, num_nodes)
        del row, col
        base = build_metcf(csr, args.window)[0].stats()
        given_traffic = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, None, sm_count)
        orders = {"none": (None, base, 0.0)}  # label -> (row permutation, ME-TCF stats, reorder s)
        for method in methods:
            if method == "rcm" and csr.nnz > args.rcm_max_nnz:
                print(f"skip rcm on {name}: {csr.nnz:,} nonzeros > --rcm-max-nnz", flush=True)
                continue
            if method == "auto":
                (chosen, perm, _), seconds = timed(lambda: choose(csr, window=args.window, seed=args.seed), device, 1)
                label = f"auto->{chosen}"
            else:
                perm, seconds = timed(lambda: reorder(csr, method, window=args.window, seed=args.seed),
                                      device, args.repeats)
                label = method
            orders[label] = (perm, build_metcf(csr, args.window, perm)[0].stats(), seconds)
        if with_spmm:
            products = {label: product(csr, perm, args.n, device) for label, (perm, _, _) in orders.items()}
            times = interleaved_ms(products)
            paths = {label: entry[3] for label, entry in products.items()}
            del products
        else:
            times, paths = dict.fromkeys(orders, float("nan")), dict.fromkeys(orders, "")
        for label, (perm, stats, seconds) in orders.items():
            traffic = l2.XTraffic(csr.rowptr, csr.col, csr.num_cols, perm, sm_count)
            predicted = l2.rows_time_ratio(given_traffic, traffic, max(args.n, 32), 4, l2_bytes)
            rows.append(record(name, split, csr, label, stats, base, seconds, times["none"], times[label],
                               paths[label], predicted))
            print(format_row(rows[-1]), flush=True)
        del csr
        if device.type == "cuda":
            torch.cuda.empty_cache()
        # After every graph: a run stopped part way keeps the graphs it finished.
        write_csv(folder / "reorder.csv", rows)

    write_csv(folder / "reorder.csv", rows)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"\n# reorder benchmark on {device_name}, window {args.window}, seed {args.seed}, "
          f"SpMM N={args.n if with_spmm else 'not run (no CUDA kernels)'}; csv: {folder / 'reorder.csv'}")
    print(HEADER)
    for r in rows:
        print(format_row(r))
    print_summary(rows)


def print_summary(rows) -> None:
    """Per split: each method's geomean time over as given, and what auto achieved against the
    best single method and against the given order, with its time per 10M nonzeros."""
    for split in ("fit", "unseen"):
        part = [r for r in rows if r["split"] == split]
        if not part:
            continue
        graphs = list(dict.fromkeys(r["graph"] for r in part))
        print(f"\n{split}: {len(graphs)} graphs")
        methods = list(dict.fromkeys(r["method"].split("->")[0] for r in part if r["method"] != "none"))
        for method in methods:
            mine = [r for r in part if r["method"].split("->")[0] == method]
            speed = geomean([r["spmm_ms_none"] / r["spmm_ms"] for r in mine if r["spmm_ms"] == r["spmm_ms"]])
            per_10m = max(r["reorder_s"] * 1e7 / max(r["nnz"], 1) for r in mine)
            timing = f"SpMM speedup over as given geomean {speed:.3f}x, " if speed == speed else ""
            print(f"  {method:<10} {timing}worst reorder s per 10M nonzeros {per_10m:.2f}")
        autos = [r for r in part if r["method"].startswith("auto")]
        timed = [r for r in autos if r["spmm_ms"] == r["spmm_ms"]]
        if timed:
            best = {g: min(r["spmm_ms"] for r in part if r["graph"] == g) for g in graphs}
            within = sum(r["spmm_ms"] <= 1.05 * best[r["graph"]] for r in timed)
            slower = sum(r["spmm_ms"] > 1.03 * r["spmm_ms_none"] for r in timed)
            print(f"  auto within 5% of the best order on {within}/{len(timed)}, more than 3% slower than as given on {slower}")
        large = [r for r in autos if r["nnz"] >= 1_000_000]
        if large:
            print(f"  auto s per 10M nonzeros (graphs of 1M+): worst {max(r['reorder_s'] * 1e7 / r['nnz'] for r in large):.2f}")


def record(graph, split, csr, method, stats, base, seconds, base_ms, ms, path, predicted_rows_ratio) -> dict:
    return {
        "graph": graph,
        "split": split,
        "rows": csr.num_rows,
        "nnz": csr.nnz,
        "method": method,
        "tc_blocks": stats["tc_blocks"],
        "blocks_vs_none": stats["tc_blocks"] / base["tc_blocks"] if base["tc_blocks"] else 1.0,
        "mean_nnz_tc": stats["mean_nnz_per_block"],
        "mean_nnz_tc_gain": stats["mean_nnz_per_block"] / base["mean_nnz_per_block"] if base["tc_blocks"] else 1.0,
        "blocks_per_window_std": stats["blocks_per_window_std"],
        "reorder_s": seconds,
        "spmm_ms_none": base_ms,
        "spmm_ms": ms,
        "path": path,
        "predicted_rows_ratio": predicted_rows_ratio,
        "measured_ratio": ms / base_ms if base_ms == base_ms and base_ms > 0 else float("nan"),
    }


HEADER = (f"{'graph':<26}{'split':<7}{'nnz':>11} {'method':<16}{'TC blocks':>11}{'vs none':>8}{'MeanNnzTC':>10}"
          f"{'gain':>7}{'blk/win std':>12}{'reorder s':>10}{'SpMM ms':>9}{'(none)':>8}  path")


def format_row(r: dict) -> str:
    return (f"{r['graph'][:25]:<26}{r['split']:<7}{r['nnz']:>11,} {r['method'][:15]:<16}{r['tc_blocks']:>11,}"
            f"{r['blocks_vs_none']:>8.3f}{r['mean_nnz_tc']:>10.2f}{r['mean_nnz_tc_gain']:>7.2f}"
            f"{r['blocks_per_window_std']:>12.1f}{r['reorder_s']:>10.3f}{r['spmm_ms']:>9.3f}{r['spmm_ms_none']:>8.3f}"
            f"{r['predicted_rows_ratio']:>9.3f}  {r['path']}")


if __name__ == "__main__":
    main()
