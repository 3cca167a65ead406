"""GCNConv against PyG's GCNConv with the same weights: outputs and gradients, every input kind."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import GCNConv, gcn_norm

pyg_nn = pytest.importorskip("torch_geometric.nn")
EdgeIndex = pytest.importorskip("torch_geometric").EdgeIndex
pyg_gcn_norm = pytest.importorskip("torch_geometric.nn.conv.gcn_conv").gcn_norm

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    ),
]
INPUT_KINDS = ["edge_index", "EdgeIndex", "torch_coo", "torch_csr", "tcsparse"]
CONFIGS = {
    "default": {},
    "improved": {"improved": True},
    "no_self_loops": {"add_self_loops": False},
    "not_normalized": {"normalize": False},
    "no_bias": {"bias": False},
}
# float64 leaves only summation-order differences. In float32 on CUDA our SpMM runs on TF32
# Tensor Cores: inputs keep 10 mantissa bits (relative rounding 2^-11 = 4.9e-4), and a GCN
# output sums a few dozen such products of O(1) size, so errors reach a few 1e-3.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5}
CUDA_FLOAT32_TOLERANCE = 5e-3


def random_graph(num_nodes=60, num_edges=400, seed=0, device="cpu"):
    """Edges with duplicates, self-loops on some nodes (one each) and one isolated node."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes - 1, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes - 1, (num_edges,), generator=g)
    keep = src != dst
    loops = torch.arange(0, num_nodes - 1, 3)
    edge_index = torch.cat([torch.stack([src[keep], dst[keep]]), loops.expand(2, -1)], dim=1)
    edge_weight = torch.rand(edge_index.size(1), generator=g) + 0.5
    return edge_index.to(device), edge_weight.to(device)


def graph_input(kind, edge_index, edge_weight, num_nodes):
    """The graph as ``kind``, plus the edge weights to pass alongside (None for matrices)."""
    if kind == "edge_index":
        return edge_index, edge_weight
    if kind == "EdgeIndex":
        return EdgeIndex(edge_index, sparse_size=(num_nodes, num_nodes)), edge_weight
    values = torch.ones(edge_index.size(1), device=edge_index.device) if edge_weight is None else edge_weight
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), values.detach(), (num_nodes, num_nodes)).coalesce()
    if kind == "torch_coo":
        return adj_t, None
    if kind == "torch_csr":
        return adj_t.to_sparse_csr(), None
    return TCSparseTensor.from_torch(adj_t), None


def pyg_graph_input(kind, edge_index, edge_weight, num_nodes):
    """What PyG receives for the same graph: a TCSparseTensor becomes PyG's torch CSR adj_t."""
    if kind == "tcsparse":
        kind = "torch_csr"
    return graph_input(kind, edge_index, edge_weight, num_nodes)


def unit_weights_for_pyg_improved(edge_index, dtype):
    """PyG 2.8's gcn_norm ignores ``improved`` on an unweighted edge_index (its self-loops get
    weight 1 because the ones are created after they are added); with explicit unit weights it
    fills 2, the documented A + 2I that our layer computes either way."""
    return torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)


def paired_layers(device, dtype, **config):
    torch.manual_seed(1)
    ours = GCNConv(16, 8, **config).to(device, dtype)
    theirs = pyg_nn.GCNConv(16, 8, **config).to(device, dtype)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def outputs_and_grads(layer, x, graph, edge_weight, weight_grad=True):
    x = x.detach().clone().requires_grad_(True)
    weight = None
    if edge_weight is not None:
        weight = edge_weight.detach().clone().requires_grad_(weight_grad)
    out = layer(x, graph, weight)
    # A loss with distinct per-entry coefficients so any misplaced row or column shows up.
    coefficients = torch.linspace(-1, 1, out.numel(), device=out.device, dtype=out.dtype).view_as(out)
    (out * coefficients).sum().backward()
    grads = {"x": x.grad, **{name: p.grad for name, p in layer.named_parameters()}}
    if weight is not None and weight_grad:
        grads["edge_weight"] = weight.grad
    return out, grads


