"""SpMM benchmark: our ME-TCF kernels (base, balanced), our grouped Tensor-Core path (its sparse
rest through the rows kernel) and our CUDA-core "rows" kernel against cuSPARSE (torch.sparse.mm
on CSR) and PyG's message-passing aggregation, per graph, N and dtype, all in the dtype under
test (float32 runs with TF32 allowed). Our paths run on the library's structure of the matrix,
reordered as ``--reorder`` says (default: as given); cuSPARSE and PyG on the graph as given. Correctness first (against cuSPARSE's fp32 result), then CUDA-event medians
with rotated X buffers; a call shorter than about half a millisecond is timed over back-to-back
calls per sample (``common.batch_for``), so small graphs compare throughput, not launch jitter. Rows of float16/bfloat16 also give the speedup over our own float32 (TF32)
kernel on the same graph and N. Every row also gives two floors at the copy bandwidth measured
in the same process (a 1 GiB device-to-device copy, bytes read plus written): the compulsory one
(the CSR, X and Y each moved once) and the no-reuse gather floor (the CSR once, one row of X per
nonzero, Y once), and the fastest path's and the rows kernel's time over them. Prints one table,
writes spmm.csv and spmm_speedup.png into --out (default $OUT, else ./out).

    python -m benchmarks.spmm --n 32,64,128,256
    python -m benchmarks.spmm --graphs rmat18,cora --n 128 --skip-pyg --dtypes float32,float16,bfloat16
    python -m benchmarks.spmm --n 128 --reorder auto   # what reorder="auto" gives
    python -m benchmarks.spmm --corpus all --tier large --n 32,64,128,256 --peers rode --skip-pyg

``--corpus fit|unseen|all`` runs the corpus (``graph_data.corpus``) at ``--tier`` instead of the
suite; every summary prints the "fit" and "unseen" graphs apart (the suite's graphs are "fit").
``--peers rode`` times RoDe (``benchmarks/peers/rode.py``: its prebuilt module, else built from a
local clone of its repository) in float32 next to ours and cuSPARSE, its output zeroed in every
timed call, where its 32-bit offsets reach (X up to 2 GiB); without a module, or a clone and a
CUDA compiler to build one, the benchmark says why in one line and runs without it. Float32 runs
here with TF32 allowed and RoDe unguarded, in this process; ``benchmarks/peers/compare.py``
compares ours with RoDe with TF32 off, each case guarded against RoDe's faults.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import (add_corpus_arguments, batch_for, copy_bandwidth, corpus_table, floors_ms, geomean,
                               out_dir, rotation_count, split_of_name, time_cuda, time_per_call_us, write_csv)

from torch_tcsparse import TCSparseTensor, kernels
from torch_tcsparse.engines.grouped import grouped_layout
from torch_tcsparse.product import launcher
from graph_data import npz, synthetic
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.formats.metcf import build_metcf

LARGE_NNZ = 1_000_000

# Loaders take the device (the CPU rebuilds a graph offline; synthetic graphs then come from the
# CPU's random stream, a different draw of the same law).
SYNTHETIC = {
    "rmat18": lambda device="cuda": synthetic.rmat(18, seed=1, device=device),
    "rmat21": lambda device="cuda": synthetic.rmat(21, seed=1, device=device),
    "uniform_1M_d16": lambda device="cuda": synthetic.uniform(1_000_000, 16, seed=1, device=device),
    "sbm_132k_shuffled": lambda device="cuda": synthetic.sbm(132_000, 600, 1000, shuffled=True, seed=1, device=device),
    "sbm_132k_ordered": lambda device="cuda": synthetic.sbm(132_000, 600, 1000, shuffled=False, seed=1, device=device),
    "band_16384_b64": lambda device="cuda": synthetic.band(16384, 64, device=device),
    "uniform_4267_d900": lambda device="cuda": synthetic.uniform(4267, 900, seed=1, device=device),
}


def npz_loader(path: Path):
    def load(device="cuda"):
        adj = npz.load_adjacency(path)
        coo = adj.tocoo()
        row = torch.from_numpy(coo.row.astype("int64")).to(device)
        col = torch.from_numpy(coo.col.astype("int64")).to(device)
        return row, col, adj.shape
    return load


def suite() -> dict:
    graphs = dict(SYNTHETIC)
    for path in npz.list_graphs():
        graphs[path.stem] = npz_loader(path)
    return graphs


def pyg_propagation():
    from torch_geometric.nn import MessagePassing

    class WeightedSum(MessagePassing):
        def __init__(self):
            super().__init__(aggr="add")

        def forward(self, x, edge_index, weight, size):
            return self.propagate(edge_index, x=x, weight=weight, size=size)

        def message(self, x_j, weight):
            return weight.view(-1, 1) * x_j

    return WeightedSum()


def load_peers(names: str) -> dict:
    """name -> peer class for each of ``names`` that builds here; a line for each that does not."""
    peers = {}
    for name in [p for p in names.split(",") if p]:
        if name != "rode":
            raise SystemExit(f"unknown peer {name!r}; known: rode")
        from benchmarks.peers import rode

        reason = rode.unavailable()
        if reason:
            print(f"peer rode skipped: {reason}", flush=True)
        else:
            peers[name] = rode.RoDe
    return peers


def bench_graph(name, load, ns, dtypes, args, bandwidth, pyg, split="fit", peers=None):
    loaded = load()
    if len(loaded) == 3 and isinstance(loaded[2], tuple):
        row, col, (num_rows, num_cols) = loaded
    else:
        row, col, num_rows = loaded
        num_cols = num_rows
    gen = torch.Generator(device="cuda").manual_seed(7)
    values = torch.rand(row.numel(), device="cuda", generator=gen) + 0.5
    csr = from_coo(row, col, values, num_rows, num_cols)
    del row, col, values
    # Our paths run on the library's own structure: reordered as --reorder asks (the kernels
    # absorb the permutation: X and Y stay in the graph's order), its grouped layout split as
    # the selector prices it. cuSPARSE and PyG run on the graph as given.
    matrix = TCSparseTensor.from_csr(csr.rowptr, csr.col, csr.values, (num_rows, num_cols), reorder=args.reorder)
    structure = matrix._structure
    layout = structure.layout
    grouped_size = structure.grouped_size()
    build_ms = time_build(lambda: build_metcf(csr))
    torch_build_ms = time_build(lambda: build_metcf(csr, use_kernels=False))
    stats = layout.stats()
    a = torch.sparse_csr_tensor(csr.rowptr, csr.col, csr.values, (num_rows, num_cols))
    edge_index = torch.stack([csr.col.long(), csr.row_indices()])
    nnz = csr.nnz
    rode = peers["rode"](csr.rowptr, csr.col, csr.values, num_cols) if peers and "rode" in peers else None
    rows = []
    for n in ns:
        tf32_best_ms = None
        for dtype in dtypes:
            element = torch.finfo(dtype).bits // 8
            x_bytes = num_cols * n * element
            xs = [(torch.randn(num_cols, n, device="cuda").to(dtype),) for _ in range(rotation_count(x_bytes))]
            # Every path multiplies the matrix rounded to the dtype under test (cuSPARSE's too).
            typed = matrix.to(dtype)
            edge_values = csr.values.to(dtype)
            a_typed = torch.sparse_csr_tensor(csr.rowptr, csr.col, edge_values, (num_rows, num_cols))
            expected = torch.sparse.mm(a, xs[0][0].float())

            def timed(fn):
                return time_cuda(fn, xs, reps=args.reps, batch=batch_for(fn, xs))

            errors = {}
            times = {}
            # Each engine on the operands A @ X keeps for it: the product without the host's routing.
            ours = {path: launcher(typed, path) for path in ("base", "balanced", "rows", "grouped")}
            for path, run in ours.items():
                got = run(xs[0][0]).float()
                errors[path] = float((got - expected).norm() / expected.norm().clamp_min(1e-30))
                times[path] = timed(run)
            times["cusparse"] = timed(lambda x: torch.sparse.mm(a_typed, x))
            pyg_ms = float("nan")
            free, _ = torch.cuda.mem_get_info()
            if pyg is not None and 3 * nnz * n * element < 0.5 * free:
                pyg_ms = timed(lambda x: pyg(x, edge_index, edge_values, (num_cols, num_rows)))
            # The grouped path counts only where the selector may take it (the layout may pay).
            best = min((p for p in ours if p != "grouped" or grouped_size is not None), key=times.get)
            rode_ms = rode_err = float("nan")
            if rode is not None and dtype == torch.float32 and not rode.supports(n):
                print(f"rode skipped on {name} N={n}: {rode.refusal(n)}", flush=True)
            elif rode is not None and dtype == torch.float32:
                rode_err = float((rode(xs[0][0]) - expected).norm() / expected.norm().clamp_min(1e-30))
                rode_ms = timed(rode)
            choice = typed.explain(n).choice
            chosen_ms = times["cusparse" if choice == "csr" else choice]
            if dtype == torch.float32:
                tf32_best_ms = times[best]
            floor_ms, gather_ms = floors_ms(num_rows, nnz, x_bytes, n, element, bandwidth)
            per_call = {}
            if nnz < LARGE_NNZ:
                per_call["ours"] = time_per_call_us(ours[best], xs)
                per_call["cusparse"] = time_per_call_us(lambda x: torch.sparse.mm(a_typed, x), xs)
            rows.append({
                "graph": name, "split": split, "rows": num_rows, "nnz": nnz, "N": n, "dtype": str(dtype).replace("torch.", ""),
                "blocks": stats["tc_blocks"], "nnz_per_block": round(stats["mean_nnz_per_block"], 2),
                "max_blocks_per_window": stats["blocks_per_window_max"],
                "base_ms": times["base"], "balanced_ms": times["balanced"], "rows_ms": times.get("rows", float("nan")),
                "grouped_ms": times["grouped"], "grouped_blocks": grouped_layout(structure).num_blocks,
                "grouped_rest_nnz": grouped_layout(structure).rest_nnz, "grouped_selectable": grouped_size is not None,
                "reorder": structure.method,
                "cusparse_ms": times["cusparse"],
                "pyg_ms": pyg_ms, "rode_ms": rode_ms, "rode_err": rode_err,
                "vs_rode": rode_ms / times[best], "rode_vs_cusparse": times["cusparse"] / rode_ms, "best": best, "speedup": times["cusparse"] / times[best],
                "vs_tf32": tf32_best_ms / times[best] if tf32_best_ms else float("nan"),
                "choice": choice, "choice_loss": chosen_ms / min(times.values()),
                "choice_vs_cusparse": chosen_ms / times["cusparse"],
                "gflops": 2 * nnz * n / (times[best] * 1e-3) / 1e9, "floor_ms": floor_ms,
                "gather_floor_ms": gather_ms, "best_vs_floor": times[best] / floor_ms,
                "best_vs_gather": times[best] / gather_ms, "rows_vs_gather": times["rows"] / gather_ms,
                "rode_vs_gather": rode_ms / gather_ms, "err": max(errors.values()),
                "us_per_call": per_call.get("ours", float("nan")),
                "cusparse_us_per_call": per_call.get("cusparse", float("nan")), "build_ms": build_ms,
                "torch_build_ms": torch_build_ms, "fastest_ms": min(times.values()),
            })
            if not all(e <= args.max_error for e in errors.values()):
                print(f"WRONG RESULT {name} N={n} {dtype}: relative error vs cuSPARSE fp32 {errors}", flush=True)
            if rode_err > args.max_error:
                print(f"WRONG RESULT rode {name} N={n}: relative error vs cuSPARSE fp32 {rode_err:.1e}", flush=True)
            del xs, expected, a_typed
    return rows


def time_build(build, reps: int = 5) -> float:
    """Median wall-clock milliseconds of a CSR -> ME-TCF conversion (it synchronizes once itself,
    to size its arrays), after one warm-up build."""
    times = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        build()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times[1:])[reps // 2]


def print_conversion(rows):
    """Conversion time per graph against the fastest SpMM path at N = 128 (or the largest N run)."""
    n = 128 if any(r["N"] == 128 for r in rows) else max(r["N"] for r in rows)
    picked = [r for r in rows if r["N"] == n and r["dtype"] == rows[0]["dtype"]]
    print(f"\nCSR -> ME-TCF conversion ms (median of 5): kernels, torch ops, and kernels over the fastest "
          f"SpMM path at N={n} {rows[0]['dtype']}")
    print(f"{'graph':<26}{'nnz':>10}{'kernels':>9}{'torch':>9}{'SpMM':>9}{'ratio':>7}")
    for r in picked:
        print(f"{r['graph'][:25]:<26}{r['nnz']:>10}{r['build_ms']:>9.3f}{r['torch_build_ms']:>9.3f}"
              f"{r['fastest_ms']:>9.3f}{r['build_ms'] / r['fastest_ms']:>7.2f}")
    for label, group in (("large", [r for r in picked if r["nnz"] >= LARGE_NNZ]),
                         ("small", [r for r in picked if r["nnz"] < LARGE_NNZ])):
        if group:
            ratios = [r["build_ms"] / r["fastest_ms"] for r in group]
            print(f"{label} graphs: conversion within 2x of one SpMM on {sum(x <= 2 for x in ratios)}/{len(group)}, "
                  f"median ratio {sorted(ratios)[len(ratios) // 2]:.2f}, kernels over torch ops geomean "
                  f"{geomean([r['torch_build_ms'] / r['build_ms'] for r in group]):.1f}x faster")


def print_table(rows, bandwidth):
    head = (f"{'graph':<26}{'nnz':>10}{'N':>5}{'dtype':>6}{'base':>9}{'bal':>9}{'rows':>9}{'grp':>9}{'cuSP':>9}{'PyG':>9}"
            f"{'RoDe':>9}{'x cuSP':>8}{'x tf32':>7}{'/floor':>7}{'/gath':>7}{'rows/g':>7}{'us/call':>9}{'cuSP us':>9}"
            f"{'err':>9}")
    print(f"\nSpMM ms (median), each dtype against cuSPARSE in the same dtype (float32: TF32 compute); at "
          f"{bandwidth / 1e12:.2f} TB/s copy bandwidth, /floor = fastest path over the compulsory floor (CSR, X, Y "
          f"once), /gath = over the no-reuse gather floor (CSR once, a row of X per nonzero, Y once), rows/g = the "
          f"rows kernel over the gather floor")
    print(head)
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
    for r in rows:
        print(f"{r['graph'][:25]:<26}{r['nnz']:>10}{r['N']:>5}{short[r['dtype']]:>6}{r['base_ms']:>9.3f}"
              f"{r['balanced_ms']:>9.3f}{r['rows_ms']:>9.3f}{r['grouped_ms']:>9.3f}{r['cusparse_ms']:>9.3f}{r['pyg_ms']:>9.3f}"
              f"{r['rode_ms']:>9.3f}{r['speedup']:>8.2f}{r['vs_tf32']:>7.2f}{r['best_vs_floor']:>7.2f}"
              f"{r['best_vs_gather']:>7.2f}{r['rows_vs_gather']:>7.2f}{r['us_per_call']:>9.1f}"
              f"{r['cusparse_us_per_call']:>9.1f}{r['err']:>9.1e}")
    for split in ("fit", "unseen"):
        part = [r for r in rows if r["split"] == split]
        if part:
            print(f"\n{split}: {len(dict.fromkeys(r['graph'] for r in part))} graphs")
            print_summary(part)


def print_summary(rows):
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for n in sorted({r["N"] for r in rows}):
            large = [r for r in rows if r["N"] == n and r["dtype"] == dtype and r["nnz"] >= LARGE_NNZ]
            small = [r for r in rows if r["N"] == n and r["dtype"] == dtype and r["nnz"] < LARGE_NNZ]
            if large:
                worst = min(large, key=lambda r: r["speedup"])
                vs_tf32 = geomean([r["vs_tf32"] for r in large])
                print(f"{dtype} N={n}: large graphs geomean speedup over cuSPARSE {geomean([r['speedup'] for r in large]):.2f}x, "
                      f"worst {worst['speedup']:.2f}x ({worst['graph']})"
                      + (f", over our TF32 {vs_tf32:.2f}x" if dtype != "float32" else ""))
            if small:
                print(f"{dtype} N={n}: small graphs geomean speedup {geomean([r['speedup'] for r in small]):.2f}x, "
                      f"median per-call {sorted(r['us_per_call'] for r in small)[len(small) // 2]:.1f} us")
            if large:
                worst = max(large, key=lambda r: r["rows_vs_gather"])
                print(f"{dtype} N={n}: large graphs over the gather floor: fastest path geomean "
                      f"{geomean([r['best_vs_gather'] for r in large]):.2f}x, rows kernel "
                      f"{geomean([r['rows_vs_gather'] for r in large]):.2f}x (worst {worst['rows_vs_gather']:.2f}x, "
                      f"{worst['graph']}); over the compulsory floor {geomean([r['best_vs_floor'] for r in large]):.2f}x")
            peer = [r for r in large + small if r["rode_ms"] == r["rode_ms"]]
            if peer:
                worst = min(peer, key=lambda r: r["vs_rode"])
                print(f"{dtype} N={n}: RoDe {geomean([r['rode_vs_cusparse'] for r in peer]):.2f}x cuSPARSE, "
                      f"{geomean([r['rode_vs_gather'] for r in peer]):.2f}x the gather floor; ours over RoDe "
                      f"geomean {geomean([r['vs_rode'] for r in peer]):.2f}x, worst {worst['vs_rode']:.2f}x "
                      f"({worst['graph']}), ahead on {sum(r['vs_rode'] > 1 for r in peer)}/{len(peer)}")
        typed = [r for r in rows if r["dtype"] == dtype]
        hits = sum(r["choice_loss"] <= 1.05 for r in typed)
        print(f"{dtype}: selector choice within 5% of the fastest path (base, balanced, rows, grouped, cuSPARSE) on {hits}/{len(typed)}, "
              f"geomean loss {geomean([r['choice_loss'] for r in typed]) - 1:.1%}, "
              f"worst {max(r['choice_loss'] for r in typed):.2f}x; slowest against cuSPARSE "
              f"{max(r['choice_vs_cusparse'] for r in typed):.2f}x its time")


def write_outputs(rows, folder: Path):
    write_csv(folder / "spmm.csv", rows)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    ns = sorted({r["N"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(8, len(graphs) * 0.6), 4.5))
    width = 0.8 / len(ns)
    for i, n in enumerate(ns):
        speed = {r["graph"]: r["speedup"] for r in rows if r["N"] == n and r["dtype"] == rows[0]["dtype"]}
        ax.bar([g + i * width for g in range(len(graphs))], [speed.get(g, 0) for g in graphs], width, label=f"N={n}")
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(graphs))], graphs, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"speedup over cuSPARSE (better kernel, {rows[0]['dtype']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "spmm_speedup.png", dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default="", help="comma-separated substrings of graph names (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated substrings of graph names to leave out")
    parser.add_argument("--n", default="32,64,128,256")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--skip-pyg", action="store_true")
    parser.add_argument("--dtypes", default="float32", help="comma list of float32, float16, bfloat16")
    parser.add_argument("--max-error", type=float, default=1e-2, help="relative error vs cuSPARSE allowed (TF32)")
    parser.add_argument("--reorder", default="none",
                        help="our paths' reordering: none, auto or a method of torch_tcsparse.reorder")
    parser.add_argument("--out", default=None)
    parser.add_argument("--peers", default="", help="comma list of public kernels to time next to ours: rode")
    add_corpus_arguments(parser)
    args = parser.parse_args(argv)
    if not kernels.available():
        raise SystemExit("needs a CUDA device and a working build of the kernels")
    torch.set_float32_matmul_precision("high")
    folder = out_dir(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    ns = [int(n) for n in args.n.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    if torch.float32 in dtypes:
        dtypes.remove(torch.float32)
        dtypes.insert(0, torch.float32)  # first, so the 16-bit rows can be compared with it
    wanted = [w for w in args.graphs.split(",") if w]
    skipped = [w for w in args.skip.split(",") if w]
    bandwidth = copy_bandwidth()
    pyg = None if args.skip_pyg else pyg_propagation()
    peers = load_peers(args.peers)
    rows = []
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    if args.corpus:
        graphs = {name: ((lambda load=load: load("cuda")), split)
                  for name, (load, split) in corpus_table(args, rectangular=True).items()}
    else:
        graphs = {name: (load, split_of_name(name)) for name, load in suite().items()}
    for name, (load, split) in graphs.items():
        if (wanted and not any(w in name for w in wanted)) or any(s in name for s in skipped):
            continue
        start = time.perf_counter()
        rows.extend(bench_graph(name, load, ns, dtypes, args, bandwidth, pyg, split, peers))
        print(f"  {name}: {time.perf_counter() - start:.1f} s", flush=True)
        torch.cuda.empty_cache()
        if rows:
            write_outputs(rows, folder)
    print_conversion(rows)
    print_table(rows, bandwidth)


if __name__ == "__main__":
    main()
