"""The grouped layout (formats/grouped.py): built from a CSR it holds the same matrix, for any
row order and chunk size, with chunks inside groups and the documented array sizes. CPU only."""
import pytest
import torch

from torch_tcsparse.formats.grouped import GROUP_ROWS, GROUP_WINDOWS, build_grouped, grouped_dense, may_pay


def random_csr(m, k, density, seed):
    gen = torch.Generator().manual_seed(seed)
    dense = (torch.rand(m, k, generator=gen) < density) * torch.randn(m, k, generator=gen)
    csr = dense.to_sparse_csr()
    return dense, csr.crow_indices().int(), csr.col_indices().int(), csr.values()


@pytest.mark.parametrize("shape, density", [((1, 1), 1.0), ((17, 5), 0.5), ((200, 300), 0.1), ((130, 64), 0.9),
                                            ((1000, 50), 0.02), ((70, 70), 0.0)])
@pytest.mark.parametrize("reordered", [False, True])
@pytest.mark.parametrize("chunk", [None, 1, 3])
def test_round_trip(shape, density, reordered, chunk):
    m, k = shape
    dense, rowptr, col, values = random_csr(m, k, density, seed=m * k)
    perm = torch.randperm(m) if reordered else None
    layout = build_grouped(rowptr, col, m, k, perm, chunk)
    assert torch.equal(grouped_dense(layout, values[layout.gather.long()]), dense)
    groups = -(-m // GROUP_ROWS)
    blocks = layout.num_blocks
    assert layout.row_map.numel() == groups * GROUP_ROWS
    assert layout.bitmaps.numel() == blocks * GROUP_WINDOWS * 4
    assert layout.sub_offsets.numel() == blocks * GROUP_WINDOWS + 1 and int(layout.sub_offsets[-1]) == col.numel()
    starts = layout.chunk_starts.long()
    assert int(starts[-1]) == blocks and bool((starts[1:] > starts[:-1]).all())
    if chunk:
        assert bool(((starts[1:] - starts[:-1]) <= chunk).all())
    expected_rows = torch.arange(m) if perm is None else perm
    assert torch.equal(layout.row_map[:m].long(), expected_rows)
    assert bool((layout.row_map[m:] == -1).all())


def test_groups_share_columns():
    """Four windows of a group touching the same 8 columns share one block of four sub-blocks."""
    dense = torch.zeros(64, 8)
    dense[::5, :] = 1.0
    csr = dense.to_sparse_csr()
    layout = build_grouped(csr.crow_indices().int(), csr.col_indices().int(), 64, 8)
    assert layout.num_blocks == 1
    assert torch.equal(layout.block_cols, torch.arange(8, dtype=torch.int32))


def test_may_pay():
    assert may_pay(26 * 1000, 1000) and not may_pay(8 * 1000, 1000) and not may_pay(0, 0)
