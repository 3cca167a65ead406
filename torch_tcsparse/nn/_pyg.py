"""PyG (torch_geometric), imported on first use: GCN normalization calls PyG's own functions,
and PyG is an optional extra, slow to import, that ``import torch_tcsparse`` must not need."""
from __future__ import annotations

import importlib

_INSTALL = 'pip install -e ".[pyg]" in a clone of torch_tcsparse, or pip install "torch-geometric>=2.5"'


def load(module_name: str, attribute: str):
    """``module_name.attribute`` from PyG, or an ImportError that says how to install PyG. An
    ImportError raised inside an installed PyG (a missing dependency of its own) is kept."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.partition(".")[0] != "torch_geometric":
            raise
        raise ImportError(
            f"GCN normalization calls PyG's {attribute}, and PyG (torch_geometric) is not installed: {_INSTALL}"
        ) from error
    return getattr(module, attribute)


def gcn_norm():
    return load("torch_geometric.nn.conv.gcn_conv", "gcn_norm")


def maybe_num_nodes():
    return load("torch_geometric.utils.num_nodes", "maybe_num_nodes")
