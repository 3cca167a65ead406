"""When a backward pass sums dX = A^T dY by scatter from the forward's operands rather than on the
transpose (``product.scatters_transpose``): the first pass through a matrix whose transpose is not
built, outside deterministic mode, where the kernels run. Without a GPU the rows engine cannot
run, so these tests give the CPU's csr engine a scatter (dense, from the forward's operands) and
tell the route that the kernels run; tests/gpu/test_rows_scatter.py checks the kernel itself."""
import types

import pytest
import torch

from torch_tcsparse import TCSparseTensor, product
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.engines.csr import CsrEngine


class ScatteringCsr(CsrEngine):
    """The csr engine with a scatter: A^T dY from the forward's operands, counting its calls."""

    scatters = True

    def __init__(self):
        self.scattered = 0

    def scatter(self, grad_y, operands):
        self.scattered += 1
        return operands.to_dense().t() @ grad_y


@pytest.fixture
def engine(monkeypatch):
    """The scattering csr engine on the route, which believes the kernels run."""
    stub = ScatteringCsr()
    monkeypatch.setitem(ENGINES, "csr", stub)
    monkeypatch.setattr(product, "kernels", KERNELS_RUN)
    return stub


# What the route asks of the kernels module, answered as on a GPU for the products (the engine
# stub multiplies on the CPU) and as on the CPU for the mean's row scale (a kernel of its own).
KERNELS_RUN = types.SimpleNamespace(usable=lambda x: True, usable_for=lambda dtype, device: device.type == "cuda")


def matrix(m=30, k=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(m, k, generator=g, dtype=torch.float64) * (torch.rand(m, k, generator=g) < 0.2)
    dense[3] = 0  # an empty row
    return TCSparseTensor.from_dense(dense), dense


def grad_x(a, x, grad_y, reduce="sum"):
    """dX of one product and backward pass on the csr path."""
    x = x.detach().requires_grad_()
    a.matmul(x, path="csr", reduce=reduce).backward(grad_y)
    return x.grad


def mean_matrix(dense):
    counts = (dense != 0).sum(1, keepdim=True).clamp(min=1)
    return dense / counts


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_first_pass_scatters_and_later_ones_build_and_keep_the_transpose(engine, reduce):
    a, dense = matrix()
    x, grad_y = torch.randn(40, 5, dtype=torch.float64), torch.randn(30, 5, dtype=torch.float64)
    expected = (mean_matrix(dense) if reduce == "mean" else dense).t() @ grad_y
    s = a._structure
    torch.testing.assert_close(grad_x(a, x, grad_y, reduce), expected)
    assert engine.scattered == 1 and s.linked_transpose() is None and s.backward_passes == 1
    torch.testing.assert_close(grad_x(a, x, grad_y, reduce), expected)
    assert engine.scattered == 1
    transpose = s.linked_transpose()
    assert transpose is not None
    torch.testing.assert_close(grad_x(a, x, grad_y, reduce), expected)
    assert engine.scattered == 1 and s.linked_transpose() is transpose and s.backward_passes == 3


def test_blocks_used_once_never_build_a_transpose(engine):
    """Fresh sampled blocks, each multiplied once forward and once backward."""
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        edges = torch.stack([torch.randint(0, 50, (200,), generator=g), torch.randint(0, 20, (200,), generator=g)])
        weights = torch.rand(200, generator=g, dtype=torch.float64)
        block = TCSparseTensor.from_batch(edges, weights, num_nodes=(50, 20))
        x, grad_y = torch.randn(50, 4, dtype=torch.float64), torch.randn(20, 4, dtype=torch.float64)
        torch.testing.assert_close(grad_x(block, x, grad_y, "mean"), mean_matrix(block.to_dense()).t() @ grad_y)
        assert block._structure.linked_transpose() is None
    assert engine.scattered == 3


def test_matrices_sharing_a_structure_count_together(engine):
    """``with_values`` shares the structure, and with it the transpose and the count."""
    a, dense = matrix()
    x, grad_y = torch.randn(40, 3, dtype=torch.float64), torch.randn(30, 3, dtype=torch.float64)
    grad_x(a, x, grad_y)
    b = a.with_values(a.values() * 2)
    torch.testing.assert_close(grad_x(b, x, grad_y), 2 * dense.t() @ grad_y)
    assert engine.scattered == 1 and a._structure.linked_transpose() is not None


def test_deterministic_mode_takes_the_transpose(engine):
    a, dense = matrix()
    x, grad_y = torch.randn(40, 3, dtype=torch.float64), torch.randn(30, 3, dtype=torch.float64)
    torch.use_deterministic_algorithms(True)
    try:
        torch.testing.assert_close(grad_x(a, x, grad_y), dense.t() @ grad_y)
    finally:
        torch.use_deterministic_algorithms(False)
    assert engine.scattered == 0 and a._structure.linked_transpose() is not None


def test_a_transpose_built_before_is_used(engine):
    a, dense = matrix()
    a.t()
    x, grad_y = torch.randn(40, 3, dtype=torch.float64), torch.randn(30, 3, dtype=torch.float64)
    torch.testing.assert_close(grad_x(a, x, grad_y), dense.t() @ grad_y)
    assert engine.scattered == 0


def test_no_gradient_of_x_counts_no_pass(engine):
    a, dense = matrix()
    v = a.values().clone().requires_grad_()
    a.with_values(v).matmul(torch.randn(40, 3, dtype=torch.float64), path="csr").sum().backward()
    assert a._structure.backward_passes == 0 and engine.scattered == 0


def test_engines_without_a_scatter_and_the_cpu_take_the_transpose(monkeypatch):
    """The CPU (no kernels) never scatters, whatever the engine; an engine without a scatter
    never does either."""
    stub = ScatteringCsr()
    monkeypatch.setitem(ENGINES, "csr", stub)
    a, dense = matrix()
    x, grad_y = torch.randn(40, 3, dtype=torch.float64), torch.randn(30, 3, dtype=torch.float64)
    torch.testing.assert_close(grad_x(a, x, grad_y), dense.t() @ grad_y)
    assert stub.scattered == 0 and a._structure.linked_transpose() is not None
    monkeypatch.setattr(product, "kernels", KERNELS_RUN)
    b, _ = matrix(seed=1)
    assert not product.scatters_transpose(b._structure, ENGINES["reference"], grad_y)
    assert b._structure.backward_passes == 1


def test_a_moved_copy_counts_its_own_passes():
    a, _ = matrix()
    a._structure.backward_passes = 2
    assert a._structure.to("cpu").backward_passes == 0
