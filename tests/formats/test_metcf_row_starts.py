"""``chunk_row_starts``: the Tensor-Core kernels find every nonzero's CSR position from it and the
bitmaps alone (``csrc/metcf_spmm.cuh``). Here the kernels' walk is replayed on the host: from the
first block of any chunk, a running count per window row, advanced block by block in order."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_tcsparse.formats import csr as csr_mod
from torch_tcsparse.formats.metcf import BALANCE_CHUNK, build_layout, chunk_row_starts
from torch_tcsparse.testing import random_coo, random_permutation

from .test_metcf import sparse_matrices


def replay(layout, first_chunk_only: bool) -> list[int]:
    """The CSR position the kernels read for every nonzero in block order, walking each window
    from its first chunk (base kernel) or each chunk from its own first block (balanced)."""
    window = layout.window
    bitmap = layout.block_bitmap.tolist()
    starts = layout.chunk_row_starts.tolist()
    offsets, chunks = layout.window_offsets.tolist(), layout.chunk_offsets.tolist()
    positions = []
    for w in range(layout.num_windows):
        for c in range(chunks[w], chunks[w + 1]):
            if first_chunk_only and c != chunks[w]:
                continue
            rb = offsets[w] + (c - chunks[w]) * BALANCE_CHUNK
            re = offsets[w + 1] if first_chunk_only else min(rb + BALANCE_CHUNK, offsets[w + 1])
            cursor = starts[c * window : (c + 1) * window]
            for b in range(rb, re):
                words = [v & 0xFFFFFFFF for v in bitmap[4 * b : 4 * b + 4]]
                for bit in range(128):  # bit order is block order
                    r, col = bit // 8, bit % 8
                    row_bits = (words[r // 4] >> (8 * (r % 4))) & 0xFF
                    if row_bits >> col & 1:
                        positions.append(cursor[r] + bin(row_bits & ((1 << col) - 1)).count("1"))
                for r in range(window):
                    cursor[r] += bin((words[r // 4] >> (8 * (r % 4))) & 0xFF).count("1")
    return positions


def block_positions(layout) -> list[int]:
    """The CSR position of every nonzero in block order, from ``csr_gather``."""
    inverse = torch.empty_like(layout.csr_gather.long())
    inverse[layout.csr_gather.long()] = torch.arange(layout.nnz)
    return inverse.tolist()


@settings(deadline=None)
@given(sparse_matrices())
def test_the_kernels_walk_finds_every_value_in_csr_order(case):
    csr, perm, window = case
    layout = build_layout(csr, window, perm)
    assert layout.chunk_row_starts.dtype == torch.int32
    assert layout.chunk_row_starts.numel() == int(layout.chunk_offsets[-1]) * window
    expected = block_positions(layout)
    assert replay(layout, first_chunk_only=True) == expected
    assert replay(layout, first_chunk_only=False) == expected


@pytest.mark.parametrize("window, with_perm", [(16, False), (8, True), (16, True)])
def test_windows_of_many_chunks(window, with_perm):
    """A hub row and dense windows spanning several chunks, with empty rows between."""
    num_rows, num_cols = 70, 2000
    row, col, values = random_coo(num_rows, num_cols, 0.05, 3, torch.float32, dense_row=5)
    keep = (row % 7) != 3  # empty rows
    csr = csr_mod.from_coo(row[keep], col[keep], values[keep], num_rows, num_cols)
    perm = random_permutation(num_rows, 4) if with_perm else None
    layout = build_layout(csr, window, perm)
    assert int((layout.chunk_offsets[1:] - layout.chunk_offsets[:-1]).max()) > 2
    expected = block_positions(layout)
    assert replay(layout, first_chunk_only=True) == expected
    assert replay(layout, first_chunk_only=False) == expected


def test_every_build_gives_the_same_starts():
    row, col, values = random_coo(50, 900, 0.2, 5, torch.float32, dense_row=7)
    csr = csr_mod.from_coo(row, col, values, 50, 900)
    native = build_layout(csr, 16)
    torch_ops = build_layout(csr, 16, use_kernels=False)
    assert torch.equal(native.chunk_row_starts, torch_ops.chunk_row_starts)
    rebuilt = chunk_row_starts(native.window_offsets, native.chunk_offsets, native.block_bitmap, native.row_map,
                               native.csr_rowptr, 16, int(native.chunk_offsets[-1]))
    assert torch.equal(rebuilt, native.chunk_row_starts)


@pytest.mark.parametrize("entries", [1, 3 * 64])
def test_starts_built_a_few_rows_at_a_time_are_the_same(monkeypatch, entries):
    row, col, values = random_coo(300, 2000, 0.05, 3, torch.float32, dense_row=5)
    csr = csr_mod.from_coo(row, col, values, 300, 2000)
    whole = build_layout(csr, 16)
    monkeypatch.setattr("torch_tcsparse.formats.metcf._ROW_COUNT_ENTRIES", entries * whole.num_blocks // 64)
    assert torch.equal(build_layout(csr, 16).chunk_row_starts, whole.chunk_row_starts)
