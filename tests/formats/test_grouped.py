"""The grouped layout (formats/grouped.py): built from a CSR it holds the same matrix, for any
row order and chunk size, with chunks inside groups and the documented array sizes. CPU only."""
import pytest
import torch

from torch_tcsparse.formats.grouped import (
    GROUP_ROWS,
    GROUP_WINDOWS,
    WINDOW,
    GroupedLayout,
    RestCsr,
    build_grouped,
    group_pairs,
    may_pay,
    split_sizes,
)
from torch_tcsparse.formats.metcf import BLOCK_WIDTH


def grouped_dense(layout: GroupedLayout, values: torch.Tensor) -> torch.Tensor:
    """The dense matrix a grouped layout and its values (in sub-block order) hold: the inverse of
    ``build_grouped``."""
    nsub = layout.sub_offsets.numel() - 1
    counts = (layout.sub_offsets[1:] - layout.sub_offsets[:-1]).long()
    sub = torch.arange(nsub, device=values.device).repeat_interleave(counts)
    words = layout.bitmaps.long() & 0xFFFFFFFF
    bits = (words.view(nsub, 4, 1) >> torch.arange(32, device=values.device)) & 1  # [sub, word, bit]
    entries = bits.view(nsub, WINDOW * BLOCK_WIDTH).nonzero()  # rows sorted by (sub, entry): value order
    if entries.shape[0] != values.numel() or not torch.equal(entries[:, 0], sub):
        raise ValueError("bitmaps and sub_offsets of the grouped layout disagree")
    block, window = sub // GROUP_WINDOWS, sub % GROUP_WINDOWS
    chunk_of_block = torch.searchsorted(layout.chunk_starts.long(), torch.arange(layout.num_blocks), right=True) - 1
    group = layout.chunk_group.long()[chunk_of_block][block]
    slot = group * GROUP_ROWS + window * WINDOW + entries[:, 1] // BLOCK_WIDTH
    rows = layout.row_map.long()[slot]
    cols = layout.block_cols.long()[block * BLOCK_WIDTH + entries[:, 1] % BLOCK_WIDTH]
    dense = torch.zeros(layout.num_rows, layout.num_cols, dtype=values.dtype)
    dense.index_put_((rows, cols), values, accumulate=True)
    return dense


def rest_dense(rest: RestCsr, values: torch.Tensor, num_rows: int, num_cols: int) -> torch.Tensor:
    """The dense matrix of a layout's rest and its values (in the rest's order)."""
    slots = torch.arange(num_rows).repeat_interleave((rest.rowptr[1:] - rest.rowptr[:-1]).long())
    rows = slots if rest.row_map is None else rest.row_map.long()[slots]
    dense = torch.zeros(num_rows, num_cols, dtype=values.dtype)
    dense.index_put_((rows, rest.col.long()), values, accumulate=True)
    return dense


def communities(m, seed):
    """Dense blocks of 128 rows and columns (two groups each) on the diagonal plus scattered
    edges: pairs of every count, as on the SBM graphs the split is for."""
    gen = torch.Generator().manual_seed(seed)
    inside = (torch.arange(m)[:, None] // 128) == (torch.arange(m)[None, :] // 128)
    mask = (torch.rand(m, m, generator=gen) < torch.where(inside, 0.5, 0.01))
    dense = mask * torch.randn(m, m, generator=gen)
    csr = dense.to_sparse_csr()
    return dense, csr.crow_indices().int(), csr.col_indices().int(), csr.values()


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


@pytest.mark.parametrize("reordered", [False, True])
@pytest.mark.parametrize("min_pair_nnz", [2, 8, 16, 1000])
def test_split_round_trip(reordered, min_pair_nnz):
    """Pairs under the threshold leave the layout for the rest: together they hold the matrix
    once, the rest's rows in the layout's slot order with sorted columns."""
    m = 700
    dense, rowptr, col, values = communities(m, seed=min_pair_nnz)
    perm = torch.randperm(m) if reordered else None
    pairs = group_pairs(rowptr, col, m, m, perm)
    layout = build_grouped(rowptr, col, m, m, perm, min_pair_nnz=min_pair_nnz, pairs=pairs)
    rest = layout.rest
    assert rest is not None
    held = grouped_dense(layout, values[layout.gather.long()]) + rest_dense(rest, values[rest.gather.long()], m, m)
    assert torch.equal(held, dense)
    assert torch.equal(torch.sort(torch.cat([layout.gather, rest.gather])).values, torch.arange(col.numel(), dtype=torch.int32))
    assert split_sizes(pairs, [min_pair_nnz])[min_pair_nnz] == (layout.num_blocks, rest.nnz)
    row_cols = torch.tensor_split(rest.col, rest.rowptr[1:-1].long())
    assert all(bool((cols[1:] > cols[:-1]).all()) for cols in row_cols)
    if perm is None:
        assert rest.row_map is None
    else:
        assert torch.equal(rest.row_map.long(), perm)


def test_split_keeps_dense_pairs():
    """Community pairs hold ~32 nonzeros of a group's 64 rows, scattered ones about 1: a
    threshold of 8 leaves nearly all scattered edges to the rest and no community edge."""
    m = 700
    dense, rowptr, col, values = communities(m, seed=0)
    sizes = split_sizes(group_pairs(rowptr, col, m, m), [1, 8])
    assert sizes[1] == (build_grouped(rowptr, col, m, m).num_blocks, 0)
    blocks, rest = sizes[8]
    outside = int(((torch.arange(m)[:, None] // 128) != (torch.arange(m)[None, :] // 128)).mul(dense != 0).sum())
    assert blocks < sizes[1][0] / 2 and 0.9 * outside <= rest <= outside
