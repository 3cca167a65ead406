"""Sampled mini-batches: what converting a batch costs against one product with it, ours and PyG's.

Batches are drawn as PyG's ``NeighborLoader`` draws them (``--batch-size`` seeds, ``--fanout``
neighbours per hop, uniformly without replacement, the targets listed first among the sources),
by a sampler in torch ops here, so no pyg-lib is needed and both sides get the same batches. The
graph is an R-MAT graph (``graph_data.synthetic``; ``--scale 21 --edge-factor 15`` is
ogbn-products' size, 2M nodes and about 60M edges). Each batch gives three matrices: the whole
sampled subgraph (what ``NeighborLoader`` yields, square) and each hop's bipartite block
([targets, sources]).

Routes, per matrix:

- ``ours-batch``: ``TCSparseTensor.from_batch`` (CSR only; the rows kernel);
- ``ours-full``: ``TCSparseTensor.from_edge_index`` (the Tensor-Core layout built at conversion);
- ``pyg-csr``: PyG's ``to_torch_csr_tensor`` of the edge_index, multiplied by ``torch.sparse.mm``.

Columns: ``convert_us``, the median conversion of the batch's edge_index; ``first_product_us``,
the first ``A @ X`` of a fresh matrix (operands prepared on first need); ``spmm_us``, the median
product at N = ``--n`` once prepared; ``host_us``, host microseconds per call of back-to-back
products (no synchronisation in between, as ``benchmarks.host_overhead`` times them);
``convert_per_spmm``, ``convert_us / spmm_us``. Writes ``batch.csv`` into ``--out`` (default
``$OUT``, else ``out``); on the CPU it runs as a quick smoke test.

``--train`` then times training epochs over the same batches (their subgraphs, as
``NeighborLoader`` yields them): a GraphSAGE of one PyG ``SAGEConv`` per hop
(``examples.sage.models``), ``--features`` random features and ``--classes`` random labels,
forward, backward and Adam step per batch, each batch's ``adj_t`` built inside the epoch
(``models.batch_adjacency``: ours ``from_batch``; PyG's CSR, or its edge_index for max on CUDA,
where PyG refuses a sparse max). ``epoch_ms`` is the median of ``--epochs`` epochs after one
warm-up epoch, ``convert_ms`` the conversions' share, timed alone. Writes ``batch_epoch.csv``.

    python -m benchmarks.batch --device cuda --scale 21 --edge-factor 15 --batches 5
    python -m benchmarks.batch --device cuda --scale 21 --edge-factor 15 --batches 50 --train --routes ours-batch
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch_geometric.utils import to_torch_csr_tensor

from benchmarks.common import out_dir, time_cuda, time_per_call_us, write_csv
from graph_data import synthetic
from torch_tcsparse import TCSparseTensor

ROUTES = ("ours-batch", "ours-full", "pyg-csr")
FIELDS = ("batch", "matrix", "rows", "cols", "nnz", "route", "device", "n", "convert_us", "first_product_us",
          "spmm_us", "host_us", "convert_per_spmm")
EPOCH_FIELDS = ("route", "aggr", "device", "batches", "epoch_ms", "convert_ms")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... or auto")
    parser.add_argument("--scale", type=int, default=None, help="R-MAT graph of 2**scale nodes (default: 21 "
                        "on CUDA, 12 on the CPU)")
    parser.add_argument("--edge-factor", type=int, default=15, help="R-MAT edges drawn per node (symmetrized)")
    parser.add_argument("--batch-size", type=int, default=1024, help="seed nodes per batch")
    parser.add_argument("--fanout", type=int, nargs="+", default=[15, 10], help="neighbours sampled per hop")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--n", type=int, default=128, help="columns of X")
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200, help="back-to-back calls timed for host_us")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="folder of batch.csv (default $OUT, else out)")
    parser.add_argument("--train", action="store_true", help="also time training epochs over the batches")
    parser.add_argument("--aggr", nargs="+", default=["mean", "max"], choices=["mean", "max"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=47)
    args = parser.parse_args(argv)
    for key in ("edge_factor", "batch_size", "batches", "n", "reps", "calls", "epochs", "features", "hidden",
                "classes"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if args.scale is not None and not 1 <= args.scale <= 30:
        parser.error(f"--scale must lie in [1, 30], got {args.scale}")
    if min(args.fanout) < 1:
        parser.error(f"--fanout counts must be at least 1, got {args.fanout}")
    return args


class Graph:
    """A graph by targets: ``rowptr`` over target nodes, ``col`` their source neighbours."""

    def __init__(self, row: torch.Tensor, col: torch.Tensor, num_nodes: int):
        counts = torch.bincount(row, minlength=num_nodes)
        self.rowptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        self.col, self.num_nodes = col, num_nodes
        # node -> position in the batch being sampled (-1: not in it), reset after every batch
        self.slot = torch.full((num_nodes,), -1, dtype=torch.long, device=col.device)


def sample(graph: Graph, seeds: torch.Tensor, fanout: list[int], gen: torch.Generator) -> tuple[torch.Tensor, list]:
    """One batch as ``NeighborLoader`` samples it: per hop, up to ``fanout[h]`` neighbours of each
    node the previous hop found, drawn without replacement. Returns the batch's nodes (graph ids,
    in batch-id order: the seeds, then each hop's new nodes) and its matrices (name, edge_index as
    [sources; targets] in batch ids, num_sources, num_targets): the whole subgraph, then each
    hop's block (its targets: the nodes found before the hop, listed first)."""
    device = seeds.device
    nodes = seeds
    graph.slot[seeds] = torch.arange(seeds.numel(), device=device)
    frontier, hops = seeds, []
    for k in fanout:
        start = graph.rowptr[frontier]
        degree = graph.rowptr[frontier + 1] - start
        owner = torch.repeat_interleave(torch.arange(frontier.numel(), device=device), degree)
        first = torch.cumsum(degree, 0) - degree
        position = torch.arange(owner.numel(), device=device) - first[owner] + start[owner]
        # A random rank among each node's neighbours: keep the first k.
        order = torch.argsort(owner.double() + torch.rand(owner.numel(), generator=gen, device=device))
        rank = torch.arange(owner.numel(), device=device) - first[owner]
        kept = order[rank < k]
        sources = graph.col[position[kept]]
        targets = graph.slot[frontier[owner[kept]]]
        new = torch.unique(sources[graph.slot[sources] < 0])
        num_targets = nodes.numel()
        graph.slot[new] = torch.arange(num_targets, num_targets + new.numel(), device=device)
        nodes = torch.cat([nodes, new])
        hops.append((torch.stack([graph.slot[sources], targets]), nodes.numel(), num_targets))
        frontier = new
    graph.slot[nodes] = -1
    subgraph = torch.cat([edges for edges, _, _ in hops], dim=1)
    return nodes, [("subgraph", subgraph, nodes.numel(), nodes.numel())] + [
        (f"hop{h + 1}", edges, num_sources, num_targets) for h, (edges, num_sources, num_targets) in enumerate(hops)]


