"""Full-batch GCN training across processes: the rows of the graph are partitioned, each rank
holds its part (torch_tcsparse.distributed), the weights are replicated and their gradients
reduced by DistributedDataParallel. Run from the repository root:

    torchrun --nproc-per-node 2 -m examples.gcn.train_distributed                  # offline default graph
    torchrun --nproc-per-node 1 -m examples.gcn.train_distributed                  # the same loss curve, one process
    torchrun --nproc-per-node 2 -m examples.gcn.train_distributed --dataset Cora   # datasets as examples.gcn.train
    torchrun --nproc-per-node 4 -m examples.gcn.train_distributed --partitioner contiguous --json run.json
    torchrun --nproc-per-node 2 -m examples.gcn.train_distributed --halo-dtype bfloat16 --overlap

NCCL on GPUs (one per process, ``--device cuda``, the default when CUDA is present), gloo on
CPUs. The model is examples.gcn.models.GCN on distributed layers: with the same seed it starts
from the same weights. Batch normalization takes its statistics over all ranks and dropout
draws its mask from (seed, epoch, layer, node, channel), so the loss curve does not depend on
the number of processes or the partition, up to floating-point rounding. Every rank loads the
dataset; a rank keeps only its rows of the graph, features and labels. Node tasks only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from torch_tcsparse.distributed import (
    DistributedGCNConv,
    GlobalBatchNorm1d,
    NodePartition,
    gcn_part,
    node_dropout,
    partition_rows,
)
from torch_tcsparse.distributed.partition import METHODS

HALO_DTYPES = {"none": None, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dropout seeds are 32-bit: one per (run seed, epoch, layer).
_SEED_SPACE = 1 << 32
_LAYER_SLOTS = 64


class DistributedGCN(torch.nn.Module):
    """examples.gcn.models.GCN on a GraphPart: conv -> [BatchNorm] -> ReLU -> dropout, repeated,
    then a last conv; parameters created in the same order, with the same state-dict keys."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers, dropout, batch_norm=False):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = torch.nn.ModuleList(DistributedGCNConv(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        hidden_sizes = sizes[1:-1] if batch_norm else []
        self.norms = torch.nn.ModuleList(GlobalBatchNorm1d(size) for size in hidden_sizes)
        self.dropout = dropout

    def forward(self, x, part, nodes, dropout_seed: int):
        for i, conv in enumerate(self.convs[:-1]):
            x = conv(x, part)
            if self.norms:
                x = self.norms[i](x)
            x = F.relu(x)
            x = node_dropout(x, nodes, self.dropout, (dropout_seed * _LAYER_SLOTS + i) % _SEED_SPACE, self.training)
        return self.convs[-1](x, part)


def dropout_seed(seed: int, epoch: int) -> int:
    """The dropout seed of an epoch of the run with ``seed`` (its layers add their index)."""
    return (seed * 1_000_003 + epoch) % _SEED_SPACE


def graph_csr(edge_index: torch.Tensor, num_nodes: int):
    """``(rowptr, col)`` of ``A[target, source]`` from a [2, E] edge_index."""
    target, source = edge_index[1], edge_index[0]
    order = torch.sort(target, stable=True).indices
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    torch.cumsum(torch.bincount(target, minlength=num_nodes), 0, out=rowptr[1:])
    return rowptr, source[order]


def shared_partition(rowptr, col, method: str, seed: int, row_weight: int = 0) -> NodePartition:
    """Rank 0 partitions; every rank gets its result (METIS need not run alike everywhere)."""
    box = [partition_rows(rowptr, col, dist.get_world_size(), method, seed, row_weight)
           if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def node_loss_sum(out, y, metric: str):
    """The example's loss summed over rows: divided by the global count it is the mean that a
    single process takes."""
    if metric == "rocauc":
        return F.binary_cross_entropy_with_logits(out, y.float(), reduction="sum") / y.size(1)
    return F.cross_entropy(out, y.squeeze(1), reduction="sum")


def split_masks(split: dict, nodes: torch.Tensor, num_nodes: int, device) -> dict:
    masks = {}
    for name, index in split.items():
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[index] = True
        masks[name] = mask[nodes].to(device)
    return masks


@torch.no_grad()
def evaluate(model, task, x, y, part, nodes, masks, device) -> dict:
    model.eval()
    out = model(x, part, nodes, 0)
    if task.metric == "acc":
        correct = (out.argmax(dim=-1, keepdim=True) == y).squeeze(1)
        counts = torch.tensor([[float((correct & masks[p]).sum()), float(masks[p].sum())] for p in task.split],
                              dtype=torch.float64, device=device)
        dist.all_reduce(counts)
        return {p: float(c[0] / c[1]) if c[1] > 0 else 0.0 for p, c in zip(task.split, counts)}
    # Other metrics (ROC-AUC) need every prediction: gathered to every rank, ranked by ogb's evaluator.
    pieces = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, (nodes.cpu(), out.cpu()))
    full = torch.empty(task.y.size(0), out.size(1))
    for piece_nodes, piece_out in pieces:
        full[piece_nodes] = piece_out
    return {p: task.evaluator.eval({"y_true": task.y[index], "y_pred": full[index]})[task.metric]
            for p, index in task.split.items()}


