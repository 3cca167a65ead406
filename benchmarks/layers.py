"""PyG layers on our TCSparseTensor ``adj_t`` against PyG's own routes, per layer and graph, and each
layer of ours against the sum of its parts.

Layers: SAGEConv (mean, max), GINConv, GraphConv, GCNConv (normalize=False on a matrix normalized
once, and normalize=True with cached=True), SGConv (K=2), APPNP (K=10, cached=True), TAGConv
(K=3), ClusterGCNConv, LGConv, GATConv and TransformerConv (8 heads of features / 8 channels).
Routes:

- ``ours``: ``fused(Layer)`` on a TCSparseTensor (``torch_tcsparse.nn.fused``);
- ``pyg-csr``: PyG's layer on a torch.sparse CSR ``adj_t`` (int64 indices, as PyG builds one);
  PyG's ``spmm`` refuses max on CUDA, so that row is left out there;
- ``pyg-edge_index``: PyG's layer on ``edge_index`` (gather and scatter).

Graphs: an R-MAT graph from ``graph_data.synthetic`` (``--scale``) and the real graphs named by
``--real`` that are in the graph folder (absent ones are said and skipped); or, with
``--corpus fit|unseen|all``, the corpus of ``graph_data.corpus`` at ``--tier`` instead. Every
graph belongs to the "fit" or the "unseen" families (those nothing was tuned on), reported apart.

Each row: ``preprocess_s``, the conversion of edge_index into the route's adjacency (the
transpose our backward uses included, GCN normalization for GCNConv); ``first_ms``, the first
forward+backward pass (a sum loss), where a layer derives what it keeps from its graph;
``epoch_ms``, the median of ``--reps`` further passes after ``--warmup``, timed with CUDA events
on a GPU; on CUDA ``kept_mib``, what the layer keeps allocated from its first pass, and
``peak_mib``, ``torch.cuda.max_memory_allocated`` during one pass above what was allocated before
it. Rows of ``ours`` also hold the sum of the layer's parts timed alone:
``products_ms``, every sparse product of one forward (our SpMM, attention's softmax over the
edges and its weighted sum) timed forward+backward by itself, ``dense_ms``, the pass with those
products replaced by stand-ins that cost nothing (the layer's dense work and everything around the products), and
``overhead``, epoch_ms over their sum (target: at most 1.1). Writes ``layers.csv`` into ``--out``
(default ``$OUT``, else ``out``) and prints, per split and layer, the geomean speedups over PyG's
routes, the worst overhead and the memory (peak plus kept) against PyG's.

    python -m benchmarks.layers --device cuda --scale 18 --features 128
    python -m benchmarks.layers --device cuda --corpus all --tier medium --no-real --features 128
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_gcn_norm

from benchmarks.common import add_corpus_arguments, corpus_table, geomean, out_dir, split_of_name, time_cuda, write_csv
from graph_data import npz, synthetic
from torch_tcsparse import TCSparseTensor, product
from torch_tcsparse.nn import attention_layers, fused, multihead
from torch_tcsparse.nn import gcn_norm as tc_gcn_norm

ROUTES = ("ours", "pyg-csr", "pyg-edge_index")
HEADS = 8
# name: (layer factory for (class, in, out), PyG class, normalized adjacency)
LAYERS = {
    "SAGEConv-mean": (lambda cls, i, o: cls(i, o, aggr="mean"), pyg_nn.SAGEConv, False),
    "SAGEConv-max": (lambda cls, i, o: cls(i, o, aggr="max"), pyg_nn.SAGEConv, False),
    "GINConv": (lambda cls, i, o: cls(torch.nn.Linear(i, o)), pyg_nn.GINConv, False),
    "GraphConv": (lambda cls, i, o: cls(i, o), pyg_nn.GraphConv, False),
    "GCNConv": (lambda cls, i, o: cls(i, o, normalize=False), pyg_nn.GCNConv, True),
    "GCNConv-normalize": (lambda cls, i, o: cls(i, o, cached=True), pyg_nn.GCNConv, False),
    "SGConv": (lambda cls, i, o: cls(i, o, K=2), pyg_nn.SGConv, False),
    "APPNP": (lambda cls, i, o: cls(K=10, alpha=0.1, cached=True), pyg_nn.APPNP, False),
    "TAGConv": (lambda cls, i, o: cls(i, o, K=3), pyg_nn.TAGConv, False),
    "ClusterGCNConv": (lambda cls, i, o: cls(i, o), pyg_nn.ClusterGCNConv, False),
    "LGConv": (lambda cls, i, o: cls(), pyg_nn.LGConv, False),
    f"GATConv-h{HEADS}": (lambda cls, i, o: cls(i, max(1, o // HEADS), heads=HEADS), pyg_nn.GATConv, False),
    f"TransformerConv-h{HEADS}": (lambda cls, i, o: cls(i, max(1, o // HEADS), heads=HEADS), pyg_nn.TransformerConv,
                                 False),
}
DEFAULT_REAL = ("planetoid_pubmed", "gg_flickr", "ogbl_ddi")
FIELDS = ("graph", "split", "nodes", "edges", "layer", "route", "device", "features", "preprocess_s", "first_ms",
          "epoch_ms", "kept_mib", "peak_mib", "products_ms", "dense_ms", "overhead")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... or auto")
    parser.add_argument("--scale", type=int, default=14, help="R-MAT graph of 2**scale nodes; 0 leaves it out")
    parser.add_argument("--real", nargs="*", default=list(DEFAULT_REAL),
                        help="real graph names (.npz stems in the graph folder); none: only the synthetic one")
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    parser.add_argument("--features", type=int, default=64, help="input and output channels")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=None, help="folder of layers.csv (default $OUT, else out)")
    add_corpus_arguments(parser)
    args = parser.parse_args(argv)
    for key, least in (("scale", 0), ("features", 1), ("warmup", 0), ("reps", 1)):
        if getattr(args, key) < least:
            parser.error(f"--{key} must be at least {least}, got {getattr(args, key)}")
    if 0 < args.scale < 2:
        parser.error(f"--scale must be 0 or at least 2, got {args.scale}")
    return args


def graphs(args, device: torch.device):
    """``(name, split, edge_index, num_nodes)`` of each graph to measure, edge_index on ``device``."""
    if args.corpus:
        for name, (load, split) in corpus_table(args).items():
            row, col, num_nodes = load(device)
            yield name, split, torch.stack([row, col]), num_nodes
        return
    if args.scale:
        row, col, num_nodes = synthetic.rmat(args.scale)
        yield f"rmat-{args.scale}", split_of_name("rmat"), torch.stack([row, col]).to(device), num_nodes
    available = {path.stem: path for path in npz.list_graphs()}
    for name in args.real:
        if name not in available:
            print(f"{name}: not in {npz.graph_dir()}, skipped")
            continue
        adj = npz.load_adjacency(available[name], symmetrize=True).tocoo()
        edge_index = torch.stack([torch.from_numpy(adj.row).long(), torch.from_numpy(adj.col).long()])
        yield name, split_of_name(name), edge_index.to(device), adj.shape[0]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepare(route: str, edge_index: torch.Tensor, num_nodes: int, normalized: bool):
    """The layer's graph arguments after ``x`` for ``route``: ``(adj_t,)`` or ``(edge_index, weight)``."""
    if route == "ours":
        if normalized:
            edge_index, weight = tc_gcn_norm(edge_index, None, num_nodes)
        else:
            weight = None
        adj = TCSparseTensor.from_edge_index(edge_index, weight, num_nodes=num_nodes)
        adj.t()  # the backward's transpose, cached on the matrix
        return (adj,)
    weight = None
    if normalized:
        edge_index, weight = pyg_gcn_norm(edge_index, None, num_nodes)
    if route == "pyg-edge_index":
        return (edge_index,) if weight is None else (edge_index, weight)
    values = torch.ones(edge_index.size(1), device=edge_index.device) if weight is None else weight
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), values, (num_nodes, num_nodes), check_invariants=False)
    return (adj_t.coalesce().to_sparse_csr(),)


