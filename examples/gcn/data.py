"""Datasets of the GCN example, each loaded through its own project's loader.

- the offline default and any folder written by ``write_node_dataset``: ogb's
  ``PygNodePropPredDataset`` with a meta_dict (``graph_data.ogb_format``);
- ogbn-arxiv / -products / -proteins: ``PygNodePropPredDataset``;
- ogbl-ddi: ``PygLinkPropPredDataset``;
- Cora / CiteSeer / PubMed: PyG's ``Planetoid`` on the raw Planetoid files.

With a ``root``, a dataset is read from there and only read: the loaders' ``processed/`` files go
to a mirror in the cache. Without one, it is downloaded into the cache on first use. Either way a
dataset that is missing raises ``MissingData`` with a one-line message, after checking the files
the loader reads (ogb asks on the terminal whether to "update" a folder lacking its release file,
so its loader is never handed one).
"""
from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch_geometric.utils import scatter, to_undirected

from graph_data import ogb_format
from graph_data.folders import cache_dir, loader_mirror

PLANETOID = ("Cora", "CiteSeer", "PubMed")
PLANETOID_SUFFIXES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


class MissingData(Exception):
    """A dataset is not where it was looked for, or could not be downloaded: the message is one
    line saying what is missing and how to get it."""


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


def folder_name(name: str) -> str:
    """The dataset's folder under its root, as its loader names it."""
    return name if name in PLANETOID else "_".join(name.split("-"))


def _ogb_meta(name: str):
    import ogb
    import pandas as pd

    kind = "linkproppred" if name.startswith("ogbl-") else "nodeproppred"
    master = pd.read_csv(Path(ogb.__file__).parent / kind / "master.csv", index_col=0, keep_default_na=False)
    if name not in master:
        raise ValueError(f"name must be an OGB dataset, got {name!r}")
    return master[name]


def required_files(name: str, root) -> list[Path]:
    """The files the loader of ``name`` reads under ``root`` (ogb's release stamp included)."""
    folder = Path(root) / folder_name(name)
    if name in PLANETOID:
        return [folder / "raw" / f"ind.{name.lower()}.{suffix}" for suffix in PLANETOID_SUFFIXES]
    meta = _ogb_meta(name)
    raw = ["edge", "num-node-list", "num-edge-list"]
    raw += ["node-feat"] if meta["has_node_attr"] == "True" else []
    raw += ["edge-feat"] if meta["has_edge_attr"] == "True" else []
    raw += [] if name.startswith("ogbl-") else ["node-label"]
    for key in ("additional node files", "additional edge files"):
        raw += [] if meta[key] == "None" else meta[key].split(",")
    split_suffix = ".pt" if name.startswith("ogbl-") else ".csv.gz"
    return [
        folder / f"RELEASE_v{meta['version']}.txt",
        *(folder / "raw" / f"{file}.csv.gz" for file in raw),
        *(folder / "split" / meta["split"] / f"{part}{split_suffix}" for part in ogb_format.SPLITS),
    ]


def missing_files(name: str, root) -> list[Path]:
    return [path for path in required_files(name, root) if not path.is_file()]


def download_root(name: str) -> Path:
    return cache_dir() / "downloads" / ("planetoid" if name in PLANETOID else "ogb")


def _source_hint(name: str) -> str:
    if name in PLANETOID:
        return f"PyG's Planetoid files ind.{name.lower()}.* in ROOT/{name}/raw"
    return f"OGB's {name} folder as its zip unpacks, in ROOT/{folder_name(name)}"


def loader_root(name: str, root) -> tuple[Path, bool]:
    """``(root to hand the loader, whether it will download)`` for dataset ``name``."""
    if root is not None:
        missing = missing_files(name, root)
        if missing:
            raise MissingData(f"{name} not found under --root {root} (no {missing[0]}): it needs "
                              f"{_source_hint(name)}; without --root it is downloaded into {download_root(name)}")
        return loader_mirror(Path(root) / folder_name(name)).parent, False
    downloads = download_root(name)
    if not missing_files(name, downloads):
        return downloads, False
    # A folder left by an interrupted download: ogb would stop at a terminal prompt on it.
    shutil.rmtree(downloads / folder_name(name), ignore_errors=True)
    return downloads, True


@contextlib.contextmanager
def loading(name: str, root: Path, downloads: bool):
    """Runs a loader; a failed download leaves nothing behind and raises ``MissingData``."""
    try:
        with ogb_format.ogb_file_globals():
            yield
    except OSError as error:
        if not downloads:
            raise
        shutil.rmtree(root / folder_name(name), ignore_errors=True)
        raise MissingData(f"could not download {name} into {root} ({type(error).__name__}: {error}); offline, "
                          f"pass --root ROOT holding {_source_hint(name)}") from None


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


def load_default(**generator_options) -> NodeTask:
    dataset, evaluator = ogb_format.default_dataset(**generator_options)
    return _node_task(dataset, evaluator, symmetrize=False, features_from_edges=False)


def load_folder(folder) -> NodeTask:
    dataset, evaluator = ogb_format.load_node_dataset(folder)
    features_from_edges = dataset[0].x is None and dataset[0].edge_attr is not None
    return _node_task(dataset, evaluator, symmetrize=False, features_from_edges=features_from_edges)


def load_ogbn(name: str, root=None) -> NodeTask:
    from ogb.nodeproppred import Evaluator, PygNodePropPredDataset

    root, downloads = loader_root(name, root)
    with loading(name, root, downloads):
        dataset = PygNodePropPredDataset(name, root=str(root))
        return _node_task(
            dataset,
            Evaluator(name),
            symmetrize=name == "ogbn-arxiv",  # arxiv is a directed citation graph; OGB symmetrizes it
            features_from_edges=name == "ogbn-proteins",
        )


def load_ogbl_ddi(root=None) -> LinkTask:
    from ogb.linkproppred import Evaluator, PygLinkPropPredDataset

    root, downloads = loader_root("ogbl-ddi", root)
    with loading("ogbl-ddi", root, downloads):
        dataset = PygLinkPropPredDataset("ogbl-ddi", root=str(root))
        split_edge = dataset.get_edge_split()
    data = dataset[0]
    return LinkTask(data.num_nodes, data.edge_index, split_edge, Evaluator("ogbl-ddi"))


def load_planetoid(name: str, root=None) -> NodeTask:
    import torch_geometric.transforms as T
    from torch_geometric.datasets import Planetoid

    root, downloads = loader_root(name, root)
    with loading(name, root, downloads):
        dataset = Planetoid(str(root), name, transform=T.NormalizeFeatures())
    data = dataset[0]
    split = {"train": data.train_mask.nonzero().view(-1), "valid": data.val_mask.nonzero().view(-1),
             "test": data.test_mask.nonzero().view(-1)}
    # ogb's own accuracy code, told the task shape by a meta_dict as for any unregistered dataset.
    evaluator = ogb_format.meta_dict_evaluator({"name": name, "num tasks": 1, "eval metric": "acc"})
    return NodeTask(data.x, data.y.view(-1, 1), data.edge_index, split, dataset.num_classes, "acc", evaluator)
