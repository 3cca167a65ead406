"""PyG's normalizing layers through ``fused(Layer)`` on a TCSparseTensor: outputs and gradients (of
X, of every parameter, of the matrix's values) equal to PyG's own layer on its own torch.sparse
CSR ``adj_t`` in float64, every propagation one product of ours and the normalization none, the
normalized matrix derived once per matrix and kept as PyG keeps its own."""
import copy

import pytest
import torch

from torch_tcsparse import TCSparseTensor, product
from torch_tcsparse.nn import fused, gcn_norm
from torch_tcsparse.nn import normalizing_layers

pyg_nn = pytest.importorskip("torch_geometric.nn")

IN, OUT, N = 8, 4, 40
# name: (layer factory, propagations per forward)
LAYERS = {
    "GCNConv": (lambda: pyg_nn.GCNConv(IN, OUT), 1),
    "GCNConv-improved": (lambda: pyg_nn.GCNConv(IN, OUT, improved=True), 1),
    "GCNConv-no-loops": (lambda: pyg_nn.GCNConv(IN, OUT, add_self_loops=False, bias=False), 1),
    "GCNConv-cached": (lambda: pyg_nn.GCNConv(IN, OUT, cached=True), 1),
    "SGConv": (lambda: pyg_nn.SGConv(IN, OUT, K=3), 3),
    "SGConv-no-loops": (lambda: pyg_nn.SGConv(IN, OUT, K=2, add_self_loops=False), 2),
    "APPNP": (lambda: pyg_nn.APPNP(K=4, alpha=0.1), 4),
    "APPNP-no-loops": (lambda: pyg_nn.APPNP(K=2, alpha=0.2, add_self_loops=False), 2),
    "TAGConv": (lambda: pyg_nn.TAGConv(IN, OUT, K=3), 3),
    "LGConv": (lambda: pyg_nn.LGConv(), 1),
    "ClusterGCNConv": (lambda: pyg_nn.ClusterGCNConv(IN, OUT, diag_lambda=0.3), 1),
    "ClusterGCNConv-no-loops": (lambda: pyg_nn.ClusterGCNConv(IN, OUT, add_self_loops=False), 1),
}
# float64 leaves summation order; PyG's ClusterGCNConv runs in float32 for a sparse adj_t.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


