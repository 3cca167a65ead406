"""reduce= ("sum", "mean", "max", "min") on every CPU route and dtype: outputs and gradients against
a float64 reference built with torch.scatter_reduce(include_self=False), on duplicate-free random
graphs, empty rows, hub rows, rectangular and reordered matrices and non-contiguous X; gradcheck
in float64; torch.compile; validation."""
import pytest
import torch

import torch_tcsparse
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.engines import extreme
from torch_tcsparse.testing import random_coo, random_permutation

REDUCTIONS = ["sum", "mean", "max", "min"]
TORCH_REDUCE = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
REORDERS = ["none", "rcm", "degree", "permutation"]


def graph(kind: str, seed: int, dtype=torch.float64):
    """(row, col, values, shape) of a duplicate-free random matrix of the given kind."""
    m, k, density, dense_row = {
        "random": (37, 37, 0.12, None),
        "hub": (45, 45, 0.05, 3),  # row 3 holds every column
        "rectangular": (23, 41, 0.15, None),
        "empty_rows": (30, 30, 0.08, None),
        "small": (12, 12, 0.25, None),  # with empty rows, for gradcheck
    }[kind]
    row, col, values = random_coo(m, k, density, seed, dtype, dense_row=dense_row)
    if kind in ("empty_rows", "small"):
        keep = (row % 3) != 0  # every third row empty, and the last rows too
        keep &= row < m - 2
        row, col, values = row[keep], col[keep], values[keep]
    return row, col, values, (m, k)


def build(row, col, values, shape, reorder="none"):
    if reorder == "permutation":
        reorder = random_permutation(shape[0], seed=5) if shape[0] == shape[1] else "none"
    return TCSparseTensor.from_coo(row, col, values, shape, reorder=reorder)


def reference(row, col, values, x, num_rows, reduce):
    """The reduction of the products values[e] * x[col[e]] over each row, empty rows 0, in the
    dtype of the inputs (float64: the reference; another dtype: torch's own result there)."""
    products = values[:, None] * x[col]
    out = torch.zeros(num_rows, x.shape[1], dtype=x.dtype)
    return out.scatter_reduce(0, row[:, None].expand(-1, x.shape[1]), products, TORCH_REDUCE[reduce], include_self=False)


def tolerance(row, col, values, x, num_rows, reduce, dtype, exact):
    """Allowed absolute error at ``dtype``: exact for max/min (one rounding of the float64
    extreme), else 4x torch's own error at that dtype plus a few units in the last place."""
    if reduce in ("max", "min"):
        return 0.0
    theirs = reference(row, col, values.to(torch.float32 if dtype.itemsize < 4 else dtype),
                       x.to(torch.float32 if dtype.itemsize < 4 else dtype), num_rows, reduce).double()
    torch_error = float((theirs.to(dtype).double() - exact).abs().max()) if exact.numel() else 0.0
    scale = float(reference(row, col, values.abs(), x.abs(), num_rows, "sum").max()) if exact.numel() else 0.0
    return 4 * torch_error + 4 * torch.finfo(dtype).eps * scale


