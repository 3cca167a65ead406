"""No product reads values older than the matrix's own, whatever wrote them: a differential fuzz of
optimizers (plain, foreach, fused) on a learnable adjacency against a matrix built fresh from the
same values, on every path, dtype and device; and the writers that bypass the version counter
(``.data``, a copy into the storage). Fused steps move no version counter, so a kept operand
would go stale unseen. The same writers on values that need no gradient (a parameter's
``.detach()``), whose operands a matrix could keep: ``stale_writers``."""
import itertools

import pytest
import torch

from stale_writers import WRITERS, assert_writes_reach_every_product
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.testing import random_dense

# Adam's eps at 1e-3: its default 1e-8 is 0 in float16, and 0 / 0 where a gradient is 0.
OPTIMIZERS = {"SGD": torch.optim.SGD,
              "Adam": lambda *args, **kwargs: torch.optim.Adam(*args, eps=1e-3, **kwargs),
              "AdamW": lambda *args, **kwargs: torch.optim.AdamW(*args, eps=1e-3, **kwargs)}
MODES = {"plain": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
CUDA_PATHS = ["auto", "base", "balanced", "rows", "grouped", "csr", "reference"]
CPU_PATHS = ["auto", "csr", "reference"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def cases():
    for device in ("cpu", "cuda"):
        paths = CPU_PATHS if device == "cpu" else CUDA_PATHS
        for path, dtype in itertools.product(paths, DTYPES):
            marks = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")] * (device == "cuda")
            yield pytest.param(device, path, dtype, marks=marks, id=f"{device}-{path}-{str(dtype)[6:]}")


def matrix(device, dtype, seed=0):
    dense = random_dense(70, 50, 0.3, seed=seed, dense_row=4)
    return TCSparseTensor.from_dense(dense.to(device=device, dtype=dtype))


def optimizer(name, mode, parameter):
    try:
        return OPTIMIZERS[name]([parameter], lr=0.05, **MODES[mode])
    except (RuntimeError, ValueError) as error:  # fused kernels exist for some devices and dtypes only
        pytest.skip(f"{name} {mode} on {parameter.device} {parameter.dtype}: {error}")


# Two runs of one product differ by the order of atomic adds at most (balanced, grouped, split
# rows): a few roundings. Stale values are off by their whole change.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_fresh(a, weights, x, path):
    """``a @ x`` equals the product of a matrix built now from the current values."""
    fresh = a.with_values(weights.detach().clone())
    with torch.no_grad():
        ours, expected = a.matmul(x, path=path).float(), fresh.matmul(x, path=path).float()
    error = float((ours - expected).norm() / expected.norm())
    assert error <= TOLERANCE[x.dtype], f"relative error {error:.3g}: the product read stale values"


@pytest.mark.parametrize("device, path, dtype", list(cases()))
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_step_reaches_the_next_product(device, path, dtype, mode, name):
    base = matrix(device, dtype)
    weights = torch.nn.Parameter(base.csr.values.clone())
    a = base.with_values(weights)
    step = optimizer(name, mode, weights)
    x = torch.randn(50, 24, device=device, dtype=dtype)
    direction = torch.randn(70, 24, device=device)
    for _ in range(3):
        loss = (a.matmul(x, path=path).float() * direction).sum()
        step.zero_grad()
        loss.backward()
        before = weights.detach().clone()
        step.step()
        assert not torch.equal(before, weights.detach()), "the step changed nothing: the test would prove nothing"
        assert_fresh(a, weights, x, path)
        a.matmul(x, path=path, reduce="mean")  # and products in evaluation read the new values too
        assert_fresh(a, weights, x, path)


@pytest.mark.parametrize("device, path, dtype", list(cases()))
@pytest.mark.parametrize("writer", ["data", "storage", "in place"])
def test_writes_that_bypass_autograd_reach_the_next_product(device, path, dtype, writer):
    base = matrix(device, dtype)
    weights = torch.nn.Parameter(base.csr.values.clone())
    a = base.with_values(weights)
    x = torch.randn(50, 24, device=device, dtype=dtype)
    a.matmul(x, path=path)
    new = torch.rand_like(weights) + 0.5
    if writer == "data":
        weights.data.copy_(new)
    elif writer == "storage":
        weights.untyped_storage().copy_(new.untyped_storage())
    else:
        with torch.no_grad():
            weights.copy_(new)
    assert_fresh(a, weights, x, path)


@pytest.mark.parametrize("device, path, dtype", list(cases()))
def test_values_without_grad_changed_in_place_reach_the_next_product(device, path, dtype):
    base = matrix(device, dtype)
    values = base.csr.values.clone()
    a = base.with_values(values)
    x = torch.randn(50, 24, device=device, dtype=dtype)
    a.matmul(x, path=path)
    values.mul_(3)
    assert_fresh(a, values, x, path)
    values.set_(torch.rand_like(values) + 0.5)  # new storage, same tensor
    assert_fresh(a, values, x, path)


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=lambda dtype: str(dtype)[6:])
@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("reorder", [False, True], ids=["natural", "reordered"])
@pytest.mark.parametrize("learnable", [False, True], ids=["detached", "learnable"])
def test_unseen_writes_reach_the_products_that_promise_them(path, dtype, writer, reorder, learnable):
    assert_writes_reach_every_product(torch.device("cpu"), path, dtype, writer, reorder, learnable)