def assert_close(ours, theirs, dtype):
    tolerance = TOLERANCE[dtype]
    if ours.is_cuda and dtype == torch.float32:
        tolerance = CUDA_FLOAT32_TOLERANCE
    torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", INPUT_KINDS)
@pytest.mark.parametrize("config", CONFIGS.keys())
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_pyg(device, kind, config, weighted, dtype):
    edge_index, edge_weight = random_graph(device=device)
    edge_weight = edge_weight.to(dtype) if weighted else None
    num_nodes = 60
    x = torch.randn(num_nodes, 16, device=device, dtype=dtype)
    ours, theirs = paired_layers(device, dtype, **CONFIGS[config])

    graph, weight = graph_input(kind, edge_index, edge_weight, num_nodes)
    if isinstance(graph, TCSparseTensor):
        graph = graph.to(dtype)
    elif graph.layout != torch.strided:
        graph = graph.to(dtype)
    pyg_graph, pyg_weight = pyg_graph_input(kind, edge_index, edge_weight, num_nodes)
    if config == "improved" and pyg_weight is None and kind in ("edge_index", "EdgeIndex"):
        pyg_weight = unit_weights_for_pyg_improved(edge_index, dtype)
    if pyg_graph.layout != torch.strided:
        pyg_graph = pyg_graph.to(dtype)

    out, grads = outputs_and_grads(ours, x, graph, weight)
    expected, expected_grads = outputs_and_grads(theirs, x, pyg_graph, pyg_weight, weighted)
    assert type(out) is torch.Tensor
    assert_close(out, expected, dtype)
    assert grads.keys() == expected_grads.keys()
    for name in grads:
        assert_close(grads[name], expected_grads[name], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_first_layer_weight_gradient_matches_pyg(device, weighted, dtype):
    # Features without gradient and in_channels < out_channels: W's gradient comes from the
    # narrower product adj @ x (8 columns here, not 16).
    edge_index, edge_weight = random_graph(device=device)
    edge_weight = edge_weight.to(dtype) if weighted else None
    x = torch.randn(60, 8, device=device, dtype=dtype)
    torch.manual_seed(1)
    ours = GCNConv(8, 16).to(device, dtype)
    theirs = pyg_nn.GCNConv(8, 16).to(device, dtype)
    theirs.load_state_dict(ours.state_dict())
    coefficients = torch.linspace(-1, 1, 60 * 16, device=device, dtype=dtype).view(60, 16)
    results = []
    for layer in (ours, theirs):
        out = layer(x, edge_index, edge_weight)
        (out * coefficients).sum().backward()
        results.append((out, layer.lin.weight.grad, layer.bias.grad))
    assert type(results[0][0].grad_fn).__name__ == "LinearThenPropagateBackward"
    for mine, expected in zip(*results):
        assert_close(mine, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", INPUT_KINDS)
def test_cached_reuses_the_first_graph(device, kind):
    edge_index, edge_weight = random_graph(device=device)
    other_index, other_weight = random_graph(seed=5, device=device)
    x = torch.randn(60, 16, device=device)
    ours, theirs = paired_layers(device, torch.float32, cached=True)
    first = ours(x, *graph_input(kind, edge_index, edge_weight, 60))
    again = ours(x, *graph_input(kind, other_index, other_weight, 60))
    expected = theirs(x, *pyg_graph_input(kind, edge_index, edge_weight, 60))
    assert_close(first, expected, torch.float32)
    # The second graph is ignored; equal up to float rounding, as CUDA kernels may sum in any order.
    torch.testing.assert_close(first, again)
    ours.reset_parameters()
    assert ours._cached_adj is None


def test_cached_matrix_is_converted_once():
    edge_index, edge_weight = random_graph()
    layer = GCNConv(16, 8, cached=True)
    layer(torch.randn(60, 16), edge_index, edge_weight)
    cached = layer._cached_adj
    layer(torch.randn(60, 16), edge_index, edge_weight)
    assert isinstance(cached, TCSparseTensor) and layer._cached_adj is cached


@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("add_self_loops", [False, True])
def test_gcn_norm_edge_index_matches_pyg(improved, add_self_loops):
    edge_index, edge_weight = random_graph()
    ours = gcn_norm(edge_index, edge_weight, 60, improved, add_self_loops)
    theirs = pyg_gcn_norm(edge_index, edge_weight, 60, improved, add_self_loops)
    dense = [torch.sparse_coo_tensor(ei, w, (60, 60)).to_dense() for ei, w in (ours, theirs)]
    assert_close(dense[0], dense[1], torch.float32)


def test_improved_without_weights_fills_two():
    edge_index = torch.tensor([[0, 1], [1, 0]])
    ours = gcn_norm(edge_index, None, 2, improved=True)
    theirs = pyg_gcn_norm(edge_index, unit_weights_for_pyg_improved(edge_index, torch.float32), 2, improved=True)
    dense = [torch.sparse_coo_tensor(ei, w, (60, 60)).to_dense() for ei, w in (ours, theirs)]
    assert_close(dense[0], dense[1], torch.float32)


@pytest.mark.parametrize("kind", ["torch_coo", "torch_csr", "tcsparse"])
def test_gcn_norm_matrix_matches_pyg(kind):
    edge_index, edge_weight = random_graph()
    matrix, _ = graph_input(kind, edge_index, edge_weight, 60)
    ours, none = gcn_norm(matrix, num_nodes=60)
    theirs, _ = pyg_gcn_norm(graph_input("torch_csr", edge_index, edge_weight, 60)[0], num_nodes=60)
    assert none is None
    if kind == "tcsparse":
        assert isinstance(ours, TCSparseTensor)
    else:
        assert ours.layout == matrix.layout
    assert_close(ours.to_dense(), theirs.to_dense(), torch.float32)


def test_gcn_norm_takes_the_node_count_from_an_edge_index():
    edge_index = torch.tensor([[0, 1], [1, 0]])
    isolated_last = gcn_norm(EdgeIndex(edge_index, sparse_size=(4, 4)))
    assert isolated_last[0][:, -4:].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    inferred = gcn_norm(edge_index)
    assert inferred[0].size(1) == 2 + 2
    with pytest.raises(TypeError, match="must hold integers"):
        gcn_norm(edge_index.double())


def test_gcn_norm_target_to_source_flow():
    edge_index, edge_weight = random_graph()
    ours = gcn_norm(edge_index, edge_weight, 60, flow="target_to_source")
    theirs = pyg_gcn_norm(edge_index, edge_weight, 60, flow="target_to_source")
    assert_close(ours[1], theirs[1], torch.float32)


def test_state_dict_is_interchangeable_with_pyg():
    theirs = pyg_nn.GCNConv(16, 8)
    ours = GCNConv(16, 8)
    ours.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    assert torch.equal(ours.lin.weight, theirs.lin.weight)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"in_channels": 0}, ValueError, "in_channels must be positive, got 0"),
        ({"in_channels": 2.5}, TypeError, "in_channels must be an int, got float"),
        ({"out_channels": -3}, ValueError, "out_channels must be positive, got -3"),
        ({"improved": "yes"}, TypeError, "improved must be a bool, got str"),
        ({"normalize": False, "add_self_loops": True}, ValueError, "self-loops without normalization"),
    ],
)
def test_constructor_validation(kwargs, error, match):
    arguments = {"in_channels": 4, "out_channels": 2, **kwargs}
    with pytest.raises(error, match=match):
        GCNConv(**arguments)


