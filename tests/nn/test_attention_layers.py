"""GATConv and TransformerConv through ``fused(Layer)`` on a TCSparseTensor: outputs, attention
weights and gradients (of X and of every parameter) equal to PyG's own layer on its own
torch.sparse CSR ``adj_t`` in float64 (heads, concat and mean, residual, beta, bipartite blocks,
no self-loops, dropout with the same draws), the weighted sum on our product (one per head on
the CPU), the graph attended over derived once per matrix.

PyG's reference gets int64 indices, as PyG builds a CSR (``to_torch_csr_tensor``): with int32
indices (what ``TCSparseTensor.to_torch_csr`` gives) PyG's scatter-max and softmax return wrong
gradients on the CPU, so its own layers do."""
import copy

import pytest
import torch

from torch_tcsparse import TCSparseTensor, product
from torch_tcsparse.nn import attention_layers, fused

pyg_nn = pytest.importorskip("torch_geometric.nn")
pyg_utils = pytest.importorskip("torch_geometric.utils")

IN, OUT, N = 8, 4, 40
TOLERANCE = 1e-12
# name: (layer factory, heads)
LAYERS = {
    "GATConv": (lambda: pyg_nn.GATConv(IN, OUT), 1),
    "GATConv-heads": (lambda: pyg_nn.GATConv(IN, OUT, heads=3), 3),
    "GATConv-mean-residual": (lambda: pyg_nn.GATConv(IN, OUT, heads=3, concat=False, residual=True), 3),
    "GATConv-no-loops": (lambda: pyg_nn.GATConv(IN, OUT, heads=2, add_self_loops=False, negative_slope=0.1), 2),
    "GATConv-no-bias": (lambda: pyg_nn.GATConv(IN, OUT, heads=2, bias=False), 2),
    "TransformerConv": (lambda: pyg_nn.TransformerConv(IN, OUT), 1),
    "TransformerConv-heads-beta": (lambda: pyg_nn.TransformerConv(IN, OUT, heads=3, beta=True), 3),
    "TransformerConv-mean": (lambda: pyg_nn.TransformerConv(IN, OUT, heads=2, concat=False), 2),
    "TransformerConv-no-root": (lambda: pyg_nn.TransformerConv(IN, OUT, heads=2, root_weight=False), 2),
}


