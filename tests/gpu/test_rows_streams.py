"""GPU tests of the rows kernel's stream walk: a warp whose rows hold at most 2 U nonzeros each
(U = 4 gathers per round, 2 with one-element 16-bit loads) walks them as one stream per slot,
writing every row, empty ones included, where its nonzeros end; a warp with a longer or split row
runs its groups of rows one after another instead. A launch groups rows where they hold at most
2 U nonzeros on average, or where a warp is one slot. Row lengths are laid out so that both kinds
of warp, the boundaries at U and 2 U, runs of empty rows and a last warp cut short all occur at
every launch shape (N from 1 to 257 columns); long rows beside short ones (a mean above 2 U) run
ungrouped except at one slot. Against the float64 reference with test_rows.py's
tolerances, outputs poisoned first (``check``).
"""
import pytest
import torch

from torch_tcsparse import csr_rows, kernels
from torch_tcsparse.formats.csr import from_coo

from .test_rows import DTYPES, check, checked_product

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

K = 4099  # columns of A, prime: the columns of one row below are distinct
# Odd and even N: every lanes-per-slot count (1 to 32), loads of 16, 8, 4 bytes or one element,
# one column tile and several (N > 128 in float32).
STREAM_N = [1, 2, 3, 5, 8, 9, 16, 17, 31, 32, 33, 64, 65, 128, 129, 256, 257]


def lengths_of(layout, m):
    """Row lengths (int64, on the GPU) of an m-row matrix laid out as ``layout``."""

    def rand(high):
        return torch.randint(0, high, (m,), device="cuda")

    if layout == "short":  # every warp streams at U = 4
        return rand(9)
    if layout == "very_short":  # every warp streams at U = 2 too
        return rand(5)
    if layout == "u_and_2u":  # blocks of 64 rows of exactly 8, of 4, of 2, and of 8 and 4 in turn
        block = torch.tensor([8] * 64 + [4] * 64 + [2] * 64 + [8, 4] * 32, device="cuda")
        return block.repeat(m // block.numel() + 1)[:m]
    if layout == "over_2u":  # 2 U + 1 in one row of every 50: its warp runs its rows in groups
        lengths = rand(9)
        lengths[::50] = 9
        return lengths
    if layout == "empty_runs":  # mostly empty, whole warps and the first and last rows too
        lengths = torch.where(torch.rand(m, device="cuda") < 0.85, 0, 1 + rand(8))
        lengths[:100] = 0
        lengths[-100:] = 0
        lengths[1000:1003] = torch.tensor([8, 0, 4], device="cuda")
        return lengths
    if layout == "long_beside_short":  # a long row every 29 rows, some split at the default pieces
        lengths = rand(9)
        long = torch.tensor([9, 16, 40, 300, 3000], device="cuda")
        lengths[::29] = long.repeat(m // 29 // long.numel() + 2)[:lengths[::29].numel()]
        return lengths
    raise ValueError(layout)


LAYOUTS = ["short", "very_short", "u_and_2u", "over_2u", "empty_runs", "long_beside_short"]


def stream_coo(layout, m, k=K):
    """COO of an m x k matrix with ``lengths_of(layout, m)`` nonzeros per row at distinct random
    columns (row i's j-th at (start_i + j step_i) mod k, k prime), randn values."""
    lengths = lengths_of(layout, m)
    row = torch.repeat_interleave(torch.arange(m, device="cuda"), lengths)
    first = torch.cumsum(lengths, 0) - lengths
    j = torch.arange(row.numel(), device="cuda") - first[row]
    start = torch.randint(0, k, (m,), device="cuda")
    step = torch.randint(1, k, (m,), device="cuda")
    col = (start[row] + j * step[row]) % k
    return row, col, torch.randn(row.numel(), device="cuda")


# Rows per matrix: several thousand rows, a last warp cut short, and fewer rows than one warp takes.
ROWS = {"short": 3001, "very_short": 2999, "u_and_2u": 2000 + 13, "over_2u": 3001, "empty_runs": 3000,
        "long_beside_short": 2011}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", STREAM_N)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_stream_walk_layouts(layout, n, dtype):
    """Split at the large graphs' pieces, at pieces of 2 U (rows of exactly 8 whole and streamed),
    at pieces of 5 (rows of 6-8 split: their warps run in groups, the others stream up to 5), and
    not at all."""
    m = ROWS[layout]
    coo = stream_coo(layout, m)
    for piece_nnz in (csr_rows.PIECE_NNZ, 8, 5, csr_rows.UNSPLIT):
        check(m, K, n, piece_nnz=piece_nnz, dtype=dtype, coo=coo)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", STREAM_N)
@pytest.mark.parametrize("layout", ["short", "u_and_2u", "empty_runs", "long_beside_short"])
def test_stream_walk_with_bias_row_map_and_addend(layout, n, dtype):
    """Every streamed row, the empty ones too, written through the row map with the bias and the
    addend added before its one rounding."""
    m = ROWS[layout]
    coo = stream_coo(layout, m)
    for piece_nnz in (csr_rows.PIECE_NNZ, 5):
        check(m, K, n, bias=True, row_map=True, addend=True, piece_nnz=piece_nnz, dtype=dtype, coo=coo)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 5, 32, 33, 257])
@pytest.mark.parametrize("layout", ["very_short", "u_and_2u", "long_beside_short"])
def test_stream_walk_beside_a_padded_split(layout, n, dtype):
    """A split sized by bounds (``padded_row_pieces``): the warps of its padding exit at once and
    the row warps after them stream as with the exact split, written through the row map with
    the bias and the addend."""
    m = ROWS[layout]
    row, col, values = stream_coo(layout, m)
    csr = from_coo(row, col, values.to(dtype), m, K)
    padded = csr_rows.row_pieces(csr.rowptr, 5, None, csr.nnz)
    assert bool((padded.piece_starts == csr_rows.PADDING).any())
    x = torch.randn(K, n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    rmap = torch.randperm(m, device="cuda").int()
    checked_product(csr, padded, x, b, rmap, torch.randn(m, n, device="cuda"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 3, 17, 33, 130])
@pytest.mark.parametrize("n", [1, 8, 32, 33, 257])
def test_stream_walk_of_fewer_rows_than_a_warp_takes(m, n, dtype):
    """Matrices of fewer rows than one warp's streams (up to 32): slots past the last row take
    none, and a slot's stream ends at the matrix's last row."""
    coo = stream_coo("short", m)
    check(m, K, n, bias=True, row_map=True, addend=True, dtype=dtype, coo=coo)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 5, 32, 33, 128, 257])
def test_all_empty_rows_get_bias_and_addend(n, dtype):
    """A matrix without nonzeros: every row of Y is the bias plus the addend, streamed or not."""
    m = 700
    coo = (torch.zeros(0, dtype=torch.long, device="cuda"),) * 2 + (torch.zeros(0, device="cuda"),)
    check(m, K, n, bias=True, row_map=True, addend=True, dtype=dtype, coo=coo)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [3, 32, 64, 257])
def test_unsplit_streams_are_bitwise_repeatable(n, dtype):
    """Without split rows every output is one slot's sum in the nonzeros' order: the same bits
    from call to call."""
    m = 3001
    row, col, values = stream_coo("long_beside_short", m)
    csr = from_coo(row, col, values.to(dtype), m, K)
    pieces = csr_rows.row_pieces(csr.rowptr, csr_rows.UNSPLIT)
    x = torch.randn(K, n, device="cuda").to(dtype)
    first = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, K)
    second = kernels.csr_rows_spmm(x, csr.rowptr, csr.col, csr.values, pieces, K)
    assert torch.equal(first, second)