def test_forward_validation():
    layer = GCNConv(4, 2)
    x = torch.randn(5, 4)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(ValueError, match="x has 3 channels but the layer expects in_channels=4"):
        layer(torch.randn(5, 3), edge_index)
    with pytest.raises(ValueError, match=r"x must be a 2-D tensor .* got \(5,\)"):
        layer(torch.randn(5), edge_index)
    with pytest.raises(ValueError, match="bipartite"):
        layer((x, x), edge_index)
    with pytest.raises(TypeError, match="edge_index must hold integers, got dtype torch.float32"):
        layer(x, edge_index.float())
    with pytest.raises(ValueError, match=r"shape \[2, num_edges\], got \(3, 3\)"):
        layer(x, torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="holds node 7, out of range for 5 nodes"):
        layer(x, torch.tensor([[0, 7], [1, 2]]))
    with pytest.raises(ValueError, match=r"negative node index \(-1\)"):
        layer(x, torch.tensor([[0, -1], [1, 2]]))
    with pytest.raises(ValueError, match=r"one entry per edge \(3\), got shape \(2,\)"):
        layer(x, edge_index, torch.ones(2))
    with pytest.raises(TypeError, match="edge_weight must be floating point, got dtype torch.int64"):
        layer(x, edge_index, torch.ones(3, dtype=torch.long))
    with pytest.raises(TypeError, match="got list"):
        layer(x, [[0, 1], [1, 2]])
    with pytest.raises(ValueError, match=r"EdgeIndex has sparse size \(6, 6\) but the graph has 5 nodes"):
        layer(x, EdgeIndex(edge_index, sparse_size=(6, 6)))
    matrix = TCSparseTensor.from_edge_index(edge_index, num_nodes=5)
    with pytest.raises(ValueError, match="edge_weight is only used with edge_index"):
        layer(x, matrix, torch.ones(3))
    with pytest.raises(ValueError, match=r"has 5 rows but the graph has 6 nodes"):
        layer(torch.randn(6, 4), matrix)
    rectangular = TCSparseTensor.from_edge_index(edge_index, num_nodes=(4, 5))
    with pytest.raises(ValueError, match=r"must be square, got shape \(5, 4\)"):
        layer(x, rectangular)
    with pytest.raises(ValueError, match="flow must be one of"):
        gcn_norm(edge_index, flow="sideways")


