"""GPU tests of the max/min backward kernel (csrc/reduce_rows_backward.cu): each output's gradient
added to its winner, dX[col[k], c] += values[k] * dY[i, c] and d(values)[k] += X[col[k], c] * dY[i, c]
for k = winners[i, c].

The winners come from the forward kernel and must equal the torch ops' (the tie rule of
engines/extreme.py); the gradients are checked against float64 sums over those winners, within the
bound of a float32 sum of the same terms (plus one rounding to a 16-bit dtype), and against torch's
own error at the same precision (the torch ops' index_put_ path, float32 sums). Outputs poisoned
with NaN before every call. N in {1, 7, 32, 64, 257} (4 columns a thread where N is a multiple of
4, else 1), rows split into pieces (a hub row), a hub column whose row of dX takes an add from
most rows, empty rows, ties, misaligned dY, strided X, deterministic mode, the compiled op.
"""
import pytest
import torch

from torch_tcsparse import TCSparseTensor, _ext, ops
from torch_tcsparse.engines import extreme
from torch_tcsparse.formats.csr import from_coo

from .kernel_data import poison, random_matrix

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EXTREMES = ["max", "min"]
N_VALUES = [1, 7, 32, 64, 257]
NEEDS = [(True, True), (True, False), (False, True)]


def matrix(dtype, m=3000, k=2500, hub_row_nnz=2000, seed=0):
    """A CSR with a quarter of its rows empty, one row of hub_row_nnz nonzeros (more than 256: the
    forward reduces it in pieces) and a hub column 0 held by every third row, with values large
    enough to win most of those rows' outputs (max) or lose them (min)."""
    row, col, values = random_matrix(m, k, 6, empty_fraction=0.25, hub_row=17, hub_nnz=hub_row_nnz, seed=seed)
    hub = torch.arange(0, m, 3, device="cuda")
    hub = hub[torch.isin(hub, row)]  # keep the empty rows empty
    row, col = torch.cat([row, hub]), torch.cat([col, torch.zeros_like(hub)])
    values = torch.cat([values, torch.full((hub.numel(),), 4.0, device="cuda")])
    return from_coo(row, col, values.to(dtype), m, k)


