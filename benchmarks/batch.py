"""Sampled mini-batches on an ogbn-products-shaped graph: what converting a batch costs against its
products, and GraphSAGE epochs and accuracy, mini-batch and full-batch, ours against PyG.

The graph is ``examples.sage.products``' (2,449,029 nodes, about 124M nonzeros, 100 features,
47 classes planted in the neighbourhood, OGB's split sizes), made on the device. Batches of
``--batch-size`` training seeds are sampled hop by hop (``--fanout``) by
``torch_tcsparse.loader``, as PyG's ``NeighborLoader`` samples (no pyg-lib needed); both sides
get the same batches. Each batch gives its whole sampled subgraph (square, what ``NeighborLoader``
yields) and one bipartite block per layer ([targets, sources]; ``layer1`` feeds the first layer).

``batch.csv``, per matrix and route:

- routes: ``ours-sampled`` (a layer's block as ``SampledBatch.blocks`` builds it: ``from_batch``'s
  matrix from what the sampler guarantees, with no read of the device; the blocks share one
  sort of the batch's edges, so its ``convert_us`` is ``blocks()`` over the number of layers;
  not for the subgraph),
  ``ours-batch`` (``TCSparseTensor.from_batch``: CSR only, the Tensor-Core layout left
  until ``BUILD_AFTER_USES`` products), ``ours-full`` (``from_edge_index``: the layout built at
  conversion), ``pyg-csr`` (PyG's ``to_torch_csr_tensor``, multiplied by ``torch.sparse.mm``);
- ``convert_us``: median conversion of the edge_index; ``first_product_us``: the first
  ``A @ X`` of a fresh matrix (N = ``--n``); ``spmm_us`` and ``host_us``: per product, device and
  host time, of its next ``BUILD_AFTER_USES - 1`` products back to back (all on the CSR for
  ``ours-batch``); ``convert_per_spmm``: ``convert_us / spmm_us``; ``layout_pays_after`` (on
  ``ours-batch``): the products after which building the layout would have paid for itself,
  ``(convert ours-full - convert ours-batch) / (spmm ours-batch - spmm ours-full)`` (empty: never).
  A training step multiplies each block once forward and once backward.

``--train`` then writes ``batch_epoch.csv``: per mode, aggregation and backend, the median epoch
of ``--epochs`` rounds that run one epoch of each backend in turn, after one warm-up. Mini-batch:
forward, backward and Adam step over the same ``--epoch-batches`` sampled batches
(``examples.sage.blocks.train_step``: each block converted inside the step, ``convert_ms`` the
conversions alone; ``sample_ms`` sampling them, the same for both). Full-batch (mean only: PyG's
max on CUDA scatters over ``edge_index``, E x C floats, 127 GB here): the whole graph per step,
``convert_ms`` building ``adj_t`` once. ``speedup``: PyG's epoch over ours. Then
``batch_accuracy.csv``: ``--seeds`` runs per mode and backend (mean; seeds ``--seed`` onwards),
each seed's model and batches the same for both backends; test accuracy by full-graph inference
after ``--accuracy-epochs`` mini-batch epochs or ``--full-accuracy-epochs`` full-batch epochs.
CSVs go to ``--out`` (default ``$OUT``, else ``out``), each as soon as its part is done.

    python -m benchmarks.batch --device cuda --quick --train     # about 2 minutes on an H200
    python -m benchmarks.batch --device cuda --train              # 10 seeds, whole epochs
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from benchmarks.common import out_dir, write_csv
from examples.sage.blocks import block_adjacencies, train_step
from examples.sage.models import BACKENDS, SAGE, prepare_adjacency, pyg_format_for
from examples.sage.products import NUM_NODES, products_task
from examples.sage.train import evaluate, full_batch_epoch
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.loader import BlockLoader, NeighborSampler
from torch_tcsparse.structure import BUILD_AFTER_USES

ROUTES = ("ours-sampled", "ours-batch", "ours-full", "pyg-csr")
FIELDS = ("batch", "matrix", "rows", "cols", "nnz", "route", "device", "n", "convert_us", "first_product_us",
          "spmm_us", "host_us", "convert_per_spmm", "layout_pays_after")
EPOCH_FIELDS = ("mode", "backend", "aggr", "device", "nodes", "nnz", "batches", "sample_ms", "convert_ms", "epoch_ms",
                "speedup")
ACCURACY_FIELDS = ("mode", "backend", "device", "seeds", "epochs", "test_acc_mean", "test_acc_std")
# OGB's GraphSAGE examples for ogbn-products: neighbour sampling at 0.003, full batch at 0.01.
LEARNING_RATE = {"mini-batch": 0.003, "full-batch": 0.01}
# Options whose default depends on --quick (about 2 minutes of an H200) or not.
SCALED = {"batches": (3, 2), "epochs": (7, 5), "epoch_batches": (None, 32), "seeds": (10, 2),
          "accuracy_epochs": (5, 2), "full_accuracy_epochs": (50, 20)}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... or auto")
    parser.add_argument("--nodes", type=int, default=None,
                        help=f"nodes of the graph (default: ogbn-products' {NUM_NODES} on CUDA, 20000 on the CPU)")
    parser.add_argument("--batch-size", type=int, default=1024, help="seed nodes per batch")
    parser.add_argument("--fanout", type=int, nargs="+", default=[15, 10, 5], help="neighbours sampled per hop")
    parser.add_argument("--n", type=int, default=128, help="columns of X in batch.csv")
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    parser.add_argument("--reps", type=int, default=20, help="conversions timed per matrix")
    parser.add_argument("--seed", type=int, default=0, help="seed of the batches and models (the first accuracy run)")
    parser.add_argument("--graph-seed", type=int, default=0, help="seed of the generated graph")
    parser.add_argument("--out", default=None, help="folder of the CSVs (default $OUT, else out)")
    parser.add_argument("--quick", action="store_true", help="the smaller defaults of the options marked [quick]")
    parser.add_argument("--batches", type=int, default=None, help="batches in batch.csv [quick: 2, else 3]")
    parser.add_argument("--train", action="store_true", help="also time training epochs and measure accuracy")
    parser.add_argument("--aggr", nargs="+", default=["mean", "max"], choices=["mean", "max"],
                        help="aggregations of the timed mini-batch epochs")
    parser.add_argument("--epochs", type=int, default=None,
                        help="timed rounds of one epoch of each backend [quick: 5, else 7]")
    parser.add_argument("--epoch-batches", type=int, default=None,
                        help="batches of a timed mini-batch epoch [quick: 32, else the whole training split]")
    parser.add_argument("--seeds", type=int, default=None, help="accuracy runs per mode and backend, 0 for none "
                        "[quick: 2, else 10]")
    parser.add_argument("--accuracy-epochs", type=int, default=None,
                        help="mini-batch epochs of an accuracy run [quick: 2, else 5]")
    parser.add_argument("--full-accuracy-epochs", type=int, default=None,
                        help="full-batch epochs of an accuracy run [quick: 20, else 50]")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.5)
    args = parser.parse_args(argv)
    for key, (full, quick) in SCALED.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    for key, least in (("nodes", 2), ("batch_size", 1), ("n", 1), ("reps", 1), ("batches", 1), ("epochs", 1),
                       ("epoch_batches", 1), ("seeds", 0), ("accuracy_epochs", 1), ("full_accuracy_epochs", 1),
                       ("hidden", 1)):
        value = getattr(args, key)
        if value is not None and value < least:
            parser.error(f"--{key.replace('_', '-')} must be at least {least}, got {value}")
    if min(args.fanout) < 1:
        parser.error(f"--fanout counts must be at least 1, got {args.fanout}")
    if not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout must lie in [0, 1), got {args.dropout}")
    return args


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_s(fn, device: torch.device):
    """(fn(), seconds), the device's work included."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