def converter(route: str, edge_index: torch.Tensor, num_sources: int, num_targets: int):
    """The route's conversion of edge_index into its [targets, sources] matrix."""
    size = (num_sources, num_targets)
    if route == "ours-batch":
        return lambda: TCSparseTensor.from_batch(edge_index, num_nodes=size)
    if route == "ours-full":
        return lambda: TCSparseTensor.from_edge_index(edge_index, num_nodes=size)
    flipped = edge_index.flip(0)

    def convert():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
            return to_torch_csr_tensor(flipped, size=(num_targets, num_sources))

    return convert


def product(route: str):
    if route == "pyg-csr":
        return lambda a, x: torch.sparse.mm(a, x)
    return lambda a, x: a @ x


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_us(fn, device: torch.device, reps: int) -> float:
    if device.type == "cuda":
        return 1e3 * time_cuda(fn, [()], warmup=3, reps=reps)
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def first_product_us(convert, multiply, x, device: torch.device, reps: int) -> float:
    """The median first product of a freshly converted matrix."""
    times = []
    for _ in range(max(3, reps // 4)):
        a = convert()
        synchronize(device)
        start = time.perf_counter()
        multiply(a, x)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def host_us(fn, xs, device: torch.device, calls: int) -> float:
    if device.type == "cuda":
        return time_per_call_us(fn, [(x,) for x in xs], calls=calls)
    for x in xs:
        fn(x)
    start = time.perf_counter()
    for i in range(calls):
        fn(xs[i % len(xs)])
    return (time.perf_counter() - start) / calls * 1e6


def measure(route, edge_index, num_sources, num_targets, args, device) -> dict:
    convert, multiply = converter(route, edge_index, num_sources, num_targets), product(route)
    xs = [torch.randn(num_sources, args.n, device=device) for _ in range(2)]
    convert_us = median_us(convert, device, args.reps)
    first_us = first_product_us(convert, multiply, xs[0], device, args.reps)
    a = convert()
    spmm_us = median_us(lambda: multiply(a, xs[0]), device, args.reps)
    return {
        "convert_us": round(convert_us, 1),
        "first_product_us": round(first_us, 1),
        "spmm_us": round(spmm_us, 1),
        "host_us": round(host_us(lambda x: multiply(a, x), xs, device, args.calls), 1),
        "convert_per_spmm": round(convert_us / spmm_us, 2),
    }


def train_epochs(batches: list, num_nodes: int, args, device: torch.device, name: str) -> list[dict]:
    """Training epochs over ``batches`` ((nodes, subgraph edge_index) each, seeds first) per
    aggregation and backend; rows of batch_epoch.csv."""
    import torch.nn.functional as F

    from examples.sage.models import BACKENDS, SAGE, batch_adjacency, pyg_format_for

    gen = torch.Generator(device=device).manual_seed(args.seed)
    x = torch.randn(num_nodes, args.features, device=device, generator=gen)
    y = torch.randint(0, args.classes, (num_nodes,), device=device, generator=gen)
    rows = []
    for aggr in args.aggr:
        pyg_format = pyg_format_for(aggr, device)
        for backend in BACKENDS:
            torch.manual_seed(args.seed)
            model = SAGE(backend, args.features, args.hidden, args.classes, len(args.fanout), 0.0, aggr).to(device)
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

            def epoch():
                for nodes, edge_index in batches:
                    adj_t = batch_adjacency(backend, edge_index, nodes.numel(), pyg_format)
                    seeds = nodes[: args.batch_size]
                    optimizer.zero_grad()
                    out = model(x[nodes], adj_t)[: seeds.numel()]
                    F.cross_entropy(out, y[seeds]).backward()
                    optimizer.step()

            epoch()
            times = []
            for _ in range(args.epochs):
                synchronize(device)
                start = time.perf_counter()
                epoch()
                synchronize(device)
                times.append(time.perf_counter() - start)
            synchronize(device)
            start = time.perf_counter()
            for nodes, edge_index in batches:
                batch_adjacency(backend, edge_index, nodes.numel(), pyg_format)
            synchronize(device)
            route = "ours" if backend == "ours" else f"pyg-{pyg_format}"
            rows.append({"route": route, "aggr": aggr, "device": name, "batches": len(batches),
                         "epoch_ms": round(statistics.median(times) * 1e3, 2),
                         "convert_ms": round((time.perf_counter() - start) * 1e3, 2)})
            print(f"  train {aggr:<5}{route:<16}{rows[-1]['epoch_ms']:>10.2f} ms/epoch"
                  f"{rows[-1]['convert_ms']:>10.2f} ms converting")
    return rows


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    scale = args.scale if args.scale is not None else (21 if device.type == "cuda" else 12)
    row, col, num_nodes = synthetic.rmat(scale, args.edge_factor, seed=args.seed, device=device)
    graph = Graph(row, col, num_nodes)
    del row
    gen = torch.Generator(device=device).manual_seed(args.seed)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"R-MAT scale {scale}: {num_nodes} nodes, {col.numel()} edges; batches of {args.batch_size} seeds, "
          f"fan-out {args.fanout}, N = {args.n}, on {name}")
    print(f"{'batch':>5} {'matrix':<9}{'rows':>8}{'cols':>8}{'nnz':>9}  {'route':<11}{'convert':>9}{'first':>9}"
          f"{'spmm':>9}{'host':>8}{'conv/spmm':>10}")
    rows, batches = [], []
    for batch in range(args.batches):
        seeds = torch.randperm(num_nodes, generator=gen, device=device)[: min(args.batch_size, num_nodes)]
        nodes, matrices = sample(graph, seeds, args.fanout, gen)
        batches.append((nodes, matrices[0][1]))
        for matrix, edge_index, num_sources, num_targets in matrices:
            for route in args.routes:
                result = measure(route, edge_index, num_sources, num_targets, args, device)
                row = {"batch": batch, "matrix": matrix, "rows": num_targets, "cols": num_sources,
                       "nnz": edge_index.size(1), "route": route, "device": name, "n": args.n, **result}
                rows.append(row)
                print(f"{batch:>5} {matrix:<9}{num_targets:>8}{num_sources:>8}{edge_index.size(1):>9}  {route:<11}"
                      f"{result['convert_us']:>9.1f}{result['first_product_us']:>9.1f}{result['spmm_us']:>9.1f}"
                      f"{result['host_us']:>8.1f}{result['convert_per_spmm']:>10.2f}")
    path = write_csv(out_dir(args.out) / "batch.csv", rows, FIELDS)
    print(f"wrote {path}")
    if args.train:
        epochs = train_epochs(batches, num_nodes, args, device, name)
        print(f"wrote {write_csv(out_dir(args.out) / 'batch_epoch.csv', epochs, EPOCH_FIELDS)}")
        return rows + epochs
    return rows


if __name__ == "__main__":
    main()
