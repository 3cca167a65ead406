"""16-bit GCNConv around hubs against a float64 reference. Normalizing in the 16-bit dtype
loses a hub's degree (in bfloat16 a sum of ones stops at 256); in float32 it is exact, and
the output is as accurate as PyG's."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import GCNConv, gcn_norm

pyg_nn = pytest.importorskip("torch_geometric.nn")

HUBS = [pytest.param(600, torch.bfloat16, id="degree600-bfloat16"), pytest.param(3000, torch.float16, id="degree3000-float16")]
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
]


def star(degree, device):
    """Node 0 linked both ways to nodes 1..degree."""
    hub = torch.zeros(degree, dtype=torch.long)
    leaves = torch.arange(1, degree + 1)
    edge_index = torch.cat([torch.stack([leaves, hub]), torch.stack([hub, leaves])], dim=1)
    return edge_index.to(device), degree + 1


def as_graph(kind, edge_index, num_nodes, dtype):
    if kind == "edge_index":
        return edge_index
    values = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), values, (num_nodes, num_nodes)).coalesce()
    if kind == "torch_csr":
        return adj_t.to_sparse_csr()
    return TCSparseTensor.from_torch(adj_t)


def reference_output(layer, x, edge_index, num_nodes):
    """D^-1/2 (A + I) D^-1/2 (x W^T) + b in float64, from the layer's (rounded) parameters."""
    source, target = edge_index
    degree = torch.ones(num_nodes, dtype=torch.float64, device=x.device).index_add(
        0, target, torch.ones(edge_index.size(1), dtype=torch.float64, device=x.device)
    )
    scale = degree.pow(-0.5)
    h = x.double() @ layer.lin.weight.double().t()
    out = h / degree.unsqueeze(1)
    out = out.index_add(0, target, (scale[source] * scale[target]).unsqueeze(1) * h[source])
    return out + layer.bias.double()


def hub_error(out, reference):
    return float((out[0].double() - reference[0]).norm() / reference[0].norm())


def layers(dtype, device):
    torch.manual_seed(0)
    ours = GCNConv(16, 8)
    torch.nn.init.normal_(ours.bias)
    theirs = pyg_nn.GCNConv(16, 8)
    theirs.load_state_dict(ours.state_dict())
    return ours.to(device, dtype), theirs.to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["edge_index", "torch_csr", "tcsparse"])
@pytest.mark.parametrize("degree, dtype", HUBS)
def test_hub_output_is_accurate_in_16_bits(degree, dtype, kind, device):
    edge_index, num_nodes = star(degree, device)
    ours, theirs = layers(dtype, device)
    x = torch.rand(num_nodes, 16, device=device).to(dtype)
    reference = reference_output(ours, x, edge_index, num_nodes)
    with torch.no_grad():
        error = hub_error(ours(x, as_graph(kind, edge_index, num_nodes, dtype)), reference)
        pyg_error = hub_error(theirs(x, edge_index), reference)
    eps = torch.finfo(dtype).eps
    assert error < 2 * eps, f"hub output off by {error:.2%}"
    # PyG's layer sums the same float32-exact degrees at best: no worse than it, up to rounding.
    assert error <= pyg_error + eps / 4, f"hub output off by {error:.3%}, PyG's by {pyg_error:.3%}"


@pytest.mark.parametrize("degree, dtype", HUBS)
def test_gcn_norm_rounds_exact_hub_weights_once(degree, dtype):
    edge_index, num_nodes = star(degree, "cpu")
    index, weight = gcn_norm(edge_index, None, num_nodes, dtype=dtype)
    assert weight.dtype == dtype
    source, target = index
    degree_64 = torch.zeros(num_nodes, dtype=torch.float64).index_add(0, target, torch.ones(index.size(1), dtype=torch.float64))
    expected = degree_64[source].rsqrt() * degree_64[target].rsqrt()
    # One rounding of the exact weight: within one unit in the last place.
    torch.testing.assert_close(weight.double(), expected, rtol=torch.finfo(dtype).eps, atol=0)
