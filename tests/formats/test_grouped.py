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
    fragment_index,
    fragment_values,
    group_pairs,
    may_pay,
    split_sizes,
)
from torch_tcsparse.formats.metcf import BLOCK_WIDTH



def fragments_of(layout, values):
    """The fragments the kernel reads for ``values`` (canonical CSR order)."""
    return fragment_values(layout, fragment_index(layout, values.element_size()), values)

def grouped_dense(layout: GroupedLayout, fragments: torch.Tensor) -> torch.Tensor:
    """The dense matrix a grouped layout and its fragments hold, read the way the mma reads them
    (PTX ISA, m16n8k8: lane (g, t) holds A entries (g + 8 (k % 2), c(t, k // 2)) for k = 0..3, with
    c = t + 4h for TF32 in the order k = 0..3, and c = 2t + h for 16-bit types, stored as the
    registers (k = 0 | 2) and (k = 1 | 3)): the inverse of ``build_grouped`` + ``fragment_values``."""
    order = (0, 2, 1, 3) if fragments.dtype.itemsize == 2 else (0, 1, 2, 3)
    lane, position = torch.arange(32).repeat_interleave(4), torch.arange(4).repeat(32)
    k = torch.tensor(order)[position]
    g, t, h = lane // 4, lane % 4, k // 2
    entry_row = g + 8 * (k % 2)
    entry_col = 2 * t + h if fragments.dtype.itemsize == 2 else t + 4 * h
    sub_of_slot = torch.nonzero(layout.sub_slots >= 0).flatten()
    assert torch.equal(layout.sub_slots[sub_of_slot].long(), torch.arange(sub_of_slot.numel()))
    assert fragments.numel() == sub_of_slot.numel() * 128
    block, window = sub_of_slot // GROUP_WINDOWS, sub_of_slot % GROUP_WINDOWS
    chunk_sizes = layout.chunk_starts[1:] - layout.chunk_starts[:-1]
    chunk_of_block = torch.arange(chunk_sizes.numel()).repeat_interleave(chunk_sizes.long())
    group = layout.chunk_group.long()[chunk_of_block][block]
    slot_rows = layout.row_map.long()[(group * GROUP_ROWS + window * WINDOW)[:, None] + entry_row]
    cols = layout.block_cols.long()[(block * BLOCK_WIDTH)[:, None] + entry_col]
    held = fragments.view(-1, 128) != 0
    assert bool((slot_rows[held] >= 0).all() and (cols[held] >= 0).all()), "a value outside the matrix"
    dense = torch.zeros(layout.num_rows, layout.num_cols, dtype=fragments.dtype)
    dense.index_put_((slot_rows[held], cols[held]), fragments.view(-1, 128)[held], accumulate=True)
    return dense


def rest_dense(rest: RestCsr, values: torch.Tensor, num_rows: int, num_cols: int) -> torch.Tensor:
    """The dense matrix of a layout's rest and its values (in the rest's order)."""
    slots = torch.arange(num_rows).repeat_interleave((rest.rowptr[1:] - rest.rowptr[:-1]).long())
    rows = slots if rest.row_map is None else rest.row_map.long()[slots]
    dense = torch.zeros(num_rows, num_cols, dtype=values.dtype)
    dense.index_put_((rows, rest.col.long()), values, accumulate=True)
    return dense


def check_chunks(layout: GroupedLayout, groups: int, chunk: int | None):
    """Every group has at least one chunk, its chunks consecutive, a chunk holds at most ``chunk``
    blocks of its group's run, and only an empty group's chunk holds none (then it is its group's
    only one): where every group is one chunk the kernel writes Y without zeroing it first."""
    starts, chunk_group = layout.chunk_starts.long(), layout.chunk_group.long()
    sizes = starts[1:] - starts[:-1]
    per_group = torch.bincount(chunk_group, minlength=groups)
    assert per_group.numel() == groups and bool((per_group >= 1).all())
    assert torch.equal(chunk_group, torch.arange(groups).repeat_interleave(per_group))
    assert int(starts[0]) == 0 and int(starts[-1]) == layout.num_blocks and bool((sizes >= 0).all())
    assert bool((per_group[chunk_group[sizes == 0]] == 1).all())
    if chunk:
        assert bool((sizes <= chunk).all())


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
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert torch.equal(grouped_dense(layout, fragments_of(layout, values.to(dtype))), dense.to(dtype))
    groups = -(-m // GROUP_ROWS)
    blocks = layout.num_blocks
    assert layout.row_map.numel() == groups * GROUP_ROWS
    assert layout.sub_slots.numel() == blocks * GROUP_WINDOWS
    assert layout.gather.numel() == layout.slot_entry.numel() == col.numel()
    check_chunks(layout, groups, chunk)
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


def test_empty_groups_keep_one_chunk():
    """Rows 64..191 empty (two whole groups) and a matrix with no nonzero at all: each empty
    group has one chunk of no block, which writes its rows (zeros, or the bias)."""
    dense = torch.zeros(300, 40)
    dense[:64, :20] = 1.0
    dense[192:, 10:] = 2.0
    csr = dense.to_sparse_csr()
    layout = build_grouped(csr.crow_indices().int(), csr.col_indices().int(), 300, 40, chunk=1)
    check_chunks(layout, 5, 1)
    sizes = (layout.chunk_starts[1:] - layout.chunk_starts[:-1]).tolist()
    chunk_group = layout.chunk_group.tolist()
    assert [sizes[chunk_group.index(g)] for g in (1, 2)] == [0, 0]
    assert chunk_group.count(1) == chunk_group.count(2) == 1
    assert torch.equal(grouped_dense(layout, fragments_of(layout, csr.values())), dense)
    nothing = torch.zeros(70, 70).to_sparse_csr()
    layout = build_grouped(nothing.crow_indices().int(), nothing.col_indices().int(), 70, 70)
    assert layout.num_blocks == 0
    assert layout.chunk_starts.tolist() == [0, 0, 0] and layout.chunk_group.tolist() == [0, 1]


def test_band_groups_have_one_chunk():
    """A band matrix: every group's blocks fit one chunk, so there are as many chunks as groups
    (for 16-bit Y the binding then neither allocates nor zeroes sums: every warp stores its
    rows)."""
    m = 1000
    i = torch.arange(m)
    band = ((i[:, None] - i[None, :]).abs() <= 8).float()
    csr = band.to_sparse_csr()
    layout = build_grouped(csr.crow_indices().int(), csr.col_indices().int(), m, m)
    groups = -(-m // GROUP_ROWS)
    check_chunks(layout, groups, None)
    assert layout.chunk_group.numel() == groups


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
    held = grouped_dense(layout, fragments_of(layout, values)) + rest_dense(rest, values[rest.gather.long()], m, m)
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
