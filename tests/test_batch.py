"""``TCSparseTensor.from_batch``: the CSR-only form of a matrix used a few times (a sampled
mini-batch or one of its bipartite blocks). Its products, gradients and transpose equal those of
the fully converted matrix; it builds the Tensor-Core layout only when a product needs it."""
import copy

import pytest
import torch

from torch_tcsparse import TCSparseTensor, conversion, kernels, product
from torch_tcsparse.formats import inputs
from torch_tcsparse.structure import BUILD_AFTER_USES, CsrStructure

NUM_SRC, NUM_DST = 70, 25


def block(num_edges=260, seed=3, dtype=torch.float64):
    """A bipartite block's edge_index (sources, targets) and weights; the last target isolated."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.stack([torch.randint(0, NUM_SRC, (num_edges,), generator=g),
                         torch.randint(0, NUM_DST - 1, (num_edges,), generator=g)])
    return edges, (torch.rand(num_edges, generator=g, dtype=torch.float64) + 0.5).to(dtype)


def pair(weights=None, **kwargs):
    edges, w = block(**kwargs)
    w = w if weights is None else weights
    return (TCSparseTensor.from_batch(edges, w, num_nodes=(NUM_SRC, NUM_DST)),
            TCSparseTensor.from_edge_index(edges, w, num_nodes=(NUM_SRC, NUM_DST)))


def is_pending(matrix) -> bool:
    return matrix._structure.layout_pending


def test_from_batch_holds_the_csr_only():
    light, full = pair()
    assert isinstance(light._structure, CsrStructure) and is_pending(light)
    assert light.shape == full.shape == (NUM_DST, NUM_SRC)
    for ours, theirs in ((light.crow_indices(), full.crow_indices()), (light.col_indices(), full.col_indices()),
                         (light.values(), full.values())):
        assert torch.equal(ours, theirs)
    torch.testing.assert_close(light.to_dense(), full.to_dense())
    assert is_pending(light)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_products_and_gradients_equal_the_converted_matrix(reduce, dtype):
    edges, w = block(dtype=dtype)
    values = w.clone().requires_grad_()
    light = TCSparseTensor.from_batch(edges, values, num_nodes=(NUM_SRC, NUM_DST))
    full = TCSparseTensor.from_edge_index(edges, values, num_nodes=(NUM_SRC, NUM_DST))
    x = torch.randn(NUM_SRC, 16, dtype=dtype, requires_grad=True)
    weight = torch.randn(NUM_DST, 16, dtype=dtype)
    results = []
    for matrix in (light, full):
        y = matrix.matmul(x, reduce=reduce)
        results.append([y, *torch.autograd.grad((y * weight).sum(), (x, values))])
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs)


def test_a_product_leaves_the_layout_pending():
    light, full = pair()
    x = torch.randn(NUM_SRC, 8, dtype=torch.float64)
    for reduce in ("sum", "mean", "max"):
        torch.testing.assert_close(light.matmul(x, reduce=reduce), full.matmul(x, reduce=reduce))
    assert is_pending(light)


def test_printing_leaves_the_layout_pending():
    light, full = pair()
    assert "tc_blocks=pending" in repr(light)
    assert is_pending(light)
    assert f"tc_blocks={full._structure.layout.num_blocks}" in repr(full)


def test_transposed_values_need_no_layout():
    light, full = pair()
    values = light.values().clone().requires_grad_()
    for _ in range(2):  # the transpose's build, then the kept one
        t_values = light.with_values(values).t().values()
        assert is_pending(light) and is_pending(light.t())
        torch.testing.assert_close(t_values, full.t().values())
        grad, = torch.autograd.grad((t_values * torch.arange(t_values.numel())).sum(), values)
        torch.testing.assert_close(grad, light._structure.transposed()._transpose_order.double())


def test_transpose_is_csr_only_and_exact():
    light, full = pair()
    t = light.t()
    assert isinstance(t._structure, CsrStructure) and is_pending(t)
    torch.testing.assert_close(t.to_dense(), full.t().to_dense())
    torch.testing.assert_close(t.t().to_dense(), full.to_dense())
    torch.testing.assert_close(light.t().to_dense(), full.t().to_dense())


def test_building_the_layout_unlinks_the_transpose():
    light, full = pair()
    light.t()
    light.stats()  # reads the layout: builds it
    assert not is_pending(light)
    assert "transpose" not in light._structure._derived
    torch.testing.assert_close(light.t().to_dense(), full.t().to_dense())
    x = torch.randn(NUM_SRC, 8, dtype=torch.float64)
    torch.testing.assert_close(light.matmul(x, path="reference"), full @ x)


def test_a_named_tensor_core_path_builds_the_layout():
    light, full = pair()
    x = torch.randn(NUM_SRC, 8, dtype=torch.float64)
    light.t()
    torch.testing.assert_close(light.matmul(x, path="reference"), full @ x)
    assert not is_pending(light)
    torch.testing.assert_close(light.t().to_dense(), full.t().to_dense())


def test_auto_builds_the_layout_after_its_price_in_products(monkeypatch):
    light, _ = pair(dtype=torch.float32)
    s = light._structure
    monkeypatch.setattr(kernels, "usable", lambda x: True)  # as on a GPU: "auto" asks the selector
    x = torch.randn(NUM_SRC, 128)
    for _ in range(BUILD_AFTER_USES):
        assert product.choose_path(s, x, "auto", "sum", False) == ("rows", None)
        assert is_pending(light)
    product.choose_path(s, x, "auto", "sum", False)
    assert not is_pending(light)


def test_copies_keep_the_light_form():
    light, full = pair()
    moved = light.to(torch.float32)
    assert is_pending(moved)
    x = torch.randn(NUM_SRC, 4)
    torch.testing.assert_close(moved @ x, full.float() @ x)
    copied = copy.deepcopy(light)
    torch.testing.assert_close(copied.to_dense(), full.to_dense())


def test_square_batch_and_pyg_edge_index_sizes():
    edges, w = block()
    square = TCSparseTensor.from_batch(edges, w, num_nodes=NUM_SRC)
    assert square.shape == (NUM_SRC, NUM_SRC) and is_pending(square)
    inferred = TCSparseTensor.from_batch(edges)
    assert inferred.shape == (int(edges.max()) + 1,) * 2


@pytest.mark.parametrize("window, error", [("16", TypeError), (16.0, TypeError), (4, ValueError), (True, TypeError)])
def test_from_batch_checks_its_window(window, error):
    edges, _ = block()
    with pytest.raises(error, match="window"):
        TCSparseTensor.from_batch(edges, window=window)


@pytest.mark.parametrize("edges, error, name", [
    (torch.zeros(2, 3), TypeError, "edge_index"),
    (torch.zeros(3, 3, dtype=torch.long), ValueError, "edge_index"),
    ([[0, 1], [1, 0]], TypeError, "edge_index"),
])
def test_from_batch_checks_its_edges(edges, error, name):
    with pytest.raises(error, match=name):
        TCSparseTensor.from_batch(edges)


def test_from_batch_checks_sizes_and_weights():
    edges, _ = block()
    with pytest.raises(ValueError, match="num_nodes"):
        TCSparseTensor.from_batch(edges, num_nodes=(NUM_SRC, NUM_DST, 1))
    with pytest.raises(ValueError, match="edge_weight"):
        TCSparseTensor.from_batch(edges, torch.ones(edges.shape[1], 2))


def csr_of(matrix):
    return matrix.crow_indices(), matrix.col_indices(), matrix.values()


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("weights", [None, torch.float64, torch.float16, torch.bfloat16])
def test_distinct_edges_take_one_sort_and_equal_from_edge_index(index_dtype, weights):
    edges, w = block()
    edges = torch.unique(edges, dim=1)[:, torch.randperm(torch.unique(edges, dim=1).shape[1])].to(index_dtype)
    w = None if weights is None else w[: edges.shape[1]].to(weights)
    csr, longest = conversion._distinct_edges_csr(edges, w, (NUM_SRC, NUM_DST), None)
    expected = inputs.from_edge_index(edges, w, (NUM_SRC, NUM_DST), None)
    assert longest == int(torch.bincount(edges[1], minlength=NUM_DST).max())
    assert (csr.num_rows, csr.num_cols) == (expected.num_rows, expected.num_cols)
    for ours, theirs in ((csr.rowptr, expected.rowptr), (csr.col, expected.col), (csr.values, expected.values)):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def test_the_one_sort_build_is_differentiable_and_casts():
    edges = torch.unique(block()[0], dim=1)
    w = torch.rand(edges.shape[1], dtype=torch.float64, requires_grad=True)
    csr, _ = conversion._distinct_edges_csr(edges, w, (NUM_SRC, NUM_DST), torch.float32)
    full = TCSparseTensor.from_edge_index(edges, w, num_nodes=(NUM_SRC, NUM_DST), dtype=torch.float32)
    assert csr.values.dtype == torch.float32 and torch.equal(csr.values, full.values())
    grad, = torch.autograd.grad((csr.values * torch.arange(csr.nnz)).sum(), w)
    expected, = torch.autograd.grad((full.values() * torch.arange(full.nnz)).sum(), w)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("case", ["duplicates", "negative source", "source too large", "negative target",
                                  "target too large", "target wrapping its key", "inferred sizes", "edge index",
                                  "integer weights"])
def test_the_one_sort_build_leaves_other_inputs_to_the_general_conversion(case):
    edges = torch.unique(block()[0], dim=1).clone()
    weights, sizes = None, (NUM_SRC, NUM_DST)
    if case == "duplicates":
        edges = torch.cat([edges, edges[:, :3]], dim=1)
    elif case == "negative source":
        edges[0, 3] = -1
    elif case == "source too large":
        edges[0, 3] = NUM_SRC
    elif case == "negative target":
        edges[1, 3] = -1
    elif case == "target too large":
        edges[1, 3] = NUM_DST
    elif case == "target wrapping its key":
        # 2**58 * 64 sources + 1 wraps to key 1: distinct keys, rows in range
        edges, sizes = torch.tensor([[0, 1], [0, 2**58]]), (64, 4)
    elif case == "inferred sizes":
        sizes = None
    elif case == "edge index":
        from torch_geometric import EdgeIndex

        edges = EdgeIndex(edges.contiguous(), sparse_size=sizes)
    else:
        weights = torch.arange(edges.shape[1])
    assert conversion._distinct_edges_csr(edges, weights, sizes, None) is None


@pytest.mark.parametrize("case", ["duplicates", "inferred sizes", "square int", "integer weights", "edge index"])
def test_other_inputs_take_the_general_conversion(case):
    edges, w = block()  # holds repeated edges
    kwargs = {"num_nodes": (NUM_SRC, NUM_DST)}
    if case != "duplicates":
        keep = torch.unique(edges, dim=1)
        edges, w = keep, w[: keep.shape[1]]
    if case == "inferred sizes":
        kwargs = {}
    elif case == "square int":
        kwargs = {"num_nodes": NUM_SRC}
    elif case == "integer weights":
        w, kwargs = torch.arange(edges.shape[1]), {**kwargs, "dtype": torch.float64}
    elif case == "edge index":
        from torch_geometric import EdgeIndex

        edges, kwargs = EdgeIndex(edges.contiguous(), sparse_size=(NUM_SRC, NUM_DST)), {}
    light = TCSparseTensor.from_batch(edges, w, **kwargs)
    full = TCSparseTensor.from_edge_index(edges, w, **kwargs)
    assert is_pending(light)
    for ours, theirs in zip(csr_of(light), csr_of(full)):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


@pytest.mark.parametrize("bad", ["negative source", "source too large", "target too large"])
def test_out_of_range_edges_are_named(bad):
    edges = torch.unique(block()[0], dim=1).clone()
    if bad == "negative source":
        edges[0, 3] = -1
    elif bad == "source too large":
        edges[0, 3] = NUM_SRC
    else:
        edges[1, 3] = NUM_DST
    with pytest.raises(ValueError) as ours:
        TCSparseTensor.from_batch(edges, num_nodes=(NUM_SRC, NUM_DST))
    with pytest.raises(ValueError) as theirs:
        TCSparseTensor.from_edge_index(edges, num_nodes=(NUM_SRC, NUM_DST))
    assert str(ours.value) == str(theirs.value) and "edge_index" in str(ours.value)


def test_empty_batches():
    none = torch.zeros(2, 0, dtype=torch.long)
    for num_nodes in ((NUM_SRC, NUM_DST), (0, 0), (NUM_SRC, 0)):
        light = TCSparseTensor.from_batch(none, num_nodes=num_nodes)
        assert light.shape == (num_nodes[1], num_nodes[0]) and light.nnz == 0
        torch.testing.assert_close(light @ torch.randn(num_nodes[0], 3), torch.zeros(num_nodes[1], 3))


pyg_nn = pytest.importorskip("torch_geometric.nn")

LAYERS = {
    "SAGEConv-mean": lambda: pyg_nn.SAGEConv(8, 4, aggr="mean"),
    "SAGEConv-max": lambda: pyg_nn.SAGEConv(8, 4, aggr="max"),
    "GraphConv": lambda: pyg_nn.GraphConv(8, 4),
    "GINConv": lambda: pyg_nn.GINConv(torch.nn.Linear(8, 4)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_pyg_layers_on_a_light_bipartite_block(name):
    """x = (x_src, x_dst) with a from_batch adj_t equals PyG on a torch.sparse CSR adj_t."""
    torch.manual_seed(0)
    layer = LAYERS[name]().double()
    light, full = pair()
    x_src, x_dst = torch.randn(NUM_SRC, 8, dtype=torch.float64), torch.randn(NUM_DST, 8, dtype=torch.float64)

    def run(adj_t):
        model = copy.deepcopy(layer)
        xs, xd = x_src.clone().requires_grad_(), x_dst.clone().requires_grad_()
        out = model((xs, xd), adj_t)
        (out * torch.arange(out.numel(), dtype=out.dtype).view_as(out).sin()).sum().backward()
        return [out, xs.grad, xd.grad] + [p.grad for p in model.parameters()]

    for ours, theirs in zip(run(light), run(full.to_torch_csr())):
        torch.testing.assert_close(ours, theirs)
