"""CPU A @ X from ME-TCF equals scipy's product on every real graph (``*.npz`` in
``graph_data.npz.graph_dir()``; skipped with a reason where there is none, as on a user's machine)."""
import numpy as np
import pytest
import torch

from graph_data.npz import graph_dir, list_graphs, load_adjacency
from torch_tcsparse import TCSparseTensor

GRAPHS = list_graphs()
FEATURES = 32
RELATIVE = 1e-5

pytestmark = pytest.mark.skipif(not GRAPHS, reason=f"no real graphs (*.npz) in {graph_dir()}")


@pytest.mark.parametrize("path", GRAPHS or [None], ids=lambda p: p.stem if p else "none")
def test_product_equals_scipy(path):
    adjacency = load_adjacency(path)
    a = TCSparseTensor.from_scipy(adjacency)
    assert a.dtype == torch.float32 and a.shape == adjacency.shape and a.nnz == adjacency.nnz
    x = torch.randn(adjacency.shape[1], FEATURES, generator=torch.Generator().manual_seed(0))
    x64 = x.double().numpy()
    expected = adjacency.astype(np.float64) @ x64
    # Per-entry scale |A| @ |X|: a bound that holds for entries that cancel to near zero.
    scale = abs(adjacency.astype(np.float64)) @ np.abs(x64)
    for engine in ("reference", "csr"):
        y = a.matmul(x, path=engine)
        assert y.dtype == torch.float32 and y.shape == expected.shape
        error = np.abs(y.double().numpy() - expected)
        relative = np.linalg.norm(error) / max(np.linalg.norm(expected), 1e-30)
        assert relative <= RELATIVE, f"{engine}: relative error {relative:.2e}"
        worst = float((error / np.maximum(scale, 1e-30)).max())
        assert worst <= RELATIVE, f"{engine}: worst entry error {worst:.2e} of |A| @ |X|"
