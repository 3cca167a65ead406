"""Graphs in OGB's on-disk node-property format, read back through ogb's own loader.

``write_node_dataset`` lays a graph out the way an ogbn-* download unpacks (the CSV variant that
ogbn-arxiv, -products and -proteins use)::

    <folder>/RELEASE_v1.txt
    <folder>/raw/{edge,node-feat,node-label,num-node-list,num-edge-list}.csv.gz  (+ edge-feat)
    <folder>/split/<split>/{train,valid,test}.csv.gz
    <folder>/meta_dict.json     the columns ogb's master.csv holds for a registered dataset

and ``load_node_dataset`` passes that meta_dict to ``ogb.nodeproppred.PygNodePropPredDataset``,
which accepts one in place of a registered name, so nothing is downloaded. ``default_dataset`` is
the offline default of the GCN example: a planted-partition graph whose node features carry a
noisy copy of the class, generated once into the cache folder.
"""
from __future__ import annotations

import functools
import gzip
import inspect
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data.data import Data, DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from graph_data.folders import cache_dir, loader_mirror

SPLITS = ("train", "valid", "test")
RELEASE_VERSION = 1

# numpy's array unpickling function, wherever this numpy version keeps it.
_reconstruct = np.zeros(0).__reduce__()[0]
# What ogb's files pickle: PyG ``Data`` in its processed files, numpy arrays in its split files
# (files written by numpy 1 name its old module path).
OGB_FILE_GLOBALS = (
    Data, DataEdgeAttr, DataTensorAttr, GlobalStorage,
    np.ndarray, np.dtype, _reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"),
    *(type(np.dtype(kind)) for kind in (np.bool_, np.int32, np.int64, np.float32, np.float64)),
)


def ogb_file_globals():
    """A context in which ``torch.load`` accepts the types ogb's files hold.

    ogb 1.3.6 calls ``torch.load(path)`` on its processed and split files; torch >= 2.6 loads with
    ``weights_only=True`` by default and refuses them. Allowing exactly these types keeps the
    weights-only unpickler (no code from a file runs), where ``weights_only=False`` would not."""
    return torch.serialization.safe_globals(list(OGB_FILE_GLOBALS))


@dataclass
class NodeGraph:
    """One graph for node-property prediction, as numpy arrays in OGB's conventions.

    ``edge_index`` [2, E] int64 holds each undirected edge once (the loader adds the reverse);
    ``node_label`` is [N, num_tasks]; ``split`` maps train/valid/test to node index arrays;
    ``node_feat`` may be None (as in ogbn-proteins, whose signal sits in ``edge_feat``)."""

    num_nodes: int
    edge_index: np.ndarray
    node_feat: np.ndarray | None
    node_label: np.ndarray
    split: dict[str, np.ndarray]
    edge_feat: np.ndarray | None = None
    num_classes: int = 2
    info: dict = field(default_factory=dict)


