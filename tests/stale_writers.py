"""Writers that change a matrix's values behind its back, and the check that later products read
what they wrote (tests/test_optimizers.py on the CPU, tests/gpu/test_stale_values.py on CUDA).
``.data``, the storage and a numpy view move no version counter of the values; an optimizer step
moves the parameter's (a fused step through ``torch_tcsparse.fused_steps``). A matrix holding the
parameter itself (learnable values) reads every write in every product, its mean and its
gradients. A matrix holding ``parameter.detach()`` (values that need no gradient, whose copies a
matrix keeps while their version counter stays) reads an optimizer's writes everywhere too, and
the others in the products whose operands read the values in place (``operands.OperandCache``)."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.product import choose_path
from torch_tcsparse.testing import random_dense, random_permutation

WRITERS = ["data", "storage", "numpy", "plain", "foreach", "fused"]
OPTIMIZER_MODES = {"plain": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
# Products of the written matrix and of one built fresh from the same values run the same
# engine on the same values: they differ by the order of atomic adds at most (balanced, grouped,
# split rows), a few roundings. Stale values are off by their whole change.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
NUM_ROWS, NUM_COLS, WIDTH = 70, 50, 24


def matrix(device, dtype, reorder: bool, seed=0) -> TCSparseTensor:
    dense = random_dense(NUM_ROWS, NUM_COLS, 0.3, seed=seed, dense_row=4).to(dtype)
    options = {"reorder": random_permutation(NUM_ROWS, seed=seed + 1)} if reorder else {}
    return TCSparseTensor.from_dense(dense, **options).to(device)


def write(writer: str, parameter: torch.nn.Parameter, values: torch.Tensor) -> None:
    """Changes ``values`` (``parameter.detach()``) the way ``writer`` does."""
    new = torch.rand_like(values) + 0.5
    if writer == "data":
        parameter.data.copy_(new)
    elif writer == "storage":
        values.untyped_storage().copy_(new.untyped_storage())
    elif writer == "numpy":
        if values.device.type != "cpu" or values.dtype == torch.bfloat16:
            pytest.skip("numpy views CPU tensors of numpy's dtypes only")
        values.numpy()[:] = new.numpy()
    else:
        try:  # eps at 1e-3: the default 1e-8 is 0 in float16, and 0 / 0 where a gradient is 0
            step = torch.optim.Adam([parameter], lr=0.1, eps=1e-3, **OPTIMIZER_MODES[writer])
        except (RuntimeError, ValueError) as error:  # fused kernels exist for some devices and dtypes only
            pytest.skip(f"Adam {writer} on {values.device} {values.dtype}: {error}")
        parameter.grad = torch.randn_like(values)
        try:
            step.step()
        except RuntimeError as error:
            pytest.skip(f"Adam {writer} on {values.device} {values.dtype}: {error}")


def assert_writes_reach_every_product(device, path: str, dtype, writer: str, reorder: bool,
                                      learnable: bool = False) -> None:
    """Products (sum and mean) and their gradients for X (the transpose's product) of learnable
    values, or the sum of values that need no gradient on a path that reads them in place, made
    once before the write and again after it, equal those of a matrix built fresh from the
    written values."""
    base = matrix(device, dtype, reorder)
    parameter = torch.nn.Parameter(base.csr.values.clone())
    values = parameter.detach()
    a = base.with_values(parameter if learnable else values)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(NUM_COLS, WIDTH, generator=generator).to(device=device, dtype=dtype)
    # An optimizer's step moves the version counter (a fused one through torch_tcsparse.fused_steps),
    # so every product of detached values reads it; the other writers reach in-place readers only.
    versioned = learnable or writer in OPTIMIZER_MODES
    checked = PRODUCTS if versioned else ["sum"]
    if not versioned:
        engine = ENGINES[choose_path(a._structure, x, path, "sum", False)[0]]
        if not engine.reads_in_place(engine.operands(engine.indices(a._structure, dtype), values), values):
            pytest.skip(f"{path} copies the values here; writes no version counter sees reach such copies "
                        "for learnable values only")
    grad_y = torch.randn(NUM_ROWS, WIDTH, generator=generator).to(device=device, dtype=dtype)
    products(a, x, grad_y, path)  # what a matrix keeps, it keeps from here
    before = values.clone()
    write(writer, parameter, values)
    assert not torch.equal(before, values), "the write changed nothing: the test would prove nothing"
    fresh = base.with_values(values.clone())
    for name, ours, expected in zip(PRODUCTS, products(a, x, grad_y, path), products(fresh, x, grad_y, path)):
        if name not in checked:
            continue
        error = float((ours.double() - expected.double()).norm() / expected.double().norm())
        assert error <= TOLERANCE[dtype], f"{name}: relative error {error:.3g}, the product read stale values"


PRODUCTS = ["sum", "mean", "sum dX", "mean dX"]


def products(a, x, grad_y, path):
    """A @ X and its mean, and dX = A^T dY of each (the transpose's product)."""
    with torch.no_grad():
        forward = [a.matmul(x, path=path, reduce=reduce) for reduce in ("sum", "mean")]
    backward = []
    for reduce in ("sum", "mean"):
        leaf = x.clone().requires_grad_()
        a.matmul(leaf, path=path, reduce=reduce).backward(grad_y)
        backward.append(leaf.grad)
    return forward + backward