def runs_on(route: str, layer: str, device: torch.device) -> bool:
    return not (route == "pyg-csr" and layer == "SAGEConv-max" and device.type == "cuda")


def median_ms(fn, device: torch.device, warmup: int, reps: int) -> float:
    """Median milliseconds of ``fn()``: CUDA events on a GPU (``benchmarks.common.time_cuda``),
    the host clock on the CPU."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            return time_cuda(fn, [()], warmup=warmup, reps=reps)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def training_step(layer, x, graph_args):
    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x, *graph_args).sum().backward()

    return step


def peak_mib(step, device: torch.device) -> float | None:
    """Peak MiB allocated during one ``step()`` above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


# Sum of parts: the sparse products a layer of ours runs, recorded during one forward and timed
# alone, and its pass with each of them replaced by a stand-in that costs nothing.
_SPARSE_CALLS = (
    (product, "matmul"),
    (attention_layers, "multihead_spmm"),
    (attention_layers, "gat_attention"),
    (attention_layers, "dot_attention"),
)


class _Free(torch.autograd.Function):
    """An output of ``shape`` from ``inputs`` (uninitialized), whose backward hands each input an
    uninitialized gradient: a product's place in the graph, without its work."""

    @staticmethod
    def forward(ctx, shape, *inputs):
        ctx.inputs = [(t.shape, t.dtype, t.device) for t in inputs]
        return inputs[0].new_empty(shape)

    @staticmethod
    def backward(ctx, grad):
        return (None, *(torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.inputs))


