"""Datasets of the GCN example, each loaded through its own project's loader.

- the offline default and any folder written by ``write_node_dataset``: ogb's
  ``PygNodePropPredDataset`` with a meta_dict (``torch_tcsparse.datasets.ogb_format``);
- ogbn-arxiv / -products / -proteins: ``PygNodePropPredDataset`` (downloads when absent);
- ogbl-ddi: ``PygLinkPropPredDataset``;
- Cora / CiteSeer / PubMed: PyG's ``Planetoid`` on the raw Planetoid files.

Read-only roots (such as ../shared/data) are mirrored into the cache so the loaders can write
their ``processed/`` folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch_geometric.utils import scatter, to_undirected

from torch_tcsparse.datasets import ogb_format

PLANETOID = ("Cora", "CiteSeer", "PubMed")


@dataclass
class NodeTask:
    x: torch.Tensor
    y: torch.Tensor  # [N, tasks]: class ids (multiclass) or 0/1 targets (binary)
    edge_index: torch.Tensor  # both directions of every edge
    split: dict
    num_outputs: int
    metric: str  # "acc" or "rocauc"
    evaluator: object  # ogb Evaluator: .eval({"y_true", "y_pred"}) -> {metric: value}


@dataclass
class LinkTask:
    num_nodes: int
    edge_index: torch.Tensor
    split_edge: dict
    evaluator: object


def _dataset_dir_name(name: str) -> str:
    return "_".join(name.split("-"))


def _loader_root(root, name: str) -> Path:
    root = Path(root)
    if (root / _dataset_dir_name(name)).is_dir():
        return ogb_format.writable_root(root, _dataset_dir_name(name))
    return root  # absent: ogb downloads it into root


def _node_task(dataset, evaluator, symmetrize: bool, features_from_edges: bool) -> NodeTask:
    data = dataset[0]
    edge_index = data.edge_index
    if symmetrize:
        edge_index = to_undirected(edge_index, num_nodes=data.num_nodes)
    x = data.x
    if features_from_edges:
        # ogbn-proteins has no node features: OGB's example averages each node's edge features.
        x = scatter(data.edge_attr, data.edge_index[1], dim=0, dim_size=data.num_nodes, reduce="mean")
    metric = evaluator.eval_metric
    num_outputs = dataset.num_classes if metric == "acc" else data.y.size(1)
    return NodeTask(x.float(), data.y, edge_index, dataset.get_idx_split(), num_outputs, metric, evaluator)


def load_default(cache=None, **generator_options) -> NodeTask:
    dataset, evaluator = ogb_format.default_dataset(cache, **generator_options)
    return _node_task(dataset, evaluator, symmetrize=False, features_from_edges=False)


def load_folder(folder) -> NodeTask:
    dataset, evaluator = ogb_format.load_node_dataset(folder)
    features_from_edges = dataset[0].x is None and dataset[0].edge_attr is not None
    return _node_task(dataset, evaluator, symmetrize=False, features_from_edges=features_from_edges)


def load_ogbn(name: str, root) -> NodeTask:
    from ogb.nodeproppred import Evaluator, PygNodePropPredDataset

    with ogb_format.trusted_torch_load():
        dataset = PygNodePropPredDataset(name, root=str(_loader_root(root, name)))
        task = _node_task(
            dataset,
            Evaluator(name),
            symmetrize=name == "ogbn-arxiv",  # arxiv is a directed citation graph; OGB symmetrizes it
            features_from_edges=name == "ogbn-proteins",
        )
    return task


def load_ogbl_ddi(root) -> LinkTask:
    from ogb.linkproppred import Evaluator, PygLinkPropPredDataset

    with ogb_format.trusted_torch_load():
        dataset = PygLinkPropPredDataset("ogbl-ddi", root=str(_loader_root(root, "ogbl-ddi")))
        split_edge = dataset.get_edge_split()
    data = dataset[0]
    return LinkTask(data.num_nodes, data.edge_index, split_edge, Evaluator("ogbl-ddi"))


def load_planetoid(name: str, root) -> NodeTask:
    import torch_geometric.transforms as T
    from torch_geometric.datasets import Planetoid

    dataset = Planetoid(str(_planetoid_root(root, name)), name, transform=T.NormalizeFeatures())
    data = dataset[0]
    split = {"train": data.train_mask.nonzero().view(-1), "valid": data.val_mask.nonzero().view(-1),
             "test": data.test_mask.nonzero().view(-1)}
    # ogb's own accuracy code, told the task shape by a meta_dict as for any unregistered dataset.
    evaluator = ogb_format.MetaDictEvaluator({"name": name, "num tasks": 1, "eval metric": "acc"})
    return NodeTask(data.x, data.y.view(-1, 1), data.edge_index, split, dataset.num_classes, "acc", evaluator)


def _planetoid_root(root, name: str) -> Path:
    root = Path(root)
    if not (root / name / "raw").is_dir():
        raise ValueError(f"no Planetoid raw files for {name} under {root} (expected {root / name / 'raw'})")
    return ogb_format.writable_root(root, name)
