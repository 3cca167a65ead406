"""The mean on the kernels that scale each output row's fp32 sums (``row_scale``: base, balanced,
deterministic balanced, rows, its split rows through the last piece to arrive and through the
finishing kernel): Y = (A @ X) / count + bias, and its gradients for X and the values, against
float64, outputs poisoned with NaN first. At the bindings, arbitrary scales with bias, addend and
row map (the scale multiplies the sums alone). Tolerances: 4x the larger of torch's own error
computing the same thing densely in the dtype and one rounding of the exact result to it; float32
allows 2^-21 per output at least, the 3xTF32 split's error per product (kernels.py).
"""
import pytest
import torch

from torch_tcsparse import TCSparseTensor, csr_rows, kernels
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.formats.metcf import build_layout

from .kernel_data import poison, random_matrix, relative_error, rounding_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
N_VALUES = [1, 8, 32, 33, 128]
PATHS = ["base", "balanced", "balanced-deterministic", "rows"]
# A hub row of 10,000 nonzeros: split into pieces on the rows path, many chunks on balanced.
MATRICES = {
    "plain": dict(m=2000, k=2000, mean_degree=8, empty_fraction=0.2),
    "hub": dict(m=3000, k=12000, mean_degree=8, empty_fraction=0.1, hub_row=1234, hub_nnz=10_000),
}


def counts_of(rowptr):
    return (rowptr[1:] - rowptr[:-1]).clamp(min=1).double()


def dense_mean(row, col, values, x, bias, scale, m, grad_y):
    """(Y, dX, d(values)) of Y = scale * (A @ x) + bias in the operands' dtype, by torch's dense
    ops and autograd (A from COO ``row``, ``col``, ``values``: one entry per nonzero)."""
    values = values.detach().clone().requires_grad_()
    x = x.detach().clone().requires_grad_()
    dense = torch.zeros(m, x.shape[0], dtype=values.dtype, device="cuda").index_put((row, col), values)
    y = (dense @ x) * scale.to(values.dtype).unsqueeze(1) + bias
    y.backward(grad_y)
    return y.detach(), x.grad, values.grad


def limit(ours_dtype, torch_result, exact):
    torch_error = relative_error(torch_result, exact)
    floor = 2.0**-21 if ours_dtype == torch.float32 else 0.0
    return 4 * max(torch_error, rounding_error(exact, ours_dtype), floor) + 1e-6


