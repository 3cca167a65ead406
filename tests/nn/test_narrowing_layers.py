"""fused(SAGEConv) and fused(GraphConv) with a sum or a mean apply their linear map before the
product where it narrows the features: outputs and every gradient equal PyG's layer on a
torch.sparse CSR adj_t in float64, and the product runs on out_channels columns. Widening maps,
max, hooks, lazy layers and autocast keep PyG's order."""
import copy

import pytest
import torch

from torch_tcsparse import TCSparseTensor, product
from torch_tcsparse.nn import fused

from test_pyg_layers import CASES, assert_close

pyg_nn = pytest.importorskip("torch_geometric.nn")

WIDE, NARROW = 12, 5

LAYERS = {
    "SAGEConv-mean": lambda i, o: pyg_nn.SAGEConv(i, o, aggr="mean"),
    "SAGEConv-sum": lambda i, o: pyg_nn.SAGEConv(i, o, aggr="sum"),
    "SAGEConv-project-normalize": lambda i, o: pyg_nn.SAGEConv(i, o, project=True, normalize=True),
    "SAGEConv-no-root-no-bias": lambda i, o: pyg_nn.SAGEConv(i, o, root_weight=False, bias=False),
    "GraphConv-add": lambda i, o: pyg_nn.GraphConv(i, o),
    "GraphConv-mean": lambda i, o: pyg_nn.GraphConv(i, o, aggr="mean"),
}


def block(num_sources=60, num_targets=25, num_edges=220, seed=3):
    """A bipartite [num_targets, num_sources] adjacency, its last target without neighbours."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.stack([torch.randint(0, num_sources, (num_edges,), generator=g),
                         torch.randint(0, num_targets - 1, (num_edges,), generator=g)])
    edges = torch.unique(edges, dim=1)
    weights = torch.rand(edges.size(1), generator=g, dtype=torch.float64) + 0.5
    return TCSparseTensor.from_edge_index(edges, weights, num_nodes=(num_sources, num_targets))


def product_widths(monkeypatch) -> list[int]:
    widths = []
    matmul = product.matmul

    def counting(a, x, *args, **kwargs):
        widths.append(x.size(-1))
        return matmul(a, x, *args, **kwargs)

    monkeypatch.setattr(product, "matmul", counting)
    return widths


def run(layer, adj_t, x_source, x_target):
    """Output and the gradients of both feature sets and every parameter, for a fixed random loss."""
    x_source, x_target = x_source.clone().requires_grad_(), x_target.clone().requires_grad_()
    out = layer((x_source, x_target), adj_t)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out.double() * weight.to(out.device)).sum().backward()
    return [out, x_source.grad, x_target.grad] + [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("device, dtype", CASES)
@pytest.mark.parametrize("name", LAYERS)
def test_narrowing_map_runs_first_with_pygs_results(name, device, dtype, monkeypatch):
    torch.manual_seed(0)
    layer = LAYERS[name](WIDE, NARROW).double()
    ours = fused(type(layer))(WIDE, NARROW, **_options(layer))
    ours.load_state_dict(layer.state_dict())
    ours = ours.to(device=device, dtype=dtype)
    a = block()
    x_source, x_target = torch.randn(60, WIDE, dtype=torch.float64), torch.randn(25, WIDE, dtype=torch.float64)

    widths = product_widths(monkeypatch)
    got = run(ours, a.to(device=device, dtype=dtype), x_source.to(device=device, dtype=dtype),
              x_target.to(device=device, dtype=dtype))
    monkeypatch.undo()
    assert widths == [NARROW]
    assert got[0].dtype == dtype and got[0].device.type == device
    expected = run(layer, a.to_torch_csr(), x_source, x_target)
    for ours_value, reference in zip(got, expected):
        if reference is None:  # x_target without root weight
            assert ours_value is None
        else:
            assert_close(ours_value, reference, dtype, device)


def _options(layer) -> dict:
    if isinstance(layer, pyg_nn.SAGEConv):
        return {"aggr": layer.aggr, "project": layer.project, "normalize": layer.normalize,
                "root_weight": layer.root_weight, "bias": layer.lin_l.bias is not None}
    return {"aggr": layer.aggr}


def _widths_of_a_call(monkeypatch, layer, a, x) -> list[int]:
    widths = product_widths(monkeypatch)
    out = layer(x, a)
    monkeypatch.undo()
    reference = copy.deepcopy(layer)
    reference.__class__ = type(layer).__mro__[1]  # the PyG layer itself
    torch.testing.assert_close(out, reference(x, a.to_torch_csr()))
    return widths


def test_a_widening_map_keeps_pygs_order(monkeypatch):
    layer = fused(pyg_nn.SAGEConv)(NARROW, WIDE)
    a = block().float()
    assert _widths_of_a_call(monkeypatch, layer, a, (torch.randn(60, NARROW), torch.randn(25, NARROW))) == [NARROW]


def test_max_keeps_pygs_order(monkeypatch):
    layer = fused(pyg_nn.SAGEConv)(WIDE, NARROW, aggr="max")
    a = block().float()
    assert _widths_of_a_call(monkeypatch, layer, a, (torch.randn(60, WIDE), torch.randn(25, WIDE))) == [WIDE]


def test_hooks_keep_pygs_order(monkeypatch):
    a = block().float()
    x = (torch.randn(60, WIDE), torch.randn(25, WIDE))
    layer = fused(pyg_nn.SAGEConv)(WIDE, NARROW)
    seen = []
    layer.lin_l.register_forward_hook(lambda module, inputs, output: seen.append(output.size(-1)))
    assert _widths_of_a_call(monkeypatch, layer, a, x) == [WIDE]
    assert seen == [NARROW, NARROW]  # ours and the reference, each through the hooked map
    layer = fused(pyg_nn.SAGEConv)(WIDE, NARROW)
    layer.register_propagate_forward_hook(lambda module, inputs, output: None)
    assert _widths_of_a_call(monkeypatch, layer, a, x) == [WIDE]


def test_a_lazy_layer_initializes_then_narrows(monkeypatch):
    layer = fused(pyg_nn.SAGEConv)(-1, NARROW)
    a = block().float()
    x = (torch.randn(60, WIDE), torch.randn(25, WIDE))
    assert _widths_of_a_call(monkeypatch, layer, a, x) == [WIDE]  # the first call initializes W
    assert _widths_of_a_call(monkeypatch, layer, a, x) == [NARROW]


def test_autocast_keeps_pygs_order(monkeypatch):
    layer = fused(pyg_nn.GraphConv)(WIDE, NARROW)
    a = block().float()
    widths = product_widths(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer((torch.randn(60, WIDE), torch.randn(25, WIDE)), a)
    assert set(widths) == {WIDE}  # autocast re-enters the product in its dtype