def _output_shape(name: str, args) -> tuple:
    if name == "matmul":
        matrix, other = args[0], args[1]
        return (matrix.shape[0],) + tuple(other.shape[1:])
    graph, first, second = args[:3]
    if name == "multihead_spmm":
        return (graph.num_rows, *second.shape[1:])
    return (graph.nnz, first.shape[1])


def _free_call(name: str):
    def call(*args):
        shape = _output_shape(name, args)
        if name != "matmul":
            return _Free.apply(shape, *(a for a in args[1:] if isinstance(a, torch.Tensor)))
        matrix, other, bias = args[0], args[1], args[3]
        values = matrix.values()
        out = _Free.apply(shape, other, *([values] if values.requires_grad else []))
        return out if bias is None else out + bias

    return call


@contextlib.contextmanager
def _replaced(make):
    """Each sparse call replaced by ``make(name, original)``."""
    with contextlib.ExitStack() as stack:
        for owner, name in _SPARSE_CALLS:
            stack.enter_context(mock.patch.object(owner, name, make(name, getattr(owner, name))))
        yield


def recorded_products(layer, x, graph_args) -> list:
    """``(function, args, kwargs)`` of each outermost sparse call of one forward: our SpMM inside
    a multi-head product is part of that product."""
    calls, depth = [], [0]

    def make(name, original):
        def record(*args, **kwargs):
            if depth[0] == 0:
                calls.append((original, args, kwargs))
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        return record

    with _replaced(make):
        layer(x, *graph_args)
    return calls


def _alone(call):
    """One product's forward and backward, its tensor arguments detached (keeping which of
    them needed a gradient), with a random output gradient."""
    function, args, kwargs = call
    leaves = [a.detach().requires_grad_(a.requires_grad)
              if isinstance(a, torch.Tensor) and not isinstance(a, TCSparseTensor) else a for a in args]
    out = function(*leaves, **kwargs)
    grad = torch.randn_like(out)

    def run():
        result = function(*leaves, **kwargs)
        if result.requires_grad:
            result.backward(grad)

    return run


def parts_ms(layer, x, graph_args, device, warmup: int, reps: int) -> tuple[float, float]:
    """(the products alone, the pass without them) in milliseconds."""
    products = sum(median_ms(_alone(call), device, warmup, reps) for call in recorded_products(layer, x, graph_args))
    with _replaced(lambda name, original: _free_call(name)):
        dense = median_ms(training_step(layer, x, graph_args), device, warmup, reps)
    return products, dense


