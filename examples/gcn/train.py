"""Full-batch GCN training with torch_tcsparse's GCNConv or PyG's, on OGB and Planetoid graphs.

Run from the repository root:

    python -m examples.gcn.train                                 # offline default
    python -m examples.gcn.train --backend pyg                   # the same model on PyG's GCNConv (CSR adj_t)
    python -m examples.gcn.train --dataset Cora                  # downloaded into the cache on first use
    python -m examples.gcn.train --dataset ogbl-ddi --root DIR   # reads DIR/ogbl_ddi, never writes there
    python -m examples.gcn.train --dataset path/to/folder        # written by graph_data.ogb_format.write_node_dataset
    python -m examples.gcn.train --seed 3 --json run.json        # the summary as JSON too (benchmarks/gcn.py)

The default dataset is a planted-partition graph (4,000 nodes, 8 classes) generated into the cache
folder ($TCSPARSE_CACHE, default ~/.cache/torch_tcsparse) in OGB's on-disk format and read back
through ogb's PygNodePropPredDataset and Evaluator, so it needs no network. Hyper-parameters
follow OGB's reference examples (see PRESETS); flags override them. Preprocessing (normalizing
the graph and, for our backend, building the TCSparseTensor) is timed apart from the epochs; an
epoch is forward, backward and optimizer step. When the first epoch projects a run of more than
half an hour, a warning says so (ogbl-ddi's 200 epochs on a CPU take hours).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from examples.gcn import data as datasets
from examples.gcn.models import BACKENDS, GCN, LinkPredictor, prepare_graph

# A run projected longer than this after its first epoch is announced with a warning.
LONG_RUN_S = 30 * 60

# OGB's reference setups (snap-stanford/ogb examples/*/gnn.py) and Kipf & Welling's for Planetoid.
NODE_OGB = dict(task="node", layers=3, hidden=256, dropout=0.5, lr=0.01, weight_decay=0.0, eval_steps=1)
PRESETS = {
    "synthetic": dict(NODE_OGB, batch_norm=True, epochs=50),
    "ogbn-arxiv": dict(NODE_OGB, batch_norm=True, epochs=500),
    "ogbn-products": dict(NODE_OGB, batch_norm=False, epochs=300),
    "ogbn-proteins": dict(NODE_OGB, batch_norm=False, dropout=0.0, epochs=1000, eval_steps=5),
    "ogbl-ddi": dict(task="link", layers=2, hidden=256, dropout=0.5, lr=0.005, weight_decay=0.0, epochs=200,
                     eval_steps=5, batch_size=64 * 1024, batch_norm=False),
    **{
        name: dict(task="node", layers=2, hidden=16, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200,
                   eval_steps=1, batch_norm=False)
        for name in datasets.PLANETOID
    },
}
# Planetoid's GCN results select nothing on the validation set: report the last epoch.
LAST_EPOCH_DATASETS = set(datasets.PLANETOID)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="synthetic",
                        help=f"one of {sorted(PRESETS)} or a folder written by write_node_dataset")
    parser.add_argument("--root", default=None,
                        help="folder holding the dataset's folder (Cora/, ogbl_ddi/, ...), only read; "
                             "default: downloaded into the cache folder")
    parser.add_argument("--backend", choices=BACKENDS, default="tcsparse")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... or auto")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    for name, kind in (("epochs", int), ("layers", int), ("hidden", int), ("dropout", float), ("lr", float),
                       ("weight_decay", float), ("eval_steps", int), ("batch_size", int)):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None,
                            help="overrides the preset")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--json", default=None, help="also write the summary, per-run results included, to this file")
    return parser.parse_args(argv)


def resolve_config(args) -> dict:
    folder = Path(args.dataset)
    preset_name = "synthetic" if (folder / "meta_dict.json").is_file() else args.dataset
    if preset_name not in PRESETS:
        raise SystemExit(f"unknown dataset {args.dataset!r}: expected one of {sorted(PRESETS)} or a dataset folder")
    config = dict(PRESETS[preset_name])
    for key in ("epochs", "layers", "hidden", "dropout", "lr", "weight_decay", "eval_steps", "batch_size"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    for key in ("epochs", "layers", "hidden", "eval_steps", "batch_size"):
        if key in config and config[key] < 1:
            raise SystemExit(f"--{key.replace('_', '-')} must be at least 1, got {config[key]}")
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1, got {args.runs}")
    if args.root is not None and preset_name == "synthetic":
        raise SystemExit("--root names where a downloaded dataset lies; the synthetic default is generated "
                         "into the cache folder ($TCSPARSE_CACHE)")
    return config


def load_task(args):
    folder = Path(args.dataset)
    if (folder / "meta_dict.json").is_file():
        return datasets.load_folder(folder)
    if args.dataset == "synthetic":
        return datasets.load_default()
    if args.dataset in datasets.PLANETOID:
        return datasets.load_planetoid(args.dataset, args.root)
    if args.dataset == "ogbl-ddi":
        return datasets.load_ogbl_ddi(args.root)
    return datasets.load_ogbn(args.dataset, args.root)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, fn, *args):
    synchronize(device)
    start = time.perf_counter()
    result = fn(*args)
    synchronize(device)
    return result, time.perf_counter() - start


def run_epochs(config, device, seed, progress, train_epoch, evaluate) -> dict:
    """Train for config["epochs"], evaluating every config["eval_steps"] and at the end: the best
    result by validation score, the last one, and the per-epoch times and losses."""
    epoch_times, losses, best, last = [], [], None, None
    bar = tqdm(range(1, config["epochs"] + 1), disable=not progress, leave=False, desc=f"seed {seed}")
    for epoch in bar:
        loss, seconds = timed(device, train_epoch)
        epoch_times.append(seconds)
        if epoch == 1 and seconds * config["epochs"] > LONG_RUN_S:
            bar.write(long_run_warning(seconds, config["epochs"], device), file=sys.stderr)
        losses.append(loss)
        if epoch % config["eval_steps"] == 0 or epoch == config["epochs"]:
            last = evaluate() | {"epoch": epoch}
            if best is None or last["valid"] > best["valid"]:
                best = last
            bar.set_postfix(loss=f"{loss:.3f}", valid=f"{last['valid']:.3f}", test=f"{last['test']:.3f}")
    return {"best": best, "last": last, "epoch_times": epoch_times, "losses": losses}


def long_run_warning(epoch_s: float, epochs: int, device) -> str:
    total_h = epoch_s * epochs / 3600
    return (f"warning: the first epoch took {epoch_s:.1f} s on {device}: {epochs} epochs take about {total_h:.1f} h "
            f"per run (--epochs shortens it)")


# Node property prediction.

def node_loss(out, y, metric):
    if metric == "rocauc":
        return F.binary_cross_entropy_with_logits(out, y.float())
    return F.cross_entropy(out, y.squeeze(1))


@torch.no_grad()
def evaluate_node(model, task, x, graph, edge_weight):
    model.eval()
    out = model(x, graph, edge_weight)
    y_pred = out.argmax(dim=-1, keepdim=True) if task.metric == "acc" else out
    return {
        part: task.evaluator.eval({"y_true": task.y[index], "y_pred": y_pred[index].cpu()})[task.metric]
        for part, index in task.split.items()
    }


def train_node(task, config, backend, device, seed, progress, last_epoch=False):
    (graph, edge_weight), preprocess_s = timed(device, prepare_graph, backend, task.edge_index.to(device), task.x.size(0))
    torch.manual_seed(seed)
    model = GCN(backend, task.x.size(1), config["hidden"], task.num_outputs, config["layers"], config["dropout"],
                config["batch_norm"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
    x, y, train_idx = task.x.to(device), task.y.to(device), task.split["train"].to(device)

    def step():
        model.train()
        optimizer.zero_grad()
        loss = node_loss(model(x, graph, edge_weight)[train_idx], y[train_idx], task.metric)
        loss.backward()
        optimizer.step()
        return loss.item()

    history = run_epochs(config, device, seed, progress, step,
                         lambda: evaluate_node(model, task, x, graph, edge_weight))
    chosen = history.pop("last") if last_epoch else history.pop("best")
    return {"metric": task.metric, **chosen, "preprocess_s": preprocess_s, **history}


# Link property prediction (ogbl-ddi).

def index_batches(count: int, batch_size: int, device, shuffle: bool = False):
    """Batches of indices into ``count`` items, as OGB's examples draw them with a DataLoader over
    ``range(count)``, but made on the device: collating a million Python ints per epoch cost
    about a second of host time per ogbl-ddi epoch, for either backend."""
    order = torch.randperm(count, device=device) if shuffle else torch.arange(count, device=device)
    return order.split(batch_size)


class NegativeSampler:
    """Uniform random node pairs that are neither edges nor self-loops, drawn on the device.

    PyG's ``negative_sampling(method="dense")``, which OGB's example calls, draws its candidates
    with Python's ``random.sample`` on the host: most of an ogbl-ddi epoch for either backend,
    too slow to run ten seeds per backend. Same distribution (uniform over the non-edges, self-loops
    excluded, PyG's pair numbering), except that candidates are drawn with replacement: with
    64k pairs out of 18M, a pair repeats about once in 200 draws."""

    def __init__(self, edge_index: torch.Tensor, num_nodes: int):
        row, col = edge_index
        off_diagonal = row != col
        row, col = row[off_diagonal], col[off_diagonal]
        self.num_nodes = num_nodes
        self.population = num_nodes * (num_nodes - 1)
        self.allowed = torch.ones(self.population, dtype=torch.bool, device=edge_index.device)
        self.allowed[row * (num_nodes - 1) + col - (col > row).long()] = False
        self.share = float(self.allowed.float().mean())

    def __call__(self, count: int) -> torch.Tensor:
        kept = []
        while sum(k.numel() for k in kept) < count:
            candidates = torch.randint(self.population, (int(1.1 * count / self.share) + 1,),
                                       device=self.allowed.device)
            kept.append(candidates[self.allowed[candidates]])
        idx = torch.cat(kept)[:count]
        row, col = idx // (self.num_nodes - 1), idx % (self.num_nodes - 1)
        return torch.stack([row, col + (col >= row).long()])


def link_scores(predictor, h, edges, batch_size):
    return torch.cat([predictor(h[edges[perm, 0]], h[edges[perm, 1]]).squeeze(1).cpu()
                      for perm in index_batches(edges.size(0), batch_size, edges.device)])


@torch.no_grad()
def evaluate_link(model, predictor, emb, graph, edge_weight, split_edge, evaluator, batch_size, device):
    model.eval()
    predictor.eval()
    h = model(emb.weight, graph, edge_weight)
    scores = {key: link_scores(predictor, h, edges.to(device), batch_size) for key, edges in (
        ("train", split_edge["eval_train"]["edge"]), ("valid", split_edge["valid"]["edge"]),
        ("valid_neg", split_edge["valid"]["edge_neg"]), ("test", split_edge["test"]["edge"]),
        ("test_neg", split_edge["test"]["edge_neg"]))}
    evaluator.K = 20
    # As in OGB's example, training edges are ranked against the validation negatives.
    negatives = {"train": "valid_neg", "valid": "valid_neg", "test": "test_neg"}
    return {part: evaluator.eval({"y_pred_pos": scores[part], "y_pred_neg": scores[neg]})["hits@20"]
            for part, neg in negatives.items()}


def train_link(task, config, backend, device, seed, progress):
    edge_index = task.edge_index.to(device)
    (graph, edge_weight), preprocess_s = timed(device, prepare_graph, backend, edge_index, task.num_nodes)
    split_edge = dict(task.split_edge)
    generator = torch.Generator().manual_seed(12345)  # OGB's fixed sample of training edges to evaluate
    sample = torch.randperm(split_edge["train"]["edge"].size(0), generator=generator)
    split_edge["eval_train"] = {"edge": split_edge["train"]["edge"][sample[: split_edge["valid"]["edge"].size(0)]]}

    torch.manual_seed(seed)
    hidden, layers, dropout = config["hidden"], config["layers"], config["dropout"]
    emb = torch.nn.Embedding(task.num_nodes, hidden).to(device)
    torch.nn.init.xavier_uniform_(emb.weight)
    model = GCN(backend, hidden, hidden, hidden, layers, dropout).to(device)
    predictor = LinkPredictor(hidden, hidden, 1, layers, dropout).to(device)
    parameters = [*model.parameters(), *emb.parameters(), *predictor.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=config["lr"])
    pos_train = split_edge["train"]["edge"].to(device)
    negatives = NegativeSampler(edge_index, task.num_nodes)

    def epoch_pass():
        model.train()
        predictor.train()
        total = 0.0
        for perm in index_batches(pos_train.size(0), config["batch_size"], device, shuffle=True):
            optimizer.zero_grad()
            h = model(emb.weight, graph, edge_weight)
            edge = pos_train[perm].t()
            pos_loss = -torch.log(predictor(h[edge[0]], h[edge[1]]) + 1e-15).mean()
            edge = negatives(perm.numel())
            neg_loss = -torch.log(1 - predictor(h[edge[0]], h[edge[1]]) + 1e-15).mean()
            loss = pos_loss + neg_loss
            loss.backward()
            for group in (emb.parameters(), model.parameters(), predictor.parameters()):
                torch.nn.utils.clip_grad_norm_(group, 1.0)
            optimizer.step()
            total += loss.item() * perm.numel()
        return total / pos_train.size(0)

    history = run_epochs(config, device, seed, progress, epoch_pass, lambda: evaluate_link(
        model, predictor, emb, graph, edge_weight, split_edge, task.evaluator, config["batch_size"], device))
    history.pop("last")
    return {"metric": "hits@20", **history.pop("best"), "preprocess_s": preprocess_s, **history}


def run(argv=None) -> dict:
    """Train ``--runs`` models; returns the per-run results and their summary."""
    args = parse_args(argv)
    config = resolve_config(args)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    task, load_s = timed(device, load_task, args)
    runs = []
    for run_index in range(args.runs):
        seed = args.seed + run_index
        if config["task"] == "link":
            result = train_link(task, config, args.backend, device, seed, not args.quiet)
        else:
            last = args.dataset in LAST_EPOCH_DATASETS
            result = train_node(task, config, args.backend, device, seed, not args.quiet, last_epoch=last)
        runs.append(result)
        if not args.quiet:
            print(f"run {run_index + 1}/{args.runs} (seed {seed}): test {result['metric']} {100 * result['test']:.2f}% "
                  f"(valid {100 * result['valid']:.2f}%, epoch {result['epoch']})")
    return {"dataset": args.dataset, "backend": args.backend, "device": str(device), **summarize(runs),
            "load_s": load_s, "runs": runs, "config": config}


def summarize(runs) -> dict:
    """Statistics over runs; a function of its own so runs trained in separate processes (one seed
    each, benchmarks/gcn.py --parallel) merge into the same numbers as one process's runs."""
    tests = [r["test"] for r in runs]
    return {
        "metric": runs[0]["metric"],
        "test_mean": statistics.mean(tests), "test_std": statistics.stdev(tests) if len(tests) > 1 else 0.0,
        "valid_mean": statistics.mean(r["valid"] for r in runs),
        "preprocess_s": statistics.mean(r["preprocess_s"] for r in runs),
        "epoch_ms_median": 1000 * statistics.median(t for r in runs for t in r["epoch_times"]),
    }


def report(summary: dict) -> str:
    metric = "accuracy" if summary["metric"] == "acc" else summary["metric"]
    runs = len(summary["runs"])
    spread = f" ± {100 * summary['test_std']:.2f}" if runs > 1 else ""
    return (
        f"{summary['dataset']} [{summary['backend']}, {summary['device']}]: final test {metric} "
        f"{100 * summary['test_mean']:.2f}%{spread} over {runs} run(s) "
        f"(valid {100 * summary['valid_mean']:.2f}%)\n"
        f"  dataset load {summary['load_s']:.2f} s | preprocessing {1000 * summary['preprocess_s']:.1f} ms | "
        f"epoch {summary['epoch_ms_median']:.1f} ms (median; forward, backward, optimizer step)"
    )


def main(argv=None) -> None:
    try:
        summary = run(argv)
    except datasets.MissingData as error:
        raise SystemExit(f"error: {error}") from None
    path = parse_args(argv).json
    if path:
        Path(path).write_text(json.dumps(summary))
    print(report(summary))


if __name__ == "__main__":
    main()
