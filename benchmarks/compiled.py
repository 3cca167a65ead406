"""Eager against ``torch.compile`` on small graphs: one product ``A @ X`` and one GCN epoch.

On graphs of a few thousand rows a product is mostly host work (Python, checks, launches), which
CUDA graphs remove: ``mode="reduce-overhead"`` replays the captured kernels of a compiled
function with the matrix as its input. Per graph this times

- the product ``A @ X`` (N columns, float32): median microseconds per call over back-to-back
  calls between CUDA events, after warm-up, eager and compiled;
- one epoch of a 2-layer GCN (``torch_tcsparse.nn.GCNConv``, in -> hidden -> classes) and of a
  2-layer GraphSAGE (PyG's ``SAGEConv`` through ``torch_tcsparse.nn.fused``): forward,
  cross-entropy, backward and an Adam step, in three modes:

  - "eager";
  - "compiled": forward and loss compiled (their backward is the compiled graph's); the
    optimizer runs eagerly, fused on a GPU: one kernel, the fastest eager step, so the
    comparison is against the best eager epoch;
  - "whole": the whole step (zero_grad, forward, loss, ``loss.backward()``, ``optimizer.step()``)
    one compiled function, its backward traced by compiled autograd
    (``torch._dynamo.config.compiled_autograd`` set when the function is compiled) and the
    optimizer compiled with it (torch.optim's default multi-tensor Adam, which the compiler
    fuses): a step is a few compiled graphs (forward, backward, step), each one CUDA-graph
    replay.

  The six epochs are timed in interleaved rounds (a few epochs of each in turn, the median of
  each over the rounds): a host-bound epoch drifts with the host's state, and interleaving
  gives each mode the same drift.

Targets it reports: compiled epochs at least ``EPOCH_SPEEDUP_TARGET`` times faster than eager, a
compiled product at most ``PRODUCT_US_TARGET`` microseconds. Real graphs are the small ones the
other benchmarks read (``graph_data.corpus.real_loader``); a graph whose file is absent is
replaced by a generated one of about its size. Without a GPU the benchmark says so and stops,
unless ``--device cpu`` is given: the times are then wall-clock medians, without CUDA graphs, and
``--backend aot_eager`` checks the compiled path without inductor's minutes of compilation.
``benchmarks.compiled_profile`` shows where the host time of these calls goes.

    python -m benchmarks.compiled --graphs planetoid_cora,planetoid_citeseer,planetoid_pubmed
    python -m benchmarks.compiled --device cpu --backend aot_eager --graphs planetoid_cora   # no GPU
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import out_dir, write_csv
from graph_data import corpus, npz

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import GCNConv

GRAPHS = ("planetoid_cora", "planetoid_citeseer", "planetoid_pubmed")
# Nonzeros of the generated graph that stands in for a real one whose file is absent.
FALLBACK_NNZ = {"planetoid_cora": 10_556, "planetoid_citeseer": 9_104, "planetoid_pubmed": 88_648}
EPOCH_SPEEDUP_TARGET = 1.5
PRODUCT_US_TARGET = 10.0


def load_graph(name: str, device: torch.device, fallback_nnz: int) -> tuple[str, torch.Tensor, torch.Tensor, int]:
    """(name, row, col, nodes) of the real graph ``name``, or of a generated uniform graph of
    ``fallback_nnz`` nonzeros (named ``uniform_<nnz>``) when its file is absent."""
    path = next((p for p in npz.list_graphs() if p.stem == name), None)
    if path is not None:
        row, col, nodes = corpus.real_loader(path)(device)
        return name, row, col, nodes
    row, col, nodes = corpus.generate("uniform", fallback_nnz, seed=0, device=device)
    return f"uniform_{fallback_nnz}", row, col, nodes


def adjacency(row: torch.Tensor, col: torch.Tensor, nodes: int) -> TCSparseTensor:
    generator = torch.Generator().manual_seed(0)
    values = (torch.rand(row.numel(), generator=generator) + 0.5).to(row.device)
    return TCSparseTensor.from_coo(row, col, values, (nodes, nodes))


def compile_options(backend: str) -> dict:
    """``torch.compile``'s arguments: inductor with CUDA graphs, or another backend as given."""
    return {"backend": "inductor", "mode": "reduce-overhead"} if backend == "inductor" else {"backend": backend}


def median_us(fn, device: torch.device, calls: int, samples: int, warmup: int) -> float:
    """Median microseconds per call of ``fn()`` over ``samples`` samples of ``calls``
    back-to-back calls: CUDA events on a GPU, the host clock on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(samples):
        if device.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)
        else:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - start) * 1e6 / calls)
    return statistics.median(times)


class TwoLayerGCN(torch.nn.Module):
    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.conv1 = GCNConv(features, hidden, normalize=False)
        self.conv2 = GCNConv(hidden, classes, normalize=False)

    def forward(self, x, adj):
        return self.conv2(self.conv1(x, adj).relu(), adj)


class TwoLayerSAGE(torch.nn.Module):
    """GraphSAGE (mean) of PyG's SAGEConv through ``fused``, the route that compiles whole."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        from torch_tcsparse.nn import fused

        self.conv1 = fused(SAGEConv)(features, hidden)
        self.conv2 = fused(SAGEConv)(hidden, classes)

    def forward(self, x, adj):
        return self.conv2(self.conv1(x, adj).relu(), adj)


