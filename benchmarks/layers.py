"""PyG layers on our TCSparseTensor ``adj_t`` against PyG's own routes, per layer and graph.

Layers: SAGEConv (mean, max), GINConv, GraphConv and GCNConv (normalize=False on a matrix
normalized once, as ``cached=True`` amounts to). Routes:

- ``ours``: ``fused(Layer)`` on a TCSparseTensor (``torch_tcsparse.nn.fused``);
- ``pyg-csr``: PyG's layer on a torch.sparse CSR ``adj_t`` (its full-batch product); PyG's ``spmm``
  refuses max on CUDA, so that row is left out there;
- ``pyg-edge_index``: PyG's layer on ``edge_index`` (gather and scatter).

Graphs: an R-MAT graph from ``graph_data.synthetic`` (``--scale``), and the real graphs named by
``--real`` that are in the graph folder (``graph_data.npz``; absent ones are said and skipped).
For each row: ``preprocess_s``, the conversion of edge_index into the route's adjacency (the
transpose our backward uses included, GCN normalization included for GCNConv); ``epoch_ms``,
the median of ``--reps`` forward+backward passes (a sum loss) after ``--warmup``; on CUDA
``peak_mib``, ``torch.cuda.max_memory_allocated`` during one pass above what was allocated before
it (empty on the CPU). Writes ``layers.csv`` into ``--out`` (default ``$OUT``, else ``out``).

    python -m benchmarks.layers --device cuda --scale 18 --features 128
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_gcn_norm

from benchmarks.common import out_dir, write_csv
from graph_data import npz, synthetic
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import fused
from torch_tcsparse.nn import gcn_norm as tc_gcn_norm

ROUTES = ("ours", "pyg-csr", "pyg-edge_index")
# name: (layer factory for (class, in, out), PyG class, normalized adjacency)
LAYERS = {
    "SAGEConv-mean": (lambda cls, i, o: cls(i, o, aggr="mean"), pyg_nn.SAGEConv, False),
    "SAGEConv-max": (lambda cls, i, o: cls(i, o, aggr="max"), pyg_nn.SAGEConv, False),
    "GINConv": (lambda cls, i, o: cls(torch.nn.Linear(i, o)), pyg_nn.GINConv, False),
    "GraphConv": (lambda cls, i, o: cls(i, o), pyg_nn.GraphConv, False),
    "GCNConv": (lambda cls, i, o: cls(i, o, normalize=False), pyg_nn.GCNConv, True),
}
DEFAULT_REAL = ("planetoid_pubmed", "gg_flickr", "ogbl_ddi")
FIELDS = ("graph", "nodes", "edges", "layer", "route", "device", "features", "preprocess_s", "epoch_ms", "peak_mib")


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
    args = parser.parse_args(argv)
    for key, least in (("scale", 0), ("features", 1), ("warmup", 0), ("reps", 1)):
        if getattr(args, key) < least:
            parser.error(f"--{key} must be at least {least}, got {getattr(args, key)}")
    if 0 < args.scale < 2:
        parser.error(f"--scale must be 0 or at least 2, got {args.scale}")
    return args


def graphs(args):
    """``(name, edge_index, num_nodes)`` of each graph to measure, on the CPU."""
    if args.scale:
        row, col, num_nodes = synthetic.rmat(args.scale)
        yield f"rmat-{args.scale}", torch.stack([row, col]), num_nodes
    available = {path.stem: path for path in npz.list_graphs()}
    for name in args.real:
        if name not in available:
            print(f"{name}: not in {npz.graph_dir()}, skipped")
            continue
        adj = npz.load_adjacency(available[name], symmetrize=True).tocoo()
        edge_index = torch.stack([torch.from_numpy(adj.row).long(), torch.from_numpy(adj.col).long()])
        yield name, edge_index, adj.shape[0]


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


def measure(layer, x, graph_args, device, warmup: int, reps: int) -> tuple[float, float | None]:
    """(median forward+backward milliseconds, peak MiB above the start on CUDA, else None)."""
    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x, *graph_args).sum().backward()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    return statistics.median(times), peak


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    rows = []
    for name, edge_index, num_nodes in graphs(args):
        edge_index = edge_index.to(device)
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
                epoch_ms, peak = measure(layer, x, graph_args, device, args.warmup, args.reps)
                row = dict(graph=name, nodes=num_nodes, edges=edge_index.size(1), layer=layer_name, route=route,
                           device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                           features=args.features, preprocess_s=f"{preprocess_s:.4f}", epoch_ms=f"{epoch_ms:.3f}",
                           peak_mib="" if peak is None else f"{peak:.1f}")
                rows.append(row)
                print(f"{name:>18} {layer_name:>13} {route:>14}  preprocess {preprocess_s:8.4f} s  "
                      f"epoch {epoch_ms:9.3f} ms" + ("" if peak is None else f"  peak {peak:8.1f} MiB"))
                del graph_args, layer
    print(f"wrote {write_csv(out_dir(args.out) / 'layers.csv', rows, FIELDS)}")
    return rows


if __name__ == "__main__":
    main()
