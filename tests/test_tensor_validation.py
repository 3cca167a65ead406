"""What TCSparseTensor refuses: unsupported torch operations (TypeError with guidance, never a
silent result) and invalid operands of A @ X (errors naming the values)."""
import numpy as np
import pytest
import torch

import torch_tcsparse
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.testing import random_dense

GUIDANCE = r"to_dense\(\)|A\.t\(\)"


@pytest.fixture
def a():
    return TCSparseTensor.from_dense(random_dense(6, 4, 0.5, seed=0))


UNSUPPORTED = {
    "A + 1": lambda a: a + 1,
    "1 + A": lambda a: 1 + a,
    "A * 2": lambda a: a * 2,
    "-A": lambda a: -a,
    "torch.add": lambda a: torch.add(a, 1),
    "A.sum()": lambda a: a.sum(),
    "torch.abs": lambda a: torch.abs(a),
    "A[0]": lambda a: a[0],
    "A.clone()": lambda a: a.clone(),
    "A.int()": lambda a: a.int(),
    "torch.mv": lambda a: torch.mv(a, torch.ones(4)),
    "torch.addmm": lambda a: torch.addmm(torch.zeros(6, 2), a, torch.ones(4, 2)),
    "X @ A": lambda a: torch.ones(3, 6) @ a,
    "torch.matmul(X, A)": lambda a: torch.matmul(torch.ones(3, 6), a),
    "torch.mm(X, A)": lambda a: torch.mm(torch.ones(3, 6), a),
    "A @ A": lambda a: a @ a.t(),
}


@pytest.mark.parametrize("op", list(UNSUPPORTED))
def test_unsupported_operations_raise_type_error_with_guidance(a, op):
    with pytest.raises(TypeError, match=GUIDANCE):
        UNSUPPORTED[op](a)


@pytest.mark.parametrize(
    "method, dtype",
    [("half", torch.float16), ("bfloat16", torch.bfloat16), ("float", torch.float32), ("double", torch.float64)],
)
def test_dtype_shorthands_convert_the_values(a, method, dtype):
    converted = getattr(a, method)()
    assert isinstance(converted, TCSparseTensor) and converted.dtype == dtype
    torch.testing.assert_close(converted.to_dense(), a.to_dense().to(dtype))


def test_requires_grad_on_the_matrix_points_to_the_values(a):
    with pytest.raises(TypeError, match=r"with_values"):
        a.requires_grad_()


def test_edge_index_out_of_range_names_the_row_of_edge_index():
    with pytest.raises(ValueError, match=r"edge_index\[1\] \(targets\) holds index 5.*size 3"):
        TCSparseTensor.from_edge_index(torch.tensor([[0], [5]]), num_nodes=3)
    with pytest.raises(ValueError, match=r"edge_index\[0\] \(sources\) holds a negative index \(-1\)"):
        TCSparseTensor.from_edge_index(torch.tensor([[-1], [0]]), num_nodes=3)


def test_equality_is_not_a_silent_identity_check(a):
    # A == B must not quietly fall back to Python's `is` comparison and return a bool.
    with pytest.raises(TypeError, match=GUIDANCE):
        a == a  # noqa: B015


INVALID_OPERANDS = [
    ("shape mismatch", lambda: torch.ones(5, 2), ValueError, r"shape mismatch.*\(6, 4\).*5 rows"),
    ("vector shape mismatch", lambda: torch.ones(6), ValueError, r"\(6, 4\).*6 rows"),
    ("3-D operand", lambda: torch.ones(4, 2, 2), ValueError, r"\[K\] or \[K, N\].*\(4, 2, 2\)"),
    ("0-D operand", lambda: torch.tensor(1.0), ValueError, r"\[K\] or \[K, N\].*\(\)"),
    ("dtype mismatch", lambda: torch.ones(4, 2, dtype=torch.float64), TypeError, r"float32.*float64.*\.to\(dtype\)"),
    ("integer operand", lambda: torch.ones(4, 2, dtype=torch.int64), TypeError, r"float32.*int64"),
    ("device mismatch", lambda: torch.ones(4, 2, device="meta"), ValueError, r"device mismatch.*cpu.*meta"),
    ("sparse operand", lambda: torch.ones(4, 2).to_sparse(), TypeError, r"dense X.*sparse_coo"),
    ("sparse csr operand", lambda: torch.ones(4, 2).to_sparse_csr(), TypeError, r"dense X.*sparse_csr"),
    ("list operand", lambda: [[1.0]] * 4, TypeError, r"Tensor.*list"),
]


