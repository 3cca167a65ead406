"""GraphSAGE training with PyG's SAGEConv on our TCSparseTensor ``adj_t`` or on PyG's own formats.

Run from the repository root:

    python -m examples.sage.train                          # offline default, full batch, our adj_t
    python -m examples.sage.train --backend pyg            # PyG's torch.sparse CSR adj_t (edge_index for max on CUDA)
    python -m examples.sage.train --aggr max
    python -m examples.sage.train --synthetic              # ogbn-products-shaped generated graph
    python -m examples.sage.train --neighbor-loader        # PyG's NeighborLoader, each batch CSR-only
    python -m examples.sage.train --dataset ogbn-products --root DIR

Datasets are the GCN example's (``examples.gcn.data``): the offline OGB-format default, a folder
written by ``graph_data.ogb_format.write_node_dataset``, OGB's node datasets and Planetoid. Each
epoch prints its time (forward, backward and optimizer step over the whole graph or over every
sampled batch) and the accuracy on the train, valid and test splits (full-graph inference).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
import torch_geometric.typing

from examples.gcn import data as datasets
from examples.gcn.train import load_task, synchronize
from examples.sage.models import AGGRS, BACKENDS, SAGE, batch_adjacency, prepare_adjacency, pyg_format_for

# ogbn-products: 47 classes, 100 features, about 51 neighbours a node (2.4M nodes: --nodes scales it).
PRODUCTS_SHAPE = dict(num_classes=47, num_features=100, avg_degree=51.0)
SYNTHETIC_NODES = 20_000


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="synthetic",
                        help="synthetic (offline default), a folder written by write_node_dataset, an OGB node "
                             f"dataset or one of {list(datasets.PLANETOID)}")
    parser.add_argument("--root", default=None, help="folder holding a downloaded dataset's folder, only read")
    parser.add_argument("--synthetic", action="store_true",
                        help="an ogbn-products-shaped generated graph (47 classes, 100 features, degree 51)")
    parser.add_argument("--nodes", type=int, default=SYNTHETIC_NODES, help="node count of --synthetic")
    parser.add_argument("--backend", choices=BACKENDS, default="ours")
    parser.add_argument("--aggr", choices=AGGRS, default="mean")
    parser.add_argument("--neighbor-loader", action="store_true",
                        help="mini-batches from PyG's NeighborLoader (needs pyg-lib or torch-sparse)")
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


def neighbor_sampling_available() -> bool:
    """PyG 2.8's NeighborLoader samples through pyg-lib or torch-sparse and fails at the first
    batch without either."""
    return torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE


def adjacency(args, edge_index, num_nodes, device):
    return prepare_adjacency(args.backend, edge_index, num_nodes, pyg_format_for(args.aggr, device))


@torch.no_grad()
def evaluate(model, task, x, adj_t):
    model.eval()
    pred = model(x, adj_t).argmax(dim=-1, keepdim=True).cpu()
    return {part: task.evaluator.eval({"y_true": task.y[index], "y_pred": pred[index]})["acc"]
            for part, index in task.split.items()}


def full_batch_epoch(model, optimizer, x, y, adj_t, train_idx):
    model.train()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x, adj_t)[train_idx], y[train_idx])
    loss.backward()
    optimizer.step()
    return loss.item()


def sampled_epoch(model, optimizer, loader, args, device):
    """One pass over the loader; each sampled subgraph becomes an adj_t used for one step
    (``models.batch_adjacency``: ours CSR-only), its conversion inside the epoch's time."""
    model.train()
    total, count = 0.0, 0
    for batch in loader:
        batch = batch.to(device)
        adj_t = batch_adjacency(args.backend, batch.edge_index, batch.num_nodes, pyg_format_for(args.aggr, device))
        optimizer.zero_grad()
        out = model(batch.x, adj_t)[: batch.batch_size]
        loss = F.cross_entropy(out, batch.y[: batch.batch_size].view(-1))
        loss.backward()
        optimizer.step()
        total, count = total + loss.item() * batch.batch_size, count + batch.batch_size
    return total / count


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    task = datasets.load_default(num_nodes=args.nodes, **PRODUCTS_SHAPE) if args.synthetic else load_task(args)
    if not isinstance(task, datasets.NodeTask) or task.metric != "acc":
        raise SystemExit(f"{args.dataset} is not a single-label node classification dataset: this example "
                         f"trains node classifiers scored by accuracy")
    num_nodes = task.x.size(0)
    use_loader = args.neighbor_loader and neighbor_sampling_available()
    if args.neighbor_loader and not use_loader:
        print("NeighborLoader needs pyg-lib or torch-sparse, neither is installed: training full-batch instead")

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
    if use_loader:
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader

        loader = NeighborLoader(Data(x=task.x, y=task.y.view(-1), edge_index=task.edge_index, num_nodes=num_nodes),
                                num_neighbors=args.fanout, batch_size=args.batch_size,
                                input_nodes=task.split["train"], shuffle=True)

    history = []
    for epoch in range(1, args.epochs + 1):
        synchronize(device)
        start = time.perf_counter()
        if use_loader:
            loss = sampled_epoch(model, optimizer, loader, args, device)
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
