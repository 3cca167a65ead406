"""On a GPU: a matrix loaded onto it (CSR-only until a product needs its layout) multiplies as the
saved one on every path, and the CUDA conversion builds the CPU's canonical CSR, repeated entries
summed from the first and casts beyond the value dtype's range refused."""
import io

import pytest
import torch

import torch_tcsparse
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.paths import PATHS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def saved(matrix) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(matrix, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("reorder", ["none", "rcm"])
@pytest.mark.parametrize("reader", ["tcsparse", "torch"])
def test_a_matrix_loaded_onto_the_gpu_multiplies_as_saved(reorder, reader):
    generator = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 3000, (2, 40_000), generator=generator)
    weights = torch.rand(40_000, generator=generator)
    original = TCSparseTensor.from_edge_index(edge_index, weights, num_nodes=3000, reorder=reorder).cuda()
    read = torch_tcsparse.load if reader == "tcsparse" else lambda f, **kw: torch.load(f, weights_only=True, **kw)
    loaded = read(saved(original.cpu()), map_location="cuda")
    assert loaded.device.type == "cuda"
    x = torch.randn(3000, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    expected = original.matmul(x, path="csr")
    for path in PATHS:
        if path in ("auto", "reference"):
            continue
        torch.testing.assert_close(loaded.matmul(x, path=path), expected, rtol=2e-3, atol=2e-3, msg=path)
    torch.testing.assert_close(loaded @ x, expected, rtol=2e-3, atol=2e-3)


def test_cuda_conversion_sums_repeats_as_the_cpu_does():
    """Integer-valued weights: every order of the sums is exact, so the CSRs must be equal."""
    generator = torch.Generator().manual_seed(2)
    row = torch.randint(0, 500, (20_000,), generator=generator)
    col = torch.randint(0, 300, (20_000,), generator=generator)
    values = torch.randint(-8, 9, (20_000,), generator=generator).float()
    on_cpu = from_coo(row, col, values, 500, 300, torch.float16)
    on_gpu = from_coo(row.cuda(), col.cuda(), values.cuda(), 500, 300, torch.float16)
    for name in ("rowptr", "col", "values"):
        assert torch.equal(getattr(on_gpu, name).cpu(), getattr(on_cpu, name)), name


def test_cuda_conversion_refuses_a_weight_beyond_float16():
    edge_index = torch.tensor([[0, 1], [1, 0]], device="cuda")
    with pytest.raises(ValueError, match=r"edge_weight holds 1e\+06, beyond the range of torch.float16"):
        TCSparseTensor.from_edge_index(edge_index, torch.tensor([1.0, 1e6], device="cuda"), dtype=torch.float16)
