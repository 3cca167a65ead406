"""Where the host time of a compiled call goes, on one small graph: the compiled product
``A @ X`` and a GCN epoch in each compiled mode of ``benchmarks.compiled``.

For the product it reports how many tensors the matrix is flattened into (each a graph input
that the compiled code guards and unwraps at every call), how many guards the compiled code
checks and what checking them costs, and what unwrapping the inputs costs; then, for the product
and each epoch, the host microseconds per call without a profiler, and cProfile's table of the
functions with the most time of their own (the profiler's overhead inflates Python-heavy
entries, so read the table for where time goes, the first line for how much). On a GPU the
calls are not synchronized: what is measured is the host's work, which is what a small graph's
compiled call is made of.

    python -m benchmarks.compiled_profile --graph planetoid_cora
    python -m benchmarks.compiled_profile --device cpu --backend aot_eager --graph planetoid_cora
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from benchmarks.compiled import (FALLBACK_NNZ, MODES, adjacency, compile_options, epoch_function,
                                 load_graph)


def host_us(fn, calls: int) -> float:
    """Host microseconds per call of ``fn()``, the median of five runs of ``calls`` calls."""
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) * 1e6 / calls)
    return sorted(runs)[2]


def profile(title: str, fn, calls: int, rows: int) -> None:
    for _ in range(10):
        fn()
    print(f"\n== {title}: {host_us(fn, calls):.1f} us per call on the host")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(rows)


def guards(fn, frame_locals: dict, calls: int) -> None:
    """The guards of ``fn``'s compiled code (Dynamo's cache entries on its code object): how
    many, how many of them match a tensor, and microseconds per check of all of them."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = _debug_get_cache_entry_list(fn.__code__)
    for entry in entries:
        text = str(entry.guard_manager)
        checks = [line for line in text.splitlines() if "+- " in line and "GuardManager" not in line]
        tensor_checks = sum("TENSOR_MATCH" in line for line in checks)
        us = host_us(lambda: entry.guard_manager.check(frame_locals), calls)
        print(f"compiled entry: {len(checks)} guards, {tensor_checks} of them on tensors; checking them: {us:.1f} us")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="planetoid_cora")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="inductor",
                        help='"inductor" (mode="reduce-overhead") or another torch.compile backend')
    parser.add_argument("--n", type=int, default=64, help="columns of X in the product")
    parser.add_argument("--calls", type=int, default=200, help="calls per timing and per profile")
    parser.add_argument("--rows", type=int, default=20, help="rows of each profile table")
    args = parser.parse_args(argv)
    for name in ("n", "calls", "rows"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    device = torch.device(args.device)
    options = compile_options(args.backend)
    graph, row, col, nodes = load_graph(args.graph, device, FALLBACK_NNZ.get(args.graph, 10_000))
    adj = adjacency(row, col, nodes)
    x = torch.randn(nodes, args.n, device=device)
    print(f"{graph}: {nodes} rows, {adj.nnz} nonzeros, {device}, backend {args.backend}")

    def product(a, x):
        return a @ x

    compiled_product = torch.compile(product, fullgraph=True, **options)
    compiled_product(adj, x)
    names, _ = adj.__tensor_flatten__()
    print(f"the matrix enters the compiled product as {len(names)} tensors")
    guards(product, {"a": adj, "x": x}, args.calls)
    from torch._functorch._aot_autograd.subclass_utils import runtime_unwrap_tensor_subclasses

    unwrap_us = host_us(lambda: runtime_unwrap_tensor_subclasses([adj, x], append_symints=False), args.calls)
    eager_us = host_us(lambda: product(adj, x), args.calls)
    print(f"unwrapping the inputs: {unwrap_us:.1f} us; eager product: {eager_us:.1f} us")
    profile("compiled product", lambda: compiled_product(adj, x), args.calls, args.rows)

    features = torch.randn(nodes, 128, device=device)
    labels = torch.randint(0, 7, (nodes,), device=device)
    for mode in MODES:
        torch._dynamo.reset()
        epoch = epoch_function(adj, features, labels, 64, 7, None if mode == "eager" else options, "gcn", mode)
        profile(f"GCN epoch, {mode}", epoch, args.calls, args.rows)


if __name__ == "__main__":
    main()
