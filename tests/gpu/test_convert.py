"""GPU tests of the CSR -> ME-TCF conversion kernels (csrc/metcf_convert.cu): every array of the
layout equal, entry for entry, to the torch build of formats/metcf.py on the same matrix, on fresh
random matrices each run (hub rows of 10^5 nonzeros, empty rows and windows, partial last
windows, row permutations, both windows, int32 and int64 indices, windows on the shared-memory
and on the search path)."""
import pytest
import torch

from torch_tcsparse.formats.csr import CSR, from_coo
from torch_tcsparse.formats.metcf import build_metcf, count_blocks

from .kernel_data import HUB_NNZ, SUBSET, random_matrix

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPES = [(17, 40, 3), (1000, 1000, 8)] if SUBSET else [(1, 1, 1), (15, 40, 3), (17, 40, 3), (1000, 1000, 8), (65537, 3000, 5)]


def assert_same_layout(csr, window, perm):
    layout, block_values = build_metcf(csr, window, perm)
    expected, expected_values = build_metcf(csr, window, perm, use_kernels=False)
    assert layout.host_counts is not None
    for name in expected.TENSOR_FIELDS:
        got, want = getattr(layout, name), getattr(expected, name)
        assert got.device.type == "cuda" and got.dtype == want.dtype, name
        assert torch.equal(got, want), name
    assert torch.equal(block_values, expected_values)
    assert torch.equal(count_blocks(csr, window, perm), expected.window_offsets.diff().long())


def random_csr(m, k, degree, hub_nnz=0):
    hub_row = int(torch.randint(0, m, (1,))) if hub_nnz else None
    row, col, values = random_matrix(m, k, degree, hub_row=hub_row, hub_nnz=min(hub_nnz, k))
    return from_coo(row, col, values, m, k)


@pytest.mark.parametrize("window", [8, 16])
@pytest.mark.parametrize("m,k,degree", SHAPES)
@pytest.mark.parametrize("permuted", [False, True])
def test_kernels_build_the_torch_layout(m, k, degree, window, permuted):
    csr = random_csr(m, k, degree)
    perm = torch.randperm(m, device="cuda") if permuted else None
    assert_same_layout(csr, window, perm)


@pytest.mark.parametrize("permuted", [False, True])
def test_hub_row(permuted):
    """A window holding a row of 10^5 nonzeros beside short ones (power-law hubs)."""
    m = 5000
    csr = random_csr(m, HUB_NNZ + 1000, 4, hub_nnz=HUB_NNZ)
    assert int((csr.rowptr[1:] - csr.rowptr[:-1]).max()) >= min(HUB_NNZ, 30_000)
    assert_same_layout(csr, 16, torch.randperm(m, device="cuda") if permuted else None)


@pytest.mark.parametrize("permuted", [False, True])
def test_narrow_and_wide_windows(permuted):
    """Windows on the shared-memory path (columns spanning at most 2^16 ids) beside windows on the
    search path, in one matrix; spans of exactly 2^16 - 1 and 2^16 on either side of the limit."""
    span = 1 << 16
    dense_rows = torch.arange(512, device="cuda").repeat_interleave(300)  # windows 0..31: narrow
    dense_cols = torch.randint(0, 2000, (dense_rows.numel(),), device="cuda")
    spread_rows = torch.randint(512, 1024, (20_000,), device="cuda")  # windows 32..63: wide
    spread_cols = torch.randint(0, 4 * span, (spread_rows.numel(),), device="cuda")
    edge_rows = torch.tensor([1024, 1025, 1040, 1041], device="cuda")  # window 64 narrow, 65 wide
    edge_cols = torch.tensor([5, 5 + span - 1, 7, 7 + span], device="cuda")
    row = torch.cat([dense_rows, spread_rows, edge_rows])
    col = torch.cat([dense_cols, spread_cols, edge_cols])
    m = 1050
    csr = from_coo(row, col, torch.randn(row.numel(), device="cuda"), m, 4 * span)
    assert_same_layout(csr, 16, torch.randperm(m, device="cuda") if permuted else None)


def test_dense_window_of_overlapping_rows():
    """16 rows sharing most of their columns: most nonzeros are not the first of their column."""
    rows = torch.arange(16, device="cuda").repeat_interleave(500)
    cols = torch.randint(0, 600, (rows.numel(),), device="cuda")
    csr = from_coo(rows, cols, torch.randn(rows.numel(), device="cuda"), 16, 600)
    assert_same_layout(csr, 16, None)


def test_int64_indices():
    csr = random_csr(3000, 500, 6)
    wide = CSR(csr.rowptr.long(), csr.col.long(), csr.values, csr.num_rows, csr.num_cols)
    layout, _ = build_metcf(wide, 16, None)
    expected, _ = build_metcf(csr, 16, None)
    for name in expected.TENSOR_FIELDS:
        if name in ("csr_rowptr", "csr_col"):
            continue
        assert torch.equal(getattr(layout, name), getattr(expected, name)), name


def test_empty_matrices():
    for m, k in [(0, 5), (40, 7)]:
        csr = from_coo(torch.zeros(0, dtype=torch.long, device="cuda"), torch.zeros(0, dtype=torch.long, device="cuda"),
                       torch.zeros(0, device="cuda"), m, k)
        layout, values = build_metcf(csr, 16, None)
        assert layout.num_blocks == 0 and values.numel() == 0
        assert layout.window_offsets.tolist() == [0] * (-(-m // 16) + 1)
