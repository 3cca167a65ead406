"""GPU tests of multi-head attention (csrc/attention.cu and the layers over it).

Kernels against float64 references from the same (dtype-rounded) data: every lane shape of the
weighted sum (8, 16, 32 lanes; 1, 2, 4 features per lane; several feature tiles), hub rows cut
into pieces with their slots merged, empty rows, the transpose's edge ids; the dots in 16-byte
copies and one element at a time (odd channels, unaligned bases); outputs poisoned with NaN
first, so an unwritten entry fails. Then the autograd route against our SpMM per head, GATConv
(concat and mean heads, with and without self-loops) and TransformerConv through ``fused``
against PyG's layers in float64, and GATConv's peak memory against PyG's.
"""
import copy

import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import fused
from torch_tcsparse.nn import multihead
from torch_tcsparse.nn.attention_graph import AttentionGraph, PIECE_NNZ

from .kernel_data import SUBSET, poison, random_matrix

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (heads, channels): features 4, 8, 16, 24, 32, 64, 96, 128, 300 reach every lane shape and tiles.
SHAPES = [(1, 4), (2, 4), (2, 8), (3, 8), (4, 8), (8, 8), (4, 24), (8, 16), (3, 100)]
if SUBSET:
    SHAPES = [(2, 4), (8, 8), (3, 100)]