MODELS = {"gcn": TwoLayerGCN, "sage": TwoLayerSAGE}


MODES = ("eager", "compiled", "whole")


def epoch_function(adj, x, labels, hidden: int, classes: int, options: dict | None, model: str = "gcn",
                   mode: str = "compiled"):
    """One training epoch of ``MODELS[model]`` as a function of no argument (a fresh model,
    seeded): eager where ``options`` is None, else compiled with ``options`` in ``mode`` (one of
    ``MODES``: "compiled" compiles forward and loss, "whole" the whole step, backward through
    compiled autograd). Adam is fused (one kernel for every parameter) on a GPU where it runs
    eagerly; compiled with the step, it is torch.optim's default, which the compiler fuses."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    torch.manual_seed(0)
    model = MODELS[model](x.shape[1], hidden, classes).to(x.device)
    whole = options is not None and mode == "whole"
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, fused=x.is_cuda and not whole)
    cudagraphs = options is not None and options.get("mode") == "reduce-overhead" and x.is_cuda
    if cudagraphs:
        # Full-batch training passes the same features and labels at every step: as static inputs
        # the CUDA graphs read them in place instead of copying them in at every replay (the
        # matrix is one already, tensor.py).
        torch._dynamo.mark_static_address(x)
        torch._dynamo.mark_static_address(labels)

    def loss_of(x, adj, labels):
        return torch.nn.functional.cross_entropy(model(x, adj), labels)

    if whole:
        return whole_step(optimizer, loss_of, (x, adj, labels), options, cudagraphs)
    compiled = loss_of if options is None else torch.compile(loss_of, fullgraph=True, **options)

    def epoch():
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        # Gradients set to None, not zeroed in place: under CUDA graphs a parameter's gradient is
        # a graph output, which the next replay overwrites.
        optimizer.zero_grad(set_to_none=True)
        loss = compiled(x, adj, labels)
        loss.backward()
        optimizer.step()
        return loss

    return epoch


def whole_step(optimizer, loss_of, inputs: tuple, options: dict, cudagraphs: bool):
    """The epoch as one compiled function. Compiled autograd is on for the functions compiled
    while ``torch._dynamo.config.compiled_autograd`` is set: the flag is read by
    ``torch.compile``, not at each call. Not ``fullgraph``: Dynamo breaks the graph at
    ``Tensor.backward()`` (compiled autograd traces the backward as a graph of its own) and
    torch.optim around its step (to run it without grad)."""
    def step(x, adj, labels):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(x, adj, labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    with torch._dynamo.config.patch(compiled_autograd=True):
        compiled = torch.compile(step, **options)

    def epoch():
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(*inputs)

    return epoch


def measure(name: str, args, device: torch.device) -> dict:
    # Each graph compiles afresh: compiled code of the previous graph would make the compiler
    # trace this one with dynamic shapes (and count towards its recompilation limit).
    torch._dynamo.reset()
    graph, row, col, nodes = load_graph(name, device, args.fallback_nnz or FALLBACK_NNZ.get(name, 10_000))
    adj = adjacency(row, col, nodes)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(nodes, args.n, generator=generator).to(device)
    features = torch.randn(nodes, args.features, generator=generator).to(device)
    labels = torch.randint(0, args.classes, (nodes,), generator=generator).to(device)
    options = compile_options(args.backend)
    timing = {"calls": args.calls, "samples": args.samples, "warmup": args.warmup}

    def product(a, x):
        return a @ x

    compiled_product = torch.compile(product, fullgraph=True, **options)
    expected = adj @ x
    error = float((compiled_product(adj, x) - expected).abs().max() / expected.abs().max().clamp(min=1e-30))
    eager_product_us = median_us(lambda: product(adj, x), device, **timing)
    compiled_product_us = median_us(lambda: compiled_product(adj, x), device, **timing)

    torch._dynamo.reset()
    functions = {(model, mode): epoch_function(adj, features, labels, args.hidden, args.classes,
                                               None if mode == "eager" else options, model, mode)
                 for model in MODELS for mode in MODES}
    epochs = interleaved_ms(functions, device, rounds=args.epochs, per_round=EPOCHS_PER_ROUND, warmup=args.warmup)
    speedup = epochs["gcn", "eager"] / epochs["gcn", "compiled"]
    sage_speedup = epochs["sage", "eager"] / epochs["sage", "compiled"]
    whole_speedup = epochs["gcn", "eager"] / epochs["gcn", "whole"]
    sage_whole_speedup = epochs["sage", "eager"] / epochs["sage", "whole"]
    path = adj._structure.selection.settled(args.n, x.dtype, device) or "csr"
    return {
        "graph": graph, "nodes": nodes, "nnz": adj.nnz, "device": str(device), "backend": args.backend,
        "n": args.n, "path": path, "rel_error": error,
        "product_eager_us": eager_product_us, "product_compiled_us": compiled_product_us,
        "epoch_eager_ms": epochs["gcn", "eager"], "epoch_compiled_ms": epochs["gcn", "compiled"],
        "epoch_speedup": speedup, "sage_epoch_eager_ms": epochs["sage", "eager"],
        "sage_epoch_compiled_ms": epochs["sage", "compiled"], "sage_epoch_speedup": sage_speedup,
        "epoch_whole_ms": epochs["gcn", "whole"], "whole_speedup": whole_speedup,
        "sage_epoch_whole_ms": epochs["sage", "whole"], "sage_whole_speedup": sage_whole_speedup,
        "meets_epoch_target": min(speedup, sage_speedup) >= EPOCH_SPEEDUP_TARGET,
        "whole_meets_epoch_target": min(whole_speedup, sage_whole_speedup) >= EPOCH_SPEEDUP_TARGET,
        "meets_product_target": compiled_product_us <= PRODUCT_US_TARGET,
    }


EPOCHS_PER_ROUND = 3


def interleaved_ms(functions: dict, device: torch.device, rounds: int, per_round: int, warmup: int) -> dict:
    """Median milliseconds per call of each function, timed in ``rounds`` rounds that run
    ``per_round`` calls of each in turn (CUDA events on a GPU, the host clock on the CPU)."""
    for fn in functions.values():
        for _ in range(warmup):
            fn()
    times = {key: [] for key in functions}
    for _ in range(rounds):
        for key, fn in functions.items():
            times[key].append(median_us(fn, device, calls=per_round, samples=1, warmup=0) / 1e3)
    return {key: statistics.median(values) for key, values in times.items()}


def print_table(rows: list[dict]) -> None:
    print(f"{'graph':<22}{'nnz':>9}{'path':>6}{'A@X eager us':>14}{'compiled us':>13}"
          f"{'GCN eager ms':>14}{'compiled ms':>13}{'speed-up':>10}{'whole ms':>10}{'speed-up':>10}"
          f"{'SAGE eager ms':>15}{'compiled ms':>13}{'speed-up':>10}{'whole ms':>10}{'speed-up':>10}")
    for r in rows:
        print(f"{r['graph']:<22}{r['nnz']:>9}{r['path']:>6}{r['product_eager_us']:>14.1f}"
              f"{r['product_compiled_us']:>13.1f}{r['epoch_eager_ms']:>14.3f}{r['epoch_compiled_ms']:>13.3f}"
              f"{r['epoch_speedup']:>9.2f}x{r['epoch_whole_ms']:>10.3f}{r['whole_speedup']:>9.2f}x"
              f"{r['sage_epoch_eager_ms']:>15.3f}{r['sage_epoch_compiled_ms']:>13.3f}"
              f"{r['sage_epoch_speedup']:>9.2f}x{r['sage_epoch_whole_ms']:>10.3f}{r['sage_whole_speedup']:>9.2f}x")
    print(f"targets: compiled epoch >= {EPOCH_SPEEDUP_TARGET}x eager on "
          f"{sum(r['meets_epoch_target'] for r in rows)}/{len(rows)} graphs (whole step compiled: "
          f"{sum(r['whole_meets_epoch_target'] for r in rows)}/{len(rows)}); compiled product <= "
          f"{PRODUCT_US_TARGET:g} us on {sum(r['meets_product_target'] for r in rows)}/{len(rows)}")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", default=",".join(GRAPHS), help="comma-separated real graph names")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else None,
                        help="cuda (the default where there is one) or cpu")
    parser.add_argument("--backend", default="inductor",
                        help='"inductor" (mode="reduce-overhead") or another torch.compile backend')
    parser.add_argument("--n", type=int, default=64, help="columns of X in the product")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--classes", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50, help="back-to-back calls per product sample")
    parser.add_argument("--samples", type=int, default=20, help="product samples (median)")
    parser.add_argument("--epochs", type=int, default=30,
                        help=f"timed rounds of {EPOCHS_PER_ROUND} epochs of each model and mode (median)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--fallback-nnz", type=int, default=None,
                        help="nonzeros of the generated graph replacing an absent one (default: about its size)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    for name in ("n", "features", "hidden", "classes", "calls", "samples", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be non-negative, got {args.warmup}")
    return args


CPU_COMMAND = "python -m benchmarks.compiled --device cpu --backend aot_eager --graphs planetoid_cora"


def main(argv=None) -> list[dict]:
    args = parse(argv)
    if args.device is None:
        raise SystemExit("benchmarks.compiled times CUDA graphs (torch.compile mode=\"reduce-overhead\") and found no "
                         f"CUDA device.\nOn a CPU, time the compiled path at a small size instead: {CPU_COMMAND}")
    device = torch.device(args.device)
    rows = [measure(name, args, device) for name in args.graphs.split(",") if name]
    print_table(rows)
    suffix = torch.cuda.get_device_name(device).split()[-1].lower() if device.type == "cuda" else "cpu"
    path = write_csv(out_dir(args.out) / f"compiled_{suffix}.csv", rows)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
