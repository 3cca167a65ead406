"""GPU tests of the float16/bfloat16 ME-TCF kernels (fp32 accumulation) against float64.

The matrix and X are rounded to the dtype under test first (they are the data), and the reference
is computed exactly from the CSR the layout was built from. The tolerance is a multiple of the
larger of torch's own dense matmul error in that dtype on the same data and the error of rounding
the exact result to the dtype once (all a kernel with fp32 accumulation should add). Under
compute-sanitizer (TCSPARSE_SANITIZER_SUBSET=1) only the rounding bound is used, which is
stricter: cuBLAS's half-precision split-K GEMMs report shared-memory hazards of their own under
racecheck. Outputs land in NaN-poisoned memory, so an unwritten entry fails.
"""
import pytest
import torch

from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.formats.metcf import build_metcf

from .kernel_data import (
    CUT_N,
    CUT_ROWS,
    HUB_NNZ,
    KERNELS,
    M_GRID,
    N_GRID,
    SUBSET,
    half_tolerance,
    poison,
    random_matrix,
    reference,
    relative_error,
    rounding_error,
    tensor_core_spmm,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float16, torch.bfloat16]


def check(kernels, m, k, n, kernel, dtype, window=16, mean_degree=8, row_perm=False, x=None, **matrix):
    row, col, values = random_matrix(m, k, mean_degree, **matrix)
    csr = from_coo(row, col, values.to(dtype), m, k)
    perm = torch.randperm(m, device="cuda") if row_perm else None
    layout, block_values = build_metcf(csr, window=window, row_perm=perm)
    x = torch.randn(k, n, device="cuda").to(dtype) if x is None else x
    ref = reference(csr.row_indices().long(), csr.col.long(), csr.values, x, m)
    poison(m * n * dtype.itemsize // 4 + 1)
    out = tensor_core_spmm(x, block_values, layout, kernel)
    assert out.dtype == dtype
    err = relative_error(out, ref)
    if ref.norm() == 0:
        assert err == 0.0
        return
    tolerance = half_tolerance(csr, x, ref, ref)
    assert err <= tolerance, f"relative error {err:.3g} over {tolerance:.3g} (m={m} k={k} n={n} {kernel} {dtype})"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n", N_GRID)
@pytest.mark.parametrize("m", M_GRID)
def test_shape_grid(kernels, m, n, kernel, dtype):
    check(kernels, m, m, n, kernel, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n", [5, 64] if SUBSET else [1, 5, 64, 96, 160])
def test_window_8_and_row_permutation(kernels, n, kernel, dtype):
    check(kernels, 1001, 777, n, kernel, dtype, window=8, row_perm=True)
    check(kernels, 1001, 777, n, kernel, dtype, window=16, row_perm=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_rectangular_and_non_contiguous(kernels, kernel, dtype):
    check(kernels, 1000, 5000, 64, kernel, dtype)
    check(kernels, 5000, 300, 13, kernel, dtype)
    wide = torch.randn(900, 80, device="cuda").to(dtype)
    check(kernels, 700, 900, 40, kernel, dtype, x=wide[:, ::2])  # strided columns


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n", [32] if SUBSET else [8, 128])
def test_hub_row(kernels, n, kernel, dtype):
    """One row with 100,000+ nonzeros: summed in fp32, so no worse than one final rounding."""
    check(kernels, 2000, HUB_NNZ + 1000, n, kernel, dtype, mean_degree=4, hub_row=1234, hub_nnz=HUB_NNZ)


@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic_balanced(kernels, dtype):
    m, k = 3000, HUB_NNZ + 100
    row, col, values = random_matrix(m, k, 6, hub_row=7, hub_nnz=HUB_NNZ)
    layout, block_values = build_metcf(from_coo(row, col, values.to(dtype), m, k))
    x = torch.randn(k, 64, device="cuda").to(dtype)
    torch.use_deterministic_algorithms(True)
    try:
        first = tensor_core_spmm(x, block_values, layout, "balanced")
        second = tensor_core_spmm(x, block_values, layout, "balanced")
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(first, second)
    assert relative_error(first.float(), tensor_core_spmm(x, block_values, layout, "base").double()) < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 13, 64])
def test_sddmm(kernels, n, dtype):
    m, k = 1500, 1100
    row, col, values = random_matrix(m, k, 9)
    layout, _ = build_metcf(from_coo(row, col, values.to(dtype), m, k), row_perm=torch.randperm(m, device="cuda"))
    grad_y, x = torch.randn(m, n, device="cuda").to(dtype), torch.randn(k, n, device="cuda").to(dtype)
    out = kernels.sddmm(grad_y, x, layout)
    assert out.dtype == dtype
    _, r, c = layout.nonzero_coordinates()
    ref = (grad_y.double()[r] * x.double()[c]).sum(1)
    assert relative_error(out, ref) <= 4 * rounding_error(ref, dtype) + 1e-6


def test_launch_shape(kernels):
    # 16-bit types: 64-column steps, two per warp where the last slice is more than half used.
    assert [kernels.column_slices("base", n, torch.float16) for n in (1, 64, 128, 192, 256)] == [1, 1, 1, 3, 2]
    warps = kernels.occupancy("base", 128, torch.bfloat16)
    assert 4 <= warps <= 64 and warps % 4 == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_in_the_same_dtype(kernel, dtype):
    """dX (A^T dY through the same kernels) and d(values) (SDDMM) in the dtype, summed in fp32."""
    from torch_tcsparse import TCSparseTensor

    m, k, n = 900, 700, 48
    row, col, values = random_matrix(m, k, 8)
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), (m, k))
    edge_values = a.csr.values.clone().requires_grad_()
    x = torch.randn(k, n, device="cuda").to(dtype).requires_grad_()
    grad_y = torch.randn(m, n, device="cuda").to(dtype)
    y = a.with_values(edge_values).matmul(x, path=kernel)
    assert y.dtype == dtype
    y.backward(grad_y)
    assert x.grad.dtype == dtype and edge_values.grad.dtype == dtype
    r, c, v = a.csr.row_indices().long(), a.csr.col.long(), a.csr.values.double()
    expected_x = torch.zeros(k, n, dtype=torch.float64, device="cuda").index_add_(0, c, v[:, None] * grad_y.double()[r])
    expected_v = (grad_y.double()[r] * x.detach().double()[c]).sum(1)
    for got, expected in ((x.grad, expected_x), (edge_values.grad, expected_v)):
        assert relative_error(got, expected) <= 4 * rounding_error(expected, dtype) + 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", CUT_N)
def test_balanced_windows_cut_in_some_slices(kernels, n, dtype):
    """Windows of several chunks over several column slices: a warp's range boundary cuts a
    window in one slice and not in another, so its fp32 sums must be zeroed and rounded into Y
    for exactly the slices in which it is cut."""
    check(kernels, CUT_ROWS, CUT_ROWS, n, "balanced", dtype, mean_degree=64)
