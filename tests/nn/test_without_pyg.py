"""PyG is an optional extra: the package imports without it, layers that need no normalization
run, and normalizing says how to install it."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_tcsparse
from torch_tcsparse.nn import GCNConv, gcn_norm

INSTALL = r'pip install -e "\.\[pyg\]" in a clone of torch_tcsparse'
EDGE_INDEX = torch.tensor([[0, 1, 2], [1, 2, 3]])


@pytest.fixture
def without_pyg(monkeypatch):
    """Imports of PyG's modules fail as if it were not installed (``None`` in sys.modules)."""
    for name in [name for name in sys.modules if name.partition(".")[0] == "torch_geometric"] + ["torch_geometric"]:
        monkeypatch.setitem(sys.modules, name, None)


def test_normalizing_asks_for_the_pyg_extra(without_pyg):
    with pytest.raises(ImportError, match=INSTALL):
        GCNConv(4, 2)(torch.randn(4, 4), EDGE_INDEX)
    with pytest.raises(ImportError, match=INSTALL):
        gcn_norm(EDGE_INDEX, num_nodes=4)
    with pytest.raises(ImportError, match=INSTALL):
        gcn_norm(EDGE_INDEX)


def test_unnormalized_layer_runs_without_pyg(without_pyg):
    layer = GCNConv(4, 2, normalize=False)
    x = torch.randn(4, 4)
    out = layer(x, EDGE_INDEX)
    adjacency = torch.zeros(4, 4).index_put_((EDGE_INDEX[1], EDGE_INDEX[0]), torch.ones(3))
    torch.testing.assert_close(out, adjacency @ layer.lin(x) + layer.bias)


def test_package_imports_without_pyg():
    code = (
        "import sys; sys.modules['torch_geometric'] = None\n"
        "import torch_tcsparse, torch_tcsparse.nn\n"
        "assert sys.modules['torch_geometric'] is None"
    )
    package_root = Path(torch_tcsparse.__file__).parents[1]  # this checkout, not another install
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=package_root)
    assert result.returncode == 0, result.stderr
