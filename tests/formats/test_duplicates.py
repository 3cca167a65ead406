"""Duplicate entries are summed in float32 (float64 for float64) and rounded once to the value
dtype: a sum in 16 bits saturates (bfloat16 stops counting at 256, float16 at 2,048) and loses
the low bits of every partial sum."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.formats import csr as csr_mod
from torch_tcsparse.formats import inputs

SIXTEEN_BIT = [torch.float16, torch.bfloat16]


def repeated_edge(count: int) -> torch.Tensor:
    return torch.tensor([[0], [1]]).repeat(1, count)


@pytest.mark.parametrize("dtype, count", [(torch.bfloat16, 300), (torch.float16, 5000)])
def test_unit_edges_are_counted_past_16_bit_saturation(dtype, count):
    matrix = TCSparseTensor.from_edge_index(repeated_edge(count), num_nodes=2, dtype=dtype)
    assert matrix.nnz == 1 and matrix.dtype == dtype
    assert float(matrix.csr.values[0]) == count
    assert float(matrix.to_dense()[1, 0]) == count


@pytest.mark.parametrize("dtype, count", [(torch.bfloat16, 300), (torch.float16, 5000)])
def test_unit_weights_are_summed_past_16_bit_saturation(dtype, count):
    weights = torch.ones(count, dtype=dtype)
    matrix = TCSparseTensor.from_edge_index(repeated_edge(count), weights, num_nodes=2)
    assert matrix.dtype == dtype and float(matrix.csr.values[0]) == count


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_weighted_duplicates_round_once(dtype):
    weights = torch.rand(3000, generator=torch.Generator().manual_seed(0)).to(dtype)
    csr = inputs.from_edge_index(repeated_edge(3000), weights, num_nodes=2)
    expected = weights.float().sum().to(dtype)
    assert csr.values.dtype == dtype and torch.equal(csr.values, expected.view(1))


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_cast_happens_after_the_sum(dtype):
    # float32 weights cast to 16 bits by ``dtype=``: the sum is taken before the cast.
    weights = torch.full((1000,), 1.0 + 2.0**-12)
    csr = inputs.from_edge_index(repeated_edge(1000), weights, num_nodes=2, dtype=dtype)
    assert csr.values.dtype == dtype
    assert torch.equal(csr.values, weights.sum().to(dtype).view(1))


def test_float64_duplicates_are_summed_in_float64_then_rounded():
    # 1 + 2^-24 + 2^-24: in float32 each addition rounds back to 1; in float64 the sum is
    # 1 + 2^-23, a float32 number.
    values = torch.tensor([1.0, 2.0**-24, 2.0**-24], dtype=torch.float64)
    row = torch.zeros(3, dtype=torch.long)
    csr = csr_mod.from_coo(row, row, values, 1, 1, torch.float32)
    assert csr.values.dtype == torch.float32 and float(csr.values[0]) == 1.0 + 2.0**-23
    assert csr_mod.from_coo(row, row, values, 1, 1).values.dtype == torch.float64


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_every_entry_point_sums_in_float32(dtype):
    count = 600
    row, col = torch.zeros(count, dtype=torch.long), torch.ones(count, dtype=torch.long)
    ones = torch.ones(count, dtype=dtype)
    rowptr = torch.tensor([0, count])
    built = [
        inputs.from_coo(row, col, ones, (1, 2)),
        inputs.from_coo(row, col, None, (1, 2), dtype=dtype),
        inputs.from_csr(rowptr, col, ones, (1, 2)),
        inputs.from_csr(rowptr, col, None, (1, 2), dtype=dtype),
        inputs.from_scipy(sp.csr_matrix((np.ones(count), (row.numpy(), col.numpy())), shape=(1, 2)), dtype=dtype),
        inputs.from_torch(torch.sparse_csr_tensor(rowptr, col, ones, (1, 2)), dtype=dtype),
    ]
    for csr in built:
        assert csr.values.dtype == dtype and csr.values.tolist() == [count]


def test_integer_weights_with_dtype_sum_exactly():
    csr = inputs.from_edge_index(repeated_edge(300), torch.ones(300, dtype=torch.int64), num_nodes=2, dtype=torch.bfloat16)
    assert csr.values.dtype == torch.bfloat16 and csr.values.tolist() == [300]


@pytest.mark.parametrize("dtype", SIXTEEN_BIT + [torch.float32, torch.float64])
def test_duplicate_sum_is_differentiable(dtype):
    weights = torch.rand(500, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    edge_index = torch.cat([repeated_edge(400), torch.tensor([[1], [0]]).repeat(1, 100)], dim=1)
    csr = inputs.from_edge_index(edge_index, weights, num_nodes=2)
    assert csr.values.dtype == dtype and csr.values.requires_grad
    (csr.values.float() * torch.tensor([2.0, 3.0])).sum().backward()
    expected = torch.cat([torch.full((400,), 3.0), torch.full((100,), 2.0)]).to(dtype)
    assert torch.equal(weights.grad, expected)


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_uncoalesced_torch_coo_sums_in_float32(dtype):
    indices = torch.zeros(2, 600, dtype=torch.long)
    coo = torch.sparse_coo_tensor(indices, torch.ones(600, dtype=dtype), (1, 1))
    csr = inputs.from_torch(coo)
    assert csr.values.dtype == dtype and csr.values.tolist() == [600]
    assert inputs.from_torch(coo, dtype=torch.float32).values.tolist() == [600]
