"""Helpers shared by the benchmarks: CUDA events, warm-up, median of many runs, rotating input
buffers (so inputs do not sit in L2), measured device-to-device bandwidth and the floors of an
SpMM at it, and the corpus's graphs with their fit/unseen split (``graph_data.corpus``)."""
from __future__ import annotations

import math
import csv
import os
import statistics
import time
from pathlib import Path

import torch

from graph_data import corpus


def out_dir(chosen: str | None = None) -> Path:
    """The folder a benchmark writes into: ``--out`` where given, else ``$OUT``, else ``out``."""
    path = Path(chosen) if chosen else Path(os.environ.get("OUT", "out"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_csv(path: Path, rows: list[dict], fields=None) -> Path:
    """``rows`` as a CSV with a header: ``fields``, else every key of the rows in order of first
    appearance."""
    fields = list(fields or dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 50 << 20))


def rotation_count(buffer_bytes: int, limit_bytes: int = 4 << 30) -> int:
    """How many copies of an input to rotate so that together they overflow L2 twice over."""
    if buffer_bytes <= 0:
        return 1
    wanted = -(-2 * l2_bytes() // buffer_bytes)
    return int(max(1, min(wanted, 16, limit_bytes // buffer_bytes)))


def time_cuda(fn, args_list, warmup: int = 5, reps: int = 20, batch: int = 1, warmup_ms: float = 25.0) -> float:
    """Median milliseconds per call of fn(*args) over reps samples, cycling through args_list.
    A sample times ``batch`` back-to-back calls between two events (see ``batch_for``). Warm-up:
    at least ``warmup`` calls and ``warmup_ms`` of calls, each waited for (a few calls of a small
    graph leave the GPU idle between graphs, and the first samples then ran slow)."""
    start, i = time.perf_counter(), 0
    while i < warmup or (time.perf_counter() - start) * 1e3 < warmup_ms:
        fn(*args_list[i % len(args_list)])
        torch.cuda.synchronize()
        i += 1
    times, call = [], 0
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn(*args_list[call % len(args_list)])
            call += 1
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / batch)
    return statistics.median(times)


def batch_for(fn, args_list, sample_ms: float = 0.5, limit: int = 64) -> int:
    """Calls per timed sample so that a sample lasts about ``sample_ms``: a single call of a few
    tens of microseconds is mostly launch latency and host jitter, and comparing such samples
    between paths compares noise; back-to-back calls time what a loop over small graphs sees."""
    one = time_cuda(fn, args_list, warmup=3, reps=5)
    return int(max(1, min(limit, round(sample_ms / max(one, 1e-3)))))


def time_per_call_us(fn, args_list, calls: int = 200) -> float:
    """Host-side microseconds per call of back-to-back asynchronous calls (no sync in between):
    the cost a training loop sees for small inputs, launch and Python overhead included."""
    for i in range(10):
        fn(*args_list[i % len(args_list)])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(*args_list[i % len(args_list)])
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), [()], warmup=3, reps=20)
    return 2 * nbytes / (ms * 1e-3)


def floors_ms(num_rows: int, nnz: int, x_bytes: int, n: int, element: int, bandwidth: float) -> tuple[float, float]:
    """The two floors of a product at the copy bandwidth (bytes read plus written per second):
    the compulsory one (the CSR's rowptr, columns and values, X and Y each moved once) and the
    no-reuse gather floor (the CSR once, one row of X per nonzero, Y once), in milliseconds.
    Only rows of X that nonzeros share in a cache take a kernel below the second."""
    a_bytes = (num_rows + 1) * 4 + nnz * (4 + element)
    y_bytes = num_rows * n * element
    to_ms = 1e3 / bandwidth
    return (a_bytes + x_bytes + y_bytes) * to_ms, (a_bytes + nnz * n * element + y_bytes) * to_ms


def settle(a, x: torch.Tensor) -> str:
    """The path ``a @ x`` runs for good at x's N: the first product settles it, measuring the
    close candidates within itself where the prediction leaves some (``torch_tcsparse.trials``)."""
    a @ x
    path = a._structure.selection.settled(x.shape[1], x.dtype, x.device)
    if path is None:
        raise RuntimeError(f"the first product at N={x.shape[1]} left the choice unsettled (timing not allowed?)")
    return path


def geomean(values) -> float:
    values = [v for v in values if v and v > 0 and v == v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def add_corpus_arguments(parser) -> None:
    parser.add_argument("--corpus", choices=(*corpus.SPLITS, "all"), default=None,
                        help="run the corpus's graphs of this split instead of the suite's (graph_data.corpus)")
    parser.add_argument("--tier", choices=tuple(corpus.TIERS), default="medium",
                        help="the corpus's size tier: " + ", ".join(f"{k} {v}" for k, v in corpus.TIERS.items()))
    parser.add_argument("--no-real", action="store_true", help="leave the real graphs out of the corpus")
    parser.add_argument("--corpus-seed", type=int, default=0, help="seed of the corpus's generated graphs")


def corpus_table(args, rectangular: bool = False) -> dict:
    """name -> (load(device) -> (row, col, num_nodes), split) of the corpus's graphs; with
    ``rectangular`` also its rectangular families, whose load returns ``(row, col, (num_rows,
    num_cols))`` (a benchmark that permutes rows and columns alike leaves them out)."""
    return {e.name: (e.load, e.split)
            for e in corpus.entries(args.corpus, args.tier, real=not args.no_real, seed=args.corpus_seed,
                                    rectangular=rectangular)}


# The suite's own synthetic graphs are of the families its constants were tuned on.
SUITE_FAMILIES = ("rmat", "sbm", "uniform", "band")


def split_of_name(name: str) -> str:
    """The split of a suite graph: its generated family's, else its real source's."""
    family = next((f for f in SUITE_FAMILIES if name.startswith(f)), corpus.real_family(name))
    return corpus.split_of(family)
