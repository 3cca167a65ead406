"""The mean on an engine that scales its rows' sums (``Engine.scales_rows``: the Tensor-Core and
rows kernels, on CUDA): the sum's operands and each row's 1 / count, applied before the bias. Its
outputs and gradients (X, values, bias) equal those of the sum over the row-scaled values, through
the eager route, the ``tcsparse::spmm`` op (opcheck, backward) and ``torch.compile``; the mean of
fixed values reads them in place, as the sum does. Checked on the CPU with the "csr" engine (whose
CSR tensor holds the values in place) made to scale rows in torch ops; the kernels' epilogues are
tested on the GPU (tests/gpu/test_mean_in_place.py)."""
import pytest
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.engines.csr import CsrEngine
from torch_tcsparse.testing import random_dense

from test_ops import op_arguments

NUM_ROWS, NUM_COLS, WIDTH = 40, 30, 5


class ScalingCsr(CsrEngine):
    """The "csr" engine with a row scale, as the kernels apply it: row_scale * (A @ x) + bias."""

    scales_rows = True

    def run(self, x, operands, bias, row_scale=None):
        y = super().run(x, operands, None)
        if row_scale is not None:
            y = y * row_scale.to(y.dtype).unsqueeze(1)
        return y if bias is None else y + bias


@pytest.fixture
def scaling(monkeypatch):
    monkeypatch.setitem(ENGINES, "csr", ScalingCsr())


def matrix(dtype=torch.float64):
    dense = random_dense(NUM_ROWS, NUM_COLS, 0.2, seed=4, dense_row=3)
    dense[[5, 17]] = 0  # empty rows: scale 1, output the bias
    return TCSparseTensor.from_dense(dense.to(dtype))


def mean_and_gradients(a, path, x, bias, grad_y):
    values = a.csr.values.clone().requires_grad_()
    x, bias = x.clone().requires_grad_(), bias.clone().requires_grad_()
    y = a.with_values(values).matmul(x, path=path, bias=bias, reduce="mean")
    y.backward(grad_y)
    return y.detach(), x.grad, values.grad, bias.grad


def test_scaled_sums_equal_the_sum_over_scaled_values(scaling):
    a = matrix()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_COLS, WIDTH, generator=generator, dtype=torch.float64)
    bias = torch.randn(WIDTH, generator=generator, dtype=torch.float64)
    grad_y = torch.randn(NUM_ROWS, WIDTH, generator=generator, dtype=torch.float64)
    ours = mean_and_gradients(a, "csr", x, bias, grad_y)  # row scale
    expected = mean_and_gradients(a, "reference", x, bias, grad_y)  # scaled copy of the values
    for name, got, want in zip(["Y", "dX", "d(values)", "d(bias)"], ours, expected):
        # The row scale is float32 (what the kernels take): 1 / count to 2^-24.
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)
    assert torch.equal(ours[0][[5, 17]], bias.expand(2, -1))


def test_the_mean_of_fixed_values_reads_them_in_place(scaling):
    """The mean keeps the sum's operands (no scaled copy), so a write no version counter sees
    (``.data``) reaches it."""
    a = matrix()
    x = torch.randn(NUM_COLS, WIDTH, dtype=torch.float64)
    before = a.matmul(x, path="csr", reduce="mean")
    kept = dict(a._cache._entries)
    a.matmul(x, path="csr")
    assert len(kept) == 1 and ("mean",) not in kept and a._cache._entries.keys() == kept.keys()
    a._values.data.mul_(2)
    torch.testing.assert_close(a.matmul(x, path="csr", reduce="mean"), 2 * before)


def test_the_op_carries_the_row_scale(scaling):
    a, (x, values, bias, _, *rest) = op_arguments("csr")
    counts = (a.csr.rowptr[1:] - a.csr.rowptr[:-1]).clamp(min=1)
    row_scale = 1.0 / counts.float()
    torch.library.opcheck(torch.ops.tcsparse.spmm, (x, values, bias, row_scale, *rest))
    torch.ops.tcsparse.spmm(x, values, bias, row_scale, *rest).square().sum().backward()
    eager_x, eager_values = x.detach().clone().requires_grad_(), values.detach().clone().requires_grad_()
    a.with_values(eager_values).matmul(eager_x, path="csr", reduce="mean").square().sum().backward()
    torch.testing.assert_close(x.grad, eager_x.grad)
    torch.testing.assert_close(values.grad, eager_values.grad)


def test_compiled_mean_carries_the_row_scale(scaling, monkeypatch):
    scales = []
    run = ScalingCsr.run
    monkeypatch.setattr(ScalingCsr, "run", lambda self, x, operands, bias, row_scale=None: (
        scales.append(row_scale is not None), run(self, x, operands, bias, row_scale))[1])
    a = matrix()
    x = torch.randn(NUM_COLS, WIDTH, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(WIDTH, dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, x: a.matmul(x, bias=bias, reduce="mean"), backend="aot_eager", fullgraph=True)
    y = compiled(a, x)
    eager = a.matmul(x, bias=bias, reduce="mean")
    torch._dynamo.reset()
    assert scales[:2] == [True, True]  # the traced forward and the eager one
    torch.testing.assert_close(y, eager)
    torch.testing.assert_close(torch.autograd.grad(y.square().sum(), x)[0],
                               torch.autograd.grad(eager.square().sum(), x)[0])
