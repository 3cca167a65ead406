"""GPU tests of reduce= ("mean", "max", "min").

max/min: the kernel of csrc/reduce_rows.cu against the torch ops of engines/extreme.py on the same
device (both form each product in fp32 and round the extreme once, and both give a tie to the
row's first nonzero, so Y and the winners must be equal bit for bit) and against a float64
scatter_reduce reference (Y equals the exact extreme rounded to the dtype); outputs poisoned with
NaN first. Every lane shape (8, 16, 32 lanes; 1, 2, 4 columns per lane; several column tiles),
hub rows, empty rows, ties, NaN and infinities, strided X; gradients; torch.compile.

mean: every sum path on the row-scaled values, against float64.
"""
import dataclasses

import pytest
import torch

from torch_tcsparse import TCSparseTensor, _ext, product
from torch_tcsparse.engines import extreme
from torch_tcsparse.formats.csr import from_coo

from .kernel_data import HUB_NNZ, M_GRID, N_GRID, SUBSET, poison, random_matrix

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EXTREMES = ["max", "min"]
TORCH_REDUCE = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}


def exact(csr, x, reduce):
    """float64 scatter_reduce(include_self=False) of the products of the (dtype-rounded) data."""
    row = csr.row_indices().long()
    products = csr.values.double()[:, None] * x.double()[csr.col.long()]
    out = torch.zeros(csr.num_rows, x.shape[1], dtype=torch.float64, device=x.device)
    return out.scatter_reduce(0, row[:, None].expand(-1, x.shape[1]), products, TORCH_REDUCE[reduce],
                              include_self=False)


def kernel(csr, x, reduce):
    poison(csr.num_rows * max(x.shape[1], 1) * 2 + 1)
    y, winners = _ext.load().reduce_rows(x, csr.rowptr, csr.col, csr.values, reduce == "max", -1)
    torch.cuda.synchronize()
    return y, winners


