"""Writes that no version counter sees (``.data``, the storage, an optimizer step, fused or not,
on the parameter whose ``.detach()`` the matrix holds) reach the next product, its mean and its
gradient for X on every CUDA path (``stale_writers``; the CPU's are in tests/test_optimizers.py)."""
import pytest
import torch

from stale_writers import WRITERS, assert_writes_reach_every_product

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("path", ["base", "balanced", "grouped", "rows", "csr", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda dtype: str(dtype)[6:])
@pytest.mark.parametrize("writer", [writer for writer in WRITERS if writer != "numpy"])
@pytest.mark.parametrize("reorder", [False, True], ids=["natural", "reordered"])
@pytest.mark.parametrize("learnable", [False, True], ids=["detached", "learnable"])
def test_unseen_writes_reach_the_products_that_promise_them(kernels, path, dtype, writer, reorder, learnable):
    assert_writes_reach_every_product(torch.device("cuda"), path, dtype, writer, reorder, learnable)