def graph(seed=0, with_loops=True):
    """Symmetric weighted graph with self-loops on a third of the nodes (PyG adds the fill to
    them) and node 0 isolated (a zero degree); ClusterGCN's diagonal needs every loop, as in
    PyG, when it adds none."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.randint(1, N, (2, 200), generator=g)
    edges = edges[:, edges[0] != edges[1]]
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    loops = torch.arange(0, N) if not with_loops else torch.arange(1, N, 3)
    edges = torch.unique(torch.cat([edges, loops.expand(2, -1)], dim=1), dim=1)
    return edges, torch.rand(edges.shape[1], generator=g, dtype=torch.float64) + 0.5


def matrix(name, dtype=torch.float64):
    edges, weights = graph(with_loops=name != "ClusterGCNConv-no-loops")
    return TCSparseTensor.from_edge_index(edges, weights, num_nodes=N, dtype=dtype)


def as_fused(layer):
    ours = copy.deepcopy(layer)
    ours.__class__ = fused(type(layer))
    return ours


def run(layer, x, adj):
    x = x.clone().requires_grad_()
    out = layer(x, adj)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    (out * weight).sum().backward()
    return [out, x.grad] + [p.grad for p in layer.parameters()]


def count_products(monkeypatch):
    calls = []
    matmul = product.matmul
    monkeypatch.setattr(product, "matmul", lambda *args, **kwargs: calls.append(1) or matmul(*args, **kwargs))
    return calls


def assert_close(ours, theirs, dtype):
    ours, theirs = ours.detach(), theirs.detach()
    scale = max(float(theirs.abs().max()), 1.0)
    torch.testing.assert_close(ours.to(theirs.dtype), theirs, rtol=0, atol=TOLERANCE[dtype] * scale)


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_equals_pyg_and_runs_one_product_per_propagation(name, monkeypatch):
    make, propagations = LAYERS[name]
    dtype = torch.float32 if name.startswith("ClusterGCNConv") else torch.float64
    torch.manual_seed(0)
    reference = make().to(dtype)
    ours = as_fused(reference)
    adj = matrix(name, dtype)
    x = torch.randn(N, IN, dtype=dtype)

    calls = count_products(monkeypatch)
    got = run(ours, x, adj)
    assert len(calls) == propagations
    calls.clear()
    ours(x, adj)  # normalized once: a second forward multiplies only
    assert len(calls) == propagations
    monkeypatch.undo()

    expected = run(reference, x, adj.to_torch_csr())
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert_close(mine, theirs, dtype)


def test_appnp_edge_dropout_draws_as_pyg():
    """Dropout on the normalized values in training: the same draws in the same order (A.csr's,
    PyG's CSR order) give the same output."""
    torch.manual_seed(0)
    reference = pyg_nn.APPNP(K=3, alpha=0.1, dropout=0.5).double()
    ours = as_fused(reference)
    adj, x = matrix("APPNP"), torch.randn(N, IN, dtype=torch.float64)
    torch.manual_seed(5)
    got = ours(x, adj)
    torch.manual_seed(5)
    expected = reference(x, adj.to_torch_csr())
    assert_close(got, expected, torch.float64)


def test_gradient_reaches_the_matrix_values_through_the_normalization():
    torch.manual_seed(0)
    reference = pyg_nn.GCNConv(IN, OUT).double()
    ours = as_fused(reference)
    adj, x = matrix("GCNConv"), torch.randn(N, IN, dtype=torch.float64)
    values = adj.values().detach().clone().requires_grad_()
    ours(x, adj.with_values(values)).square().sum().backward()

    # PyG's normalization in torch ops on the dense matrix: the reference gradient.
    dense = adj.to_dense().clone().requires_grad_()
    with_loops = dense + torch.eye(N, dtype=torch.float64)
    scale = with_loops.sum(1).pow(-0.5)
    normalized = scale[:, None] * with_loops * scale[None, :]
    (normalized @ reference.lin(x) + reference.bias).square().sum().backward()
    csr = adj.csr
    expected = dense.grad[csr.row_indices(), csr.col.long()]
    assert_close(values.grad, expected, torch.float64)


def test_normalized_once_per_matrix(monkeypatch):
    built = []
    normalize = normalizing_layers.gcn_normalized
    monkeypatch.setattr(normalizing_layers, "gcn_normalized", lambda *a: built.append(1) or normalize(*a))
    layer = fused(pyg_nn.GCNConv)(IN, OUT).double()
    adj, x = matrix("GCNConv"), torch.randn(N, IN, dtype=torch.float64)
    for _ in range(3):
        layer(x, adj)
    assert len(built) == 1
    other = adj.with_values(adj.values() * 2)
    torch.testing.assert_close(layer(x, other), pyg_nn.GCNConv.forward(layer, x, other.to_torch_csr()))
    assert len(built) == 2
    adj.values().mul_(3)  # changed in place: normalized anew
    layer(x, adj)
    assert len(built) == 3
    layer.reset_parameters()
    layer(x, adj)
    assert len(built) == 4


def test_cached_keeps_the_first_graph_as_pyg_does():
    layer = fused(pyg_nn.GCNConv)(IN, OUT, cached=True).double()
    first, x = matrix("GCNConv"), torch.randn(N, IN, dtype=torch.float64)
    expected = layer(x, first)
    torch.testing.assert_close(layer(x, first.with_values(first.values() * 5)), expected)


def test_sgconv_cached_features_as_pyg():
    torch.manual_seed(0)
    reference = pyg_nn.SGConv(IN, OUT, K=2, cached=True).double()
    ours = as_fused(reference)
    adj, x = matrix("SGConv"), torch.randn(N, IN, dtype=torch.float64)
    ours(x, adj)
    torch.testing.assert_close(ours(torch.zeros_like(x), adj), reference(x, adj.to_torch_csr()))


def test_matrix_checks_name_the_problem():
    layer = fused(pyg_nn.GCNConv)(IN, OUT).double()
    adj, x = matrix("GCNConv"), torch.randn(N, IN, dtype=torch.float64)
    with pytest.raises(ValueError, match="edge_weight is only used with edge_index"):
        layer(x, adj, torch.ones(adj.nnz, dtype=torch.float64))
    with pytest.raises(ValueError, match="adjacency matrix has 40 rows but the graph has 39 nodes"):
        layer(x[:-1], adj)
    rectangular = TCSparseTensor.from_edge_index(torch.tensor([[0, 1], [1, 2]]), num_nodes=(4, 3), dtype=torch.float64)
    with pytest.raises(ValueError, match="must be square"):
        layer(x[:4], rectangular)
    with pytest.raises(ValueError, match="does not support bipartite"):
        layer((x, x), adj)


def test_other_inputs_take_pyg_route():
    torch.manual_seed(0)
    reference = pyg_nn.SGConv(IN, OUT, K=2).double()
    ours = as_fused(reference)
    edges, weights = graph()
    x = torch.randn(N, IN, dtype=torch.float64)
    torch.testing.assert_close(ours(x, edges, weights), reference(x, edges, weights))


def test_a_subclass_with_its_own_forward_keeps_it():
    class Doubled(pyg_nn.GCNConv):
        def forward(self, x, edge_index, edge_weight=None):
            return 2 * super().forward(x, edge_index, edge_weight)

    assert fused(Doubled).forward is Doubled.forward


@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("add_self_loops", [False, True])
def test_gcn_norm_of_a_matrix_keeps_its_structure_where_it_can(improved, add_self_loops):
    edges, weights = graph()
    adj = TCSparseTensor.from_edge_index(edges, weights, num_nodes=N)
    normalized, none = gcn_norm(adj, improved=improved, add_self_loops=add_self_loops)
    pyg_gcn_norm = pytest.importorskip("torch_geometric.nn.conv.gcn_conv").gcn_norm
    expected, _ = pyg_gcn_norm(adj.to_torch_csr(), None, N, improved, add_self_loops)
    assert none is None and isinstance(normalized, TCSparseTensor)
    torch.testing.assert_close(normalized.to_dense(), expected.to_dense(), rtol=0, atol=1e-15)
    assert (normalized._structure is adj._structure) == (not add_self_loops)
