"""GPU tests of the mean's row scale (``kernels.row_scale``, ``csrc/row_scale.h``): equal to the
reciprocal row counts repeated over each row, for empty, single, short and hub rows, both index
types and both scale dtypes, and for a matrix without nonzeros; bad arguments refused; the mean
product takes it on CUDA and equals the sum divided by the row counts."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def rowptr_of(lengths, dtype=torch.int64):
    rowptr = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    rowptr[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return rowptr.to(dtype).cuda()


def by_counts(rowptr, dtype):
    counts = rowptr.diff().long()
    return torch.repeat_interleave(1.0 / counts.clamp(min=1).to(dtype), counts)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_rows_of_every_shape(kernels, index_dtype, dtype):
    g = torch.Generator().manual_seed(0)
    lengths = [0, 1, 0, 0, 3, 100_000, 0, 7] + torch.randint(0, 40, (5000,), generator=g).tolist() + [0, 2, 0]
    rowptr = rowptr_of(lengths, index_dtype)
    nnz = int(rowptr[-1])
    scale = kernels.row_scale(rowptr, nnz, dtype)
    assert scale.dtype == dtype and scale.shape == (nnz,) and scale.device == rowptr.device
    assert torch.equal(scale, by_counts(rowptr, dtype))


def test_no_nonzeros_and_no_rows(kernels):
    assert kernels.row_scale(rowptr_of([0, 0, 0]), 0, torch.float32).numel() == 0
    assert kernels.row_scale(rowptr_of([]), 0, torch.float32).numel() == 0


@pytest.mark.parametrize("case, match", [("cpu", "CUDA"), ("dtype", "dtype"), ("nnz", "nnz"),
                                         ("index", "int32 or int64"), ("no_rows", "without rows")])
def test_bad_arguments_are_refused(kernels, case, match):
    rowptr, nnz, dtype = rowptr_of([2, 1]), 3, torch.float32
    if case == "cpu":
        rowptr = rowptr.cpu()
    elif case == "dtype":
        dtype = torch.float16
    elif case == "nnz":
        nnz = -1
    elif case == "index":
        rowptr = rowptr.float()
    else:
        rowptr = rowptr_of([])
    with pytest.raises(RuntimeError, match=match):
        kernels.row_scale(rowptr, nnz, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=str)
def test_mean_product_on_cuda_takes_the_kernel(kernels, dtype, monkeypatch):
    from torch_tcsparse import TCSparseTensor

    g = torch.Generator().manual_seed(1)
    edge_index = torch.cat([torch.randint(0, 300, (2, 3000), generator=g),
                            torch.stack([torch.zeros(500, dtype=torch.int64), torch.arange(500) % 300])], 1)
    a = TCSparseTensor.from_edge_index(edge_index.cuda(), num_nodes=300, dtype=dtype)
    x = torch.randn(300, 16, generator=g).to(dtype).cuda()
    calls = []
    row_scale = kernels.row_scale
    monkeypatch.setattr(kernels, "row_scale", lambda *args: calls.append(1) or row_scale(*args))
    mean = a.matmul(x, reduce="mean")
    assert calls == [1]
    dense = a.to_dense().double()
    counts = (dense != 0).sum(1, keepdim=True).clamp(min=1)
    expected = (dense @ x.double()) / counts
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3}[dtype]
    assert torch.allclose(mean.double(), expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())
