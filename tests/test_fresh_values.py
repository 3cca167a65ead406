"""Products always read the matrix's current values: every operand a matrix derives from them
(block order, casts, the transpose's copy) is rebuilt after an in-place change."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.testing import devices

CUDA_PATHS = ["base", "balanced", "rows", "grouped", "csr", "auto"]
CPU_PATHS = ["reference", "csr", "auto"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def cases():
    for device in devices:
        for path in CUDA_PATHS if device.type == "cuda" else CPU_PATHS:
            for dtype in DTYPES:
                yield pytest.param(device, path, dtype, id=f"{device.type}-{path}-{dtype}".replace("torch.", ""))


def graph(device, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, 30, (2, 100), generator=generator)
    return TCSparseTensor.from_edge_index(edge_index, num_nodes=30).to(device=device, dtype=dtype)


def dense_of(base: TCSparseTensor, values: torch.Tensor) -> torch.Tensor:
    csr = base.csr
    dense = torch.zeros(base.shape, dtype=torch.float64)
    dense[csr.row_indices().cpu(), csr.col.long().cpu()] = values.detach().double().cpu()
    return dense


def close(actual, expected, dtype):
    tolerance = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected, rtol=tolerance, atol=tolerance)


def test_reproducer_after_an_optimizer_step():
    base = TCSparseTensor.from_edge_index(torch.randint(0, 30, (2, 100)), num_nodes=30).half()
    w = torch.nn.Parameter(torch.rand(base.nnz).half())
    a = base.with_values(w)
    x = torch.randn(30, 8).half()
    with torch.no_grad():
        y0 = a @ x
    (a @ x).float().pow(2).sum().backward()
    torch.optim.SGD([w], lr=0.5).step()
    with torch.no_grad():
        assert not torch.equal(a @ x, y0)


@pytest.mark.parametrize("device, path, dtype", list(cases()))
def test_product_and_gradient_follow_in_place_changes(device, path, dtype):
    base = graph(device, dtype)
    w = torch.rand(base.nnz, device=device).to(dtype)
    a = base.with_values(w)
    x = torch.randn(30, 8, device=device).to(dtype)
    for step in range(3):
        with torch.no_grad():
            y = a.matmul(x, path=path)
        close(y, dense_of(base, w) @ x.double().cpu(), dtype)
        grad_y = torch.randn(30, 8, device=device).to(dtype)
        x_grad = x.clone().requires_grad_()
        a.matmul(x_grad, path=path).backward(grad_y)
        close(x_grad.grad, dense_of(base, w).t() @ grad_y.double().cpu(), dtype)
        with torch.no_grad():
            w.mul_(-1.5).add_(0.25)


@pytest.mark.parametrize("device", devices, ids=str)
def test_autocast_copy_follows_in_place_changes(device):
    base = graph(device, torch.float32)
    w = torch.rand(base.nnz, device=device)
    a = base.with_values(w)
    x = torch.randn(30, 4, device=device)
    dtype = torch.bfloat16
    for _ in range(2):
        with torch.autocast(device.type, dtype=dtype):
            y = a @ x
        close(y, dense_of(base, w) @ x.double().cpu(), dtype)
        with torch.no_grad():
            w.mul_(3.0)


def test_backward_after_an_in_place_change_is_refused():
    base = graph("cpu", torch.float32)
    w = torch.rand(base.nnz, requires_grad=True)
    values = w * 1.0
    y = base.with_values(values) @ torch.randn(30, 4)
    with torch.no_grad():
        values.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cpu_half_precision_keeps_sparse_semantics(dtype):
    # Rows 0 and 1 share a Tensor-Core window; only row 0 stores a nonzero in column 0.
    a = TCSparseTensor.from_dense(torch.eye(2, dtype=dtype))
    x = torch.tensor([[float("inf")], [1.0]], dtype=dtype)
    expected = torch.tensor([[float("inf")], [1.0]], dtype=dtype)
    assert torch.equal(a @ x, expected)
    assert torch.equal(a.matmul(x, path="csr"), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cpu_half_precision_sums_in_float32(dtype):
    # 4,096 products of 1: a 16-bit running sum stalls (at 2,048 in float16, 256 in bfloat16).
    n = 4096
    a = TCSparseTensor.from_dense(torch.ones(1, n, dtype=dtype))
    assert float(a @ torch.ones(n, dtype=dtype)) == n


def test_nested_x_is_refused():
    a = graph("cpu", torch.float32)
    x = torch.nested.nested_tensor([torch.randn(30, 2), torch.randn(30, 3)])
    with pytest.raises(TypeError, match="nested tensor"):
        a @ x


@pytest.mark.parametrize("device", devices, ids=str)
def test_empty_matrix_on_every_path(device):
    paths = CUDA_PATHS if device.type == "cuda" else CPU_PATHS
    a = TCSparseTensor.from_coo(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), shape=(0, 0))
    a = a.to(device)
    x = torch.randn(0, 3, device=device)
    for path in paths:
        assert a.matmul(x, path=path).shape == (0, 3), path