def operands(csr, n, dtype, seed=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(csr.num_cols, n, device="cuda", generator=gen)
    x[0] = x[0].abs() + 3.0  # the hub column's products are the largest of their rows
    grad_y = torch.randn(csr.num_rows, n, device="cuda", generator=gen)
    return x.to(dtype), grad_y.to(dtype)


def winners_of(csr, x, reduce):
    _, winners = _ext.load().reduce_rows(x, csr.rowptr, csr.col, csr.values, reduce == "max", -1)
    _, winners_torch = extreme.forward(x, csr.values, csr.rowptr, csr.col, reduce, "reference")
    assert torch.equal(winners, winners_torch)
    return winners


def kernel(csr, x, grad_y, winners, needs):
    poison(csr.num_cols * x.shape[1])
    poison(csr.nnz)
    grad_x, grad_values = _ext.load().reduce_rows_backward(grad_y, winners, csr.col, csr.values, x, *needs)
    torch.cuda.synchronize()
    assert grad_x.dtype == grad_values.dtype == torch.float32
    assert grad_x.shape == ((csr.num_cols if needs[0] else 0), x.shape[1])
    assert grad_values.shape == ((csr.nnz if needs[1] else 0),)
    return grad_x, grad_values


def exact(csr, x, grad_y, winners):
    """float64 (dX, d(values)) over the winners, and per entry the sum of |terms| and their count."""
    n = x.shape[1]
    won = (winners >= 0).reshape(-1)
    edge = winners.reshape(-1)[won].long()
    column = torch.arange(n, device="cuda").repeat(csr.num_rows)[won]
    g = grad_y.double().reshape(-1)[won]
    j = csr.col.long()[edge]
    terms_x = csr.values.double()[edge] * g
    terms_v = x.double()[j, column] * g

    def sums(index, terms, size):
        out = torch.zeros(size, dtype=torch.float64, device="cuda")
        return (out.index_add(0, index, terms), out.index_add(0, index, terms.abs()),
                out.index_add(0, index, torch.ones_like(terms)))

    dx = [s.view(csr.num_cols, n) for s in sums(j * n + column, terms_x, csr.num_cols * n)]
    dv = sums(edge, terms_v, csr.nnz)
    return dx, dv


def check_sums(got, reference, dtype):
    """got (float32 sums, rounded here to dtype) within the bound of a float32 sum of the terms
    (each term rounded once, count + 1 roundings of partial sums, 2 units of the count for
    safety) plus one rounding to dtype (relative, or one step of its subnormals)."""
    value, magnitude, count = reference
    rounded = got.to(dtype).double()
    assert bool(torch.isfinite(rounded).all()), "an entry was not written"
    eps32, info = torch.finfo(torch.float32).eps, torch.finfo(dtype)
    bound = (count + 2) * eps32 * magnitude + info.eps * value.abs() + info.tiny * info.eps
    assert bool(((rounded - value).abs() <= bound).all()), float(((rounded - value).abs() / bound).max())


def relative_error(out, ref):
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def check_against_torch(csr, x, grad_y, winners, got, reference, needs):
    """Relative errors at most twice the torch ops' (float32 sums by index_put_ in another order,
    rounded to the dtype) plus the typical error of a float32 sum of the terms (sqrt(count) units
    of their magnitude) and 4 units of the dtype: a lost or doubled term is far above that."""
    torch_x, torch_v = extreme.backward(grad_y, x, csr.values, csr.col, winners, *needs, "reference")
    eps32 = torch.finfo(torch.float32).eps
    for wanted, mine, theirs, (value, magnitude, count) in zip(needs, got, (torch_x, torch_v), reference):
        if wanted:
            typical = eps32 * (count + 1).sqrt() * magnitude
            floor = float(typical.norm() / value.norm().clamp_min(1e-30)) + 4 * torch.finfo(x.dtype).eps
            assert relative_error(mine.to(x.dtype), value) <= 2 * relative_error(theirs, value) + floor


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
@pytest.mark.parametrize("n", N_VALUES)
@pytest.mark.parametrize("needs", NEEDS, ids=["both", "x", "values"])
def test_gradients_match_float64(needs, n, reduce, dtype):
    csr = matrix(dtype)
    x, grad_y = operands(csr, n, dtype)
    winners = winners_of(csr, x, reduce)
    grad_x, grad_values = kernel(csr, x, grad_y, winners, needs)
    dx, dv = exact(csr, x, grad_y, winners)
    if needs[0]:
        check_sums(grad_x, dx, dtype)
    if needs[1]:
        check_sums(grad_values, dv, dtype)
    check_against_torch(csr, x, grad_y, winners, (grad_x, grad_values), (dx, dv), needs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
def test_hub_column_takes_most_rows(reduce, dtype):
    """Most rows' outputs of a max go to column 0 (its values and X's row are the largest), so
    its row of dX sums an add from about a third of the rows per column."""
    csr = matrix(dtype, m=60000, k=20000, hub_row_nnz=10000)
    x, grad_y = operands(csr, 32, dtype)
    winners = winners_of(csr, x, reduce)
    if reduce == "max":
        hub_wins = (csr.col.long()[winners.clamp(min=0).long()] == 0) & (winners >= 0)
        assert int(hub_wins.sum(0).min()) > 60000 // 6
    grad_x, grad_values = kernel(csr, x, grad_y, winners, (True, True))
    dx, dv = exact(csr, x, grad_y, winners)
    check_sums(grad_x, dx, dtype)
    check_sums(grad_values, dv, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
@pytest.mark.parametrize("n", [7, 32])
def test_ties_follow_the_forward_winners(n, reduce, dtype):
    """Small integers: most outputs are ties, broken by the forward's rule (the first nonzero); the
    sums are exact in float32, so the kernel equals the torch ops bit for bit."""
    m, k = 2000, 300
    row, col, _ = random_matrix(m, k, 10, seed=3)
    values = torch.randint(-2, 3, (row.numel(),), device="cuda").float()
    csr = from_coo(row, col, values.to(dtype), m, k)
    x = torch.randint(-3, 4, (k, n), device="cuda").to(dtype)
    grad_y = torch.randint(-2, 3, (m, n), device="cuda").to(dtype)
    winners = winners_of(csr, x, reduce)
    grad_x, grad_values = kernel(csr, x, grad_y, winners, (True, True))
    torch_x, torch_v = extreme.backward(grad_y, x, csr.values, csr.col, winners, True, True, "reference")
    assert torch.equal(grad_x.to(dtype), torch_x) and torch.equal(grad_values.to(dtype), torch_v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_grad_y_and_strided_x(dtype):
    """dY starting 2 elements into its storage (its rows are read one element at a time) and X a
    column slice of a wider array (its row stride is not N)."""
    csr = matrix(dtype, m=1500, k=1200, hub_row_nnz=600)
    wide = torch.randn(csr.num_cols, 40, device="cuda").to(dtype)
    x = wide[:, 3:35]
    winners = winners_of(csr, x, "max")
    storage = torch.randn(csr.num_rows * 32 + 2, device="cuda").to(dtype)
    grad_y = storage[2:].view(csr.num_rows, 32)
    assert grad_y.data_ptr() % 16 != 0
    grad_x, grad_values = kernel(csr, x, grad_y, winners, (True, True))
    dx, dv = exact(csr, x, grad_y, winners)
    check_sums(grad_x, dx, dtype)
    check_sums(grad_values, dv, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
@pytest.mark.parametrize("n", [7, 64])
def test_product_gradients_against_float64_on_the_cpu(n, reduce, dtype):
    """A.matmul(X, reduce=...) with X and the values requiring grad: the rows path's forward and
    this backward, against the float64 CPU product's gradients (no ties in randn data)."""
    m = k = 2000
    row, col, values = random_matrix(m, k, 7, empty_fraction=0.2, hub_row=5, hub_nnz=1500, seed=4)
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), shape=(m, k))
    v = a.csr.values.clone().requires_grad_()
    x = torch.randn(k, n, device="cuda").to(dtype).requires_grad_()
    y = a.with_values(v).matmul(x, reduce=reduce, path="rows")
    grad_y = torch.randn_like(y)
    poison(k * n)
    y.backward(grad_y)
    cpu = a.cpu().double()
    v64, x64 = cpu.csr.values.clone().requires_grad_(), x.detach().cpu().double().requires_grad_()
    cpu.with_values(v64).matmul(x64, reduce=reduce).backward(grad_y.double().cpu())
    tol = 1e-5 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps
    torch.testing.assert_close(x.grad.double().cpu(), x64.grad, rtol=tol, atol=tol * float(x64.grad.abs().max()))
    torch.testing.assert_close(v.grad.double().cpu(), v64.grad, rtol=tol, atol=tol * float(v64.grad.abs().max()))


@pytest.mark.parametrize("reduce", EXTREMES)
def test_deterministic_mode_repeats_the_torch_ops(reduce):
    """Under deterministic algorithms the rows path's backward is the torch ops' (sorted adds): the
    same bits on every run, equal to the reference path's backward of the same winners."""
    csr = matrix(torch.float32, m=20000, k=5000, hub_row_nnz=3000)
    a = TCSparseTensor.from_csr(csr.rowptr, csr.col, csr.values, shape=(csr.num_rows, csr.num_cols))
    x, grad_y = operands(csr, 32, torch.float32)
    winners = winners_of(a.csr, x, reduce)
    grads = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            v, xx = a.csr.values.clone().requires_grad_(), x.clone().requires_grad_()
            a.with_values(v).matmul(xx, reduce=reduce, path="rows").backward(grad_y)
            grads.append((xx.grad, v.grad))
        grads.append(extreme.backward(grad_y, x, a.csr.values, a.csr.col, winners, True, True, "reference"))
    finally:
        torch.use_deterministic_algorithms(False)
    for other in grads[1:]:
        assert torch.equal(grads[0][0], other[0]) and torch.equal(grads[0][1], other[1])


def test_backward_op_matches_its_fake():
    csr = matrix(torch.float32, m=500, k=400, hub_row_nnz=300)
    x, grad_y = operands(csr, 12, torch.float32)
    winners = winners_of(csr, x, "max")
    for needs in NEEDS:
        torch.library.opcheck(ops.spmm_extreme_backward, (grad_y, winners, csr.col, csr.values, x, *needs),
                              test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("reduce", EXTREMES)
def test_compiled_gradients_match_eager(reduce):
    """The compiled product's backward graph holds tcsparse::spmm_extreme_backward."""
    torch._dynamo.reset()
    csr = matrix(torch.float32, m=1500, k=1200, hub_row_nnz=600)
    a = TCSparseTensor.from_csr(csr.rowptr, csr.col, csr.values, shape=(csr.num_rows, csr.num_cols))
    x, _ = operands(csr, 16, torch.float32)

    def loss(x, v):
        return a.with_values(v).matmul(x, reduce=reduce).pow(2).sum()

    eager_x, eager_v = x.clone().requires_grad_(), a.csr.values.clone().requires_grad_()
    loss(eager_x, eager_v).backward()
    compiled_x, compiled_v = x.clone().requires_grad_(), a.csr.values.clone().requires_grad_()
    torch.compile(loss, backend="aot_eager", fullgraph=True)(compiled_x, compiled_v).backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_v.grad, eager_v.grad, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_binding_validation():
    csr = matrix(torch.float32, m=50, k=40, hub_row_nnz=0)
    x, grad_y = operands(csr, 4, torch.float32)
    winners = winners_of(csr, x, "max")
    backward = _ext.load().reduce_rows_backward
    with pytest.raises(RuntimeError, match="grad_y must be Float like x"):
        backward(grad_y.half(), winners, csr.col, csr.values, x, True, True)
    with pytest.raises(RuntimeError, match="winners must be Int"):
        backward(grad_y, winners.long(), csr.col, csr.values, x, True, True)
    with pytest.raises(RuntimeError, match="winners must have grad_y's shape"):
        backward(grad_y, winners[:, :2], csr.col, csr.values, x, True, True)
    with pytest.raises(RuntimeError, match="col must be Int"):
        backward(grad_y, winners, csr.col.long(), csr.values, x, True, True)
    with pytest.raises(RuntimeError, match="values must be 1-D with"):
        backward(grad_y, winners, csr.col, csr.values[1:], x, True, True)
