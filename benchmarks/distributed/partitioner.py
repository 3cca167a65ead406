"""The multilevel partitioner against METIS: edge cut, balance and time per graph and part count.

    python -m benchmarks.distributed.partitioner                                  # real graphs, k = 2, 4, 16, CPU
    python -m benchmarks.distributed.partitioner --graphs none --rmat 16,18 --parts 2,8
    python -m benchmarks.distributed.partitioner --graphs none --rmat 24 --parts 2,4,8 --device cuda --no-metis

Real graphs are read from the data folder (graph_data.npz: symmetrized, self-loops dropped),
R-MAT graphs generated as the distributed benchmark does (benchmarks.distributed.graph). Every
row weighs its nonzeros plus one (plus ``--row-weight``: a comma list balances each weight at
once); METIS (pymetis, one CPU core) balances the first weight. The cut counts the nonzeros
between parts (both directions of an edge); the imbalance is the heaviest part over the mean,
per weight, and "rows" the same for the row count. On a GPU, the peak is the partitioner's
device memory above the graph's. Writes partitioner.csv into --out (default $OUT, else ./out).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import out_dir, write_csv
from graph_data import npz
from torch_tcsparse.distributed import partition_rows

from .graph import rmat_block

DEFAULT_GRAPHS = ("planetoid_cora", "planetoid_pubmed", "gg_coauthor_cs", "gnnadvisor_PROTEINS_full",
                  "snap_email-Enron", "musae_facebook", "gg_amazon_cs", "ogbl_ddi")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default=",".join(DEFAULT_GRAPHS),
                        help="comma list of real graphs of the data folder, or 'none'")
    parser.add_argument("--rmat", default="", help="comma list of R-MAT scales")
    parser.add_argument("--edge-factor", type=int, default=16)
    parser.add_argument("--parts", default="2,4,16")
    parser.add_argument("--row-weight", default="0", help="an int or a comma list (one balanced weight each)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's choice)")
    parser.add_argument("--no-metis", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.graphs = [] if args.graphs == "none" else args.graphs.split(",")
    args.rmat = [int(s) for s in args.rmat.split(",") if s]
    args.parts = [int(p) for p in args.parts.split(",")]
    args.row_weight = tuple(int(w) for w in args.row_weight.split(","))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a GPU")
    return args


def real_graph(name: str):
    path = npz.graph_dir() / f"{name}.npz"
    if not path.exists():
        return None
    matrix = npz.load_adjacency(path, symmetrize=True)
    matrix.setdiag(0)
    matrix.eliminate_zeros()
    return torch.from_numpy(matrix.indptr.astype(np.int64)), torch.from_numpy(matrix.indices.astype(np.int64))


def part_sums(partition, weights: torch.Tensor) -> torch.Tensor:
    """[parts, columns]: each part's sum of each column of the per-node ``weights``."""
    return torch.stack([weights[partition.nodes(r)].sum(0) for r in range(partition.num_parts)]).double()


def balance(partition, weights: torch.Tensor) -> list[float]:
    """Per column of ``weights``, the heaviest part over an equal share."""
    per_part = part_sums(partition, weights)
    return (per_part.max(0).values / per_part.mean(0)).tolist()


def run(name: str, rowptr, col, args, device) -> list[dict]:
    rows = []
    degree = rowptr.diff()
    weights = torch.stack([degree + 1 + w for w in args.row_weight] + [torch.ones_like(degree)], 1)
    index = torch.int32 if rowptr.numel() - 1 <= torch.iinfo(torch.int32).max else torch.int64
    device_rowptr, device_col = rowptr.to(device), col.to(device, index)
    for parts in args.parts:
        methods = ["multilevel"] + ([] if args.no_metis else ["metis"])
        cuts = {}
        for method in methods:
            weight = args.row_weight if method == "multilevel" else args.row_weight[0]
            on_device = method == "multilevel"
            base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            partition = partition_rows(device_rowptr if on_device else rowptr, device_col if on_device else col,
                                       parts, method, row_weight=weight)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30 if device.type == "cuda" and on_device else ""
            cuts[method] = partition.cut_nonzeros(rowptr, col)
            imbalance = balance(partition, weights)
            rows.append({"graph": name, "nodes": rowptr.numel() - 1, "nnz": col.numel(), "parts": parts,
                         "method": method, "device": device.type if on_device else "cpu", "seconds": seconds,
                         "cut": cuts[method], "cut_vs_metis": "", "imbalance": ";".join(f"{v:.3f}" for v in imbalance[:-1]),
                         "rows_imbalance": f"{imbalance[-1]:.3f}", "peak_gb": peak})
        if "metis" in cuts:
            rows[-2]["cut_vs_metis"] = cuts["multilevel"] / max(cuts["metis"], 1)
        for row in rows[-len(methods):]:
            print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    ratio = f", {row['cut_vs_metis']:.2f}x METIS" if row["cut_vs_metis"] != "" else ""
    peak = f", peak {row['peak_gb']:.2f} GB" if row["peak_gb"] != "" else ""
    return (f"{row['graph']} ({row['nodes']} nodes, {row['nnz']} nnz) into {row['parts']} [{row['method']}, "
            f"{row['device']}]: {row['seconds']:.2f} s, cut {row['cut']}{ratio}, imbalance {row['imbalance']} "
            f"(rows {row['rows_imbalance']}){peak}")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    for name in args.graphs:
        graph = real_graph(name)
        if graph is None:
            print(f"{name}: not in {npz.graph_dir()}, skipped", flush=True)
            continue
        rows += run(name, *graph, args, device)
    for scale in args.rmat:
        rowptr, col = rmat_block(scale, args.edge_factor, 0, 1 << scale, device)
        rows += run(f"rmat{scale}", rowptr.cpu(), col.cpu(), args, device)
        del rowptr, col
    print(f"wrote {write_csv(out_dir(args.out) / 'partitioner.csv', rows)}")


if __name__ == "__main__":
    main()
