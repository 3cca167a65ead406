"""Full-batch GCN, GraphSAGE or GIN training across processes: the rows of the graph are
partitioned, each rank holds its part (torch_tcsparse.distributed), the weights are replicated and
their gradients reduced by DistributedDataParallel. Run from the repository root:

    torchrun --nproc-per-node 2 -m examples.gcn.train_distributed                  # offline default graph
    torchrun --nproc-per-node 1 -m examples.gcn.train_distributed                  # the same loss curve, one process
    torchrun --nproc-per-node 2 -m examples.gcn.train_distributed --dataset Cora   # datasets as examples.gcn.train
    torchrun --nproc-per-node 4 -m examples.gcn.train_distributed --model sage --aggr max --json run.json
    torchrun --nproc-per-node 2 -m examples.gcn.train_distributed --halo-dtype bfloat16 --overlap

    python -m examples.gcn.blocks --dataset ogbn-products --root DIR --out products_blocks   # once
    torchrun --nproc-per-node 4 -m examples.gcn.train_distributed --blocks products_blocks

NCCL on GPUs (one per process, ``--device cuda``, the default when CUDA is present), gloo on
CPUs. The GCN is examples.gcn.models.GCN on distributed layers: with the same seed it starts
from the same weights. Batch normalization takes its statistics over all ranks and dropout
draws its mask from (seed, epoch, layer, node, channel), so the loss curve does not depend on
the number of processes or the partition, up to floating-point rounding.

Each rank holds only its block of rows (a range of node ids), features, labels and splits; the
blocks are partitioned together (partition_blocks), and Placement moves every row, feature and
label to the rank of its part. With ``--blocks``, the folder examples.gcn.blocks exported, each
rank reads its block's rows from memory-mapped arrays and no process ever holds the whole
dataset. With ``--dataset``, every rank runs the dataset's loader, which reads whole files, and
keeps its block. Node tasks only.
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

from examples.gcn.blocks import block_of, read_block, read_meta
from torch_tcsparse.distributed import (
    DistributedGCNConv,
    DistributedGINConv,
    DistributedSAGEConv,
    GlobalBatchNorm1d,
    GraphPart,
    Placement,
    block_bounds,
    gcn_part,
    node_dropout,
    partition_blocks,
)
from torch_tcsparse.distributed.partition import METHODS

HALO_DTYPES = {"none": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODELS = ("gcn", "sage", "gin")
AGGREGATIONS = ("mean", "sum", "max", "min")

# Dropout seeds are 32-bit: one per (run seed, epoch, layer).
_SEED_SPACE = 1 << 32
_LAYER_SLOTS = 64


class DistributedGNN(torch.nn.Module):
    """conv -> [BatchNorm] -> ReLU -> dropout, repeated, then a last conv, on a GraphPart (or on
    the whole graph's matrix in one process). ``kind``: "gcn" (examples.gcn.models.GCN's layers,
    created in the same order, with the same state-dict keys), "sage" (``aggr``) or "gin" (each
    layer's MLP: Linear, ReLU, Linear)."""

    def __init__(self, kind, in_channels, hidden_channels, out_channels, num_layers, dropout, batch_norm=False,
                 aggr="mean"):
        super().__init__()
        if kind not in MODELS:
            raise ValueError(f"kind must be one of {MODELS}, got {kind!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        sizes = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = torch.nn.ModuleList(_conv(kind, a, b, aggr) for a, b in zip(sizes[:-1], sizes[1:]))
        hidden_sizes = sizes[1:-1] if batch_norm else []
        self.norms = torch.nn.ModuleList(GlobalBatchNorm1d(size) for size in hidden_sizes)
        self.dropout = dropout

    def forward(self, x, part, nodes, dropout_seed: int):
        for i, conv in enumerate(self.convs[:-1]):
            x = conv(x, part)
            if self.norms:
                x = self.norms[i](x)
            # ReLU and dropout in one step: it keeps a byte per entry for the backward pass, not
            # the ReLU's output and the mask beside the dropout's output.
            x = node_dropout(x, nodes, self.dropout, (dropout_seed * _LAYER_SLOTS + i) % _SEED_SPACE, self.training,
                             relu=True)
        return self.convs[-1](x, part)


def _conv(kind: str, in_channels: int, out_channels: int, aggr: str) -> torch.nn.Module:
    if kind == "gcn":
        return DistributedGCNConv(in_channels, out_channels)
    if kind == "sage":
        return DistributedSAGEConv(in_channels, out_channels, aggr)
    mlp = torch.nn.Sequential(torch.nn.Linear(in_channels, out_channels), torch.nn.ReLU(),
                              torch.nn.Linear(out_channels, out_channels))
    return DistributedGINConv(mlp)


def dropout_seed(seed: int, epoch: int) -> int:
    """The dropout seed of an epoch of the run with ``seed`` (its layers add their index)."""
    return (seed * 1_000_003 + epoch) % _SEED_SPACE


def node_loss_sum(out, y, metric: str):
    """The example's loss summed over rows: divided by the global count it is the mean that a
    single process takes."""
    if metric == "rocauc":
        return F.binary_cross_entropy_with_logits(out, y.float(), reduction="sum") / y.size(1)
    return F.cross_entropy(out, y.squeeze(1), reduction="sum")


@torch.no_grad()
def evaluate(model, block, x, y, part, nodes, masks, device, evaluator=None) -> dict:
    model.eval()
    out = model(x, part, nodes, 0)
    splits = list(masks)
    if block.metric == "acc":
        correct = (out.argmax(dim=-1, keepdim=True) == y).squeeze(1)
        counts = torch.tensor([[float((correct & masks[p]).sum()), float(masks[p].sum())] for p in splits],
                              dtype=torch.float64, device=device)
        dist.all_reduce(counts)
        return {p: float(c[0] / c[1]) if c[1] > 0 else 0.0 for p, c in zip(splits, counts)}
    # Other metrics (ROC-AUC) rank every prediction: the predictions (not the graph) are gathered
    # to every rank and ranked by ogb's evaluator.
    pieces = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, (nodes.cpu(), out.cpu(), y.cpu(), {p: m.cpu() for p, m in masks.items()}))
    result = {}
    for split in splits:
        true = torch.cat([piece[2][piece[3][split]] for piece in pieces])
        predicted = torch.cat([piece[1][piece[3][split]] for piece in pieces])
        result[split] = evaluator.eval({"y_true": true, "y_pred": predicted})[block.metric]
    return result


def place(block, device, method: str, seed: int, row_weight: int) -> dict:
    """Partitions the blocks (every rank calls it) and moves this rank's share of rows,
    features, labels and splits to it, on ``device``; columns in partition positions. The
    block goes to ``device`` first: the partitioner's and the moves' collectives run there
    (NCCL carries only GPU tensors)."""
    rowptr, col = block.rowptr.to(device), block.col.to(device)
    part_of_rows = partition_blocks(rowptr, col, block.bounds, method=method, seed=seed, row_weight=row_weight)
    placement = Placement(part_of_rows, block.bounds)
    rowptr, col, _ = placement.move_csr(rowptr, col)
    rank = dist.get_rank()
    first, end = placement.bounds[rank], placement.bounds[rank + 1]
    nodes = placement.move(torch.arange(block.bounds[rank], block.bounds[rank + 1], device=device))
    return {"rowptr": rowptr, "col": col, "bounds": placement.bounds, "nodes": nodes,
            "x": placement.move(block.x.to(device)), "y": placement.move(block.y.to(device)),
            "masks": {name: placement.move(mask.to(device)) for name, mask in block.masks.items()},
            "cut": int(((col < first) | (col >= end)).sum())}


def build_part(placed: dict, model: str, overlap: bool = False, halo_dtype=None) -> GraphPart:
    """This rank's part: the normalized adjacency for GCN, the adjacency for GraphSAGE and GIN."""
    build = gcn_part if model == "gcn" else GraphPart.from_rows
    return build(placed["rowptr"], placed["col"], None, placed["bounds"], overlap=overlap, halo_dtype=halo_dtype)


def train_placed(block, placed: dict, part: GraphPart, config: dict, device: torch.device, seed: int,
                 model_kind: str = "gcn", aggr: str = "mean", progress: bool = False, evaluator=None) -> dict:
    """Train on this rank's part; every rank of the world calls it. Returns the losses (global
    means), epoch times and the best and last evaluations."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes, x, y, masks = placed["nodes"], placed["x"], placed["y"], placed["masks"]
    torch.manual_seed(seed)
    model = DistributedGNN(model_kind, block.num_features, config["hidden"], block.num_outputs, config["layers"],
                           config["dropout"], config["batch_norm"], aggr).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])

    # The features stay as they are through training: their halo rows cross the link once.
    part.fix_features(x)
    losses, epoch_times, best, last = [], [], None, None
    for epoch in range(1, config["epochs"] + 1):
        start = time.perf_counter()
        ddp.train()
        optimizer.zero_grad()
        out = ddp(x, part, nodes, dropout_seed(seed, epoch))
        train = masks["train"]
        local = node_loss_sum(out[train], y[train], block.metric)
        # DDP averages the ranks' gradients: each rank's share is scaled by the world size.
        (local * (world / block.train_count)).backward()
        optimizer.step()
        total = local.detach().reshape(1).double()
        # The output is not kept through the next epoch's forward pass.
        del out, local
        dist.all_reduce(total)
        losses.append(float(total) / block.train_count)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_times.append(time.perf_counter() - start)
        if epoch % config["eval_steps"] == 0 or epoch == config["epochs"]:
            last = evaluate(model, block, x, y, part, nodes, masks, device, evaluator) | {"epoch": epoch}
            if best is None or last["valid"] > best["valid"]:
                best = last
            if progress and rank == 0:
                print(f"epoch {epoch}: loss {losses[-1]:.4f} valid {last['valid']:.4f} test {last['test']:.4f}",
                      file=sys.stderr)
    return {"losses": losses, "epoch_times": epoch_times, "best": best, "last": last,
            "rows": part.num_own, "halo": part.num_halo, "nnz": part.nnz, "cut": placed["cut"]}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=None,
                        help="as in examples.gcn.train: synthetic (the default), Cora, ogbn-arxiv, ... or a dataset "
                             "folder; every rank loads it whole and keeps its block")
    parser.add_argument("--root", default=None, help="folder holding the dataset's folder, only read")
    parser.add_argument("--blocks", default=None,
                        help="a folder written by examples.gcn.blocks: each rank reads only its block")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="cuda: one GPU per process (LOCAL_RANK), NCCL; cpu: gloo")
    parser.add_argument("--model", choices=MODELS, default="gcn")
    parser.add_argument("--aggr", choices=AGGREGATIONS, default="mean", help="GraphSAGE's aggregation")
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
    if args.blocks is not None and (args.dataset is not None or args.root is not None):
        raise SystemExit("--blocks reads an export in place of a dataset: give --blocks or --dataset/--root, not both")
    if args.blocks is None and args.dataset is None:
        args.dataset = "synthetic"
    if args.row_weight < 0:
        raise SystemExit(f"--row-weight must be at least 0, got {args.row_weight}")
    return args


def training_config(args) -> tuple[dict, str]:
    """The run's hyper-parameters (the dataset's preset, overridden by flags) and its dataset's
    name: an export's is in its meta.json."""
    from examples.gcn import train as single

    preset_args = argparse.Namespace(**vars(args), backend="tcsparse", runs=1, batch_size=None)
    dataset = args.dataset
    if args.blocks is not None:
        try:
            dataset = read_meta(args.blocks)["dataset"]
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
        # An export of a dataset folder is named by the folder's path, which need not exist where
        # it trains; such folders take the synthetic preset, as examples.gcn.train gives them.
        preset_args.dataset = dataset if dataset in single.PRESETS else "synthetic"
    config = single.resolve_config(preset_args)
    if config["task"] != "node":
        raise SystemExit(f"train_distributed runs node tasks; {dataset} is a {config['task']} task")
    return config, dataset


