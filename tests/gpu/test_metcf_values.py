"""The Tensor-Core paths ("base", "balanced") read the matrix's values as they are at each
product: products and their gradients (dX through the transpose, the values' SDDMM) against float64
references computed on the CPU, for values of every kernel dtype held contiguously, as a strided
view or as a view at an odd element offset (2-byte aligned 16-bit values), on matrices with a hub
row, empty rows and an odd nonzero count, across column counts that take every slice width; and a
write to the values' storage between two products. Outputs land in NaN-poisoned memory, so an
unwritten entry fails; tolerances are a multiple of torch's own dense matmul error at the same
precision on the same data (or of one rounding of the exact result, whichever is larger)."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor

from .kernel_data import poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
KERNELS = ["base", "balanced"]
N_GRID = [1, 8, 32, 100, 128, 257]
HOLDINGS = ["contiguous", "strided", "offset"]
M, K = 600, 500


def graph(dtype, seed=0):
    """COO on the CPU: about 8 nonzeros a row, a tenth of the rows empty, a hub row of 300 and an
    odd nonzero count (a 16-bit value then ends mid-word)."""
    generator = torch.Generator().manual_seed(seed)
    row = torch.randint(0, M, (8 * M,), generator=generator)
    row = row[row % 10 != 3]
    row = torch.cat([row, torch.full((300,), 7)])
    col = torch.cat([torch.randint(0, K, (row.numel() - 300,), generator=generator),
                     torch.randperm(K, generator=generator)[:300]])
    key = torch.unique(row * K + col)
    if key.numel() % 2 == 0:
        key = key[1:]
    row, col = key // K, key % K
    values = (torch.randn(key.numel(), generator=generator) + 0.1).to(dtype)
    return row, col, values


def held(values: torch.Tensor, holding: str) -> torch.Tensor:
    """``values`` on the GPU, as a contiguous tensor or a view of a larger one."""
    nnz = values.numel()
    if holding == "contiguous":
        return values.cuda()
    if holding == "strided":
        storage = torch.zeros(2 * nnz, dtype=values.dtype, device="cuda")
        view = storage[::2]
    else:
        storage = torch.zeros(nnz + 1, dtype=values.dtype, device="cuda")
        view = storage[1:]
    view.copy_(values.cuda())
    return view


def dense64(row, col, values) -> torch.Tensor:
    dense = torch.zeros(M, K, dtype=torch.float64)
    dense[row, col] = values.double()
    return dense


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got = got.detach().double().cpu()
    assert bool(torch.isfinite(got).all()), "output has NaN/inf: an entry was not written"
    return float((got - expected).norm() / expected.norm().clamp_min(1e-30))


def tolerance(left: torch.Tensor, right: torch.Tensor, exact: torch.Tensor, dtype) -> float:
    """4x the larger of torch's own dense error for ``left @ right`` (float64 CPU tensors rounded to
    ``dtype`` on the GPU, under the current matmul precision) and one rounding of ``exact``."""
    torch_result = (left.to(device="cuda", dtype=dtype) @ right.to(device="cuda", dtype=dtype)).double().cpu()
    torch_error = float((torch_result - exact).norm() / exact.norm().clamp_min(1e-30))
    rounding = float((exact.to(dtype).double() - exact).norm() / exact.norm().clamp_min(1e-30))
    return 4 * max(torch_error, rounding) + 1e-6


@pytest.mark.parametrize("holding", HOLDINGS)
@pytest.mark.parametrize("n", N_GRID)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype)[6:])
def test_products_and_gradients_read_the_values_as_held(kernels, dtype, kernel, n, holding):
    row, col, values = graph(dtype)
    base = TCSparseTensor.from_coo(row.cuda(), col.cuda(), values.cuda(), (M, K))
    order = torch.argsort(row * K + col)  # canonical CSR order
    row, col, values = row[order], col[order], values[order]
    edge_values = held(values, holding).requires_grad_()
    a = base.with_values(edge_values)
    generator = torch.Generator().manual_seed(1)
    x_cpu = torch.randn(K, n, generator=generator).to(dtype)
    grad_y_cpu = torch.randn(M, n, generator=generator).to(dtype)
    x = x_cpu.cuda().requires_grad_()
    dense = dense64(row, col, values)
    poison(M * n * dtype.itemsize // 4 + 1)
    y = a.matmul(x, path=kernel)
    expected = dense @ x_cpu.double()
    assert relative_error(y, expected) <= tolerance(dense, x_cpu.double(), expected, dtype)
    y.backward(grad_y_cpu.cuda())
    expected_x = dense.t() @ grad_y_cpu.double()
    assert relative_error(x.grad, expected_x) <= tolerance(dense.t(), grad_y_cpu.double(), expected_x, dtype)
    expected_v = (grad_y_cpu.double()[row] * x_cpu.double()[col]).sum(1)
    assert relative_error(edge_values.grad, expected_v) <= 4 * float(
        (expected_v.to(dtype).double() - expected_v).norm() / expected_v.norm()) + 1e-6


# Strided values reach the kernels as a contiguous copy, which fixed values keep while their
# version counter stays (operands.OperandCache): a storage write reaches values read in place.
@pytest.mark.parametrize("holding", [holding for holding in HOLDINGS if holding != "strided"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype)[6:])
def test_a_storage_write_between_two_products_reaches_the_second(kernels, dtype, kernel, holding):
    row, col, values = graph(dtype, seed=2)
    base = TCSparseTensor.from_coo(row.cuda(), col.cuda(), values.cuda(), (M, K))
    order = torch.argsort(row * K + col)
    row, col, values = row[order], col[order], values[order]
    held_values = held(values, holding)
    a = base.with_values(held_values)
    x_cpu = torch.randn(K, 32, generator=torch.Generator().manual_seed(3)).to(dtype)
    x = x_cpu.cuda()
    a.matmul(x, path=kernel)
    new = (values.double() * -2 + 0.5).to(dtype)
    held_values.untyped_storage().copy_(held(new, holding).untyped_storage())
    poison(M * 32 * dtype.itemsize // 4 + 1)
    y = a.matmul(x, path=kernel)
    dense = dense64(row, col, new)
    expected = dense @ x_cpu.double()
    assert relative_error(y, expected) <= tolerance(dense, x_cpu.double(), expected, dtype)
