"""BCSR: tiles of the mma A-operand shape, only nonzero tiles stored, checked against an
independent count on random matrices of awkward shapes (hypothesis), with and without a row
permutation."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.formats import csr as csr_mod
from torch_tcsparse.formats.bcsr import BLOCK_SHAPES, build_bcsr
from torch_tcsparse.testing import coo_to_dense, random_coo, random_permutation


@st.composite
def cases(draw):
    num_rows, num_cols = draw(st.integers(1, 60)), draw(st.integers(1, 60))
    density = draw(st.sampled_from([0.0, 0.03, 0.2, 1.0]))
    dense_row = draw(st.one_of(st.none(), st.integers(0, num_rows - 1)))
    seed = draw(st.integers(0, 2**16))
    row, col, values = random_coo(num_rows, num_cols, density, seed, torch.float64, dense_row=dense_row)
    csr = csr_mod.from_coo(row, col, values, num_rows, num_cols)
    perm = random_permutation(num_rows, seed + 1) if draw(st.booleans()) else None
    return csr, perm, draw(st.sampled_from(BLOCK_SHAPES))


@given(cases())
def test_tiles_reconstruct_the_matrix_and_only_nonzero_tiles_are_stored(case):
    csr, perm, (bh, bw) = case
    bcsr = build_bcsr(csr, (bh, bw), perm)
    dense = coo_to_dense(csr.row_indices(), csr.col, csr.values, (csr.num_rows, csr.num_cols))
    assert torch.equal(bcsr.to_dense(perm), dense)

    slot = torch.arange(csr.num_rows) if perm is None else torch.argsort(perm)
    tiles = {(int(slot[r]) // bh, int(c) // bw) for r, c in zip(csr.row_indices(), csr.col)}
    assert bcsr.num_blocks == len(tiles)
    assert bcsr.block_rowptr.numel() == math.ceil(csr.num_rows / bh) + 1
    assert bcsr.values.shape == (len(tiles), bh, bw)
    stats = bcsr.stats()
    assert stats["tc_blocks"] == len(tiles)
    if tiles:
        assert stats["mean_nnz_per_block"] == pytest.approx(csr.nnz / len(tiles))


def test_tensor_builds_bcsr_in_its_row_order():
    dense = torch.zeros(20, 20)
    dense[torch.arange(20), torch.arange(20)] = torch.arange(1.0, 21.0)
    perm = torch.randperm(20)
    a = TCSparseTensor.from_dense(dense, reorder=perm)
    bcsr = a.to_bcsr((16, 16))
    assert torch.equal(bcsr.to_dense(perm), dense)


@pytest.mark.parametrize("shape", [(8, 8), (16, 4), "16x8"])
def test_unsupported_block_shapes_are_named(shape):
    csr = csr_mod.from_coo(torch.tensor([0]), torch.tensor([0]), None, 1, 1)
    with pytest.raises(ValueError, match="block_shape"):
        build_bcsr(csr, shape)