def check_forward(a, row, col, values, x, reduce, **kwargs):
    dtype = x.dtype
    exact = reference(row, col, values.double(), x.double(), a.shape[0], reduce)
    y = a.matmul(x, reduce=reduce, **kwargs)
    assert y.dtype == dtype and y.shape == exact.shape
    if reduce in ("max", "min"):
        # Rounding is monotone: the extreme of the exact products, rounded once.
        torch.testing.assert_close(y, exact.to(dtype), rtol=0, atol=0)
    else:
        allowed = tolerance(row, col, values.double(), x.double(), a.shape[0], reduce, dtype, exact)
        error = float((y.double() - exact).abs().max()) if exact.numel() else 0.0
        assert error <= allowed, f"{reduce} {dtype}: max error {error:.3g} over {allowed:.3g}"
    return y


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["random", "hub", "rectangular", "empty_rows"])
def test_forward_matches_scatter_reduce(kind, dtype, reduce):
    row, col, values, shape = graph(kind, seed=1, dtype=dtype)
    a = build(row, col, values, shape)
    x = torch.randn(shape[1], 9, dtype=torch.float64).to(dtype)
    y = check_forward(a, row, col, values, x, reduce)
    empty = torch.bincount(row, minlength=shape[0]) == 0
    assert torch.all(y[empty] == 0)


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("reorder", REORDERS)
def test_reordered_matrices(reorder, reduce):
    for kind in ("hub", "empty_rows"):
        row, col, values, shape = graph(kind, seed=2, dtype=torch.float32)
        a = build(row, col, values, shape, reorder)
        x = torch.randn(shape[1], 6)
        check_forward(a, row, col, values, x, reduce)


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("layout", ["transposed", "column_slice"])
def test_non_contiguous_x(reduce, layout):
    row, col, values, shape = graph("random", seed=3, dtype=torch.float32)
    a = build(row, col, values, shape)
    wide = torch.randn(shape[1], 12)
    x = {"transposed": torch.randn(7, shape[1]).t(), "column_slice": wide[:, 2:9:2]}[layout]
    check_forward(a, row, col, values, x, reduce)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_vector_x(reduce):
    row, col, values, shape = graph("hub", seed=3, dtype=torch.float32)
    a = build(row, col, values, shape)
    x = torch.randn(shape[1], 12)[:, 4]
    y = a.matmul(x, reduce=reduce)
    assert y.shape == (shape[0],)
    torch.testing.assert_close(y, check_forward(a, row, col, values, x.unsqueeze(1), reduce).squeeze(1))


CPU_PATHS = [(reduce, path) for reduce in REDUCTIONS for path in ("reference", "csr", "auto")
             if not (reduce in ("max", "min") and path == "csr")]  # max/min: test_validation


@pytest.mark.parametrize("reduce, path", CPU_PATHS)
def test_every_cpu_path(reduce, path):
    row, col, values, shape = graph("hub", seed=4, dtype=torch.float32)
    a = build(row, col, values, shape)
    check_forward(a, row, col, values, torch.randn(shape[1], 5), reduce, path=path)


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("reorder", ["none", "rcm"])
def test_gradients_match_reference(reduce, dtype, reorder):
    row, col, values, shape = graph("empty_rows", seed=6, dtype=dtype)
    a = build(row, col, values, shape, reorder)
    v = a.csr.values.clone().requires_grad_()
    x = torch.randn(shape[1], 5, dtype=dtype, requires_grad=True)
    weight = torch.randn(shape[0], 5, dtype=torch.float64)
    (a.with_values(v).matmul(x, reduce=reduce).double() * weight).sum().backward()

    csr_row, csr_col = a.csr.row_indices().long(), a.csr.col.long()
    v64 = a.csr.values.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    (reference(csr_row, csr_col, v64, x64, shape[0], reduce) * weight).sum().backward()
    rtol, atol = (1e-12, 1e-12) if dtype == torch.float64 else (1e-5, 1e-5)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=rtol, atol=atol)
    torch.testing.assert_close(v.grad.double(), v64.grad, rtol=rtol, atol=atol)
    empty = torch.bincount(csr_row, minlength=shape[0]) == 0
    assert empty.any()