def load_block(args, dataset: str):
    """``(block, evaluator)`` of this rank: read from the export, or cut from the loaded task."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if args.blocks is not None:
        try:
            bounds = block_bounds(read_meta(args.blocks)["num_nodes"], world)
            block = read_block(args.blocks, bounds, rank)
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
        return block, export_evaluator(block, dataset)
    # The dataset loaders need PyG and ogb; the training does not, so they load here.
    from examples.gcn import data as datasets
    from examples.gcn import train as single

    try:
        task = single.load_task(args)
    except datasets.MissingData as error:
        raise SystemExit(f"error: {error}") from None
    return block_of(task, block_bounds(task.x.size(0), world), rank), task.evaluator


def export_evaluator(block, dataset: str):
    """ogb's Evaluator for an export's metric, without its dataset: the Evaluator reads only the
    task count and the metric. Accuracy is counted without one (``evaluate``)."""
    if block.metric == "acc":
        return None
    from graph_data import ogb_format

    return ogb_format.meta_dict_evaluator({"name": dataset, "num tasks": block.y.size(1), "eval metric": block.metric})


def train(args, config: dict, dataset: str, device: torch.device) -> dict:
    """Loads this rank's block and trains on it; every rank of the world calls it. Returns the
    run's summary, the halo rows and cut nonzeros summed over the ranks."""
    block, evaluator = load_block(args, dataset)
    placed = place(block, device, args.partitioner, args.seed, args.row_weight)
    part = build_part(placed, args.model, args.overlap, HALO_DTYPES[args.halo_dtype])
    result = train_placed(block, placed, part, config, device, args.seed, args.model, args.aggr,
                          progress=not args.quiet, evaluator=evaluator)
    totals = torch.tensor([result["halo"], result["cut"]], device=device)
    dist.all_reduce(totals)
    return {"dataset": dataset, "processes": dist.get_world_size(), "model": args.model,
            "halo_rows": int(totals[0]), "cut_nonzeros": int(totals[1]), "config": config, **result}


def main(argv=None) -> None:
    args = parse_args(argv)
    config, dataset = training_config(args)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        device = torch.device("cpu")
        if use_cuda:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(device)
        summary = train(args, config, dataset, device)
        if dist.get_rank() == 0:
            if args.json:
                Path(args.json).write_text(json.dumps(summary))
            chosen = summary["best"]
            epoch_ms = 1000 * sorted(summary["epoch_times"])[len(summary["epoch_times"]) // 2]
            print(f"{dataset} [{args.model}, {dist.get_world_size()} x {device.type}]: "
                  f"test {100 * chosen['test']:.2f}% (valid {100 * chosen['valid']:.2f}%, epoch {chosen['epoch']}), "
                  f"final loss {summary['losses'][-1]:.4f}, epoch {epoch_ms:.1f} ms (median), "
                  f"halo {summary['halo_rows']} rows for {summary['cut_nonzeros']} cut nonzeros")
        # No rank leaves while another still talks to it (gloo aborts on a peer's closed socket).
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