@pytest.mark.parametrize("kind", ["torch_coo", "torch_csr", "torch_csc", "tcsparse"])
def test_gcn_norm_keeps_the_matrix_dtype(kind):
    edge_index, edge_weight = random_graph()
    matrix, _ = graph_input("torch_coo" if kind == "torch_csc" else kind, edge_index, edge_weight, 60)
    if kind == "torch_csc":
        matrix = matrix.to_sparse_csc()
    normalized, _ = gcn_norm(matrix.to(torch.bfloat16), num_nodes=60)
    expected, _ = gcn_norm(matrix, num_nodes=60)
    assert normalized.dtype == torch.bfloat16
    assert isinstance(normalized, TCSparseTensor) == (kind == "tcsparse")
    if kind != "tcsparse":
        assert normalized.layout == (torch.sparse_csr if kind == "torch_csc" else matrix.layout)
    torch.testing.assert_close(normalized.to_dense().float(), expected.to_dense(), rtol=1e-2, atol=1e-3)


def test_gcn_norm_validation():
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    matrix = TCSparseTensor.from_edge_index(edge_index, num_nodes=4)
    with pytest.raises(TypeError, match="num_nodes must be an int, got float"):
        gcn_norm(edge_index, num_nodes=4.0)
    with pytest.raises(ValueError, match="num_nodes must be non-negative, got -1"):
        gcn_norm(edge_index, num_nodes=-1)
    with pytest.raises(ValueError, match="holds node 3, out of range for 3 nodes"):
        gcn_norm(edge_index, num_nodes=3)
    with pytest.raises(TypeError, match="improved must be a bool, got int"):
        gcn_norm(edge_index, improved=1)
    with pytest.raises(TypeError, match="add_self_loops must be a bool, got str"):
        gcn_norm(edge_index, add_self_loops="no")
    with pytest.raises(TypeError, match="dtype must be one of .* got torch.int64"):
        gcn_norm(edge_index, dtype=torch.int64)
    with pytest.raises(TypeError, match="edge_index must be a .* got list"):
        gcn_norm([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="edge_weight is only used with edge_index"):
        gcn_norm(matrix, torch.ones(3))
    with pytest.raises(ValueError, match="has 4 rows but the graph has 5 nodes"):
        gcn_norm(matrix, num_nodes=5)
    integer_matrix = torch.sparse_coo_tensor(edge_index, torch.ones(3, dtype=torch.long), (4, 4))
    with pytest.raises(TypeError, match="floating-point values, got dtype torch.int64"):
        gcn_norm(integer_matrix)
    with pytest.raises(TypeError, match=r"x must be one of .* got dtype torch.int64"):
        GCNConv(4, 2)(torch.ones(4, 4, dtype=torch.long), edge_index)