def first_winner_gradients(rowptr, col, values, x, grad_y, reduce):
    """(dX, d(values)) in float64 with each output's gradient sent to the first nonzero of its
    row whose product is the extreme (torch.argmax takes the first): 16-bit data ties often,
    where scatter_reduce's backward would split the gradient among the tied nonzeros."""
    values, x, grad_y = values.double(), x.double(), grad_y.double()
    grad_x, grad_values = torch.zeros_like(x), torch.zeros_like(values)
    for i in range(rowptr.numel() - 1):
        lo, hi = int(rowptr[i]), int(rowptr[i + 1])
        if lo == hi:
            continue
        products = values[lo:hi, None] * x[col[lo:hi]]
        winner = lo + (products.argmax(0) if reduce == "max" else products.argmin(0))
        for c, e in enumerate(winner.tolist()):
            grad_x[col[e], c] += values[e] * grad_y[i, c]
            grad_values[e] += x[col[e], c] * grad_y[i, c]
    return grad_x, grad_values


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16bit_gradients(reduce, dtype):
    row, col, values, shape = graph("hub", seed=7, dtype=dtype)
    a = build(row, col, values, shape)
    v = a.csr.values.clone().requires_grad_()
    x = torch.randn(shape[1], 4).to(dtype).requires_grad_()
    grad_y = torch.randn(shape[0], 4).to(dtype)
    a.with_values(v).matmul(x, reduce=reduce).backward(grad_y)
    csr = a.csr
    if reduce in ("max", "min"):
        expected_x, expected_v = first_winner_gradients(csr.rowptr.long(), csr.col.long(), csr.values, x.detach(),
                                                        grad_y, reduce)
    else:
        v64, x64 = csr.values.double().requires_grad_(), x.detach().double().requires_grad_()
        reference(csr.row_indices().long(), csr.col.long(), v64, x64, shape[0], reduce).backward(grad_y.double())
        expected_x, expected_v = x64.grad, v64.grad
    tol = 4 * torch.finfo(dtype).eps
    torch.testing.assert_close(x.grad.double(), expected_x, rtol=tol, atol=tol * float(expected_x.abs().max()))
    torch.testing.assert_close(v.grad.double(), expected_v, rtol=tol, atol=tol * float(expected_v.abs().max()))


@pytest.mark.parametrize("reduce", ["mean", "max", "min"])
@pytest.mark.parametrize("reorder", ["none", "permutation"])
def test_gradcheck(reduce, reorder):
    row, col, values, shape = graph("small", seed=8)
    a = build(row, col, values, shape, reorder)
    v = a.csr.values.clone().requires_grad_()
    x = torch.randn(shape[1], 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, v: a.with_values(v).matmul(x, reduce=reduce), (x, v))


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_max_min_gradient_goes_to_one_winner(reduce):
    # Row 0 holds the same product twice: the first nonzero takes the whole gradient.
    a = TCSparseTensor.from_coo(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]), torch.tensor([1.0, 2.0, 3.0]), (3, 2))
    v = a.csr.values.clone().requires_grad_()
    x = torch.tensor([[2.0], [1.0]], requires_grad=True)
    y = a.with_values(v).matmul(x, reduce=reduce)
    torch.testing.assert_close(y, torch.tensor([[2.0], [3.0], [0.0]]))
    y.sum().backward()
    torch.testing.assert_close(v.grad, torch.tensor([2.0, 0.0, 1.0]))
    torch.testing.assert_close(x.grad, torch.tensor([[1.0], [3.0]]))


def _atomic_sums_on_cpu(grad_y, winners, col, values, x, needs_x, needs_values):
    """What the "rows" backward kernel returns, by index_add_ in float32 (a stand-in on the CPU)."""
    won = winners >= 0
    edge = winners.clamp(min=0).long()
    g = torch.where(won, grad_y.float(), 0.0)
    n = x.shape[1]
    grad_x = torch.zeros(x.shape[0] if needs_x else 0, n)
    grad_values = torch.zeros(values.numel() if needs_values else 0)
    if needs_x:
        grad_x.view(-1).index_add_(0, (col.long()[edge] * n + torch.arange(n)).view(-1),
                                   (values.float()[edge] * g).view(-1))
    if needs_values:
        grad_values.index_add_(0, edge.view(-1), (x.float()[col.long()[edge], torch.arange(n)] * g).view(-1))
    return grad_x, grad_values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
