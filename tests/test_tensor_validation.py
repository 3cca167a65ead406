"""What TCSparseTensor refuses: unsupported torch operations (TypeError with guidance, never a
silent result) and invalid operands of A @ X (errors naming the values)."""
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
