"""Host-side cost per SpMM call on small graphs, layer by layer, and the cost of a selector choice.

On graphs of a few thousand rows the kernel runs for a few microseconds and a call of ``A @ X``
costs what Python and the launch cost. This times back-to-back calls (no synchronisation in
between) of each layer, from the user's ``A @ X`` down to the engine's launch with prepared
operands, so the difference between two rows is the cost of one layer, and the product with its
backward for X against the forward alone (and torch.sparse's), beside this machine's floors
(torch's cheapest op and a Python autograd.Function, each with its backward), and what one
more product adds to a chain of them with one backward call (a model's products share
autograd's fixed cost per backward call); then the
first (uncached) selector choice at N against one SpMM (the matrix's features built, as
``benchmarks.selector`` times it; ``python -m benchmarks.selector --first-choice`` times it alone,
on a machine without a GPU too); then one training step (forward, backward,
Adam) of a 2-layer GCN (in 100 -> 256 -> 47 out, our GCNConv, cached graph). cProfile listings of
``A @ X``, of it with its backward and of the training step go to
``$OUT/host_overhead_profile_*.txt``.

    python -m benchmarks.host_overhead --graphs planetoid_cora,planetoid_citeseer --n 128
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch

from benchmarks.common import out_dir, settle, time_cuda, time_per_call_us
from benchmarks.selector import first_choice_rounds, first_choice_sample

import torch_tcsparse
from torch_tcsparse import product
from graph_data import npz


def load(name: str) -> torch_tcsparse.TCSparseTensor:
    path = next((p for p in npz.list_graphs() if p.stem == name), None)
    if path is None:
        raise SystemExit(f"graph {name} not found in {npz.graph_dir()}")
    coo = npz.load_adjacency(path).tocoo()
    row = torch.from_numpy(coo.row.astype("int64")).cuda()
    col = torch.from_numpy(coo.col.astype("int64")).cuda()
    values = torch.rand(row.numel(), device="cuda") + 0.5
    return torch_tcsparse.TCSparseTensor.from_coo(row, col, values, coo.shape)


def layers(a: torch_tcsparse.TCSparseTensor, dtype: torch.dtype, n: int) -> dict:
    """Callables of one X each, outermost first, then the product with its backward."""
    a = a.to(dtype)
    path = settle(a, torch.randn(a.shape[1], n, device="cuda", dtype=dtype))
    csr = a.to_torch_csr()
    grad_y = torch.randn(a.shape[0], n, device="cuda", dtype=dtype)
    grad_x = torch.randn(a.shape[1], n, device="cuda", dtype=dtype)

    def forward_backward(x):
        (a @ x.requires_grad_()).backward(grad_y)

    def csr_forward_backward(x):
        torch.sparse.mm(csr, x.requires_grad_()).backward(grad_y)

    def op_forward_backward(x):
        (x.requires_grad_() * 2).backward(grad_x)

    def function_forward_backward(x):
        Twice.apply(x.requires_grad_()).backward(grad_x)

    def chained(multiply, grad):
        """CHAIN products in a row, then one backward: within a model a product does not pay
        autograd's fixed cost per backward call (the hand-over to the device thread) alone."""
        def run(x):
            y = x.requires_grad_()
            for _ in range(CHAIN):
                y = multiply(y)
            y.backward(grad)
        return run

    return {
        f"A @ X (path {path})": lambda x: a @ x,
        f"product.matmul ({path})": lambda x: product.matmul(a, x),
        f"engine launch ({path}), operands prepared": product.launcher(a, path),
        "torch.empty_like (one allocation)": lambda x: torch.empty_like(x),
        "torch.sparse.mm (cuSPARSE)": lambda x: torch.sparse.mm(csr, x),
        f"A @ X + backward for X ({path})": forward_backward,
        "torch.sparse.mm + backward for X": csr_forward_backward,
        # Floors of this machine: torch's own cheapest op, and a Python autograd.Function, with
        # their backward (autograd's engine and its device thread).
        "x * 2 (one torch op)": lambda x: x * 2,
        "x * 2 + backward": op_forward_backward,
        "autograd.Function x * 2 + backward": function_forward_backward,
        f"{CHAIN} x (A @ X) + backward": chained(lambda y: a @ y, grad_y),
        f"{CHAIN} x torch.sparse.mm + backward": chained(lambda y: torch.sparse.mm(csr, y), grad_y),
        f"{CHAIN} x (x * 2) + backward": chained(lambda y: y * 2, grad_x),
    }