# batch.csv: conversions and products of one batch's matrices.

def converter(route: str, edge_index: torch.Tensor, sizes: tuple[int, int], sampled=None):
    """The route's conversion of edge_index into its [targets, sources] matrix, and the number of
    matrices one conversion builds (``sampled``: the batch's block and its number of layers, for
    ``ours-sampled``, whose conversion builds every layer's block)."""
    if route == "ours-sampled":
        return sampled
    return _converter(route, edge_index, sizes), 1


def _converter(route: str, edge_index: torch.Tensor, sizes: tuple[int, int]):
    if route == "ours-batch":
        return lambda: TCSparseTensor.from_batch(edge_index, num_nodes=sizes)
    if route == "ours-full":
        return lambda: TCSparseTensor.from_edge_index(edge_index, num_nodes=sizes)
    from torch_geometric.utils import to_torch_csr_tensor

    flipped, shape = edge_index.flip(0), (sizes[1], sizes[0])

    def convert():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
            return to_torch_csr_tensor(flipped, size=shape)

    return convert


def product(route: str):
    if route == "pyg-csr":
        return lambda a, x: torch.sparse.mm(a, x)
    return lambda a, x: a @ x


def median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def measure(route: str, edge_index: torch.Tensor, sizes: tuple[int, int], args, device: torch.device,
            sampled=None) -> dict:
    """A row of batch.csv: conversions timed alone, then fresh matrices each timed over its first
    product and its next ``BUILD_AFTER_USES - 1`` (which ``from_batch`` runs on the CSR)."""
    (convert, built), multiply = converter(route, edge_index, sizes, sampled), product(route)
    x = torch.randn(sizes[0], args.n, device=device)
    convert()
    converts = [timed_s(convert, device)[1] / built for _ in range(args.reps)]
    uses = BUILD_AFTER_USES - 1
    firsts, steadies, hosts = [], [], []
    for _ in range(max(3, args.reps // 4)):
        a = convert()
        firsts.append(timed_s(lambda: multiply(a, x), device)[1])
        start = time.perf_counter()
        for _ in range(uses):
            multiply(a, x)
        hosts.append((time.perf_counter() - start) / uses)
        synchronize(device)
        steadies.append((time.perf_counter() - start) / uses)
    row = {"convert_us": median_us(converts), "first_product_us": median_us(firsts),
           "spmm_us": median_us(steadies), "host_us": median_us(hosts)}
    row["convert_per_spmm"] = round(row["convert_us"] / max(row["spmm_us"], 1e-3), 2)
    return row


def layout_pays_after(light: dict, full: dict) -> float | str:
    """Products after which ours-full's conversion would have paid back its extra cost."""
    saved = light["spmm_us"] - full["spmm_us"]
    if saved <= 0:
        return ""
    return round(max(full["convert_us"] - light["convert_us"], 0.0) / saved, 1)


def conversion_table(sampler, train_idx, args, device, name) -> list[dict]:
    print(f"{'batch':>5} {'matrix':<9}{'rows':>9}{'cols':>9}{'nnz':>10}  {'route':<11}{'convert':>9}{'first':>9}"
          f"{'spmm':>9}{'host':>8}{'conv/spmm':>10}{'pays':>7}")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    rows = []
    for index in range(args.batches):
        seeds = train_idx[torch.randperm(train_idx.numel(), generator=gen, device=device)[: args.batch_size]]
        batch = sampler.sample(seeds, gen)
        n = batch.nodes.numel()
        matrices = [("subgraph", batch.edge_index, (n, n), None)] + [
            (f"layer{i + 1}", edges, sizes, (lambda i=i: batch.blocks()[i], batch.num_layers))
            for i, (edges, sizes) in enumerate(batch.layer_edges())]
        for matrix, edges, sizes, sampled in matrices:
            results = {route: measure(route, edges, sizes, args, device, sampled) for route in args.routes
                       if sampled is not None or route != "ours-sampled"}
            for route, result in results.items():
                pays = (layout_pays_after(result, results["ours-full"])
                        if route == "ours-batch" and "ours-full" in results else "")
                rows.append({"batch": index, "matrix": matrix, "rows": sizes[1], "cols": sizes[0],
                             "nnz": edges.size(1), "route": route, "device": name, "n": args.n, **result,
                             "layout_pays_after": pays})
                print(f"{index:>5} {matrix:<9}{sizes[1]:>9}{sizes[0]:>9}{edges.size(1):>10}  {route:<11}"
                      f"{result['convert_us']:>9.1f}{result['first_product_us']:>9.1f}{result['spmm_us']:>9.1f}"
                      f"{result['host_us']:>8.1f}{result['convert_per_spmm']:>10.2f}{pays!s:>7}")
    return rows


# batch_epoch.csv: epoch times on the same batches and graph.

def new_model(backend, aggr, task, args, device, seed):
    torch.manual_seed(seed)
    return SAGE(backend, task.x.size(1), args.hidden, task.num_outputs, len(args.fanout), args.dropout,
                aggr).to(device)


def interleaved_epoch_ms(epochs: dict, device, rounds: int) -> dict:
    """Median ms of each of ``epochs`` (key -> epoch function) over ``rounds`` rounds that run one
    epoch of each in turn, after one warm-up epoch each (kernels built, selector settled, allocator
    grown). An epoch of sampled batches is bound by the host, whose speed drifts from one epoch to
    the next: interleaving exposes both backends to the same drift."""
    for epoch in epochs.values():
        epoch()
    times = {key: [] for key in epochs}
    for _ in range(rounds):
        for key, epoch in epochs.items():
            times[key].append(timed_s(epoch, device)[1])
    return {key: round(statistics.median(values) * 1e3, 2) for key, values in times.items()}


def minibatch_epochs(task, sampler, args, device, name) -> list[dict]:
    train_idx = task.split["train"]
    loader = BlockLoader(sampler, train_idx, args.batch_size, shuffle=True,
                         generator=torch.Generator(device=device).manual_seed(args.seed))
    count = min(args.epoch_batches or len(loader), len(loader))
    batches, seconds = timed_s(lambda: [batch for batch, _ in zip(loader, range(count))], device)
    nnz = sum(batch.edge_index.size(1) for batch in batches) // len(batches)
    print(f"mini-batch epoch: {count} batches of {args.batch_size} seeds, {nnz} sampled edges a batch, "
          f"sampled in {seconds * 1e3:.1f} ms")
    x = task.x
    rows = []
    for aggr in args.aggr:
        pyg_format = pyg_format_for(aggr, device)
        epochs = {backend: minibatch_epoch(backend, aggr, pyg_format, task, batches, args, device)
                  for backend in BACKENDS}
        for backend, epoch_ms in interleaved_epoch_ms(epochs, device, args.epochs).items():
            _, convert_s = timed_s(lambda: [block_adjacencies(backend, b, pyg_format) for b in batches], device)
            rows.append({"mode": "mini-batch", "backend": backend if backend == "ours" else f"pyg-{pyg_format}",
                         "aggr": aggr, "device": name, "nodes": x.size(0), "nnz": nnz, "batches": count,
                         "sample_ms": round(seconds * 1e3, 2), "convert_ms": round(convert_s * 1e3, 2),
                         "epoch_ms": epoch_ms})
    return with_speedups(rows)


def minibatch_epoch(backend, aggr, pyg_format, task, batches, args, device):
    """One epoch over ``batches`` of a fresh model of ``backend`` and its Adam."""
    model = new_model(backend, aggr, task, args, device, args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE["mini-batch"])

    def epoch():
        model.train()
        for batch in batches:
            train_step(model, optimizer, batch, task.x, task.y, backend, pyg_format)

    return epoch


def full_batch_epochs(task, adjacencies, args, device, name) -> list[dict]:
    epochs = {backend: full_batch_epoch_of(backend, adjacencies[backend][0], task, args, device)
              for backend in BACKENDS}
    rows = []
    for backend, epoch_ms in interleaved_epoch_ms(epochs, device, args.epochs).items():
        rows.append({"mode": "full-batch", "backend": backend if backend == "ours" else "pyg-csr", "aggr": "mean",
                     "device": name, "nodes": task.x.size(0), "nnz": task.edge_index.size(1), "batches": 1,
                     "sample_ms": 0.0, "convert_ms": round(adjacencies[backend][1] * 1e3, 2), "epoch_ms": epoch_ms})
    return with_speedups(rows)


def full_batch_epoch_of(backend, adj_t, task, args, device):
    """One full-batch epoch of a fresh model of ``backend`` and its Adam."""
    model = new_model(backend, "mean", task, args, device, args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE["full-batch"])
    return lambda: full_batch_epoch(model, optimizer, task.x, task.y, adj_t, task.split["train"])


def with_speedups(rows: list[dict]) -> list[dict]:
    """``speedup`` on our rows: PyG's epoch of the same mode and aggregation over ours."""
    for row in rows:
        pyg = [r for r in rows if r["aggr"] == row["aggr"] and r["backend"] != "ours"]
        row["speedup"] = round(pyg[0]["epoch_ms"] / row["epoch_ms"], 3) if row["backend"] == "ours" and pyg else ""
        print(f"  {row['mode']:<11}{row['aggr']:<6}{row['backend']:<15}{row['epoch_ms']:>11.2f} ms/epoch"
              f"{row['convert_ms']:>10.2f} ms converting  {row['speedup']}")
    return rows


# batch_accuracy.csv: test accuracy over seeds, the same seeds for both backends.

def accuracy_runs(task, sampler, adjacencies, args, device, name) -> list[dict]:
    results = {}
    for seed in range(args.seed, args.seed + args.seeds):
        for mode in ("mini-batch", "full-batch"):
            for backend in BACKENDS:
                adj_t = adjacencies[backend][0]
                model = new_model(backend, "mean", task, args, device, seed)
                optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE[mode])
                if mode == "mini-batch":
                    loader = BlockLoader(sampler, task.split["train"], args.batch_size, shuffle=True,
                                         generator=torch.Generator(device=device).manual_seed(seed))
                    for _ in range(args.accuracy_epochs):
                        model.train()
                        for batch in loader:
                            train_step(model, optimizer, batch, task.x, task.y, backend)
                else:
                    for _ in range(args.full_accuracy_epochs):
                        full_batch_epoch(model, optimizer, task.x, task.y, adj_t, task.split["train"])
                accuracy = evaluate(model, task, task.x, adj_t)["test"]
                results.setdefault((mode, backend), []).append(accuracy)
                print(f"  seed {seed} {mode:<11}{backend:<5} test accuracy {accuracy:.4f}")
    rows = []
    for (mode, backend), accuracies in results.items():
        rows.append({"mode": mode, "backend": backend, "device": name, "seeds": len(accuracies),
                     "epochs": args.accuracy_epochs if mode == "mini-batch" else args.full_accuracy_epochs,
                     "test_acc_mean": round(statistics.mean(accuracies), 4),
                     "test_acc_std": round(statistics.pstdev(accuracies), 4)})
        print(f"{mode:<11}{backend:<5} test accuracy {rows[-1]['test_acc_mean']:.4f} +- {rows[-1]['test_acc_std']:.4f}"
              f" over {len(accuracies)} seeds")
    return rows


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    nodes = args.nodes or (NUM_NODES if device.type == "cuda" else 20_000)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    began = time.perf_counter()
    task, seconds = timed_s(lambda: products_task(nodes, args.graph_seed, device), device)
    sampler = NeighborSampler.from_edge_index(task.edge_index, args.fanout, nodes)
    print(f"ogbn-products-shaped graph on {name}: {nodes} nodes, {task.edge_index.size(1)} nonzeros, made in "
          f"{seconds:.1f} s; batches of {args.batch_size} seeds, fan-out {args.fanout}")
    rows = conversion_table(sampler, task.split["train"], args, device, name)
    print(f"wrote {write_csv(out_dir(args.out) / 'batch.csv', rows, FIELDS)}")
    if not args.train:
        return rows
    epochs = minibatch_epochs(task, sampler, args, device, name)
    adjacencies = {backend: timed_s(lambda: prepare_adjacency(backend, task.edge_index, nodes), device)
                   for backend in BACKENDS}
    epochs += full_batch_epochs(task, adjacencies, args, device, name)
    print(f"wrote {write_csv(out_dir(args.out) / 'batch_epoch.csv', epochs, EPOCH_FIELDS)} "
          f"({time.perf_counter() - began:.0f} s so far)")
    accuracy = accuracy_runs(task, sampler, adjacencies, args, device, name) if args.seeds else []
    if accuracy:
        print(f"wrote {write_csv(out_dir(args.out) / 'batch_accuracy.csv', accuracy, ACCURACY_FIELDS)}")
    print(f"done in {time.perf_counter() - began:.0f} s")
    return rows + epochs + accuracy


if __name__ == "__main__":
    main()
