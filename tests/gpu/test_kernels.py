"""GPU tests of the ME-TCF kernels against a float64 reference, on fresh random data each run.

Outputs land in memory poisoned with NaN first, so an unwritten entry fails. TF32 tolerances are
a multiple of torch's own TF32 dense-matmul error on the same data. Under compute-sanitizer set
TCSPARSE_SANITIZER_SUBSET=1: a representative subset of the grid runs (sanitized kernels are slow).
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
    poison,
    random_matrix,
    reference,
    relative_error,
    tf32_tolerance,
    tensor_core_spmm,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")



@pytest.fixture
def precision():
    previous = torch.get_float32_matmul_precision()

    def use(mode):
        torch.set_float32_matmul_precision(mode)

    yield use
    torch.set_float32_matmul_precision(previous)


def run(kernels, layout, values, x, kernel):
    poison(layout.num_rows * x.shape[1])
    out = tensor_core_spmm(x, values, layout, kernel)
    torch.cuda.synchronize()
    return out


def check(kernels, m, k, n, kernel, window=16, mean_degree=8, row_perm=False, x=None, **matrix):
    row, col, values = random_matrix(m, k, mean_degree, **matrix)
    csr = from_coo(row, col, values, m, k)
    perm = torch.randperm(m, device="cuda") if row_perm else None
    layout, block_values = build_metcf(csr, window=window, row_perm=perm)
    x = torch.randn(k, n, device="cuda") if x is None else x
    ref = reference(row, col, values, x, m)
    out = run(kernels, layout, block_values, x, kernel)
    err = relative_error(out, ref)
    if ref.norm() == 0:
        assert err == 0.0
        return
    # The kernels round the canonical values (duplicates summed first): so does the error model.
    tolerance = tf32_tolerance(csr.row_indices(), csr.col.long(), csr.values, x, m, ref)
    assert err <= tolerance, f"relative error {err:.3g} over {tolerance:.3g} (m={m} k={k} n={n} {kernel})"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n", N_GRID)
@pytest.mark.parametrize("m", M_GRID)
def test_shape_grid(kernels, precision, m, n, kernel):
    precision("high")
    check(kernels, m, m, n, kernel)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n", [5, 64] if SUBSET else [1, 5, 64, 96, 160])
def test_window_8_and_row_permutation(kernels, precision, n, kernel):
    precision("high")
    check(kernels, 1001, 777, n, kernel, window=8, row_perm=True)
    check(kernels, 1001, 777, n, kernel, window=16, row_perm=True)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [(1000, 5000), (5000, 300), (33, 1)])
def test_rectangular(kernels, precision, shape, kernel):
    precision("high")
    check(kernels, shape[0], shape[1], 64, kernel)
    check(kernels, shape[0], shape[1], 13, kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_dense_blocks_and_all_empty(kernels, precision, kernel):
    precision("high")
    check(kernels, 300, 40, 96, kernel, mean_degree=30)  # most TC blocks nearly full
    check(kernels, 100, 100, 32, kernel, empty_fraction=1.0)  # no nonzero at all


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n", [32] if SUBSET else [8, 32, 128])
def test_hub_row(kernels, precision, n, kernel):
    """One row with 100,000+ nonzeros: a window of 10,000+ TC blocks, many balanced chunks."""
    precision("high")
    k = HUB_NNZ + 1000
    check(kernels, 2000, k, n, kernel, mean_degree=4, hub_row=1234, hub_nnz=HUB_NNZ)


@pytest.mark.parametrize("n", CUT_N)
def test_balanced_windows_cut_in_some_slices(kernels, precision, n):
    """Windows of several chunks over several column slices, cut by a warp's range boundary in
    one slice and not in another: only the cut slices are zeroed and added into."""
    precision("high")
    check(kernels, CUT_ROWS, CUT_ROWS, n, "balanced", mean_degree=64)


@pytest.mark.parametrize("kernel", KERNELS)
def test_non_contiguous_x(kernels, precision, kernel):
    precision("high")
    m, k = 700, 900
    base = torch.randn(64, k, device="cuda")
    check(kernels, m, k, 64, kernel, x=base.t())  # transposed view
    wide = torch.randn(k, 80, device="cuda")
    check(kernels, m, k, 40, kernel, x=wide[:, ::2])  # strided columns


@pytest.mark.parametrize("kernel", KERNELS)
def test_exact_fp32_path(kernels, precision, kernel):
    precision("highest")
    row, col, values = random_matrix(3000, 3000, 16)
    layout, block_values = build_metcf(from_coo(row, col, values, 3000, 3000))
    x = torch.randn(3000, 96, device="cuda")
    err = relative_error(run(kernels, layout, block_values, x, kernel), reference(row, col, values, x, 3000))
    assert err < 2e-6, f"3xTF32 error {err:.3g} is not fp32 level"


def test_balanced_repeated_calls_and_deterministic(kernels, precision):
    precision("high")
    m, k = 3000, HUB_NNZ + 100
    row, col, values = random_matrix(m, k, 6, hub_row=7, hub_nnz=HUB_NNZ)
    layout, block_values = build_metcf(from_coo(row, col, values, m, k))
    x = torch.randn(k, 64, device="cuda")
    ref = reference(row, col, values, x, m)
    first = run(kernels, layout, block_values, x, "balanced")
    second = run(kernels, layout, block_values, x, "balanced")
    assert relative_error(second, ref) <= relative_error(first, ref) * 1.01 + 1e-7  # no stale accumulation
    torch.use_deterministic_algorithms(True)
    try:
        a = run(kernels, layout, block_values, x, "balanced")
        b = run(kernels, layout, block_values, x, "balanced")
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(a, b)
    assert relative_error(a, ref) < tf32_tolerance(row, col, values, x, m, ref)


@pytest.mark.parametrize("n", [1, 13, 64])
def test_sddmm(kernels, n):
    m, k = 1500, 1100
    row, col, values = random_matrix(m, k, 9)
    csr = from_coo(row, col, values, m, k)
    layout, _ = build_metcf(csr, row_perm=torch.randperm(m, device="cuda"))
    grad_y, x = torch.randn(m, n, device="cuda"), torch.randn(k, n, device="cuda")
    poison(layout.nnz)
    out = kernels.sddmm(grad_y, x, layout)
    _, r, c = layout.nonzero_coordinates()
    ref = (grad_y.double()[r] * x.double()[c]).sum(1)
    assert relative_error(out, ref) < 1e-5


def test_rejects_bad_inputs(kernels):
    row, col, values = random_matrix(100, 100, 4)
    layout, block_values = build_metcf(from_coo(row, col, values, 100, 100))
    x = torch.randn(100, 8, device="cuda")
    with pytest.raises(RuntimeError, match="x must have 100 rows, got 50"):
        tensor_core_spmm(x[:50], block_values, layout, "base")
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        tensor_core_spmm(x.double(), block_values.double(), layout, "base")
    with pytest.raises(RuntimeError, match="cpu|CPU|CUDA"):
        tensor_core_spmm(x.cpu(), block_values, layout, "base")


# The binding's own checks (TCS_CHECK in bindings.cpp) for callers that skip the Python layer.
# Run in a child process: messages streamed through c10::str crashed the interpreter (SIGSEGV)
# instead of raising, and a crash must fail this test, not end the whole pytest run.
BINDING_CHECK = """
import torch
from torch_tcsparse import _ext
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.formats.metcf import build_metcf
from torch_tcsparse.kernels import layout_arguments
row = torch.arange(100, device="cuda")
layout, values = build_metcf(from_coo(row, row, None, 100, 100))
x = torch.randn(100, 8, device="cuda")
args = layout_arguments(layout)
calls = {
    "x must have 100 rows, got 50": lambda: _ext.load().spmm(x[:50], values, *args, False, False, False),
    "values must be 1-D with 100 entries, got shape [99]": lambda: _ext.load().spmm(x, values[:99], *args, False, False, False),
    "values must have x's dtype Half, got Float": lambda: _ext.load().spmm(x.half(), values, *args, False, False, False),
    "chunk_row_starts must hold window (16) entries": lambda: _ext.load().spmm(
        x, values, *args[:7], args[7][:-1], *args[8:], False, False, False),
    "window must be 8 or 16, got 3": lambda: _ext.load().launch_shape(3, 1, 8, False, False, torch.float32),
    "the kernels take float32, float16 or bfloat16, got Double": lambda: _ext.load().launch_shape(16, 1, 8, False, False, torch.float64),
}
for expected, call in calls.items():
    try:
        call()
    except RuntimeError as e:
        assert expected in str(e), (expected, str(e))
        print("raised:", expected)
"""


def test_binding_checks_raise(kernels):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", BINDING_CHECK], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.count("raised:") == 6, (done.returncode, done.stdout, done.stderr[-2000:])


@pytest.mark.parametrize("kernel", KERNELS)
def test_launch_shape(kernels, kernel):
    # 64-column slices where the last one is more than half used, else 32-column ones.
    assert [kernels.column_slices(kernel, n) for n in (1, 32, 64, 96, 128, 160)] == [1, 1, 1, 3, 2, 5]
    # Resident warps per SM: whole thread blocks of 4 warps, at most 64 warps on sm_80/sm_90.
    warps = kernels.occupancy(kernel, 128)
    assert 4 <= warps <= 64 and warps % 4 == 0
