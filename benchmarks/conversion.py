"""Peak memory and wall time of the CPU conversion against scipy's CSR build.

Builds a uniform random graph (seeded; default 2M nodes, 20M edges), then measures, each case in
a fresh process so that no allocator cache or earlier peak is counted:

- ``scipy``: ``coo_matrix((ones, (dst, src))).tocsr()``, whose result is canonical as ours is
  (columns sorted, duplicates summed);
- ``convert``: ``TCSparseTensor.from_edge_index`` (canonical CSR, ME-TCF layout);
- ``transpose``: ``A.t()`` of a converted matrix.

``--weighted`` gives both builds random float32 edge weights (a normalized GCN adjacency) instead
of ones, which they then carry through their sorts.

Peak memory is the peak resident set above the resident set just before the case (the edge
list and its weights, and for ``transpose`` the converted matrix, already resident), read from the kernel's
high-water mark (``VmHWM``), reset through ``/proc/self/clear_refs`` before the case: torch's
allocations escape ``tracemalloc``, and ``ru_maxrss`` cannot be reset.

    python -m benchmarks.conversion --nodes 2000000 --edges 20000000 [--weighted]

(run from the repository root, it measures the package of this checkout.)
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

CASES = ("scipy", "convert", "transpose")


def edge_list(nodes: int, edges: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, nodes, (2, edges), generator=generator)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(case: str, nodes: int, edges: int, seed: int, weighted: bool) -> dict:
    """Wall seconds and peak bytes above the starting resident set of one case, in this process."""
    import scipy.sparse as sp

    from torch_tcsparse import TCSparseTensor

    # Lazy imports, first-call set-up and the first build of the compiled CPU passes (cached after)
    # are paid on a small graph, not counted.
    TCSparseTensor.from_edge_index(edge_list(100, 1000, seed), num_nodes=100).t()
    edge_index = edge_list(nodes, edges, seed)
    weights = torch.rand(edges, generator=torch.Generator().manual_seed(seed)) if weighted else None
    if case == "scipy":
        src, dst = edge_index[0].numpy(), edge_index[1].numpy()

        def run():
            data = weights.numpy() if weighted else np.ones(edges, dtype=np.float32)
            return sp.coo_matrix((data, (dst, src)), shape=(nodes, nodes)).tocsr()
    elif case == "convert":
        def run():
            return TCSparseTensor.from_edge_index(edge_index, weights, num_nodes=nodes)
    else:
        matrix = TCSparseTensor.from_edge_index(edge_index, weights, num_nodes=nodes)

        def run():
            return matrix.t()
    start_kib = _status_kib("VmRSS")
    _reset_peak()
    start, start_cpu = time.perf_counter(), _cpu_seconds()
    result = run()
    seconds, cpu_seconds = time.perf_counter() - start, _cpu_seconds() - start_cpu
    peak_kib = _status_kib("VmHWM")
    del result
    return {"case": case, "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_bytes": (peak_kib - start_kib) * 1024}


def run_case(case: str, args) -> dict:
    command = [sys.executable, "-m", "benchmarks.conversion", "--case", case, "--nodes", str(args.nodes), "--edges", str(args.edges),
               "--seed", str(args.seed), "--threads", str(args.threads)] + (["--weighted"] if args.weighted else [])
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2_000_000)
    parser.add_argument("--edges", type=int, default=20_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=1, help="processes per case; the median time is reported")
    parser.add_argument("--weighted", action="store_true", help="random float32 edge weights instead of ones")
    parser.add_argument("--case", choices=CASES, help="measure this case in this process (used by the driver)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.case:
        print(json.dumps(measure(args.case, args.nodes, args.edges, args.seed, args.weighted)))
        return

    results = {}
    for case in CASES:
        runs = [run_case(case, args) for _ in range(args.repeats)]
        results[case] = {
            "seconds": float(np.median([r["seconds"] for r in runs])),
            "cpu_seconds": float(np.median([r["cpu_seconds"] for r in runs])),
            "peak_bytes": int(np.max([r["peak_bytes"] for r in runs])),
        }
    weights = "random float32 weights" if args.weighted else "unweighted"
    print(f"{args.nodes:,} nodes, {args.edges:,} edges, {weights}, {args.threads} threads (seed {args.seed})")
    print(f"{'case':<10} {'seconds':>8} {'cpu s':>7} {'peak MB':>9} {'B/edge':>7} {'time/scipy':>11} {'mem/scipy':>10}")
    base = results["scipy"]
    for case in CASES:
        r = results[case]
        print(
            f"{case:<10} {r['seconds']:8.2f} {r['cpu_seconds']:7.2f} {r['peak_bytes'] / 1e6:9.0f} {r['peak_bytes'] / args.edges:7.1f} "
            f"{r['seconds'] / base['seconds']:11.2f} {r['peak_bytes'] / base['peak_bytes']:10.2f}"
        )


if __name__ == "__main__":
    main()