def check(m, k, n, reduce, dtype, x=None, mean_degree=8, **matrix):
    row, col, values = random_matrix(m, k, mean_degree, **matrix)
    csr = from_coo(row, col, values.to(dtype), m, k)
    x = torch.randn(k, n, device="cuda").to(dtype) if x is None else x
    y, winners = kernel(csr, x, reduce)
    assert y.dtype == dtype and winners.dtype == torch.int32 and y.shape == winners.shape == (m, n)
    y_torch, winners_torch = extreme.forward(x, csr.values, csr.rowptr, csr.col, reduce, "reference")
    assert torch.equal(winners, winners_torch)
    assert torch.equal(y, y_torch)
    assert torch.equal(y, exact(csr, x, reduce).to(dtype))
    empty = csr.rowptr[1:] == csr.rowptr[:-1]
    assert bool((winners[empty] == -1).all()) and bool((y[empty] == 0).all())
    won = winners[~empty].long()
    assert bool((won >= csr.rowptr[:-1][~empty, None]).all()) and bool((won < csr.rowptr[1:][~empty, None]).all())
    return csr, x, y, winners


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
@pytest.mark.parametrize("n", N_GRID)
@pytest.mark.parametrize("m", M_GRID)
def test_shape_grid(m, n, reduce, dtype):
    check(m, m, n, reduce, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
@pytest.mark.parametrize("n", [7, 64] if SUBSET else [7, 16, 64, 130])
def test_hub_row_and_empty_rows(n, reduce, dtype):
    """One row of 10^5 nonzeros (reduced in pieces); a quarter of the rows empty."""
    check(2000, HUB_NNZ + 1000, n, reduce, dtype, mean_degree=4, empty_fraction=0.25, hub_row=1234,
          hub_nnz=HUB_NNZ)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
def test_rectangular_and_tiny(reduce, dtype):
    for m, k, n in [(1000, 5000, 33), (5000, 300, 9), (33, 1, 1), (1, 40, 200), (3, 3, 0)]:
        check(m, k, n, reduce, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
def test_strided_and_transposed_x(reduce, dtype):
    k = 900
    wide = torch.randn(k, 56, device="cuda").to(dtype)
    check(700, k, 47, reduce, dtype, x=wide[:, :47])
    check(700, k, 40, reduce, dtype, x=wide[:, 1:41])
    check(700, k, 64, reduce, dtype, x=torch.randn(64, k, device="cuda").to(dtype).t())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
def test_ties_go_to_the_first_nonzero(reduce, dtype):
    """Small integers: most outputs are ties, which the kernel and the torch ops break alike."""
    m, k, n = 500, 60, 24
    row, col, _ = random_matrix(m, k, 10)
    values = torch.randint(-2, 3, (row.numel(),), device="cuda").float()
    csr = from_coo(row, col, values.to(dtype), m, k)
    x = torch.randint(-3, 4, (k, n), device="cuda").to(dtype)
    y, winners = kernel(csr, x, reduce)
    y_torch, winners_torch = extreme.forward(x, csr.values, csr.rowptr, csr.col, reduce, "reference")
    assert torch.equal(y, y_torch) and torch.equal(winners, winners_torch)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
def test_nan_and_infinities(reduce, dtype):
    m, k, n = 300, 200, 20
    row, col, values = random_matrix(m, k, 6)
    csr = from_coo(row, col, values.to(dtype), m, k)
    x = torch.randn(k, n, device="cuda")
    x[torch.rand(k, n, device="cuda") < 0.05] = float("nan")
    x[torch.rand(k, n, device="cuda") < 0.05] = float("inf")
    x[torch.rand(k, n, device="cuda") < 0.05] = float("-inf")
    x = x.to(dtype)
    y, winners = kernel(csr, x, reduce)
    y_torch, winners_torch = extreme.forward(x, csr.values, csr.rowptr, csr.col, reduce, "reference")
    assert torch.equal(winners, winners_torch)
    torch.testing.assert_close(y, y_torch, rtol=0, atol=0, equal_nan=True)


def test_binding_validation():
    csr = from_coo(torch.tensor([0, 1], device="cuda"), torch.tensor([1, 0], device="cuda"),
                   torch.ones(2, device="cuda"), 2, 2)
    x = torch.randn(2, 3, device="cuda")
    with pytest.raises(RuntimeError, match="values must be"):
        _ext.load().reduce_rows(x, csr.rowptr, csr.col, csr.values.half(), True, -1)
    with pytest.raises(RuntimeError, match="rowptr must be Int, got Long"):
        _ext.load().reduce_rows(x, csr.rowptr.long(), csr.col, csr.values, True, -1)
    with pytest.raises(RuntimeError, match="x must be float32, float16 or bfloat16"):
        _ext.load().reduce_rows(x.double(), csr.rowptr, csr.col, csr.values.double(), True, -1)
    with pytest.raises(RuntimeError, match="longest must be"):
        _ext.load().reduce_rows(x, csr.rowptr, csr.col, csr.values, True, -2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
@pytest.mark.parametrize("reorder", ["none", "degree", "permutation"])
def test_matrix_product_and_gradients(reorder, reduce, dtype):
    """A.matmul(X, reduce=...) takes the kernel by itself; its gradients equal the float64
    torch reference's on the CPU (each output's gradient to one nonzero, no ties here)."""
    m = k = 800
    row, col, values = random_matrix(m, k, 7, hub_row=5, hub_nnz=600)
    order = torch.randperm(m, device="cuda") if reorder == "permutation" else reorder
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), shape=(m, k), reorder=order)
    probe = torch.empty(1, 1, device="cuda", dtype=dtype)
    assert product.choose_path(a._structure, probe, "auto", reduce, False) == ("rows", None)
    v = a.csr.values.clone().requires_grad_()
    x = torch.randn(k, 40, device="cuda").to(dtype).requires_grad_()
    y = a.with_values(v).matmul(x, reduce=reduce)
    assert torch.equal(y, a.matmul(x, reduce=reduce, path="rows"))
    grad_y = torch.randn_like(y)
    y.backward(grad_y)

    cpu = a.cpu().double()
    v64, x64 = cpu.csr.values.clone().requires_grad_(), x.detach().cpu().double().requires_grad_()
    y64 = cpu.with_values(v64).matmul(x64, reduce=reduce)
    torch.testing.assert_close(y.double().cpu(), y64.to(dtype).double(), rtol=0, atol=0)
    y64.backward(grad_y.double().cpu())
    # 16-bit: sums in fp32, one rounding; float32: sums of a few dozen fp32 terms.
    tol = 1e-5 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps
    torch.testing.assert_close(x.grad.double().cpu(), x64.grad, rtol=tol, atol=tol * float(x64.grad.abs().max()))
    torch.testing.assert_close(v.grad.double().cpu(), v64.grad, rtol=tol, atol=tol * float(v64.grad.abs().max()))


@pytest.mark.parametrize("reduce", EXTREMES)
def test_deterministic_gradients(reduce):
    m = k = 1500
    row, col, values = random_matrix(m, k, 9)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, k))
    x = torch.randn(k, 32, device="cuda")
    grad_y = torch.randn(m, 32, device="cuda")
    grads = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            v, xx = a.csr.values.clone().requires_grad_(), x.clone().requires_grad_()
            a.with_values(v).matmul(xx, reduce=reduce).backward(grad_y)
            grads.append((xx.grad, v.grad))
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("reduce", EXTREMES + ["mean"])
def test_compiled_matches_eager(reduce):
    torch._dynamo.reset()
    m = k = 600
    row, col, values = random_matrix(m, k, 6)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, k))
    a.t()
    x = torch.randn(k, 16, device="cuda", requires_grad=True)
    eager = torch.relu(a.matmul(x, reduce=reduce))  # the selector's choice settles outside the graph
    # The mean runs the sum's op, whose "rows" path builds its row split outside the graph (a break).
    compiled = torch.compile(lambda x: torch.relu(a.matmul(x, reduce=reduce)), fullgraph=reduce != "mean",
                             backend="aot_eager")
    y = compiled(x)
    torch.testing.assert_close(y, eager)
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(eager.sum(), x)[0])
    torch._dynamo.reset()


