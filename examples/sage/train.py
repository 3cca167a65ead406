"""GraphSAGE training with PyG's SAGEConv on our TCSparseTensor ``adj_t`` or on PyG's own formats.

Run from the repository root:

    python -m examples.sage.train                          # offline default, full batch, our adj_t
    python -m examples.sage.train --backend pyg            # PyG's torch.sparse CSR adj_t (edge_index for max on CUDA)
    python -m examples.sage.train --aggr max
    python -m examples.sage.train --synthetic              # ogbn-products-shaped graph made in memory
    python -m examples.sage.train --neighbor-loader        # sampled mini-batches, per-layer blocks
    python -m examples.sage.train --dataset ogbn-products --root DIR

Datasets are the GCN example's (``examples.gcn.data``): the offline OGB-format default, a folder
written by ``graph_data.ogb_format.write_node_dataset``, OGB's node datasets and Planetoid; or,
with ``--synthetic``, an ogbn-products-shaped graph made in memory on the device
(``examples.sage.products``). Each epoch prints its time (forward, backward and optimizer step
over the whole graph or over every sampled batch, sampling included) and the accuracy on the
train, valid and test splits (full-graph inference).

``--neighbor-loader`` samples the training nodes' neighbourhoods as PyG's ``NeighborLoader``
does, with ``torch_tcsparse.loader`` on the device (PyG's own loader where pyg-lib is installed),
and trains each layer on its bipartite block (``examples.sage.blocks``).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
import torch_geometric.typing

from examples.gcn import data as datasets
from examples.gcn.train import load_task, synchronize
from examples.sage.blocks import from_pyg_batch, train_step
from examples.sage.models import AGGRS, BACKENDS, SAGE, prepare_adjacency, pyg_format_for
from examples.sage.products import products_task
from torch_tcsparse.loader import BlockLoader, NeighborSampler

# ogbn-products has 2,449,029 nodes (--nodes); the default keeps a CPU run short.
SYNTHETIC_NODES = 20_000


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="synthetic",
                        help="synthetic (offline default), a folder written by write_node_dataset, an OGB node "
                             f"dataset or one of {list(datasets.PLANETOID)}")
    parser.add_argument("--root", default=None, help="folder holding a downloaded dataset's folder, only read")
    parser.add_argument("--synthetic", action="store_true",
                        help="an ogbn-products-shaped graph made in memory (47 classes, 100 features, degree 50.5)")
    parser.add_argument("--nodes", type=int, default=SYNTHETIC_NODES, help="node count of --synthetic")
    parser.add_argument("--backend", choices=BACKENDS, default="ours")
    parser.add_argument("--aggr", choices=AGGRS, default="mean")
    parser.add_argument("--neighbor-loader", action="store_true",
                        help="sampled mini-batches of per-layer blocks (torch_tcsparse.loader; PyG's "
                             "NeighborLoader where pyg-lib is installed)")
    parser.add_argument("--fanout", type=int, nargs="+", default=[15, 10, 5], help="neighbours sampled per layer")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... or auto")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for key, least in (("nodes", 2), ("batch_size", 1), ("epochs", 1), ("layers", 1), ("hidden", 1)):
        if getattr(args, key) < least:
            parser.error(f"--{key.replace('_', '-')} must be at least {least}, got {getattr(args, key)}")
    if min(args.fanout) < 1:
        parser.error(f"--fanout counts must be at least 1, got {args.fanout}")
    if args.synthetic and args.dataset != "synthetic":
        parser.error(f"--synthetic generates its graph: drop --dataset {args.dataset}")
    if args.neighbor_loader and len(args.fanout) != args.layers:
        parser.error(f"--fanout needs one count per layer ({args.layers}), got {args.fanout}")
    return args


def pyg_sampler_available() -> bool:
    """PyG 2.8's NeighborLoader samples through pyg-lib or torch-sparse; only pyg-lib reports the
    per-hop counts that split a batch into per-layer blocks."""
    return torch_geometric.typing.WITH_PYG_LIB


class PygBatches:
    """The batches of PyG's ``NeighborLoader`` as ``SampledBatch``es on ``device``, every epoch."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, device

    def __iter__(self):
        return (from_pyg_batch(batch).to(self.device) for batch in self.loader)


