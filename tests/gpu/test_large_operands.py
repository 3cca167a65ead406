"""Products whose dense operands hold more than 2^31 elements (a rank's rows or halo of a
billion-edge graph at 128 channels), on every path: an offset computed in 32 bits (a column id
times the row length, a row of Y times N) would read or write the wrong rows there.

The matrix is square with 2^24 + 4096 rows and columns and few nonzeros, in the first and last
rows and columns, so that at N = 128 both X and Y hold more than 2^31 elements and the nonzeros
reach past element 2^31 of each. Tolerances are a multiple of torch's own error on the same
products in the same dtype (TF32 allowed where the Tensor-Core paths round to TF32), outputs are
poisoned with NaN first, references are float64. About 40 GB of GPU memory.
"""
import pytest
import torch

from torch_tcsparse import TCSparseTensor

from .kernel_data import poison, relative_error, rounding_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SIZE = (1 << 24) + 4096
N = 128
EDGE_ROWS = 64
PER_ROW = 32


def matrix(dtype):
    """COO of the first and last EDGE_ROWS rows, PER_ROW distinct nonzeros each: half in random
    columns, half in the last 4096."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows = torch.cat([torch.arange(EDGE_ROWS), torch.arange(SIZE - EDGE_ROWS, SIZE)]).cuda()
    # One random column per stripe of the first SIZE - 4096: distinct, so that no two sum into one entry.
    stripe = (SIZE - 4096) // (PER_ROW // 2)
    low = torch.arange(PER_ROW // 2, device="cuda") * stripe + torch.randint(
        0, stripe, (rows.numel(), PER_ROW // 2), device="cuda", generator=gen)
    high = SIZE - 4096 + torch.rand(rows.numel(), 4096, device="cuda", generator=gen).argsort(1)[:, : PER_ROW // 2]
    col = torch.cat([low, high], 1).flatten()
    row = rows.repeat_interleave(PER_ROW)
    values = (torch.rand(col.numel(), device="cuda", generator=gen) + 0.5).to(dtype)
    return row, col, values


def compact_reference(row, col, values, x, reduce="sum"):
    """float64 rows of A @ X at the rows the nonzeros touch (ascending), and those rows."""
    touched, inverse = torch.unique(row, return_inverse=True)
    products = values.double()[:, None] * x.double()[col]
    out = torch.zeros(touched.numel(), x.shape[1], dtype=torch.float64, device="cuda")
    if reduce == "sum":
        out.index_add_(0, inverse, products)
    else:
        out.fill_(-torch.inf).scatter_reduce_(0, inverse[:, None].expand_as(products), products, "amax")
    return touched, out


def torch_error(row, col, values, x, ref, tf32: bool):
    """Relative error of torch's dense matmul in x's dtype on the touched rows and columns."""
    touched, row_index = torch.unique(row, return_inverse=True)
    columns, col_index = torch.unique(col, return_inverse=True)
    dense = torch.zeros(touched.numel(), columns.numel(), dtype=x.dtype, device="cuda")
    dense.index_put_((row_index, col_index), values, accumulate=True)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        out = dense @ x[columns]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return relative_error(out, ref)


def check_output(y, touched, ref, tolerance):
    assert y.shape == (SIZE, N)
    assert relative_error(y[touched], ref) <= tolerance
    untouched = torch.ones(SIZE, dtype=torch.bool, device="cuda")
    untouched[touched] = False
    # Every other row is zero (not NaN: the poison shows an unwritten row).
    assert bool((y[untouched] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("path", ["rows", "base", "balanced", "csr"])
def test_product_past_two_to_the_31_elements(path, dtype):
    row, col, values = matrix(dtype)
    a = TCSparseTensor.from_coo(row, col, values, shape=(SIZE, SIZE))
    x = torch.randn(SIZE, N, device="cuda").to(dtype)
    assert x.numel() > 2**31 and int(col.max()) * N > 2**31
    touched, ref = compact_reference(row, col, values, x)
    tf32 = path in ("base", "balanced") and dtype == torch.float32
    tolerance = 4 * max(torch_error(row, col, values, x, ref, tf32), rounding_error(ref, dtype), 2.0**-24) + 1e-6
    poison(SIZE * N * x.element_size() // 4)
    y = a.matmul(x, path=path)
    check_output(y, touched, ref, tolerance)


def test_rows_max_past_two_to_the_31_elements():
    row, col, values = matrix(torch.float32)
    a = TCSparseTensor.from_coo(row, col, values, shape=(SIZE, SIZE))
    x = torch.randn(SIZE, N, device="cuda")
    touched, ref = compact_reference(row, col, values, x, reduce="max")
    poison(SIZE * N)
    y = a.matmul(x, path="rows", reduce="max")
    # Every output is one product, rounded once.
    check_output(y, touched, ref, rounding_error(ref, torch.float32) + 1e-7)


def test_rows_gradient_past_two_to_the_31_elements():
    """The backward pass (the matrix's first: a scatter from the forward's operands into a
    float32 dX past 2^31 elements) with a Y-sized gradient: X's gradient at the columns the
    nonzeros touch is A^T dY there."""
    row, col, values = matrix(torch.float32)
    a = TCSparseTensor.from_coo(row, col, values, shape=(SIZE, SIZE))
    x = torch.randn(SIZE, N, device="cuda", requires_grad=True)
    grad_y = torch.randn(SIZE, N, device="cuda")
    touched, ref = compact_reference(col, row, values, grad_y)
    tolerance = 4 * max(torch_error(col, row, values, grad_y, ref, False), 2.0**-24) + 1e-6
    y = a.matmul(x, path="rows")
    poison(SIZE * N)  # after the forward pass: the gradient, not Y, takes the poisoned block
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    check_output(grad_x, touched, ref, tolerance)