# Sums in fp32 over a few dozen terms, one rounding to the dtype.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def graph(m=3000, k=2500, hub_nnz=3 * PIECE_NNZ + 17, seed=0):
    """AttentionGraph of a random matrix with empty rows and a hub row of several pieces."""
    row, col, _ = random_matrix(m, k, 6, empty_fraction=0.2, hub_row=m // 2, hub_nnz=hub_nnz, seed=seed)
    adj = TCSparseTensor.from_coo(row, col, torch.ones(row.numel(), device="cuda"), (m, k))
    return AttentionGraph(adj)


def features(rows, heads, channels, dtype):
    return torch.randn(rows, heads, channels, device="cuda").to(dtype)


def relative_error(got, exact):
    assert bool(torch.isfinite(got).all()), "an output entry was not written"
    return float((got.double() - exact).norm() / exact.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads, channels", SHAPES)
def test_weighted_sum_and_its_transpose(heads, channels, dtype):
    g = graph()
    o = g.kernel_operands(torch.empty(0, device="cuda", dtype=dtype))
    assert o is not None and o.pieces.num_slots > 0
    weights = torch.rand(g.nnz, heads, device="cuda").to(dtype)
    x = features(g.num_cols, heads, channels, dtype)
    row, col = g.row.long(), g.col.long()
    exact = torch.zeros(g.num_rows, heads, channels, dtype=torch.float64, device="cuda")
    exact.index_add_(0, row, weights.double()[:, :, None] * x.double()[col])
    poison(g.num_rows * heads * channels * dtype.itemsize // 4 + 1)
    y = multihead.CUDA_KERNELS.spmm(weights, x, o.col, None, o.pieces, o.num_rows)
    assert y.dtype == dtype and y.shape == exact.shape
    assert relative_error(y, exact) < TOLERANCE[dtype]

    grad = features(g.num_rows, heads, channels, dtype)
    exact_t = torch.zeros(g.num_cols, heads, channels, dtype=torch.float64, device="cuda")
    exact_t.index_add_(0, col, weights.double()[:, :, None] * grad.double()[row])
    y_t = multihead.CUDA_KERNELS.spmm(weights, grad, o.col_t, o.edge_ids_t, o.pieces_t, o.num_cols)
    assert relative_error(y_t, exact_t) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads, channels", SHAPES + [(2, 7), (3, 1)])
@pytest.mark.parametrize("aligned", [True, False])
def test_dots(heads, channels, dtype, aligned):
    g = graph()
    o = g.kernel_operands(torch.empty(0, device="cuda", dtype=dtype))

    def operand(rows):
        # An unaligned base (one element in) takes the kernel's element-wise loads.
        size, first = rows * heads * channels, 0 if aligned else 1
        storage = torch.randn(size + 1, device="cuda").to(dtype)
        return storage[first:first + size].view(rows, heads, channels)

    a, b = operand(g.num_rows), operand(g.num_cols)
    exact = (a.double()[g.row.long()] * b.double()[g.col.long()]).sum(-1)
    poison(g.nnz * heads * dtype.itemsize // 4 + 1)
    got = multihead.CUDA_KERNELS.sddmm(a, b, o.row, o.col)
    assert got.dtype == dtype and got.shape == (g.nnz, heads)
    assert relative_error(got, exact) < TOLERANCE[dtype]


@pytest.mark.parametrize("heads", [1, 4])
def test_autograd_route_equals_our_spmm_per_head(heads):
    g = graph(400, 700, hub_nnz=2 * PIECE_NNZ)
    weights = torch.rand(g.nnz, heads, device="cuda", requires_grad=True)
    x = torch.randn(g.num_cols, heads, 16, device="cuda", requires_grad=True)
    got, expected = multihead.multihead_spmm(g, weights, x), multihead.per_head_products(g.matrix, weights, x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    grad = torch.randn_like(got)
    for mine, theirs in zip(torch.autograd.grad(got, (weights, x), grad),
                            torch.autograd.grad(expected, (weights, x), grad)):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    a = torch.randn(g.num_rows, heads, 16, device="cuda")
    for transposed, features in ((False, x.detach()), (True, a)):
        torch.testing.assert_close(multihead.weighted_sums(g, weights.detach(), features, transposed),
                                   multihead.per_head_products(g.matrix, weights.detach(), features, transposed),
                                   rtol=1e-4, atol=1e-4)


# name: (PyG class, arguments)
LAYERS = {
    "GATConv": ("GATConv", dict(in_channels=32, out_channels=8, heads=4)),
    "GATConv-1-head": ("GATConv", dict(in_channels=32, out_channels=16)),
    "GATConv-8-heads-mean": ("GATConv", dict(in_channels=32, out_channels=8, heads=8, concat=False)),
    "GATConv-no-loops": ("GATConv", dict(in_channels=32, out_channels=8, heads=2, add_self_loops=False)),
    "TransformerConv-1-head": ("TransformerConv", dict(in_channels=32, out_channels=8)),
    "TransformerConv": ("TransformerConv", dict(in_channels=32, out_channels=8, heads=4, beta=True)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_on_cuda_equals_pyg_in_float64(name, dtype):
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    pyg_utils = pytest.importorskip("torch_geometric.utils")
    class_name, arguments = LAYERS[name]
    torch.manual_seed(0)
    reference = getattr(pyg_nn, class_name)(**arguments).double()
    ours = copy.deepcopy(reference)
    ours.__class__ = fused(type(reference))
    ours = ours.to(device="cuda", dtype=dtype)
    row, col, _ = random_matrix(2000, 2000, 8, hub_row=7, hub_nnz=1500, seed=1)
    edges = torch.unique(torch.stack([col, row]), dim=1)
    adj = TCSparseTensor.from_edge_index(edges, num_nodes=2000, dtype=dtype)
    pyg_adj = pyg_utils.to_torch_csr_tensor(edges.flip(0).cpu(), size=(2000, 2000)).double()
    x = torch.randn(2000, 32, dtype=torch.float64)

    def run(layer, x, adj):
        x = x.clone().requires_grad_()
        out = layer(x, adj)
        weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float64, device=out.device).view_as(out)
        (out.double() * weight).sum().backward()
        return [out, x.grad] + [p.grad for p in layer.parameters()]

    got = run(ours, x.to(device="cuda", dtype=dtype), adj)
    expected = run(reference, x, pyg_adj)
    # PyG's own layer in the same dtype on the GPU sets the error allowed: the dtype's rounding
    # of the layer's intermediates, not our products, dominates in 16 bits.
    pyg_same_dtype = copy.deepcopy(reference).to(device="cuda", dtype=dtype)
    theirs_rounded = run(pyg_same_dtype, x.to(device="cuda", dtype=dtype), pyg_adj.to("cuda").to(dtype))

    def error(got, exact):
        return float((got.double().cpu() - exact).norm() / exact.norm().clamp_min(1e-30))

    for mine, rounded, exact in zip(got, theirs_rounded, expected):
        assert error(mine, exact) <= 3 * error(rounded, exact) + 1e-5


def test_gat_kernel_route_runs_and_needs_less_memory_than_pyg(monkeypatch):
    """8 heads of 8 channels on a graph of 1M+ edges: the forward runs the kernels, and forward +
    backward peak below PyG's GATConv on edge_index (which gathers E x 64 messages)."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    from graph_data import synthetic

    row, col, num_nodes = synthetic.rmat(16, device="cuda")
    edges = torch.stack([row, col])
    adj = TCSparseTensor.from_edge_index(edges, num_nodes=num_nodes)
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(64, 8, heads=8).cuda()
    ours = fused(pyg_nn.GATConv)(64, 8, heads=8).cuda()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(num_nodes, 64, device="cuda")
    calls = []
    spmm = multihead.CudaKernels.spmm
    monkeypatch.setattr(multihead.CudaKernels, "spmm", staticmethod(lambda *a: calls.append(1) or spmm(*a)))

    def peak(layer, graph):
        layer(x, graph).sum().backward()  # the derived graph and the kernels' operands, once
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        layer(x, graph).sum().backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before

    ours_peak, theirs_peak = peak(ours, adj), peak(theirs, edges)
    assert calls, "the multi-head kernel did not run"
    assert ours_peak < theirs_peak, (ours_peak, theirs_peak)
