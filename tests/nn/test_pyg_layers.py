"""PyG's own layers with a TCSparseTensor as ``adj_t``: layer x aggregation x dtype x device, outputs
and gradients (of X and of every parameter) against the same layer on a torch.sparse CSR
``adj_t`` in float64 on the CPU, and whether the product ran on our kernels.

PyG's own layers that normalize the matrix themselves (GCNConv and APPNP with normalize=True,
SGConv, ClusterGCNConv) build a new torch.sparse matrix from ours: they take a TCSparseTensor and
give PyG's result, but multiply on torch.sparse; ``fused(Layer)`` runs them on our kernels
(tests/nn/test_normalizing_layers.py)."""
import copy

import pytest
import torch

from torch_tcsparse import TCSparseTensor, product
from torch_tcsparse.nn import gcn_norm
from torch_tcsparse.nn import fused

pyg_nn = pytest.importorskip("torch_geometric.nn")

IN, OUT = 8, 4
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CASES = [
    pytest.param("cpu", torch.float64, id="cpu-float64"),
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cuda", torch.float32, id="cuda-float32", marks=CUDA),
    pytest.param("cuda", torch.float16, id="cuda-float16", marks=CUDA),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=CUDA),
]
# Relative to the largest reference value: float64 and float32 sum in another order than torch;
# float32 on CUDA may run TF32 in the layers' own matmuls; 16-bit layers round every activation.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 8e-2}
CUDA_FLOAT32_TOLERANCE = 5e-3

# name: (layer factory, aggregations, adjacency ("plain" or "normalized"), runs on our kernels)
LAYERS = {
    "GCNConv": (lambda aggr: pyg_nn.GCNConv(IN, OUT, normalize=False, aggr=aggr), ["add", "mean", "max"],
                "normalized", True),
    "GCNConv-normalize": (lambda aggr: pyg_nn.GCNConv(IN, OUT, normalize=True), ["add"], "plain", False),
    "SAGEConv": (lambda aggr: pyg_nn.SAGEConv(IN, OUT, aggr=aggr), ["mean", "max", "sum", "min"], "plain", True),
    "GINConv": (lambda aggr: pyg_nn.GINConv(torch.nn.Linear(IN, OUT), aggr=aggr), ["add", "max"], "plain", True),
    "GraphConv": (lambda aggr: pyg_nn.GraphConv(IN, OUT, aggr=aggr), ["add", "mean", "max", "min"], "plain", True),
    "SGConv": (lambda aggr: pyg_nn.SGConv(IN, OUT, K=2), ["add"], "plain", False),
    "APPNP": (lambda aggr: pyg_nn.APPNP(K=3, alpha=0.1, normalize=False), ["add"], "normalized", True),
    "APPNP-normalize": (lambda aggr: pyg_nn.APPNP(K=2, alpha=0.1), ["add"], "plain", False),
    "LGConv": (lambda aggr: pyg_nn.LGConv(normalize=False), ["add"], "normalized", True),
    "TAGConv": (lambda aggr: pyg_nn.TAGConv(IN, OUT, K=2, normalize=False), ["add"], "normalized", True),
    "ClusterGCNConv": (lambda aggr: pyg_nn.ClusterGCNConv(IN, OUT), ["add"], "plain", False),
}
TABLE = [(name, aggr) for name, (_, aggrs, _, _) in LAYERS.items() for aggr in aggrs]