def measure(layer, x, graph_args, device, warmup: int, reps: int) -> dict:
    """The first forward+backward's milliseconds (what a layer derives from its graph, the first
    choices of its products), the median of the others, and on CUDA the MiB the layer keeps from
    the first (a normalized matrix, an attention pattern) and the peak MiB of one step above what
    was allocated before it (else None)."""
    step = training_step(layer, x, graph_args)
    synchronize(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    start = time.perf_counter()
    step()
    synchronize(device)
    first_ms = (time.perf_counter() - start) * 1e3
    layer.zero_grad(set_to_none=True)
    x.grad = None
    kept = None if before is None else (torch.cuda.memory_allocated(device) - before) / 2**20
    epoch = median_ms(step, device, warmup, reps)
    return dict(first_ms=first_ms, epoch_ms=epoch, kept_mib=kept, peak_mib=peak_mib(step, device))


def _held(row: dict) -> float:
    """MiB a step needs: its peak and what the layer keeps between steps."""
    return float(row["peak_mib"]) + float(row["kept_mib"])


def summarize(rows: list[dict]) -> None:
    """Per split and layer: geomean speedup of ours over each PyG route, the worst overhead of
    ours over its parts, and (on CUDA) the geomean of our memory (peak plus kept) over PyG's."""
    by_key = {(row["graph"], row["layer"], row["route"]): row for row in rows}
    for split in sorted({row["split"] for row in rows}):
        print(f"\n{split} families: speedup of ours (geomean over graphs), overhead over parts (worst), "
              "memory (peak + kept) ours / PyG (geomean)")
        for layer in dict.fromkeys(row["layer"] for row in rows if row["split"] == split):
            ours = [row for row in rows if row["split"] == split and row["layer"] == layer and row["route"] == "ours"]
            line = f"  {layer:>20}"
            for route in ROUTES[1:]:
                pairs = [(by_key.get((row["graph"], layer, route)), row) for row in ours]
                pairs = [(theirs, mine) for theirs, mine in pairs if theirs is not None]
                if not pairs:
                    continue
                speedup = geomean(float(theirs["epoch_ms"]) / float(mine["epoch_ms"]) for theirs, mine in pairs)
                line += f"  vs {route}: {speedup:5.2f}x time"
                memory = [_held(mine) / _held(theirs) for theirs, mine in pairs if mine["peak_mib"] and _held(theirs) > 0]
                line += f", {geomean(memory):4.2f}x memory" if memory else ""
            overheads = [float(row["overhead"]) for row in ours if row["overhead"]]
            line += f"  overhead {max(overheads):.2f}" if overheads else ""
            print(line)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = []
    for name, split, edge_index, num_nodes in graphs(args, device):
        torch.manual_seed(0)
        x = torch.randn(num_nodes, args.features, device=device).requires_grad_()
        for layer_name in args.layers:
            factory, pyg_class, normalized = LAYERS[layer_name]
            for route in args.routes:
                if not runs_on(route, layer_name, device):
                    continue
                synchronize(device)
                start = time.perf_counter()
                graph_args = prepare(route, edge_index, num_nodes, normalized)
                synchronize(device)
                preprocess_s = time.perf_counter() - start
                torch.manual_seed(0)
                layer = factory(fused(pyg_class) if route == "ours" else pyg_class, args.features,
                                args.features).to(device)
                timing = measure(layer, x, graph_args, device, args.warmup, args.reps)
                epoch_ms, peak, kept = timing["epoch_ms"], timing["peak_mib"], timing["kept_mib"]
                row = dict(graph=name, split=split, nodes=num_nodes, edges=edge_index.size(1), layer=layer_name,
                           route=route, device=device_name, features=args.features,
                           preprocess_s=f"{preprocess_s:.4f}", first_ms=f"{timing['first_ms']:.3f}",
                           epoch_ms=f"{epoch_ms:.3f}", kept_mib="" if kept is None else f"{kept:.1f}",
                           peak_mib="" if peak is None else f"{peak:.1f}", products_ms="", dense_ms="", overhead="")
                line = (f"{name:>18} {layer_name:>20} {route:>14}  preprocess {preprocess_s:8.4f} s  "
                        f"first {timing['first_ms']:9.3f} ms  epoch {epoch_ms:9.3f} ms"
                        + ("" if peak is None else f"  kept {kept:8.1f} MiB  peak {peak:8.1f} MiB"))
                if route == "ours":
                    products, dense = parts_ms(layer, x, graph_args, device, args.warmup, args.reps)
                    row.update(products_ms=f"{products:.3f}", dense_ms=f"{dense:.3f}",
                               overhead=f"{epoch_ms / (products + dense):.3f}")
                    line += f"  parts {products:.3f} + {dense:.3f} ms ({row['overhead']}x)"
                rows.append(row)
                print(line, flush=True)
                del graph_args, layer
    print(f"wrote {write_csv(out_dir(args.out) / 'layers.csv', rows, FIELDS)}")
    summarize(rows)
    return rows


if __name__ == "__main__":
    main()