def train_partitioned(task, config: dict, partition: NodePartition, device: torch.device, seed: int,
                      progress: bool = False, overlap: bool = False, halo_dtype=None) -> dict:
    """Train on this rank's part; every rank of the world calls it. ``task`` holds the whole
    graph (``x``, ``y``, ``edge_index``, ``split``, ``num_outputs``, ``metric``, ``evaluator``);
    the rank keeps its rows. ``overlap`` and ``halo_dtype``: the part's halo exchange
    (``gcn_part``). Returns the losses (global means), epoch times and the best and last
    evaluations."""
    rank, world = dist.get_rank(), dist.get_world_size()
    num_nodes = task.x.size(0)
    rowptr, col = graph_csr(task.edge_index, num_nodes)
    rows = partition.rows(rowptr, col, None, rank)
    part = gcn_part(rows[0].to(device), rows[1].to(device), None, partition.bounds, overlap=overlap,
                    halo_dtype=halo_dtype)
    nodes = partition.nodes(rank)
    x, y = task.x[nodes].to(device), task.y[nodes].to(device)
    masks = split_masks(task.split, nodes, num_nodes, device)
    nodes = nodes.to(device)
    train_count = len(task.split["train"])

    torch.manual_seed(seed)
    model = DistributedGCN(task.x.size(1), config["hidden"], task.num_outputs, config["layers"], config["dropout"],
                           config["batch_norm"]).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])

    losses, epoch_times, best, last = [], [], None, None
    for epoch in range(1, config["epochs"] + 1):
        start = time.perf_counter()
        ddp.train()
        optimizer.zero_grad()
        out = ddp(x, part, nodes, dropout_seed(seed, epoch))
        train = masks["train"]
        local = node_loss_sum(out[train], y[train], task.metric)
        # DDP averages the ranks' gradients: each rank's share is scaled by the world size.
        (local * (world / train_count)).backward()
        optimizer.step()
        total = local.detach().reshape(1).double()
        dist.all_reduce(total)
        losses.append(float(total) / train_count)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_times.append(time.perf_counter() - start)
        if epoch % config["eval_steps"] == 0 or epoch == config["epochs"]:
            last = evaluate(model, task, x, y, part, nodes, masks, device) | {"epoch": epoch}
            if best is None or last["valid"] > best["valid"]:
                best = last
            if progress and rank == 0:
                print(f"epoch {epoch}: loss {losses[-1]:.4f} valid {last['valid']:.4f} test {last['test']:.4f}",
                      file=sys.stderr)
    return {"losses": losses, "epoch_times": epoch_times, "best": best, "last": last,
            "rows": part.num_own, "halo": part.num_halo, "nnz": part.nnz}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="synthetic",
                        help="as in examples.gcn.train: synthetic, Cora, ogbn-arxiv, ... or a dataset folder")
    parser.add_argument("--root", default=None, help="folder holding the dataset's folder, only read")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="cuda: one GPU per process (LOCAL_RANK), NCCL; cpu: gloo")
    parser.add_argument("--partitioner", choices=METHODS, default="auto")
    parser.add_argument("--row-weight", type=int, default=0,
                        help="a row's weight beside its nonzeros when partitioning (partition_rows)")
    parser.add_argument("--overlap", action="store_true",
                        help="exchange the halo during the interior block's product instead of before the products")
    parser.add_argument("--halo-dtype", choices=tuple(HALO_DTYPES), default="none",
                        help="send halo rows in 16 bits (rounded once per exchange)")
    parser.add_argument("--seed", type=int, default=0)
    for name, kind in (("epochs", int), ("layers", int), ("hidden", int), ("dropout", float), ("lr", float),
                       ("weight_decay", float), ("eval_steps", int)):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None,
                            help="overrides the preset")
    parser.add_argument("--quiet", action="store_true", help="no per-evaluation line")
    parser.add_argument("--json", default=None, help="rank 0 writes the summary to this file")
    args = parser.parse_args(argv)
    if args.row_weight < 0:
        raise SystemExit(f"--row-weight must be at least 0, got {args.row_weight}")
    return args


def main(argv=None) -> None:
    # The dataset loaders need PyG and ogb; the training above does not, so they load here.
    from examples.gcn import data as datasets
    from examples.gcn import train as single

    args = parse_args(argv)
    args.backend, args.runs, args.batch_size = "tcsparse", 1, None
    config = single.resolve_config(args)
    if config["task"] != "node":
        raise SystemExit(f"train_distributed runs node tasks; {args.dataset} is a {config['task']} task")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        device = torch.device("cpu")
        if use_cuda:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        try:
            task = single.load_task(args)
        except datasets.MissingData as error:
            raise SystemExit(f"error: {error}") from None
        rowptr, col = graph_csr(task.edge_index, task.x.size(0))
        partition = shared_partition(rowptr, col, args.partitioner, args.seed, args.row_weight)
        result = train_partitioned(task, config, partition, device, args.seed, progress=not args.quiet,
                                   overlap=args.overlap, halo_dtype=HALO_DTYPES[args.halo_dtype])
        halo = torch.tensor([result["halo"]], device=device)
        dist.all_reduce(halo)
        if dist.get_rank() == 0:
            summary = {"dataset": args.dataset, "processes": dist.get_world_size(), "partitioner": partition.method,
                       "halo_rows": int(halo), "cut_nonzeros": partition.cut_nonzeros(rowptr, col),
                       "config": config, **result}
            if args.json:
                Path(args.json).write_text(json.dumps(summary))
            chosen = summary["best"]
            epoch_ms = 1000 * sorted(result["epoch_times"])[len(result["epoch_times"]) // 2]
            print(f"{args.dataset} [{dist.get_world_size()} x {device.type}, {partition.method} partition]: "
                  f"test {100 * chosen['test']:.2f}% (valid {100 * chosen['valid']:.2f}%, epoch {chosen['epoch']}), "
                  f"final loss {result['losses'][-1]:.4f}, epoch {epoch_ms:.1f} ms (median), "
                  f"halo {int(halo)} rows for {summary['cut_nonzeros']} cut nonzeros")
        # No rank leaves while another still talks to it (gloo aborts on a peer's closed socket).
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