def random_graph(num_nodes=50, num_edges=300, seed=0):
    """A duplicate-free weighted graph without self-loops, node 0 isolated (an empty row)."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.randint(1, num_nodes, (2, num_edges), generator=g)
    edges = edges[:, edges[0] != edges[1]]
    edges = torch.unique(torch.cat([edges, edges.flip(0)], dim=1), dim=1)
    weights = torch.rand(edges.shape[1], generator=g, dtype=torch.float64) + 0.5
    return edges, weights


def adjacency(kind: str, dtype, device) -> TCSparseTensor:
    edges, weights = random_graph()
    a = TCSparseTensor.from_edge_index(edges, weights, num_nodes=50)
    if kind == "normalized":
        a, _ = gcn_norm(a, num_nodes=50)
    return a.to(device=device, dtype=dtype)


def run(layer, x, adj_t):
    """(output, dX, parameter gradients) of a layer for a fixed random loss."""
    x = x.clone().requires_grad_()
    out = layer(x, adj_t)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out.double() * weight.to(out.device)).sum().backward()
    return out, x.grad, [p.grad for p in layer.parameters()]


def winners_may_differ(dtype, aggr) -> bool:
    """Whether max/min may pick another neighbour than the float64 reference: features rounded
    to 16 bits tie often, and a tie goes to the first neighbour, so the gradient of the features
    may land elsewhere: only the outputs are compared then (tests/test_reduce.py and
    tests/gpu/test_reduce.py check the winners and gradients in 16 bits exactly)."""
    return dtype.itemsize < 4 and aggr in ("max", "min")


def assert_close(ours, expected, dtype, device):
    tol = CUDA_FLOAT32_TOLERANCE if (device == "cuda" and dtype == torch.float32) else TOLERANCE[dtype]
    ours, expected = ours.detach(), expected.detach().double()
    scale = max(float(expected.abs().max()), 1.0) if expected.numel() else 1.0
    torch.testing.assert_close(ours.double().cpu(), expected, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("device, dtype", CASES)
@pytest.mark.parametrize("name, aggr", TABLE)
def test_layer_matches_torch_sparse(name, aggr, device, dtype, monkeypatch):
    make, _, kind, on_our_kernels = LAYERS[name]
    if name == "ClusterGCNConv" and dtype != torch.float32:
        pytest.skip("PyG's ClusterGCNConv builds float32 degrees for a sparse adj_t: other dtypes fail in PyG")
    if not on_our_kernels and dtype.itemsize < 4:
        pytest.skip("the layer multiplies PyG's own torch.sparse matrix: its 16-bit route is PyG's and torch's")
    torch.manual_seed(0)
    layer = make(aggr).double()
    reference = copy.deepcopy(layer)
    if device == "cuda" and aggr in ("max", "min"):
        # PyG's spmm refuses max/min for a torch.sparse matrix on CUDA: the adapter's subclass.
        ours_layer = _fused_copy(layer)
    else:
        ours_layer = copy.deepcopy(layer)
    ours_layer = ours_layer.to(device=device, dtype=dtype)

    a = adjacency(kind, dtype, device)
    x = torch.randn(50, IN, dtype=torch.float64)
    calls = []
    matmul = product.matmul
    monkeypatch.setattr(product, "matmul", lambda *args, **kwargs: calls.append(1) or matmul(*args, **kwargs))
    out, grad_x, grads = run(ours_layer, x.to(device=device, dtype=dtype), a)
    monkeypatch.undo()
    assert bool(calls) == on_our_kernels
    assert out.dtype == dtype and out.device.type == device

    # ClusterGCNConv's sparse route runs in float32 only (its degrees are float32 in PyG).
    reference_dtype = torch.float32 if name == "ClusterGCNConv" else torch.float64
    torch_csr = a.to(device="cpu", dtype=reference_dtype).to_torch_csr()
    expected, expected_grad_x, expected_grads = run(reference.to(reference_dtype), x.to(reference_dtype), torch_csr)
    assert_close(out, expected, dtype, device)
    if winners_may_differ(dtype, aggr):
        gradients = []
    else:
        gradients = list(zip([grad_x] + grads, [expected_grad_x] + expected_grads))
    for ours, theirs in gradients:
        assert_close(ours, theirs, dtype, device)


def _fused_copy(layer):
    """``layer`` as an instance of ``fused(type(layer))``, with the same parameters."""
    copied = copy.deepcopy(layer)
    copied.__class__ = fused(type(layer))
    return copied


BIPARTITE_LAYERS = {
    "SAGEConv": (lambda aggr: pyg_nn.SAGEConv(IN, OUT, aggr=aggr), ["mean", "max", "sum", "min"]),
    "GINConv": (lambda aggr: pyg_nn.GINConv(torch.nn.Linear(IN, IN), aggr=aggr), ["add", "max"]),
    "GraphConv": (lambda aggr: pyg_nn.GraphConv(IN, OUT, aggr=aggr), ["add", "mean", "max", "min"]),
}
BIPARTITE_TABLE = [(name, aggr) for name, (_, aggrs) in BIPARTITE_LAYERS.items() for aggr in aggrs]


def bipartite_graph(num_src=70, num_dst=25, num_edges=200, seed=2):
    """A sampled block's shape: edges from num_src source nodes to num_dst targets (the targets
    listed first among the sources, as PyG's samplers list them), the last target isolated."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.stack([torch.randint(0, num_src, (num_edges,), generator=g),
                         torch.randint(0, num_dst - 1, (num_edges,), generator=g)])
    edges = torch.unique(edges, dim=1)
    return edges, torch.rand(edges.shape[1], generator=g, dtype=torch.float64) + 0.5


