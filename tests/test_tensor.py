"""TCSparseTensor: constructors, conversions, every route to A @ X on every CPU path and dtype,
transpose, with_values, to(), repr."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch_geometric import EdgeIndex

import torch_tcsparse
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.testing import (
    assert_matches_reference,
    cpu_paths,
    devices,
    float_dtypes,
    half_dtypes,
    random_dense,
    random_permutation,
    value_dtypes,
)


def constructors(dense: torch.Tensor) -> dict:
    """The same matrix through every public constructor."""
    row, col = torch.nonzero(dense, as_tuple=True)
    values = dense[row, col]
    m, k = dense.shape
    csr = dense.to_sparse_csr()
    edge_index = torch.stack([col, row])
    return {
        "dense": lambda: TCSparseTensor.from_dense(dense),
        "coo": lambda: TCSparseTensor.from_coo(row, col, values, (m, k)),
        "csr": lambda: TCSparseTensor.from_csr(csr.crow_indices(), csr.col_indices(), csr.values(), (m, k)),
        "scipy": lambda: TCSparseTensor.from_scipy(sp.csr_matrix(dense.numpy())),
        "torch_coo": lambda: TCSparseTensor.from_torch(dense.to_sparse()),
        "torch_csr": lambda: TCSparseTensor.from_torch(csr),
        "edge_index": lambda: TCSparseTensor.from_edge_index(edge_index, values, num_nodes=(k, m)),
        "pyg_edge_index": lambda: TCSparseTensor.from_edge_index(EdgeIndex(edge_index, sparse_size=(k, m)), values),
    }


@st.composite
def dense_matrices(draw, dtype=torch.float64):
    num_rows = draw(st.integers(1, 50))
    num_cols = draw(st.integers(1, 50))
    density = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    dense_row = draw(st.one_of(st.none(), st.integers(0, num_rows - 1)))
    return random_dense(num_rows, num_cols, density, draw(st.integers(0, 2**16)), dtype, dense_row=dense_row)


@given(dense_matrices())
def test_every_constructor_round_trips(dense):
    for name, build in constructors(dense).items():
        a = build()
        assert isinstance(a, TCSparseTensor), name
        assert a.shape == dense.shape and a.dtype == torch.float64 and a.device == dense.device, name
        assert a.nnz == int((dense != 0).sum()), name
        assert torch.equal(a.to_dense(), dense), name
        assert np.array_equal(a.to_scipy().toarray(), dense.numpy()), name
        assert torch.equal(a.to_torch_csr().to_dense(), dense), name


@given(dense_matrices(), st.sampled_from(cpu_paths), st.sampled_from([8, 16]), st.booleans(), st.integers(1, 9))
def test_product_equals_scipy_on_every_path(dense, path, window, permute, n):
    perm = random_permutation(dense.shape[0], seed=n) if permute else "none"
    a = TCSparseTensor.from_dense(dense, window=window, reorder=perm)
    x = torch.randn(dense.shape[1], n, dtype=torch.float64)
    expected = sp.csr_matrix(dense.numpy()) @ x.numpy()
    y = a.matmul(x, path=path)
    assert type(y) is torch.Tensor
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)


def product_routes():
    return {
        "@": lambda a, x: a @ x,
        "torch.matmul": torch.matmul,
        "torch.mm": torch.mm,
        "torch.sparse.mm": torch.sparse.mm,
        "Tensor.matmul": torch.Tensor.matmul,
        "A.matmul": lambda a, x: a.matmul(x),
        "A.mm": lambda a, x: a.mm(x),
        "torch_tcsparse.spmm": torch_tcsparse.spmm,
    }


@pytest.mark.parametrize("route", list(product_routes()))
@pytest.mark.parametrize("dtype", float_dtypes)
def test_every_route_returns_a_plain_dense_product(route, dtype):
    dense = random_dense(37, 21, 0.2, seed=2, dtype=dtype)
    x = torch.randn(21, 5, dtype=dtype)
    y = product_routes()[route](TCSparseTensor.from_dense(dense), x)
    assert type(y) is torch.Tensor and y.layout == torch.strided
    assert_matches_reference(y, dense, x)


@pytest.mark.parametrize("route", ["@", "torch.matmul", "A.matmul", "torch_tcsparse.spmm"])
@pytest.mark.parametrize("path", cpu_paths)
def test_vector_operand(route, path):
    dense = random_dense(19, 23, 0.3, seed=4)
    a, x = TCSparseTensor.from_dense(dense), torch.randn(23)
    y = a.matmul(x, path=path) if route == "A.matmul" else product_routes()[route](a, x)
    assert y.shape == (19,)
    assert_matches_reference(y[:, None], dense, x[:, None])


@pytest.mark.parametrize("path", cpu_paths)
@pytest.mark.parametrize("layout", ["transposed", "strided_columns", "single_column"])
def test_non_contiguous_and_narrow_operands(path, layout):
    dense = random_dense(33, 40, 0.15, seed=6)
    x = {
        "transposed": torch.randn(7, 40).t(),
        "strided_columns": torch.randn(40, 12)[:, ::3],
        "single_column": torch.randn(40, 1),
    }[layout]
    y = TCSparseTensor.from_dense(dense).matmul(x, path=path)
    assert_matches_reference(y, dense, x)


@pytest.mark.parametrize("path", ["reference", "auto"])
@pytest.mark.parametrize("dtype", half_dtypes)
def test_half_precision_reference_path(path, dtype):
    dense = random_dense(45, 38, 0.2, seed=7, dtype=dtype)
    x = torch.randn(38, 6).to(dtype)
    a = TCSparseTensor.from_dense(dense)
    assert a.dtype == dtype
    assert_matches_reference(a.matmul(x, path=path), dense, x)


@pytest.mark.parametrize("dtype", float_dtypes)
@pytest.mark.parametrize("path", cpu_paths)
def test_float_tolerance_against_torch_dense(dtype, path):
    # Larger, denser inputs so that rounding differs: the error must stay within a few times
    # torch's own dense matmul error at the same precision.
    dense = torch.randn(64, 300, dtype=dtype) * (torch.rand(64, 300) < 0.5)
    x = torch.randn(300, 16, dtype=dtype)
    assert_matches_reference(TCSparseTensor.from_dense(dense).matmul(x, path=path), dense, x)


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (5, 3)])
@pytest.mark.parametrize("path", cpu_paths)
def test_products_without_nonzeros_or_columns(shape, path):
    a = TCSparseTensor.from_dense(torch.zeros(shape))
    for n in (0, 3):
        y = a.matmul(torch.randn(shape[1], n), path=path)
        assert y.shape == (shape[0], n) and bool((y == 0).all())


def test_transpose_is_correct_and_cached():
    dense = random_dense(30, 17, 0.25, seed=8, dtype=torch.float64)
    a = TCSparseTensor.from_dense(dense)
    t = a.t()
    assert isinstance(t, TCSparseTensor) and t.shape == (17, 30)
    assert torch.equal(t.to_dense(), dense.t())
    assert a.t()._structure is t._structure, "the transpose structure is rebuilt"
    assert t.t()._structure is a._structure
    assert torch.equal(t.t().to_dense(), dense)
    assert torch.equal(torch.t(a).to_dense(), dense.t()) and torch.equal(a.T.to_dense(), dense.t())
    x = torch.randn(30, 4, dtype=torch.float64)
    for path in cpu_paths:
        assert_matches_reference(t.matmul(x, path=path), dense.t(), x)


def test_transpose_of_reordered_matrix():
    dense = random_dense(25, 25, 0.2, seed=9, dtype=torch.float64)
    a = TCSparseTensor.from_dense(dense, reorder=random_permutation(25, seed=1))
    x = torch.randn(25, 3, dtype=torch.float64)
    for path in cpu_paths:
        assert_matches_reference(a.t().matmul(x, path=path), dense.t(), x)


def test_with_values_shares_structure():
    dense = random_dense(20, 24, 0.3, seed=10, dtype=torch.float64)
    a = TCSparseTensor.from_dense(dense)
    new_values = torch.randn(a.nnz, dtype=torch.float64)
    b = a.with_values(new_values)
    assert b._structure is a._structure
    row, col = a.csr.row_indices(), a.csr.col.long()
    expected = torch.zeros_like(dense).index_put_((row, col), new_values)
    assert torch.equal(b.to_dense(), expected)
    assert torch.equal(a.to_dense(), dense), "with_values changed the original"
    x = torch.randn(24, 3, dtype=torch.float64)
    for path in cpu_paths:
        assert_matches_reference(b.matmul(x, path=path), expected, x)


@pytest.mark.parametrize("dtype", value_dtypes)
def test_with_values_can_change_dtype(dtype):
    a = TCSparseTensor.from_dense(random_dense(8, 8, 0.5, seed=11))
    b = a.with_values(torch.ones(a.nnz, dtype=dtype))
    assert b.dtype == dtype and b._structure is a._structure
    assert torch.equal(b.to_dense(), (a.to_dense() != 0).to(dtype))


def test_with_values_rejects_wrong_values():
    a = TCSparseTensor.from_dense(random_dense(8, 8, 0.5, seed=11))
    with pytest.raises(ValueError, match=rf"\({a.nnz}\).*\({a.nnz + 1},\)"):
        a.with_values(torch.ones(a.nnz + 1))
    with pytest.raises(TypeError, match=r"int64"):
        a.with_values(torch.ones(a.nnz, dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_to_dtype(dtype):
    dense = random_dense(18, 18, 0.3, seed=12)
    a = TCSparseTensor.from_dense(dense)
    b = a.to(dtype)
    assert b.dtype == dtype and b._structure is a._structure
    assert torch.equal(b.to_dense(), dense.to(dtype))
    x = torch.randn(18, 2).to(dtype)
    assert_matches_reference(b.matmul(x, path="reference"), dense.to(dtype), x)
    assert a.dtype == torch.float32


def test_to_device_and_dtype_forms():
    a = TCSparseTensor.from_dense(random_dense(6, 6, 0.5, seed=13))
    assert a.to("cpu")._structure is a._structure
    assert a.to(torch.device("cpu"), torch.float64).dtype == torch.float64
    assert a.to(dtype=torch.float64).dtype == torch.float64
    assert a.cpu().device.type == "cpu"
    with pytest.raises(TypeError, match=r"floating dtype.*int32"):
        a.to(torch.int32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_cuda_and_back():
    dense = random_dense(40, 30, 0.2, seed=14)
    a = TCSparseTensor.from_dense(dense)
    a.t()
    c = a.cuda()
    assert c.device.type == "cuda" and c._structure.layout.device.type == "cuda"
    assert c.t()._structure.layout.device.type == "cuda"
    assert torch.equal(c.cpu().to_dense(), dense)
    x = torch.randn(30, 8)
    for path in ["csr", "reference", "auto"]:
        assert_matches_reference(c.matmul(x.cuda(), path=path), dense, x)


def test_repr_and_properties():
    dense = random_dense(33, 20, 0.2, seed=15)
    a = TCSparseTensor.from_dense(dense, window=8)
    text = repr(a)
    for part in ["TCSparseTensor(", "shape=(33, 20)", f"nnz={a.nnz}", "dtype=torch.float32", "device=cpu", "window=8"]:
        assert part in text, part
    assert f"tc_blocks={a.stats()['tc_blocks']}" in text
    assert str(a) == text
    assert a.reorder_method == "none" and a.stats()["reorder"] == "none"
    assert a.stats()["mean_nnz_per_block"] == pytest.approx(a.nnz / a.stats()["tc_blocks"])
    assert torch.equal(a.csr.values, a.to_torch_csr().values())


def test_user_permutation_is_validated():
    dense = random_dense(5, 5, 0.5, seed=16)
    with pytest.raises(ValueError, match=r"repeats"):
        TCSparseTensor.from_dense(dense, reorder=torch.tensor([0, 0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"outside \[0, 5\)"):
        TCSparseTensor.from_dense(dense, reorder=torch.tensor([0, 1, 2, 3, 5]))
    with pytest.raises(ValueError, match=r"5 entries.*\(4,\)"):
        TCSparseTensor.from_dense(dense, reorder=torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"window.*4"):
        TCSparseTensor.from_dense(dense, window=4)


def test_constructor_dtype_option():
    edge_index = torch.tensor([[0, 1], [1, 0]])
    a = TCSparseTensor.from_edge_index(edge_index, dtype=torch.float64)
    assert a.dtype == torch.float64
    assert TCSparseTensor.from_scipy(sp.eye(3, format="csr"), dtype=torch.float16).dtype == torch.float16


@pytest.mark.parametrize("layout", ["csc", "bsr"])
def test_from_torch_refuses_other_sparse_layouts(layout):
    dense = torch.eye(4)
    tensor_ = dense.to_sparse_csc() if layout == "csc" else dense.to_sparse_bsr((2, 2))
    with pytest.raises(TypeError, match=r"COO and CSR.*sparse_" + layout):
        TCSparseTensor.from_torch(tensor_)


def test_duplicate_summation_is_documented():
    for constructor in (TCSparseTensor.from_edge_index, TCSparseTensor.from_coo, TCSparseTensor.from_csr):
        assert "summed" in constructor.__doc__, constructor.__name__


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_stats_count_value_bytes_of_the_dtype(dtype):
    a = TCSparseTensor.from_dense(random_dense(20, 20, 0.2, seed=17, dtype=dtype))
    stats = a.stats()
    value_bytes = torch.finfo(dtype).bits // 8
    assert stats["csr_bytes"] == 21 * 4 + a.nnz * (4 + value_bytes)
    assert stats["tc_blocks"] == a._structure.layout.num_blocks


REORDER_METHODS = ["tca", "jaccard", "shuffle", "rcm", "degree", "auto"]


@pytest.mark.parametrize("method", REORDER_METHODS)
@pytest.mark.parametrize("shape", [(45, 45), (45, 30)], ids=["square", "rectangular"])
def test_reordered_tensor_multiplies_like_the_original(method, shape):
    # The permutation only moves rows between windows: every product, the transpose and the
    # gradients stay those of the user's matrix.
    dense = random_dense(*shape, 0.1, seed=18, dtype=torch.float64, dense_row=4)
    a = TCSparseTensor.from_dense(dense, reorder=method)
    expected_methods = ("tca", "jaccard", "shuffle", "rcm", "degree", "none") if method == "auto" else (method,)
    assert a.reorder_method in expected_methods
    assert torch.equal(a.to_dense(), dense)
    x = torch.randn(shape[1], 3, dtype=torch.float64, requires_grad=True)
    for path in cpu_paths:
        assert_matches_reference(a.matmul(x, path=path), dense, x)
    xt = torch.randn(shape[0], 2, dtype=torch.float64)
    assert_matches_reference(a.t() @ xt, dense.t(), xt)
    (a @ x).sum().backward()
    torch.testing.assert_close(x.grad, dense.t() @ torch.ones(shape[0], 3, dtype=torch.float64))


def test_symmetric_reordering_defaults_and_refusals():
    square = random_dense(20, 20, 0.2, seed=19)
    perm = random_permutation(20, seed=2)
    assert TCSparseTensor.from_dense(square, reorder=perm)._structure.col_perm is not None
    assert TCSparseTensor.from_dense(square, reorder=perm, symmetric=False)._structure.col_perm is None
    rectangular = random_dense(20, 12, 0.2, seed=19)
    a = TCSparseTensor.from_dense(rectangular, reorder=perm)
    assert a._structure.col_perm is None
    assert torch.equal(a.t().to_dense(), rectangular.t())
    with pytest.raises(ValueError, match=r"square.*20 x 12"):
        TCSparseTensor.from_dense(rectangular, reorder=perm, symmetric=True)


@pytest.mark.parametrize("special", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_non_finite_x_rows_reach_only_rows_that_use_them_on_the_csr_path(special):
    # Sparse semantics (scipy, torch.sparse): row 1 never reads X[0], so it stays finite.
    a = TCSparseTensor.from_dense(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    x = torch.tensor([[special, 1.0], [1.0, 3.0]])
    y = a.matmul(x, path="csr")
    assert torch.equal(y[1], torch.tensor([2.0, 6.0])), f"row 1 is {y[1].tolist()}"
    assert not bool(torch.isfinite(y[0, 0]))


@pytest.mark.parametrize("special", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_non_finite_x_rows_spread_inside_a_block_on_tensor_core_paths(special):
    # Documented (README, "Non-finite X"): the Tensor-Core paths multiply whole 16x8 blocks, so
    # a non-finite X row reaches every row of a window that shares its block (0 * inf = NaN),
    # as in a dense product; rows of other windows stay exact.
    dense = torch.zeros(32, 2)
    dense[0, 0], dense[1, 1], dense[16, 1] = 1.0, 2.0, 3.0
    a = TCSparseTensor.from_dense(dense)
    x = torch.tensor([[special, 1.0], [1.0, 3.0]])
    y = a.matmul(x, path="reference")
    assert not bool(torch.isfinite(y[0, 0]))
    assert not bool(torch.isfinite(y[1, 0])), "row 1 shares row 0's block: the documented spread"
    assert torch.equal(y[16], torch.tensor([3.0, 9.0])), "a row of another window must stay exact"


@pytest.mark.parametrize("device", devices, ids=str)
@pytest.mark.parametrize("path", ["reference", "csr", "auto"])
def test_product_on_every_device(device, path):
    dense = random_dense(50, 36, 0.15, seed=20)
    x = torch.randn(36, 8)
    a = TCSparseTensor.from_dense(dense).to(device)
    y = a.matmul(x.to(device), path=path)
    assert y.device.type == device.type
    assert_matches_reference(y, dense, x)


@pytest.mark.parametrize("device", devices, ids=str)
@pytest.mark.parametrize("path", cpu_paths)
@pytest.mark.parametrize("x_grad", [False, True])
def test_bias_is_added_to_every_row_and_differentiable(device, path, x_grad):
    dense = random_dense(50, 36, 0.15, seed=21, dtype=torch.float64)
    a = TCSparseTensor.from_dense(dense).to(device)
    x = torch.randn(36, 8, dtype=torch.float64, device=device, requires_grad=x_grad)
    bias = torch.randn(8, dtype=torch.float64, device=device, requires_grad=True)
    y = a.matmul(x, path=path, bias=bias)
    expected_x = x.detach().clone().requires_grad_(x_grad)
    expected_bias = bias.detach().clone().requires_grad_()
    expected = dense.to(device) @ expected_x + expected_bias
    torch.testing.assert_close(y, expected)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    expected.backward(grad_y)
    torch.testing.assert_close(bias.grad, expected_bias.grad)
    if x_grad:
        torch.testing.assert_close(x.grad, expected_x.grad)


@pytest.mark.parametrize(
    "bias, x_shape, error, match",
    [
        (torch.zeros(7, dtype=torch.float64), (36, 8), ValueError, r"shape \[N\] = \[8\], got \(7,\)"),
        (torch.zeros(1, 8, dtype=torch.float64), (36, 8), ValueError, r"got \(1, 8\)"),
        (torch.zeros(8, dtype=torch.float32), (36, 8), TypeError, "must match X"),
        (torch.zeros(1, dtype=torch.float64), (36,), ValueError, r"needs X of shape \[K, N\]"),
        ([0.0] * 8, (36, 8), TypeError, "must be a torch.Tensor"),
    ],
)
def test_bias_is_validated(bias, x_shape, error, match):
    a = TCSparseTensor.from_dense(random_dense(50, 36, 0.15, seed=21, dtype=torch.float64))
    with pytest.raises(error, match=match):
        a.matmul(torch.randn(x_shape, dtype=torch.float64), bias=bias)