def graph(seed=0):
    """A directed weighted graph with self-loops on some nodes and node 0 without in-edges (an
    empty row without GAT's loops)."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.stack([torch.randint(0, N, (250,), generator=g), torch.randint(1, N, (250,), generator=g)])
    edges = torch.unique(torch.cat([edges, torch.arange(1, N, 4).expand(2, -1)], dim=1), dim=1)
    return edges, torch.rand(edges.shape[1], generator=g, dtype=torch.float64) + 0.5


def matrices(num_nodes=N, edges=None, weights=None):
    """(ours, PyG's CSR adj_t) of one graph; num_nodes: an int or (sources, targets)."""
    if edges is None:
        edges, weights = graph()
    ours = TCSparseTensor.from_edge_index(edges, weights, num_nodes=num_nodes)
    size = tuple(num_nodes) if isinstance(num_nodes, tuple) else (num_nodes, num_nodes)
    return ours, pyg_utils.to_torch_csr_tensor(edges.flip(0), weights, size=(size[1], size[0]))


def as_fused(layer):
    ours = copy.deepcopy(layer)
    ours.__class__ = fused(type(layer))
    return ours


def run(layer, x, adj, seed=3, **kwargs):
    """(output, attention weights, dX..., parameter gradients) for a fixed random loss; x may be
    a pair."""
    pair = isinstance(x, tuple)
    xs = [t.clone().requires_grad_() for t in (x if pair else (x,))]
    torch.manual_seed(seed)
    out, (_, alpha) = layer(tuple(xs) if pair else xs[0], adj, return_attention_weights=True, **kwargs)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    (out * weight).sum().backward()
    return [out, alpha] + [t.grad for t in xs] + [p.grad for p in layer.parameters()]


def assert_all_close(got, expected, tolerance=TOLERANCE):
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        if theirs is None:  # a parameter the layer does not use
            assert mine is None
            continue
        mine, theirs = mine.detach(), theirs.detach()
        scale = max(float(theirs.abs().max()), 1.0) if theirs.numel() else 1.0
        torch.testing.assert_close(mine, theirs, rtol=0, atol=tolerance * scale)


def count_products(monkeypatch):
    calls = []
    matmul = product.matmul
    monkeypatch.setattr(product, "matmul", lambda *args, **kwargs: calls.append(1) or matmul(*args, **kwargs))
    return calls


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_equals_pyg(name, monkeypatch):
    make, heads = LAYERS[name]
    torch.manual_seed(0)
    reference = make().double()
    ours = as_fused(reference)
    adj, pyg_adj = matrices()
    x = torch.randn(N, IN, dtype=torch.float64)
    calls = count_products(monkeypatch)
    got = run(ours, x, adj)
    monkeypatch.undo()
    # The forward's weighted sum: one product per head (TransformerConv's scores add the
    # backward's products of their dots, two per head).
    assert len(calls) == heads * (1 if name.startswith("GAT") else 3)
    assert_all_close(got, run(reference, x, pyg_adj))


@pytest.mark.parametrize("name", ["GATConv-heads", "TransformerConv-mean"])
def test_attention_dropout_draws_as_pyg(name):
    make, _ = LAYERS[name]
    torch.manual_seed(0)
    reference = make().double()
    reference.dropout = 0.4
    ours = as_fused(reference)
    adj, pyg_adj = matrices()
    x = torch.randn(N, IN, dtype=torch.float64)
    got, expected = run(ours, x, adj), run(reference, x, pyg_adj)
    assert_all_close(got, expected)
    ours.eval()
    assert not torch.equal(ours(x, adj), got[0])


@pytest.mark.parametrize("make", [
    lambda: pyg_nn.GATConv((IN, IN + 2), OUT, heads=2, add_self_loops=False),
    lambda: pyg_nn.GATConv(IN, OUT, heads=2),
    lambda: pyg_nn.TransformerConv((IN, IN + 2), OUT, heads=2),
], ids=["GATConv-lin-src-dst", "GATConv-shared-lin", "TransformerConv"])
def test_bipartite_block(make):
    """x = (x_src, x_dst) with a [targets, sources] adj_t, as in mini-batch training; GAT adds a
    loop to each target (the targets come first among the sources)."""
    torch.manual_seed(0)
    reference = make().double()
    ours = as_fused(reference)
    g = torch.Generator().manual_seed(2)
    edges = torch.unique(torch.stack([torch.randint(0, 30, (120,), generator=g),
                                      torch.randint(0, 11, (120,), generator=g)]), dim=1)
    adj, pyg_adj = matrices((30, 12), edges, torch.ones(edges.shape[1], dtype=torch.float64))
    dst_channels = IN if isinstance(reference.in_channels, int) else reference.in_channels[1]
    x = (torch.randn(30, IN, dtype=torch.float64), torch.randn(12, dst_channels, dtype=torch.float64))
    got = run(ours, x, adj)
    assert got[0].shape[0] == 12
    assert_all_close(got, run(reference, x, pyg_adj))


def test_gat_without_target_features():
    torch.manual_seed(0)
    reference = pyg_nn.GATConv(IN, OUT, heads=2, add_self_loops=False).double()
    ours = as_fused(reference)
    adj, pyg_adj = matrices()
    x = torch.randn(N, IN, dtype=torch.float64)
    torch.testing.assert_close(ours((x, None), adj), reference((x, None), pyg_adj), rtol=0, atol=1e-12)


def test_graph_derived_once_per_matrix(monkeypatch):
    built = []
    derive = attention_layers.attention_graph
    monkeypatch.setattr(attention_layers, "attention_graph", lambda *a: built.append(1) or derive(*a))
    layer = fused(pyg_nn.GATConv)(IN, OUT, heads=2).double()
    adj, _ = matrices()
    x = torch.randn(N, IN, dtype=torch.float64)
    for _ in range(3):
        layer(x, adj).sum().backward()
    assert len(built) == 1
    layer(x, adj.with_values(adj.values() + 1))
    assert len(built) == 2


def test_edge_features_take_pyg_route():
    torch.manual_seed(0)
    reference = pyg_nn.GATConv(IN, OUT, heads=2, edge_dim=3, add_self_loops=False).double()
    ours = as_fused(reference)
    adj, pyg_adj = matrices()
    x, edge_attr = torch.randn(N, IN, dtype=torch.float64), torch.randn(adj.nnz, 3, dtype=torch.float64)
    torch.testing.assert_close(ours(x, adj, edge_attr), reference(x, pyg_adj, edge_attr), rtol=0, atol=1e-12)


def test_feature_rows_must_match_the_matrix():
    layer = fused(pyg_nn.GATConv)(IN, OUT).double()
    adj, _ = matrices()
    with pytest.raises(ValueError, match="source features have 39 rows but adj_t has 40 columns"):
        layer(torch.randn(N - 1, IN, dtype=torch.float64), adj)
    layer = fused(pyg_nn.TransformerConv)((IN, IN), OUT).double()
    with pytest.raises(ValueError, match="target features have 39 rows but adj_t has 40 rows"):
        layer((torch.randn(N, IN, dtype=torch.float64), torch.randn(N - 1, IN, dtype=torch.float64)), adj)