# Products in a chain whose backward is one call: the cost a product adds to a model's step is
# (chain - one product with its backward) / (CHAIN - 1).
CHAIN = 8
# Rows of layers() whose cost per added link of a chain is printed: (chain, one link).
_MARGINAL = {"A @ X": ("x (A @ X) + backward", "A @ X + backward for X"),
             "torch.sparse.mm": ("x torch.sparse.mm + backward", "torch.sparse.mm + backward for X"),
             "x * 2": ("x (x * 2) + backward", "x * 2 + backward")}


class Twice(torch.autograd.Function):
    """x * 2 as a Python autograd.Function: the floor of a product with a Python backward."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def profile(fn, x, path: Path, calls: int = 2000) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn(x)
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    path.write_text(text.getvalue())


def gcn_step(a: torch_tcsparse.TCSparseTensor, out: Path, name: str) -> float:
    """ms per training step of a 2-layer GCN on ``a`` (graph cached in the layers); profiled."""
    from torch_tcsparse.nn import GCNConv

    torch.manual_seed(0)
    layers = torch.nn.ModuleList([GCNConv(100, 256, cached=True), GCNConv(256, 47, cached=True)]).cuda()
    optimizer = torch.optim.Adam(layers.parameters(), lr=0.01)
    x = torch.randn(a.shape[0], 100, device="cuda")
    target = torch.randint(0, 47, (a.shape[0],), device="cuda")

    def step():
        optimizer.zero_grad()
        hidden = torch.relu(layers[0](x, a))
        loss = torch.nn.functional.cross_entropy(layers[1](hidden, a), target)
        loss.backward()
        optimizer.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    profile(lambda _: step(), None, out / f"host_overhead_profile_{name}_gcn_step.txt", calls=50)
    return (time.perf_counter() - start) / 50 * 1e3


def choice_cost(a: torch_tcsparse.TCSparseTensor, n: int, out: Path, name: str) -> tuple[float, float, float]:
    """(us of a first choice at N = ``n`` on a fresh cache with the matrix's features built, us of
    those features, us of one SpMM with the chosen path), the first choice timed as
    ``benchmarks.selector`` times it; the first choices profiled into ``out``."""
    s = a._structure
    subject = (s.layout, n, a.dtype, s.selection.rows_share_ratio, s.grouped_size)
    features_us, choice_us = first_choice_rounds({name: subject})[name]
    profile(lambda _: first_choice_sample(*subject), None, out / f"host_overhead_profile_{name}_first_choice.txt",
            calls=200)
    x = torch.randn(a.shape[1], n, device="cuda")
    spmm_us = 1e3 * time_cuda(lambda: a @ x, [()], warmup=5, reps=30)
    return choice_us, features_us, spmm_us


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", default="planetoid_cora,planetoid_citeseer,planetoid_pubmed")
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--dtypes", default="float32,float16")
    args = parser.parse_args(argv)
    out = out_dir()
    print(f"host us per call, N = {args.n}, {torch.cuda.get_device_name()}")
    for name in args.graphs.split(","):
        a = load(name)
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            xs = [(torch.randn(a.shape[1], args.n, device="cuda", dtype=dtype),) for _ in range(4)]
            print(f"{name} {dtype_name}")
            measured = {}
            for label, fn in layers(a, dtype, args.n).items():
                measured[label] = time_per_call_us(fn, xs, calls=2000)
                print(f"  {label:<36}{measured[label]:8.1f}")
            for name_of, (chain, single) in _MARGINAL.items():
                chain_us = next(us for label, us in measured.items() if label.endswith(chain))
                single_us = next(us for label, us in measured.items() if label.startswith(single))
                label = f"{name_of} + backward, per link of a chain"
                print(f"  {label:<48}{(chain_us - single_us) / (CHAIN - 1):8.1f}")
            typed = a.to(dtype)
            profile(lambda x: typed @ x, xs[0][0], out / f"host_overhead_profile_{name}_{dtype_name}.txt")
            grad_y = torch.randn(a.shape[0], args.n, device="cuda", dtype=dtype)
            profile(lambda x: (typed @ x.requires_grad_()).backward(grad_y), xs[1][0],
                    out / f"host_overhead_profile_{name}_{dtype_name}_backward.txt")
        choice_us, features_us, spmm_us = choice_cost(a, args.n, out, name)
        print(f"  first choice {choice_us:.1f} us (features, once per matrix: {features_us:.1f} us), one SpMM "
              f"{spmm_us:.1f} us: {choice_us / spmm_us:.2f}x")
        print(f"  GCN training step (2 layers, 100 -> 256 -> 47): {gcn_step(a, out, name):.3f} ms")


if __name__ == "__main__":
    main()
