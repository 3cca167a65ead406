"""A cached GCNConv moved to another dtype or device after its first call (``module.to``) keeps
working, with PyG's results: the cached graph follows the features."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import GCNConv

pyg_nn = pytest.importorskip("torch_geometric.nn")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def graph(num_nodes=40, num_edges=200):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, num_nodes, (2, num_edges), generator=g), torch.rand(num_edges, generator=g) + 0.5


def paired_cached_layers():
    torch.manual_seed(1)
    ours = GCNConv(8, 16, cached=True)
    theirs = pyg_nn.GCNConv(8, 16, cached=True)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize(
    "first, then, tolerance",
    [
        (torch.float32, torch.float64, 1e-6),
        (torch.float64, torch.float32, 1e-5),
        (torch.float32, torch.bfloat16, 3e-2),
    ],
    ids=["float32-to-float64", "float64-to-float32", "float32-to-bfloat16"],
)
def test_cache_follows_a_dtype_change(first, then, tolerance):
    edge_index, edge_weight = graph()
    x = torch.randn(40, 8)
    ours, theirs = paired_cached_layers()
    for layer in (ours, theirs):
        layer.to(first)(x.to(first), edge_index, edge_weight.to(first))
        layer.to(then)
    out = ours(x.to(then), edge_index, edge_weight.to(then))
    expected = theirs(x.to(then), edge_index, edge_weight.to(then))
    assert out.dtype == then and ours._cached_adj.dtype == then
    torch.testing.assert_close(out.double(), expected.double(), rtol=tolerance, atol=tolerance)


def test_double_after_a_float_forward_matches_pyg_gradients():
    edge_index, edge_weight = graph()
    x = torch.randn(40, 8, dtype=torch.float64)
    ours, theirs = paired_cached_layers()
    grads = []
    for layer in (ours, theirs):
        layer(x.float(), edge_index, edge_weight)
        layer.double()
        x_grad = x.clone().requires_grad_()
        layer(x_grad, edge_index, edge_weight.double()).pow(2).sum().backward()
        grads.append((x_grad.grad, layer.lin.weight.grad, layer.bias.grad))
    for mine, expected in zip(*grads):
        torch.testing.assert_close(mine, expected, rtol=1e-6, atol=1e-6)


@needs_cuda
@pytest.mark.parametrize("kind", ["edge_index", "tcsparse"])
def test_cache_follows_a_move_to_cuda(kind):
    edge_index, edge_weight = graph()
    if kind == "tcsparse":
        graph_input, weight = TCSparseTensor.from_edge_index(edge_index, edge_weight, num_nodes=40), None
    else:
        graph_input, weight = edge_index, edge_weight
    x = torch.randn(40, 8)
    ours, _ = paired_cached_layers()
    on_cpu = ours(x, graph_input, weight)
    ours.cuda()
    on_cuda = ours(x.cuda(), graph_input, weight)  # the cached graph serves; the CPU one is ignored
    assert ours._cached_adj.device.type == "cuda"
    # TF32 Tensor Cores on the GPU round the inputs to 10 mantissa bits.
    torch.testing.assert_close(on_cuda.cpu(), on_cpu, rtol=5e-3, atol=5e-3)
    ours.cpu()
    torch.testing.assert_close(ours(x, graph_input, weight), on_cpu)
