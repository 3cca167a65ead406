"""GPU tests of the attention softmax with in-kernel scores (csrc/edge_softmax.cu) and the
transpose's row sums (csrc/attention.cu), through ``edge_attention``'s autograd functions.

The kernel route against the torch route (``TorchRoute``, the contract CPU runs use) in float64
from the same dtype-rounded inputs: attention weights and the gradients of every per-node array,
for GAT with and without target scores and for dot products, one head and several (H = 1, 3, 8),
on a graph with empty rows and hub rows cut into many pieces of 64 edges. Each dtype may err by
a few times what the torch route itself errs by in that dtype, or one rounding of the exact
result, whichever is larger. Outputs are poisoned with NaN first, so an unwritten entry fails;
two runs give the same bits (no atomics) where the kernels compute everything.
"""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.nn import edge_attention
from torch_tcsparse.nn.attention_graph import SOFTMAX_PIECE_EDGES, AttentionGraph

from .kernel_data import poison, random_matrix

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEADS = [1, 3, 8]


def graph(m=3000, k=2500, seed=0):
    """Empty rows (a fifth), a hub row of many pieces and one just over one piece."""
    row, col, _ = random_matrix(m, k, 6, empty_fraction=0.2, hub_row=m // 2, hub_nnz=2000, seed=seed)
    row = torch.cat([row, torch.full((SOFTMAX_PIECE_EDGES + 1,), 7, device="cuda")])
    col = torch.cat([col, torch.arange(SOFTMAX_PIECE_EDGES + 1, device="cuda")])
    adj = TCSparseTensor.from_coo(row, col, torch.ones(row.numel(), device="cuda"), (m, k))
    return AttentionGraph(adj)


def relative_error(got, exact):
    assert bool(torch.isfinite(got).all()), "an entry was not written"
    return float((got.double() - exact).norm() / exact.norm().clamp_min(1e-30))


def rounding_error(exact, dtype):
    return float((exact.to(dtype).double() - exact).norm() / exact.norm().clamp_min(1e-30))


def run(function, arrays, route, grad):
    """(alpha, gradient of each array) of ``function`` on ``route``."""
    leaves = [None if a is None else a.detach().clone().requires_grad_() for a in arrays]
    alpha = function.apply(*leaves, route, *PARAMETER[function])
    grads = torch.autograd.grad(alpha, [a for a in leaves if a is not None], grad.to(alpha.dtype))
    return [alpha, *grads]


PARAMETER = {edge_attention.GatAttention: (0.2,), edge_attention.DotAttention: (0.35,)}


def check(function, arrays, dtype, g):
    arrays = [None if a is None else a.to(dtype) for a in arrays]
    o = g.kernel_operands(arrays[0])
    assert o is not None
    heads = arrays[0].shape[1]
    grad = torch.randn(g.nnz, heads, device="cuda")
    exact = run(function, [None if a is None else a.double() for a in arrays], edge_attention.TorchRoute(g),
                grad.double())
    rounded = run(function, arrays, edge_attention.TorchRoute(g), grad.to(dtype))
    poison(g.nnz * heads * dtype.itemsize // 4 + 1)
    got = run(function, arrays, edge_attention.KernelRoute(g, o), grad.to(dtype))
    again = run(function, arrays, edge_attention.KernelRoute(g, o), grad.to(dtype))
    assert len(got) == len(exact)
    # Dot attention's one-head gradients run our SpMM, whose sums may use atomics.
    reproducible = function is edge_attention.GatAttention or heads > 1
    for i, (mine, repeat, theirs, reference) in enumerate(zip(got, again, rounded, exact)):
        assert mine.dtype == dtype and mine.shape == reference.shape
        assert torch.equal(mine, repeat) or (i > 0 and not reproducible)
        allowed = 4 * max(relative_error(theirs, reference), rounding_error(reference, dtype)) + 1e-6
        assert relative_error(mine, reference) <= allowed


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("with_dst", [True, False])
def test_gat_attention_kernels_equal_the_torch_route(heads, dtype, with_dst):
    g = graph()
    src = 2 * torch.randn(g.num_cols, heads, device="cuda")
    dst = 2 * torch.randn(g.num_rows, heads, device="cuda") if with_dst else None
    check(edge_attention.GatAttention, [src, dst], dtype, g)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("channels", [8, 7])
def test_dot_attention_kernels_equal_the_torch_route(heads, channels, dtype):
    g = graph(seed=1)
    query = torch.randn(g.num_rows, heads, channels, device="cuda")
    key = torch.randn(g.num_cols, heads, channels, device="cuda")
    check(edge_attention.DotAttention, [query, key], dtype, g)


@pytest.mark.parametrize("heads", [1, 8])
def test_rows_sum_to_one_and_empty_rows_read_nothing(heads):
    g = graph(seed=2)
    src = torch.randn(g.num_cols, heads, device="cuda")
    dst = torch.randn(g.num_rows, heads, device="cuda")
    alpha = edge_attention.gat_attention(g, src, dst, 0.2)
    sums = torch.zeros(g.num_rows, heads, device="cuda").index_add_(0, g.row.long(), alpha)
    filled = g.lengths > 0
    assert int((~filled).sum()) > 0 and int(g.lengths.max()) > 20 * SOFTMAX_PIECE_EDGES
    torch.testing.assert_close(sums[filled], torch.ones_like(sums[filled]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transpose_row_sums(dtype):
    g = graph(seed=3)
    o = g.kernel_operands(torch.empty(0, device="cuda", dtype=dtype))
    values = torch.randn(g.nnz, 8, device="cuda").to(dtype)
    exact = torch.zeros(g.num_cols, 8, dtype=torch.float64, device="cuda").index_add_(0, g.col.long(),
                                                                                      values.double())
    poison(g.num_cols * 8 * dtype.itemsize // 4 + 1)
    got = edge_attention.KernelRoute(g, o).column_sums(values)
    assert got.dtype == dtype
    assert relative_error(got, exact) <= 4 * rounding_error(exact, dtype) + 1e-6
