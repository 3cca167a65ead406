"""ME-TCF layout: every documented invariant, checked against an independent computation, on
random matrices of awkward shapes (hypothesis), with and without a row permutation."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from torch_tcsparse.formats import csr as csr_mod
from torch_tcsparse.formats import metcf, packed
from torch_tcsparse.formats.metcf import BALANCE_CHUNK, BLOCK_WIDTH, build_layout, build_metcf, count_blocks
from torch_tcsparse.testing import coo_to_dense, random_coo, random_permutation, tensor


@st.composite
def sparse_matrices(draw):
    """(csr, row_perm or None, window): empty rows/columns, M not a multiple of 16, a single row,
    a dense row, nnz = 0 and rectangular shapes all come up."""
    num_rows = draw(st.one_of(st.just(1), st.integers(1, 70)))
    num_cols = draw(st.one_of(st.just(1), st.integers(1, 70)))
    density = draw(st.sampled_from([0.0, 0.02, 0.1, 0.4, 1.0]))
    dense_row = draw(st.one_of(st.none(), st.integers(0, num_rows - 1)))
    seed = draw(st.integers(0, 2**16))
    row, col, values = random_coo(num_rows, num_cols, density, seed, torch.float64, dense_row=dense_row)
    csr = csr_mod.from_coo(row, col, values, num_rows, num_cols)
    perm = random_permutation(num_rows, seed + 1) if draw(st.booleans()) else None
    window = draw(st.sampled_from([8, 16]))
    return csr, perm, window


def slot_of_rows(num_rows, perm):
    return list(range(num_rows)) if perm is None else torch.argsort(perm).tolist()


def distinct_columns_per_window(csr, perm, window):
    """Independent count: the set of columns of the rows that land in each window."""
    slot = slot_of_rows(csr.num_rows, perm)
    windows = [set() for _ in range(math.ceil(csr.num_rows / window))]
    for r, c in zip(csr.row_indices().tolist(), csr.col.tolist()):
        windows[slot[r] // window].add(c)
    return [sorted(cols) for cols in windows]


def csr_dense(csr):
    return coo_to_dense(csr.row_indices(), csr.col, csr.values, (csr.num_rows, csr.num_cols))


@given(sparse_matrices())
def test_layout_reconstructs_the_matrix(case):
    csr, perm, window = case
    layout, values = build_metcf(csr, window, perm)
    block, row, col = layout.nonzero_coordinates()
    assert row.numel() == csr.nnz and values.numel() == csr.nnz
    assert bool((row >= 0).all()) and bool((col >= 0).all()), "a nonzero points at padding"
    rebuilt = coo_to_dense(row, col, values, (csr.num_rows, csr.num_cols))
    assert torch.equal(rebuilt, csr_dense(csr))
    # Each (row, col) once: accumulation above could hide a duplicate with a split value.
    assert torch.unique(row * max(csr.num_cols, 1) + col).numel() == csr.nnz


@given(sparse_matrices())
def test_blocks_hold_the_condensed_columns_of_each_window(case):
    csr, perm, window = case
    layout, _ = build_metcf(csr, window, perm)
    expected = distinct_columns_per_window(csr, perm, window)
    blocks_per_window = (layout.window_offsets[1:] - layout.window_offsets[:-1]).tolist()
    assert layout.num_windows == len(expected) == math.ceil(csr.num_rows / window)
    assert blocks_per_window == [math.ceil(len(cols) / BLOCK_WIDTH) for cols in expected]
    for w, cols in enumerate(expected):
        start, end = int(layout.window_offsets[w]), int(layout.window_offsets[w + 1])
        lanes = layout.block_cols[start * BLOCK_WIDTH : end * BLOCK_WIDTH].tolist()
        padding = len(lanes) - len(cols)
        assert 0 <= padding < BLOCK_WIDTH
        # Columns ascending, padding (-1) only at the end of the window's last block.
        assert lanes == cols + [-1] * padding


@given(sparse_matrices())
def test_local_ids_block_offsets_and_row_map(case):
    csr, perm, window = case
    layout, _ = build_metcf(csr, window, perm)
    local = layout.local_ids.long()
    assert bool((local < window * BLOCK_WIDTH).all())
    offsets = layout.block_offsets.long()
    assert int(offsets[0]) == 0 and int(offsets[-1]) == csr.nnz
    assert bool((offsets[1:] > offsets[:-1]).all()), "a stored block holds no nonzero"
    for b in range(layout.num_blocks):
        ids = local[offsets[b] : offsets[b + 1]]
        assert bool((ids[1:] > ids[:-1]).all()), f"local ids of block {b} not strictly ascending"
    expected_rows = torch.arange(csr.num_rows) if perm is None else perm
    assert layout.row_map.numel() == layout.num_windows * window
    assert torch.equal(layout.row_map[: csr.num_rows].long(), expected_rows)
    assert bool((layout.row_map[csr.num_rows :] == -1).all())
    blocks = layout.window_offsets[1:] - layout.window_offsets[:-1]
    chunks = (blocks + BALANCE_CHUNK - 1) // BALANCE_CHUNK
    assert torch.equal(layout.chunk_offsets[1:] - layout.chunk_offsets[:-1], chunks)


@given(sparse_matrices())
def test_block_bitmap_marks_exactly_the_local_ids(case):
    # The kernels read a value's place in its block as the number of set bits before its id:
    # that is its rank among the block's ascending ids only if the bits are exactly those ids.
    csr, perm, window = case
    layout, _ = build_metcf(csr, window, perm)
    words = layout.block_bitmap.long() & 0xFFFFFFFF
    assert layout.block_bitmap.dtype == torch.int32 and words.numel() == 4 * layout.num_blocks
    offsets = layout.block_offsets.long()
    for b in range(layout.num_blocks):
        bits = [i for i in range(128) if (int(words[4 * b + i // 32]) >> (i % 32)) & 1]
        assert bits == layout.local_ids[offsets[b] : offsets[b + 1]].tolist()


@given(sparse_matrices())
def test_csr_arrays_and_gathers(case):
    csr, perm, window = case
    layout, values = build_metcf(csr, window, perm)
    assert torch.equal(layout.csr_rowptr, csr.rowptr) and torch.equal(layout.csr_col, csr.col)
    assert torch.equal(values[layout.csr_gather], csr.values)
    assert torch.equal(torch.sort(layout.csr_gather).values, torch.arange(csr.nnz))
    assert layout.transpose_gather.numel() == 0


@given(sparse_matrices())
def test_stats_are_consistent(case):
    csr, perm, window = case
    layout, _ = build_metcf(csr, window, perm)
    stats = layout.stats()
    per_window = [math.ceil(len(c) / BLOCK_WIDTH) for c in distinct_columns_per_window(csr, perm, window)]
    blocks = sum(per_window)
    assert stats["tc_blocks"] == blocks == layout.num_blocks
    assert stats["nnz"] == csr.nnz and stats["window"] == window
    assert stats["mean_nnz_per_block"] == pytest.approx(csr.nnz / blocks if blocks else 0.0)
    assert stats["blocks_per_window_mean"] == pytest.approx(sum(per_window) / len(per_window))
    assert stats["blocks_per_window_std"] == pytest.approx(torch.tensor(per_window, dtype=torch.float64).std(unbiased=False).item())
    assert stats["blocks_per_window_max"] == max(per_window)
    assert stats["bytes_vs_csr"] == pytest.approx(stats["bytes"] / stats["csr_bytes"])
    assert stats["csr_bytes"] == (csr.num_rows + 1) * 4 + csr.nnz * 8


@given(sparse_matrices())
def test_count_blocks_agrees_with_build(case):
    csr, perm, window = case
    layout, _ = build_metcf(csr, window, perm)
    counted = count_blocks(csr, window, perm)
    assert counted.dtype == torch.int64
    assert torch.equal(counted, (layout.window_offsets[1:] - layout.window_offsets[:-1]).long())


def test_documented_dtypes():
    row, col, values = random_coo(20, 30, 0.3, seed=1)
    layout, _ = build_metcf(csr_mod.from_coo(row, col, values, 20, 30))
    expected = dict(
        window_offsets=torch.int32,
        block_offsets=torch.int32,
        local_ids=torch.uint8,
        block_cols=torch.int32,
        block_bitmap=torch.int32,
        row_map=torch.int32,
        chunk_offsets=torch.int32,
        chunk_row_starts=torch.int32,
        transpose_gather=torch.int32,
        csr_gather=torch.int32,
    )
    assert {name: getattr(layout, name).dtype for name in expected} == expected


def test_worked_example():
    # Window of 16 rows: row 0 uses columns 3 and 40, row 1 uses 3; 2 distinct columns -> 1 block.
    csr = csr_mod.from_coo(tensor([0, 0, 1]), tensor([40, 3, 3]), tensor([1.0, 2.0, 3.0]), 2, 41)
    layout, values = build_metcf(csr)
    assert layout.window_offsets.tolist() == [0, 1]
    assert layout.block_offsets.tolist() == [0, 3]
    assert layout.block_cols.tolist() == [3, 40, -1, -1, -1, -1, -1, -1]
    assert layout.local_ids.tolist() == [0, 1, 8]
    assert values.tolist() == [2.0, 1.0, 3.0]
    assert layout.row_map.tolist() == [0, 1] + [-1] * 14


@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (5, 0), (17, 9)])
def test_matrices_without_nonzeros(shape):
    empty = tensor([], dtype=torch.long)
    csr = csr_mod.from_coo(empty, empty, None, *shape)
    layout, values = build_metcf(csr)
    assert layout.num_blocks == 0 and values.numel() == 0
    assert layout.num_windows == math.ceil(shape[0] / 16)
    assert layout.window_offsets.tolist() == [0] * (layout.num_windows + 1)
    assert count_blocks(csr).tolist() == [0] * layout.num_windows
    assert layout.stats()["mean_nnz_per_block"] == 0.0


def test_rejects_unknown_window():
    csr = csr_mod.from_coo(tensor([0]), tensor([0]), None, 1, 1)
    with pytest.raises(ValueError, match=r"window.*\(8, 16\).*32"):
        build_metcf(csr, window=32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to compare CPU and CUDA builds")
@given(sparse_matrices())
def test_cpu_and_cuda_builds_are_identical(case):
    csr, perm, window = case
    cpu_layout, cpu_values = build_metcf(csr, window, perm)
    cuda_perm = None if perm is None else perm.cuda()
    cuda_layout, cuda_values = build_metcf(csr.to("cuda"), window, cuda_perm)
    assert cuda_layout.device.type == "cuda"
    for name in cpu_layout.TENSOR_FIELDS:
        expected, actual = getattr(cpu_layout, name), getattr(cuda_layout, name)
        assert actual.device.type == "cuda", name
        assert torch.equal(actual.cpu(), expected), name
    assert torch.equal(cuda_values.cpu(), cpu_values)
    assert torch.equal(count_blocks(csr.to("cuda"), window, cuda_perm).cpu(), count_blocks(csr, window, perm))


def test_build_layout_is_the_layout_of_build_metcf():
    row, col, values = random_coo(300, 200, 0.05, seed=4, dtype=torch.float32, duplicates=True)
    csr = csr_mod.from_coo(row, col, values, 300, 200)
    for window, perm in [(16, None), (8, random_permutation(300, 5))]:
        expected, _ = build_metcf(csr, window, perm)
        layout = build_layout(csr, window, perm)
        for name in expected.TENSOR_FIELDS:
            assert torch.equal(getattr(layout, name), getattr(expected, name)), name


@pytest.mark.parametrize("window, with_perm", [(16, False), (8, True)])
def test_layout_built_in_slices_is_the_layout_built_at_once(monkeypatch, window, with_perm):
    row, col, values = random_coo(100, 100, 0.3, seed=6, dtype=torch.float32)
    csr = csr_mod.from_coo(row, col, values, 100, 100)
    perm = random_permutation(100, 7) if with_perm else None
    expected = build_layout(csr, window, perm, use_kernels=False)
    monkeypatch.setattr(packed, "SLICE", 7)
    layout = build_layout(csr, window, perm, use_kernels=False)
    for name in expected.TENSOR_FIELDS:
        assert torch.equal(getattr(layout, name), getattr(expected, name)), name


@given(sparse_matrices())
def test_layout_without_packed_keys_is_the_same(case):
    """Where window, column and row fields would not fit one int64 key (huge column counts), a
    stable sort takes over: same layout."""
    csr, perm, window = case
    expected = build_layout(csr, window, perm, use_kernels=False)
    blocks = count_blocks(csr, window, perm, use_kernels=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packed, "KEY_BITS", 0)
        layout = build_layout(csr, window, perm, use_kernels=False)
        assert torch.equal(count_blocks(csr, window, perm, use_kernels=False), blocks)
    for name in expected.TENSOR_FIELDS:
        assert torch.equal(getattr(layout, name), getattr(expected, name)), name



@pytest.mark.parametrize("use_kernels", [None, False])
def test_huge_column_count_with_small_column_ids(use_kernels):
    """Columns past 2**50 leave no room for a packed sort key of the torch build, and the compiled
    CPU build keeps no array per column; the layout stays right."""
    row, col, values = random_coo(40, 60, 0.3, seed=8, dtype=torch.float64)
    csr = csr_mod.from_coo(row, col, values, 40, 2**57)
    for window in (8, 16):
        layout, block_values = build_metcf(csr, window, use_kernels=use_kernels)
        _, rows, cols = layout.nonzero_coordinates()
        in_csr_order = layout.csr_gather.long()
        assert torch.equal(rows[in_csr_order], csr.row_indices())
        assert torch.equal(cols[in_csr_order], csr.col.long())
        assert torch.equal(block_values[in_csr_order], csr.values)
