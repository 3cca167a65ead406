"""Under torch.autocast, A @ X runs in the autocast dtype like torch.matmul: float32 operands are
cast, float64 ones are not, and gradients come back in the dtype of the leaves."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.testing import assert_matches_reference, devices, random_dense


def autocast_dtypes(device):
    return [torch.bfloat16] if device.type == "cpu" else [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("device", devices, ids=str)
def test_product_runs_in_the_autocast_dtype(device):
    dense = random_dense(70, 40, 0.2, seed=3)
    a = TCSparseTensor.from_dense(dense).to(device)
    x = torch.randn(40, 16, device=device)
    for dtype in autocast_dtypes(device):
        with torch.autocast(device.type, dtype=dtype):
            y = a @ x
        assert_matches_reference(y, dense, x, dtype)


@pytest.mark.parametrize("device", devices, ids=str)
def test_output_of_an_autocast_layer_multiplies_a_float32_matrix(device):
    # In a model under autocast the features arrive in the autocast dtype while A stays float32.
    dense = random_dense(50, 30, 0.3, seed=4)
    a = TCSparseTensor.from_dense(dense).to(device)
    linear = torch.nn.Linear(8, 12).to(device)
    features = torch.randn(30, 8, device=device)
    for dtype in autocast_dtypes(device):
        with torch.autocast(device.type, dtype=dtype):
            h = linear(features)
            y = a @ h
        assert h.dtype == dtype and y.dtype == dtype
        assert_matches_reference(y, dense, h.detach().float(), dtype)


def test_gradients_return_in_the_leaves_dtype():
    dense = random_dense(30, 20, 0.3, seed=5)
    a = TCSparseTensor.from_dense(dense)
    x = torch.randn(20, 6, requires_grad=True)
    values = a.csr.values.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = a.with_values(values) @ x
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and values.grad.dtype == torch.float32
    ones = torch.ones(30, 6)
    assert_matches_reference(x.grad.to(torch.bfloat16), dense.t(), ones, torch.bfloat16)


def test_float64_is_not_cast():
    a = TCSparseTensor.from_dense(random_dense(10, 10, 0.5, seed=6, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ torch.randn(10, 3, dtype=torch.float64)).dtype == torch.float64


def test_cast_matrix_is_kept_across_products():
    a = TCSparseTensor.from_dense(random_dense(10, 10, 0.5, seed=7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a @ torch.randn(10, 2)
        a @ torch.randn(10, 2)
    assert len(a._cache) == 1  # the bfloat16 copy, made once