@pytest.mark.parametrize("case", INVALID_OPERANDS, ids=[c[0] for c in INVALID_OPERANDS])
@pytest.mark.parametrize("route", ["@", "torch.matmul", "torch.sparse.mm", "spmm"])
def test_invalid_operands_are_named(a, case, route):
    _, make_x, error, message = case
    x = make_x()
    call = {
        "@": lambda: a @ x,
        "torch.matmul": lambda: torch.matmul(a, x),
        "torch.sparse.mm": lambda: torch.sparse.mm(a, x),
        "spmm": lambda: torch_tcsparse.spmm(a, x),
    }[route]
    with pytest.raises(error, match=message):
        call()


def test_invalid_path_is_named(a):
    with pytest.raises(ValueError, match=r"path must be one of.*'fastest'"):
        a.matmul(torch.ones(4, 2), path="fastest")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal of the CUDA kernel paths")
@pytest.mark.parametrize("path", ["base", "balanced", "rows", "grouped"])
def test_kernel_paths_need_cuda(a, path):
    with pytest.raises(ValueError, match=rf"{path}.*CUDA.*cpu"):
        a.matmul(torch.ones(4, 2), path=path)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_csr_path_with_half_precision_is_refused_or_correct(dtype):
    # torch's CPU sparse CSR product has no half kernels: the path must refuse with a clear
    # ValueError/TypeError, not surface a NotImplementedError from deep inside torch.
    dense = random_dense(6, 4, 0.5, seed=1, dtype=dtype)
    a, x = TCSparseTensor.from_dense(dense), torch.ones(4, 2, dtype=dtype)
    try:
        y = a.matmul(x, path="csr")
    except (ValueError, TypeError) as error:
        assert str(dtype) in str(error)
    else:
        torch.testing.assert_close(y, (dense.float() @ x.float()).to(dtype))


def test_extra_arguments_are_refused(a):
    with pytest.raises(TypeError, match=r"out="):
        torch.matmul(a, torch.ones(4, 2), out=torch.empty(6, 2))


def test_spmm_needs_a_tcsparse_tensor():
    with pytest.raises(TypeError, match=r"TCSparseTensor.*Tensor"):
        torch_tcsparse.spmm(torch.ones(2, 2), torch.ones(2, 2))


EDGES = torch.tensor([[0, 1, 2], [1, 2, 0]])