def planted_partition(
    num_nodes: int = 4000,
    num_classes: int = 8,
    num_features: int = 64,
    avg_degree: float = 8.0,
    homophily: float = 0.4,
    feature_signal: float = 0.15,
    train_fraction: float = 0.5,
    seed: int = 0,
) -> NodeGraph:
    """A stochastic-block-style graph with learnable labels.

    Each node gets a random class; a fraction ``homophily`` of its edges goes to nodes of its own
    class, the rest anywhere. Features are ``feature_signal * centroid[class] + N(0, 1)``. With
    the defaults, a classifier of the features alone does far worse than one of the features
    averaged over two hops of the normalized graph: the graph carries the signal a GCN has to find.
    Node ids are random, so classes are scattered over the id range as in real graphs."""
    for name, value in (("num_nodes", num_nodes), ("num_classes", num_classes), ("num_features", num_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise ValueError(f"{name} must be an int >= 2, got {value!r}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must lie in [0, 1], got {homophily}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction}")
    if avg_degree <= 0:
        raise ValueError(f"avg_degree must be positive, got {avg_degree}")
    rng = np.random.default_rng(seed)
    label = rng.integers(0, num_classes, num_nodes)
    members = [np.flatnonzero(label == c) for c in range(num_classes)]

    num_draws = int(num_nodes * avg_degree / 2)
    src = rng.integers(0, num_nodes, num_draws)
    dst = rng.integers(0, num_nodes, num_draws)
    same = rng.random(num_draws) < homophily
    for c, nodes in enumerate(members):
        pick = same & (label[src] == c)
        if nodes.size:
            dst[pick] = nodes[rng.integers(0, nodes.size, int(pick.sum()))]
    low, high = np.minimum(src, dst), np.maximum(src, dst)
    pairs = np.unique(np.stack([low, high])[:, low != high], axis=1)

    centroids = rng.standard_normal((num_classes, num_features))
    features = feature_signal * centroids[label] + rng.standard_normal((num_nodes, num_features))

    order = rng.permutation(num_nodes)
    num_train = int(train_fraction * num_nodes)
    num_valid = (num_nodes - num_train) // 2
    split = {
        "train": np.sort(order[:num_train]),
        "valid": np.sort(order[num_train : num_train + num_valid]),
        "test": np.sort(order[num_train + num_valid :]),
    }
    info = {
        "generator": "planted_partition",
        "num_nodes": num_nodes,
        "num_classes": num_classes,
        "num_features": num_features,
        "avg_degree": avg_degree,
        "homophily": homophily,
        "feature_signal": feature_signal,
        "train_fraction": train_fraction,
        "seed": seed,
    }
    return NodeGraph(
        num_nodes=num_nodes,
        edge_index=pairs.astype(np.int64),
        node_feat=features.astype(np.float32),
        node_label=label.astype(np.int64)[:, None],
        split=split,
        num_classes=num_classes,
        info=info,
    )


def _write_csv_gz(path: Path, array: np.ndarray, fmt: str) -> None:
    array = np.asarray(array)
    if array.ndim == 1:
        array = array[:, None]
    # mtime=0 keeps the archives byte-identical across runs of the same generator.
    with gzip.GzipFile(path, "wb", mtime=0) as handle:
        np.savetxt(handle, array, fmt=fmt, delimiter=",")


def meta_dict_for(folder: Path, graph: NodeGraph, name: str, task_type: str, eval_metric: str, split_name: str) -> dict:
    """The meta-information ogb reads from master.csv for a registered dataset, for ``folder``."""
    return {
        "name": name,
        "dir_path": str(folder),
        "version": RELEASE_VERSION,
        "num tasks": int(graph.node_label.shape[1]),
        "num classes": int(graph.num_classes),
        "eval metric": eval_metric,
        "task type": task_type,
        "download_name": Path(folder).name,
        "url": "",
        "add_inverse_edge": "True",
        "has_node_attr": str(graph.node_feat is not None),
        "has_edge_attr": str(graph.edge_feat is not None),
        "split": split_name,
        "additional node files": "None",
        "additional edge files": "None",
        "is hetero": "False",
        "binary": "False",
    }


def write_node_dataset(
    graph: NodeGraph,
    folder,
    name: str = "ogbn-synthetic",
    task_type: str = "multiclass classification",
    eval_metric: str = "acc",
    split_name: str = "random",
) -> dict:
    """Write ``graph`` into ``folder`` in OGB's CSV node-property layout; returns the meta_dict
    (also saved as ``meta_dict.json``) to pass to ``PygNodePropPredDataset``."""
    if "classification" not in task_type and "regression" not in task_type:
        raise ValueError(f"task_type must name a classification or regression task, got {task_type!r}")
    if eval_metric not in ("acc", "rocauc"):
        raise ValueError(f"eval_metric must be 'acc' or 'rocauc' (ogb's node metrics), got {eval_metric!r}")
    if graph.edge_index.ndim != 2 or graph.edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {graph.edge_index.shape}")
    for name, array in (("node_feat", graph.node_feat), ("node_label", graph.node_label)):
        if array is not None and array.shape[0] != graph.num_nodes:
            raise ValueError(f"{name} has {array.shape[0]} rows, expected one per node ({graph.num_nodes})")
    if graph.node_label.ndim != 2:
        raise ValueError(f"node_label must be [num_nodes, num_tasks], got shape {graph.node_label.shape}")
    if set(graph.split) != set(SPLITS):
        raise ValueError(f"split must hold exactly {SPLITS}, got {sorted(graph.split)}")
    folder = Path(folder).resolve()
    raw, split_dir = folder / "raw", folder / "split" / split_name
    raw.mkdir(parents=True, exist_ok=True)
    split_dir.mkdir(parents=True, exist_ok=True)

    num_edges = graph.edge_index.shape[1]
    _write_csv_gz(raw / "edge.csv.gz", graph.edge_index.T, "%d")
    _write_csv_gz(raw / "num-node-list.csv.gz", np.array([graph.num_nodes]), "%d")
    _write_csv_gz(raw / "num-edge-list.csv.gz", np.array([num_edges]), "%d")
    if graph.node_feat is not None:
        _write_csv_gz(raw / "node-feat.csv.gz", graph.node_feat, "%.7g")
    label_format = "%d" if np.issubdtype(graph.node_label.dtype, np.integer) else "%.7g"
    _write_csv_gz(raw / "node-label.csv.gz", graph.node_label, label_format)
    if graph.edge_feat is not None:
        _write_csv_gz(raw / "edge-feat.csv.gz", graph.edge_feat, "%.7g")
    for part in SPLITS:
        _write_csv_gz(split_dir / f"{part}.csv.gz", graph.split[part], "%d")
    (folder / f"RELEASE_v{RELEASE_VERSION}.txt").write_text(f"# {name}: written by torch_tcsparse\n{json.dumps(graph.info)}\n")

    meta = meta_dict_for(folder, graph, name, task_type, eval_metric, split_name)
    (folder / "meta_dict.json").write_text(json.dumps(meta, indent=1))
    return meta


def read_meta_dict(folder) -> dict:
    """The meta_dict saved by ``write_node_dataset``, pointed at ``folder`` wherever it now lies."""
    folder = Path(folder).resolve()
    path = folder / "meta_dict.json"
    if not path.is_file():
        raise ValueError(f"folder {folder} holds no meta_dict.json: not a dataset written by write_node_dataset")
    meta = json.loads(path.read_text())
    meta["dir_path"] = str(folder)
    return meta


def load_node_dataset(folder, transform=None):
    """``(dataset, evaluator)``: ogb's ``PygNodePropPredDataset`` and ``Evaluator`` for a folder
    written by ``write_node_dataset``. ``folder`` is only read: ogb's processed files go to a
    mirror of it in the cache (``folders.loader_mirror``)."""
    meta = read_meta_dict(folder)
    return _open(loader_mirror(folder), meta, transform)


def _open(folder: Path, meta: dict, transform):
    from ogb.nodeproppred import PygNodePropPredDataset

    meta = dict(meta, dir_path=str(folder))
    with ogb_file_globals():
        dataset = PygNodePropPredDataset(meta["name"], transform=transform, meta_dict=meta)
    return dataset, meta_dict_evaluator(meta)


def meta_dict_evaluator(meta_dict: dict):
    """ogb's node ``Evaluator`` for a dataset known by its meta_dict instead of master.csv (the
    Evaluator reads only the task count and the metric from there). ogb is imported here, on
    first use: the modules that import this one (the examples, the mini-batch benchmark on its
    generated graph) run without ogb where they never read an OGB folder."""
    return _meta_dict_evaluator()(meta_dict)


@functools.cache
def _meta_dict_evaluator() -> type:
    from ogb.nodeproppred import Evaluator

    class MetaDictEvaluator(Evaluator):
        def __init__(self, meta_dict: dict):
            self.name = meta_dict["name"]
            self.num_tasks = int(meta_dict["num tasks"])
            self.eval_metric = meta_dict["eval metric"]

    return MetaDictEvaluator


DEFAULT_NAME = "ogbn-synthetic-sbm"


def default_dataset(transform=None, **generator_options):
    """``(dataset, evaluator)`` for the offline default: ``planted_partition(**generator_options)``
    in OGB format under ``generated/`` in the cache folder, generated and processed on first use.

    The folder name encodes the generator options, so different graphs never collide; a new
    folder is built in a temporary sibling and renamed into place, so concurrent or interrupted
    runs never see half a dataset."""
    options = _generator_defaults() | generator_options
    root = cache_dir() / "generated"
    folder = root / ("synthetic_sbm_" + "_".join(f"{key}{options[key]}" for key in sorted(options)))
    if not (folder / "meta_dict.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging_", dir=root))
        try:
            meta = write_node_dataset(planted_partition(**options), staging, name=DEFAULT_NAME)
            _open(staging, meta, None)
            try:
                staging.rename(folder)
            except OSError:
                if not (folder / "meta_dict.json").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return _open(folder, read_meta_dict(folder), transform)


def _generator_defaults() -> dict:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(planted_partition).parameters.items()
    }
