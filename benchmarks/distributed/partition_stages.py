"""Where the multilevel partitioner spends its time: each coarsening level (clustering and
contraction), the initial partition and the refinement of each level, with Jet's iterations
(moves, rebalancing, cut counts) per level, on an R-MAT graph.

    python -m benchmarks.distributed.partition_stages --rmat 17 --parts 2,4 --threads 1
    python -m benchmarks.distributed.partition_stages --rmat 24 --parts 2,4 --device cuda

Every stage is timed between device synchronizations, so on a GPU a stage's time includes the
waits for its host reads. The stages are found by wrapping the partitioner's module functions
for the run: the partition is the one ``partition_rows`` returns.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from contextlib import contextmanager

import torch

from torch_tcsparse.distributed import multilevel, partition_rows, refinement

from .graph import rmat_block
from .partitioner import balance, part_sums

_STAGES = {multilevel: ("cluster", "contract", "initial_partition", "refine")}
_STEPS = {refinement: ("_filtered_moves", "_rebalance", "cut_weight")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rmat", type=int, default=17, help="the R-MAT scale")
    parser.add_argument("--edge-factor", type=int, default=16)
    parser.add_argument("--parts", default="2,4")
    parser.add_argument("--row-weight", default="198,147", help="an int or a comma list (one balanced weight each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    args.parts = [int(p) for p in args.parts.split(",")]
    args.row_weight = tuple(int(w) for w in args.row_weight.split(","))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a GPU")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def _timed(device: torch.device, stages: list, steps: Counter):
    """Wraps the stages (one record each: name, graph size, seconds, the steps inside it) and
    the refinement's steps (counted and timed) for the duration of the block."""
    originals = []

    def stage(name, function):
        def wrapper(graph, *args, **kwargs):
            steps.clear()
            _sync(device)
            start = time.perf_counter()
            result = function(graph, *args, **kwargs)
            _sync(device)
            stages.append((name, graph.num_nodes, graph.num_edges, time.perf_counter() - start, dict(steps)))
            return result
        return wrapper

    def step(name, function):
        def wrapper(*args, **kwargs):
            _sync(device)
            start = time.perf_counter()
            result = function(*args, **kwargs)
            _sync(device)
            steps[name] += 1
            steps[name + "_s"] += time.perf_counter() - start
            return result
        return wrapper

    for wrap, table in ((stage, _STAGES), (step, _STEPS)):
        for module, names in table.items():
            for name in names:
                originals.append((module, name, getattr(module, name)))
                setattr(module, name, wrap(name, getattr(module, name)))
    try:
        yield
    finally:
        for module, name, function in reversed(originals):
            setattr(module, name, function)


def _balance(partition, rowptr: torch.Tensor, row_weights: tuple[int, ...]) -> str:
    """Per balanced weight (a row's nonzeros + 1 + its row weight), the heaviest part over an
    equal share, and the parts' rows and nonzeros."""
    degree = rowptr.diff().long()
    heaviest = balance(partition, torch.stack([degree + 1 + weight for weight in row_weights], 1))
    rows = [end - start for start, end in zip(partition.bounds[:-1], partition.bounds[1:])]
    nonzeros = part_sums(partition, degree[:, None]).squeeze(1).long().tolist()
    return (f"heaviest part / share {', '.join(f'{value:.3f}' for value in heaviest)}; rows {rows}; "
            f"nonzeros {nonzeros}")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rowptr, col = rmat_block(args.rmat, args.edge_factor, 0, 1 << args.rmat, device)
    index = torch.int32 if rowptr.numel() - 1 <= torch.iinfo(torch.int32).max else torch.int64
    col = col.to(index)
    print(f"rmat{args.rmat}: {rowptr.numel() - 1} nodes, {col.numel()} nnz, row weights {args.row_weight}",
          flush=True)
    for parts in args.parts:
        stages, steps = [], Counter()
        with _timed(device, stages, steps):
            _sync(device)
            start = time.perf_counter()
            partition = partition_rows(rowptr, col, parts, "multilevel", args.seed, args.row_weight)
            _sync(device)
            seconds = time.perf_counter() - start
        cut = partition.cut_nonzeros(rowptr.cpu(), col.cpu())
        print(f"{parts} parts: {seconds:.2f} s, cut {cut} ({cut / max(col.numel(), 1):.4f} of the nonzeros), "
              f"{_balance(partition, rowptr.cpu(), args.row_weight)}")
        for name, nodes, edges, stage_seconds, inside in stages:
            detail = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in inside.items())
            print(f"  {name:18s} {nodes:10d} nodes {edges:11d} edges {stage_seconds:8.2f} s  {detail}", flush=True)


if __name__ == "__main__":
    main()