def neighbor_loader(task, args, device):
    """The training nodes' batches, each a ``SampledBatch`` on ``device``."""
    train_idx = task.split["train"]
    if pyg_sampler_available():
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader

        graph = Data(edge_index=task.edge_index.cpu(), num_nodes=task.x.size(0))
        loader = NeighborLoader(graph, num_neighbors=args.fanout, batch_size=args.batch_size,
                                input_nodes=train_idx.cpu(), shuffle=True)
        return PygBatches(loader, device), "PyG's NeighborLoader (pyg-lib)"
    sampler = NeighborSampler.from_edge_index(task.edge_index.to(device), args.fanout, task.x.size(0))
    generator = torch.Generator(device=device).manual_seed(args.seed)
    return BlockLoader(sampler, train_idx, args.batch_size, shuffle=True, generator=generator), \
        "torch_tcsparse.loader on the device"


def adjacency(args, edge_index, num_nodes, device):
    return prepare_adjacency(args.backend, edge_index, num_nodes, pyg_format_for(args.aggr, device))


@torch.no_grad()
def evaluate(model, task, x, adj_t):
    model.eval()
    pred = model(x, adj_t).argmax(dim=-1, keepdim=True)
    return {part: task.evaluator.eval({"y_true": task.y[index], "y_pred": pred[index]})["acc"]
            for part, index in task.split.items()}


def full_batch_epoch(model, optimizer, x, y, adj_t, train_idx):
    model.train()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x, adj_t)[train_idx], y[train_idx])
    loss.backward()
    optimizer.step()
    return loss.item()


def sampled_epoch(model, optimizer, batches, x, y, backend, pyg_format):
    """One pass over ``batches`` (``SampledBatch``es), a step each; the mean loss over seeds."""
    model.train()
    total, count = x.new_zeros(()), 0
    for batch in batches:
        total += train_step(model, optimizer, batch, x, y, backend, pyg_format) * batch.batch_size
        count += batch.batch_size
    return float(total) / max(count, 1)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    task = products_task(args.nodes, args.seed, device) if args.synthetic else load_task(args)
    if getattr(task, "metric", None) != "acc":
        raise SystemExit(f"{args.dataset} is not a single-label node classification dataset: this example "
                         f"trains node classifiers scored by accuracy")
    num_nodes = task.x.size(0)
    synchronize(device)
    start = time.perf_counter()
    adj_t = adjacency(args, task.edge_index.to(device), num_nodes, device)
    synchronize(device)
    print(f"{args.backend} adj_t ({args.aggr}) on {device}: {num_nodes} nodes, {task.edge_index.size(1)} edges, "
          f"built in {time.perf_counter() - start:.3f} s")

    torch.manual_seed(args.seed)
    model = SAGE(args.backend, task.x.size(1), args.hidden, task.num_outputs, args.layers, args.dropout,
                 args.aggr).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    x, y, train_idx = task.x.to(device), task.y.view(-1).to(device), task.split["train"].to(device)
    pyg_format = pyg_format_for(args.aggr, device)
    if args.neighbor_loader:
        loader, sampler_name = neighbor_loader(task, args, device)
        print(f"mini-batches of {args.batch_size} seeds, fan-out {args.fanout}, sampled by {sampler_name}")

    history = []
    for epoch in range(1, args.epochs + 1):
        synchronize(device)
        start = time.perf_counter()
        if args.neighbor_loader:
            loss = sampled_epoch(model, optimizer, loader, x, y, args.backend, pyg_format)
        else:
            loss = full_batch_epoch(model, optimizer, x, y, adj_t, train_idx)
        synchronize(device)
        seconds = time.perf_counter() - start
        scores = evaluate(model, task, x, adj_t)
        history.append({"epoch": epoch, "seconds": seconds, "loss": loss, **scores})
        print(f"epoch {epoch:3d}  {seconds * 1e3:8.1f} ms  loss {loss:.4f}  train {scores['train']:.4f}  "
              f"valid {scores['valid']:.4f}  test {scores['test']:.4f}")
    return history


if __name__ == "__main__":
    try:
        main()
    except datasets.MissingData as error:
        raise SystemExit(str(error)) from None