# The csr path takes 16-bit X through cuSPARSE, whose precision is torch's (test_kernels_16bit).
MEAN_CASES = [(path, dtype) for path in ["base", "balanced", "rows", "grouped", "csr", "auto"] for dtype in DTYPES
              if path != "csr" or dtype == torch.float32]


@pytest.mark.parametrize("path, dtype", MEAN_CASES, ids=str)
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_mean_on_every_sum_path(reorder, path, dtype):
    """The mean is the sum over the values divided by their row's count (formed in fp32, rounded
    once to the dtype): within 4 units of the dtype's rounding of the sum of |products| of each
    row (each scaled value rounds once, each output once), and float32 within 1e-5 of it."""
    m = k = 1200
    row, col, values = random_matrix(m, k, 8, empty_fraction=0.2, hub_row=3, hub_nnz=900)
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), shape=(m, k), reorder=reorder)
    x = torch.randn(k, 48, device="cuda").to(dtype)
    poison(m * 48 + 1)
    y = a.matmul(x, reduce="mean", path=path)
    ref = exact(a.csr, x, "mean")
    counts = (a.csr.rowptr[1:] - a.csr.rowptr[:-1]).clamp(min=1).double()[:, None]
    scale = exact(dataclasses.replace(a.csr, values=a.csr.values.abs()), x.abs(), "sum") / counts
    eps = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps
    assert bool(((y.double() - ref).abs() <= 4 * eps * scale + 1e-30).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mean_gradients(dtype):
    m = k = 700
    row, col, values = random_matrix(m, k, 6)
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), shape=(m, k))
    v = a.csr.values.clone().requires_grad_()
    x = torch.randn(k, 24, device="cuda").to(dtype).requires_grad_()
    y = a.with_values(v).matmul(x, reduce="mean")
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    cpu = a.cpu().double()
    v64, x64 = cpu.csr.values.clone().requires_grad_(), x.detach().cpu().double().requires_grad_()
    cpu.with_values(v64).matmul(x64, reduce="mean").backward(grad_y.double().cpu())
    tol = 1e-5 if dtype == torch.float32 else 8 * torch.finfo(dtype).eps
    torch.testing.assert_close(x.grad.double().cpu(), x64.grad, rtol=tol, atol=tol * float(x64.grad.abs().max()))
    torch.testing.assert_close(v.grad.double().cpu(), v64.grad, rtol=tol, atol=tol * float(v64.grad.abs().max()))