def test_rows_backward_takes_the_atomic_sums_outside_deterministic_mode(needs, dtype):
    """The "rows" path's backward hands the kernel's float32 sums back in the operands' dtypes and
    sends what it does not want as None; deterministic mode and the "reference" path keep the torch
    ops. The kernel's own results are checked on the GPU (tests/gpu/test_reduce_backward.py)."""
    row, col, values, shape = graph("empty_rows", seed=4, dtype=dtype)
    a = build(row, col, values, shape)
    s, v = a._structure, a.csr.values
    x = torch.randn(shape[1], 5).to(dtype)
    _, winners = extreme.forward(x, v, s.rowptr, s.col, "max", "reference")
    grad_y = torch.randn(shape[0], 5).to(dtype)
    calls = []

    def counted(*args):
        calls.append(args)
        return _atomic_sums_on_cpu(*args)

    expected = extreme.backward(grad_y, x, v, s.col, winners, *needs, "reference", counted)
    assert not calls
    got = extreme.backward(grad_y, x, v, s.col, winners, *needs, "rows", counted)
    assert len(calls) == 1
    for g, e, wanted, like in zip(got, expected, needs, (x, v)):
        assert (g is None) == (e is None) == (not wanted)
        if wanted:
            assert g.dtype == e.dtype == like.dtype and g.shape == e.shape == like.shape
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    torch.use_deterministic_algorithms(True)
    try:
        extreme.backward(grad_y, x, v, s.col, winners, *needs, "rows", counted)
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(calls) == 1