INVALID_CONSTRUCTIONS = {
    "float window": (lambda: TCSparseTensor.from_edge_index(EDGES, window=16.0), TypeError, r"window.*16\.0.*float"),
    "bool window": (lambda: TCSparseTensor.from_edge_index(EDGES, window=True), TypeError, r"window.*True.*bool"),
    "string symmetric": (lambda: TCSparseTensor.from_edge_index(EDGES, symmetric="yes"), TypeError, r"symmetric.*'yes'.*str"),
    "integer symmetric": (lambda: TCSparseTensor.from_edge_index(EDGES, symmetric=1), TypeError, r"symmetric.*1.*int"),
    "float seed": (lambda: TCSparseTensor.from_edge_index(EDGES, seed=1.5), TypeError, r"seed.*1\.5"),
    "negative seed": (lambda: TCSparseTensor.from_edge_index(EDGES, seed=-1), ValueError, r"seed.*-1"),
    "float numpy permutation": (
        lambda: TCSparseTensor.from_edge_index(EDGES, reorder=np.array([2.0, 0.0, 1.0])), TypeError, r"reorder.*float64"
    ),
    "complex permutation": (
        lambda: TCSparseTensor.from_edge_index(EDGES, reorder=torch.tensor([2, 0, 1], dtype=torch.complex64)),
        ValueError, r"permutation.*integer.*complex64",
    ),
    "list permutation": (lambda: TCSparseTensor.from_edge_index(EDGES, reorder=[2, 0, 1]), TypeError, r"reorder.*list"),
    "complex weights": (
        lambda: TCSparseTensor.from_edge_index(EDGES, torch.ones(3, dtype=torch.complex64)), TypeError, r"edge_weight.*complex64"
    ),
    "complex weights with a dtype": (
        lambda: TCSparseTensor.from_edge_index(EDGES, torch.ones(3, dtype=torch.complex64), dtype=torch.float32),
        TypeError, r"edge_weight.*complex64",
    ),
    "string dtype": (lambda: TCSparseTensor.from_edge_index(EDGES, dtype="float32"), TypeError, r"dtype.*'float32'"),
    "empty rowptr": (
        lambda: TCSparseTensor.from_csr(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)),
        ValueError, r"rowptr.*at least one.*\(0,\)",
    ),
    "shape overflowing int64 indexing": (
        lambda: TCSparseTensor.from_coo(torch.tensor([0]), torch.tensor([0]), shape=(1, 2**62)),
        ValueError, r"shape \(1, 4611686018427387904\) is too large",
    ),
    "element count overflowing int64": (
        lambda: TCSparseTensor.from_coo(torch.tensor([3]), torch.tensor([0]), shape=(2**32, 2**32)),
        ValueError, r"shape \(4294967296, 4294967296\) is too large",
    ),
    "num_nodes overflowing int64": (
        lambda: TCSparseTensor.from_edge_index(EDGES, num_nodes=2**40), ValueError, r"num_nodes.*1099511627776.*too large"
    ),
    "float16 weight beyond its range": (
        lambda: TCSparseTensor.from_edge_index(EDGES, torch.tensor([1.0, 1e6, 2.0]), dtype=torch.float16),
        ValueError, r"edge_weight holds 1e\+06, beyond the range of torch.float16 \(largest finite value 65504\)",
    ),
    "float16 sum of repeated weights beyond its range": (
        lambda: TCSparseTensor.from_coo(torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([4e4, 4e4]),
                                        dtype=torch.float16),
        ValueError, r"values \(summed over repeated entries\) holds 80000, beyond the range of torch.float16",
    ),
    "float32 value from float64 beyond its range": (
        lambda: TCSparseTensor.from_coo(torch.tensor([0]), torch.tensor([1]), torch.tensor([1e300], dtype=torch.float64),
                                        dtype=torch.float32),
        ValueError, r"values holds 1e\+300, beyond the range of torch.float32",
    ),
    "edge_index on the meta device": (
        lambda: TCSparseTensor.from_edge_index(torch.zeros(2, 3, dtype=torch.long, device="meta")),
        ValueError, r"edge_index is a meta tensor",
    ),
    "CSR arrays on the meta device": (
        lambda: TCSparseTensor.from_csr(torch.zeros(3, dtype=torch.long, device="meta"),
                                        torch.zeros(2, dtype=torch.long, device="meta")),
        ValueError, r"rowptr is a meta tensor",
    ),
    "COO tensor with a dense dimension": (
        lambda: TCSparseTensor.from_torch(torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2, 3), (2, 3))),
        ValueError, r"without dense dimensions.*sparse_dim=1, dense_dim=1",
    ),
}


@pytest.mark.parametrize("case", list(INVALID_CONSTRUCTIONS))
def test_invalid_constructions_name_the_argument_and_value(case):
    build, error, message = INVALID_CONSTRUCTIONS[case]
    with pytest.raises(error, match=message):
        build()


def test_numpy_integer_permutation_reorders_as_a_tensor_does():
    perm = np.array([2, 0, 1], dtype=np.int32)
    from_numpy = TCSparseTensor.from_edge_index(EDGES, reorder=perm, window=np.int64(8), symmetric=np.bool_(True))
    from_tensor = TCSparseTensor.from_edge_index(EDGES, reorder=torch.from_numpy(perm), window=8)
    assert from_numpy.reorder_method == "user"
    assert torch.equal(from_numpy._structure.row_perm, from_tensor._structure.row_perm)
    x = torch.randn(3, 2)
    torch.testing.assert_close(from_numpy.matmul(x, path="reference"), from_tensor.to_dense() @ x)


def test_a_wide_matrix_within_int64_indexing_builds():
    a = TCSparseTensor.from_coo(torch.tensor([0]), torch.tensor([2**40 - 1]), shape=(2, 2**40))
    assert a.shape == (2, 2**40) and a.nnz == 1


def test_infinite_weights_stay_infinite_in_float16():
    """Only finite values that the cast would turn into inf are refused: an inf given is kept."""
    a = TCSparseTensor.from_edge_index(torch.tensor([[0, 1], [1, 0]]), torch.tensor([float("inf"), 1.0]),
                                       dtype=torch.float16)
    assert torch.equal(a.csr.values, torch.tensor([1.0, float("inf")], dtype=torch.float16))
