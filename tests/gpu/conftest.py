import pytest


@pytest.fixture(scope="module")
def kernels():
    from torch_tcsparse import kernels

    assert kernels.available(), "the CUDA extension must build on a machine with a GPU"
    return kernels