def run_mean(a, x, bias, path, values=None):
    deterministic = path.endswith("-deterministic")
    torch.use_deterministic_algorithms(deterministic)
    try:
        matrix = a if values is None else a.with_values(values)
        return matrix.matmul(x, path=path.removesuffix("-deterministic"), bias=bias, reduce="mean")
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("reorder", ["none", "degree"])
@pytest.mark.parametrize("case", list(MATRICES))
@pytest.mark.parametrize("n", N_VALUES)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype)[6:])
def test_mean_and_its_gradients(dtype, path, n, case, reorder):
    spec = dict(MATRICES[case])
    m, k = spec.pop("m"), spec.pop("k")
    row, col, values = random_matrix(m, k, spec.pop("mean_degree"), seed=11, **spec)
    a = TCSparseTensor.from_coo(row, col, values.to(dtype), shape=(m, k), reorder=reorder)
    csr = a.csr
    csr_row, csr_col = csr.row_indices().long(), csr.col.long()
    generator = torch.Generator(device="cuda").manual_seed(12)
    x = torch.randn(k, n, device="cuda", generator=generator).to(dtype)
    bias = torch.randn(n, device="cuda", generator=generator).to(dtype)
    grad_y = torch.randn(m, n, device="cuda", generator=generator).to(dtype)
    scale = 1.0 / counts_of(csr.rowptr)

    poison(m * n * dtype.itemsize // 4 + 1)
    with torch.no_grad():
        y = run_mean(a, x, bias, path)
    torch.cuda.synchronize()
    leaf_values = csr.values.clone().requires_grad_()
    leaf_x = x.clone().requires_grad_()
    run_mean(a, leaf_x, bias, path, leaf_values).backward(grad_y)

    exact = dense_mean(csr_row, csr_col, csr.values.double(), x.double(), bias.double(), scale, m, grad_y.double())
    in_dtype = dense_mean(csr_row, csr_col, csr.values, x, bias, scale, m, grad_y)
    for name, ours, torch_result, expected in zip(["Y", "dX", "d(values)"], [y, leaf_x.grad, leaf_values.grad],
                                                  in_dtype, exact):
        assert ours.dtype == dtype
        error, bound = relative_error(ours, expected), limit(dtype, torch_result, expected)
        assert error <= bound, f"{name}: relative error {error:.3g} over {bound:.3g}"
    empty = csr.rowptr[1:] == csr.rowptr[:-1]
    assert torch.equal(y[empty], bias.expand(int(empty.sum()), -1))


def random_scale(m):
    return torch.rand(m, device="cuda") + 0.25


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("row_perm", [False, True], ids=["natural", "permuted"])
@pytest.mark.parametrize("n", N_VALUES)
@pytest.mark.parametrize("kernel", ["base", "balanced"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype)[6:])
def test_tensor_core_row_scale(dtype, kernel, n, row_perm, deterministic):
    """metcf_spmm's row_scale: any scale, indexed by Y's row (the user's, through row_map)."""
    if deterministic and kernel == "base":
        pytest.skip("the base kernel is deterministic already")
    m, k = 3000, 12000
    row, col, values = random_matrix(m, k, 6, seed=21, hub_row=17, hub_nnz=10_000)
    csr = from_coo(row, col, values.to(dtype), m, k)
    perm = torch.randperm(m, device="cuda", generator=torch.Generator(device="cuda").manual_seed(22)) if row_perm else None
    layout = build_layout(csr, 16, perm)
    x = torch.randn(k, n, device="cuda").to(dtype)
    scale = random_scale(m)
    poison(m * n * dtype.itemsize // 4 + 1)
    torch.use_deterministic_algorithms(deterministic)
    try:
        y = kernels.metcf_spmm(x, csr.values, kernels.layout_arguments(layout), kernel == "balanced", scale)
    finally:
        torch.use_deterministic_algorithms(False)
    torch.cuda.synchronize()
    csr_row, csr_col = csr.row_indices().long(), csr.col.long()
    zero = torch.zeros(n, device="cuda")
    grad_y = torch.zeros(m, n, device="cuda")
    exact = dense_mean(csr_row, csr_col, csr.values.double(), x.double(), zero.double(), scale.double(), m,
                       grad_y.double())[0]
    in_dtype = dense_mean(csr_row, csr_col, csr.values, x, zero.to(dtype), scale, m, grad_y.to(dtype))[0]
    error, bound = relative_error(y, exact), limit(dtype, in_dtype, exact)
    assert error <= bound, f"relative error {error:.3g} over {bound:.3g}"


# piece_nnz 32: the last piece of a split row to arrive writes it; 4 at N = 128: 2,500 pieces of
# the hub row, over the launch size where a finishing kernel writes split rows instead.
@pytest.mark.parametrize("piece_nnz", [32, 4])
@pytest.mark.parametrize("extras", ["bias", "bias-addend-row_map"])
@pytest.mark.parametrize("n", N_VALUES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype)[6:])
def test_rows_row_scale(dtype, n, extras, piece_nnz):
    """csr_rows_spmm's row_scale multiplies each row's sums, whole or summed from pieces, before
    the bias and the addend: Y[row_map[i]] = scale[row_map[i]] * (A @ x)[i] + bias + addend."""
    m, k = 3000, 12000
    row, col, values = random_matrix(m, k, 6, seed=31, hub_row=1234, hub_nnz=10_000)
    csr = from_coo(row, col, values.to(dtype), m, k)
    pieces = csr_rows.row_pieces(csr.rowptr, piece_nnz)
    x = torch.randn(k, n, device="cuda").to(dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    full = extras != "bias"
    row_map = torch.randperm(m, device="cuda").int() if full else None
    addend = torch.randn(m, n, device="cuda") if full else None
    scale = random_scale(m)
    poison(m * n * dtype.itemsize // 4 + 1)
    y = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, k, bias, row_map, addend, scale)
    torch.cuda.synchronize()
    csr_row, csr_col = csr.row_indices().long(), csr.col.long()
    y_row = csr_row if row_map is None else row_map.long()[csr_row]
    zero_grad = torch.zeros(m, n, device="cuda")
    exact = dense_mean(y_row, csr_col, csr.values.double(), x.double(), bias.double(), scale.double(), m,
                       zero_grad.double())[0]
    in_dtype = dense_mean(y_row, csr_col, csr.values, x, bias, scale, m, zero_grad.to(dtype))[0]
    if addend is not None:
        exact, in_dtype = exact + addend.double(), (in_dtype.float() + addend).to(dtype)
    error, bound = relative_error(y, exact), limit(dtype, in_dtype, exact)
    assert error <= bound, f"relative error {error:.3g} over {bound:.3g}"


@pytest.mark.parametrize("path", ["base", "balanced", "rows"])
def test_the_mean_of_fixed_values_reads_them_in_place(path):
    """A write no version counter sees (through ``.data``) reaches the next mean of values that
    need no gradient: the mean reads the sum's operands, which read the values where they lie."""
    m = k = 2000
    row, col, values = random_matrix(m, k, 8, seed=41)
    a = TCSparseTensor.from_coo(row, col, values, shape=(m, k))
    x = torch.randn(k, 32, device="cuda")
    before = a.matmul(x, path=path, reduce="mean")
    a._values.data.mul_(2)  # a write no version counter of the values sees
    after = a.matmul(x, path=path, reduce="mean")
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-5)
