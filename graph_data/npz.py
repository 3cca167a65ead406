"""Adjacency matrices stored as pickle-free CSR ``.npz`` files (``adj_indptr``, ``adj_indices``,
``adj_shape``, optional ``adj_data``), the layout of the ``graphs/`` folder of the data root."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from graph_data.folders import data_root


def graph_dir() -> Path:
    """The folder of real graphs: ``$TCSPARSE_GRAPHS`` if set, else ``graphs/`` in the data root.
    Tests and benchmarks skip real graphs with a reason when it holds none."""
    return Path(os.environ.get("TCSPARSE_GRAPHS", data_root() / "graphs"))


def list_graphs(folder: Path | None = None) -> list[Path]:
    folder = graph_dir() if folder is None else Path(folder)
    return sorted(folder.glob("*.npz")) if folder.is_dir() else []


def load_adjacency(path: Path, symmetrize: bool = False) -> sp.csr_matrix:
    """The adjacency of one ``.npz`` graph as float32 scipy CSR; directed graphs can be symmetrized."""
    with np.load(path, allow_pickle=False) as data:
        shape = tuple(int(s) for s in data["adj_shape"])
        indptr, indices = data["adj_indptr"], data["adj_indices"]
        values = data["adj_data"] if "adj_data" in data else np.ones(indices.size, dtype=np.float32)
        info = json.loads(str(data["info"])) if "info" in data else {}
    adj = sp.csr_matrix((values.astype(np.float32), indices, indptr), shape=shape)
    if symmetrize and not info.get("symmetric", False):
        adj = ((adj + adj.T) > 0).astype(np.float32).tocsr()
    adj.sum_duplicates()
    return adj
