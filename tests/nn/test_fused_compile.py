"""PyG's layers through ``fused(Layer)`` on a TCSparseTensor compile with ``fullgraph=True`` and no
graph break, to the eager result: the compiled route README's torch.compile section names (PyG's
own ``propagate`` reads the matrix's layout, which the compiler hides)."""
import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn")

from torch_tcsparse import TCSparseTensor  # noqa: E402
from torch_tcsparse.nn import fused  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

LAYERS = {
    "SAGEConv mean": lambda: fused(pyg_nn.SAGEConv)(16, 8),
    "SAGEConv max": lambda: fused(pyg_nn.SAGEConv)(16, 8, aggr="max"),
    "GINConv": lambda: fused(pyg_nn.GINConv)(torch.nn.Linear(16, 8)),
    "GraphConv": lambda: fused(pyg_nn.GraphConv)(16, 8),
    "GCNConv normalize=False": lambda: fused(pyg_nn.GCNConv)(16, 8, normalize=False),
}


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="needs a CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(LAYERS))
def test_fused_layer_compiles_without_graph_breaks(name, device):
    torch.manual_seed(0)
    layer = LAYERS[name]().to(device)
    edge_index = torch.randint(0, 50, (2, 300), device=device)
    a = TCSparseTensor.from_edge_index(edge_index, torch.rand(300, device=device) + 0.5, num_nodes=50)
    x = torch.randn(50, 16, device=device, requires_grad=True)
    explanation = torch._dynamo.explain(lambda x, a: layer(x, a))(x, a)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(lambda x, a: layer(x, a), fullgraph=True, backend="aot_eager")
    y = compiled(x, a)
    torch.testing.assert_close(y, layer(x, a), rtol=1e-4, atol=1e-5)
    grad, = torch.autograd.grad(y.sum(), x)
    expected, = torch.autograd.grad(layer(x, a).sum(), x)
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-5)