@pytest.mark.parametrize("device, dtype", CASES)
@pytest.mark.parametrize("name, aggr", BIPARTITE_TABLE)
def test_bipartite_block_with_source_and_target_features(name, aggr, device, dtype):
    """x = (x_src, x_dst) with a rectangular [num_dst, num_src] adj_t, as in mini-batch training."""
    torch.manual_seed(0)
    layer = BIPARTITE_LAYERS[name][0](aggr).double()
    reference = copy.deepcopy(layer)
    ours_layer = _fused_copy(layer) if device == "cuda" and aggr in ("max", "min") else copy.deepcopy(layer)
    ours_layer = ours_layer.to(device=device, dtype=dtype)
    edges, weights = bipartite_graph()
    a = TCSparseTensor.from_edge_index(edges, weights, num_nodes=(70, 25))
    assert a.shape == (25, 70)
    x_src, x_dst = torch.randn(70, IN, dtype=torch.float64), torch.randn(25, IN, dtype=torch.float64)

    def run_pair(layer, adj_t, x_src, x_dst):
        x_src, x_dst = x_src.clone().requires_grad_(), x_dst.clone().requires_grad_()
        out = layer((x_src, x_dst), adj_t)
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        (out.double() * weight.to(out.device)).sum().backward()
        return [out, x_src.grad, x_dst.grad] + [p.grad for p in layer.parameters()]

    ours = run_pair(ours_layer, a.to(device=device, dtype=dtype), x_src.to(device=device, dtype=dtype),
                    x_dst.to(device=device, dtype=dtype))
    expected = run_pair(reference, a.to_torch_csr(), x_src, x_dst)
    assert ours[0].shape == (25, ours[0].shape[1]) and ours[0].dtype == dtype
    if winners_may_differ(dtype, aggr):
        ours, expected = ours[:1], expected[:1]
    for got, want in zip(ours, expected):
        assert_close(got, want, dtype, device)


@pytest.mark.parametrize("aggr", ["max", "min", "mean", "sum"])
def test_fused_layer_matches_the_layer(aggr):
    edges, weights = random_graph()
    a = TCSparseTensor.from_edge_index(edges, weights.float(), num_nodes=50)
    layer = pyg_nn.SAGEConv(IN, OUT, aggr=aggr)
    adapted = fused(pyg_nn.SAGEConv)(IN, OUT, aggr=aggr)
    adapted.load_state_dict(layer.state_dict())
    x = torch.randn(50, IN)
    torch.testing.assert_close(adapted(x, a), layer(x, a.to_torch_csr()))
    torch.testing.assert_close(adapted(x, a.to_torch_csr()), layer(x, a.to_torch_csr()))
    assert fused(pyg_nn.SAGEConv) is type(adapted) and isinstance(adapted, pyg_nn.SAGEConv)


def test_fused_validation():
    with pytest.raises(TypeError, match="layer_class must be a PyG MessagePassing class, got 3"):
        fused(3)


def test_pyg_sees_a_sparse_csr_matrix():
    utils = pytest.importorskip("torch_geometric.utils")
    edges, weights = random_graph()
    a = TCSparseTensor.from_edge_index(edges, weights, num_nodes=50)
    assert a.layout == torch.sparse_csr and utils.is_torch_sparse_tensor(a)
    index, values = utils.to_edge_index(a)
    expected_index, expected_values = utils.to_edge_index(a.to_torch_csr())
    assert torch.equal(index, expected_index) and torch.equal(values, expected_values)
    x = torch.randn(50, 3, dtype=torch.float64)
    torch.testing.assert_close(utils.spmm(a, x, reduce="max"), a.matmul(x, reduce="max"))


@pytest.mark.parametrize("name, aggr", [("SAGEConv", "max"), ("SAGEConv", "min"), ("GraphConv", "max"),
                                        ("GINConv", "max")])
def test_fused_max_min_never_reach_pygs_spmm(name, aggr, monkeypatch):
    """PyG's spmm refuses max/min for a sparse matrix on CUDA; here it refuses everywhere, and
    the fused layer, plain and on a bipartite block, still runs (on our product)."""
    import importlib

    module = importlib.import_module(type(LAYERS[name][0](aggr)).__module__)

    def refuse(*args, **kwargs):
        raise NotImplementedError("PyG's spmm refuses max/min for a sparse matrix on CUDA")

    monkeypatch.setattr(module, "spmm", refuse)
    layer = _fused_copy(LAYERS[name][0](aggr).double())
    edges, weights = random_graph()
    a = TCSparseTensor.from_edge_index(edges, weights, num_nodes=50)
    x = torch.randn(50, IN, dtype=torch.float64, requires_grad=True)
    layer(x, a).sum().backward()
    assert x.grad is not None
    block = TCSparseTensor.from_edge_index(*bipartite_graph(), num_nodes=(70, 25))
    pair = (torch.randn(70, IN, dtype=torch.float64), torch.randn(25, IN, dtype=torch.float64))
    assert layer(pair, block).shape[0] == 25
    with pytest.raises(NotImplementedError):
        LAYERS[name][0](aggr).double()(x, a.to_torch_csr())