@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
def test_backward_op_fake_gives_float32_sums(needs):
    """tcsparse::spmm_extreme_backward as a compiled backward graph sees it: float32 dX
    [num_cols, N] and d(values) [nnz], each empty where not wanted."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_tcsparse import ops

    with FakeTensorMode():
        grad_y, winners = torch.empty(30, 6, dtype=torch.bfloat16), torch.empty(30, 6, dtype=torch.int32)
        col, values, x = torch.empty(90, dtype=torch.int32), torch.empty(90, dtype=torch.bfloat16), torch.empty(40, 6)
        grad_x, grad_values = ops.spmm_extreme_backward(grad_y, winners, col, values, x.bfloat16(), *needs)
        assert grad_x.dtype == grad_values.dtype == torch.float32
        assert grad_x.shape == ((40 if needs[0] else 0), 6) and grad_values.shape == ((90 if needs[1] else 0),)


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_nan_product_wins(reduce):
    # Row 0: the first NaN wins; row 1: all products -inf, the first wins; row 2: empty.
    a = TCSparseTensor.from_coo(torch.tensor([0, 0, 0, 0, 1, 1]), torch.tensor([0, 1, 2, 3, 0, 1]), torch.ones(6),
                                (3, 4))
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, -inf], [nan, -inf], [5.0, 2.0], [nan, 3.0]])
    y = a.matmul(x, reduce=reduce)
    y_grad_path, winners = extreme.forward(x, a.csr.values, a.csr.rowptr, a.csr.col, reduce, "reference")
    torch.testing.assert_close(y, y_grad_path, equal_nan=True, rtol=0, atol=0)
    assert torch.isnan(y[0, 0]) and y[1, 1] == -inf and bool((y[2] == 0).all())
    assert winners[0, 0] == 1 and winners[1, 1] == 4 and bool((winners[2] == -1).all())


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_routes_and_spellings(reduce):
    row, col, values, shape = graph("random", seed=9, dtype=torch.float32)
    a = build(row, col, values, shape)
    x = torch.randn(shape[1], 4)
    expected = a.matmul(x, reduce=reduce)
    torch.testing.assert_close(torch.sparse.mm(a, x, reduce), expected)
    torch.testing.assert_close(torch.sparse.mm(a, x, reduce=reduce), expected)
    torch.testing.assert_close(torch_tcsparse.spmm(a, x, reduce), expected)
    torch.testing.assert_close(torch_tcsparse.spmm(a, x, reduce=reduce, path="reference"), expected)
    alias = {"sum": "add", "max": "amax", "min": "amin"}.get(reduce)
    if alias is not None:
        torch.testing.assert_close(a.matmul(x, reduce=alias), expected)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_bias(reduce):
    row, col, values, shape = graph("empty_rows", seed=10, dtype=torch.float32)
    a = build(row, col, values, shape)
    x, bias = torch.randn(shape[1], 4), torch.randn(4)
    torch.testing.assert_close(a.matmul(x, bias=bias, reduce=reduce), a.matmul(x, reduce=reduce) + bias)


def test_mean_follows_values_changed_in_place():
    row, col, values, shape = graph("random", seed=11, dtype=torch.float32)
    a = build(row, col, values.clone(), shape)
    x = torch.randn(shape[1], 3)
    before = a.matmul(x, reduce="mean")
    with torch.no_grad():
        a._values.mul_(2)
    torch.testing.assert_close(a.matmul(x, reduce="mean"), 2 * before)


@pytest.mark.parametrize("reduce", ["mean", "max", "min"])
def test_autocast_on_cpu(reduce):
    row, col, values, shape = graph("random", seed=12, dtype=torch.float32)
    a = build(row, col, values, shape)
    x = torch.randn(shape[1], 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = a.matmul(x, reduce=reduce)
    assert y.dtype == torch.bfloat16
    check_forward(a.to(torch.bfloat16), row, col, values.to(torch.bfloat16), x.to(torch.bfloat16), reduce)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("reduce", ["mean", "max", "min"])
def test_compiles_fullgraph_with_gradients(fresh_dynamo, reduce):
    row, col, values, shape = graph("empty_rows", seed=13, dtype=torch.float32)
    a = build(row, col, values, shape, "rcm")
    a.t()  # the transpose's structure is built eagerly, outside the graph
    x = torch.randn(shape[1], 5, requires_grad=True)
    compiled = torch.compile(lambda x: torch.relu(a.matmul(x, reduce=reduce)) * 2, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    eager = torch.relu(a.matmul(x, reduce=reduce)) * 2
    torch.testing.assert_close(y, eager)
    (grad,) = torch.autograd.grad(y.pow(2).sum(), x)
    (expected,) = torch.autograd.grad(eager.pow(2).sum(), x)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("reduce", ["mean", "max", "min"])
def test_compiled_value_gradients_match_eager(fresh_dynamo, reduce):
    row, col, values, shape = graph("hub", seed=14, dtype=torch.float32)
    a = build(row, col, values, shape)
    x = torch.randn(shape[1], 3)

    def loss(x, v):
        return a.with_values(v).matmul(x, reduce=reduce).pow(2).sum()

    eager_x, eager_v = x.clone().requires_grad_(), a.csr.values.clone().requires_grad_()
    loss(eager_x, eager_v).backward()
    compiled_x, compiled_v = x.clone().requires_grad_(), a.csr.values.clone().requires_grad_()
    torch.compile(loss, backend="aot_eager")(compiled_x, compiled_v).backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)
    torch.testing.assert_close(compiled_v.grad, eager_v.grad)


def test_validation():
    row, col, values, shape = graph("random", seed=15, dtype=torch.float32)
    a = build(row, col, values, shape)
    x = torch.randn(shape[1], 2)
    with pytest.raises(ValueError, match="reduce must be one of.*'prod'"):
        a.matmul(x, reduce="prod")
    with pytest.raises(TypeError, match="reduce must be a str, got int"):
        a.matmul(x, reduce=1)
    with pytest.raises(ValueError, match="reduce='max'/'min' runs on path.*path='base'"):
        a.matmul(x, reduce="max", path="base")
    with pytest.raises(ValueError, match="path 'rows' needs a CUDA tensor"):
        a.matmul(x, reduce="min", path="rows")
    with pytest.raises(ValueError, match="shape mismatch"):
        a.matmul(torch.randn(shape[1] + 1, 2), reduce="max")
    with pytest.raises(TypeError, match="dtype mismatch"):
        a.matmul(x.double(), reduce="mean")
