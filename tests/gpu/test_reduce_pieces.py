"""GPU tests of the max/min kernel's long rows (csrc/reduce_rows.cu): rows of more than 256
nonzeros are reduced in pieces and the pieces merged in order, which must give exactly what the
CPU torch ops of engines/extreme.py give (the reference path): the same Y (NaN where it is NaN)
and the same winning nonzero for every output, ties and NaN included, whatever the split. Rows
of every length around the pieces' bounds, a hub row among short and empty rows, ties, NaN and
infinities, every dtype and N from 1 to 512; outputs poisoned with NaN first.
"""
import pytest
import torch

from torch_tcsparse import kernels
from torch_tcsparse.engines import extreme

from .kernel_data import SUBSET, poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EXTREMES = ["max", "min"]
HUB = 30_000 if SUBSET else 100_000
# One, two and four columns per lane, several column tiles, N = 512.
N_SPLIT = [1, 7, 64, 130] if SUBSET else [1, 7, 9, 33, 64, 65, 128, 130, 512]
# Around the pieces' bounds (chunks of 128 nonzeros, rows of more than 256 split).
BOUND_LENGTHS = [127, 128, 129, 255, 256, 257, 383, 384, 385, 511, 512, 513, 769, 4099]


def csr(lengths, k, gen, values=None):
    """(rowptr, col, values) on the GPU of rows of these lengths: random columns (repeats within a
    row included, which tie) and randn values unless given."""
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    rowptr = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(lengths, 0)
    nnz = int(rowptr[-1])
    col = torch.randint(0, k, (nnz,), generator=gen)
    values = torch.randn(nnz, generator=gen) if values is None else values
    return rowptr.int().cuda(), col.int().cuda(), values.cuda()


def short_rows(count, gen, longest=12, empty_fraction=0.25):
    lengths = torch.randint(0, longest + 1, (count,), generator=gen)
    lengths[torch.rand(count, generator=gen) < empty_fraction] = 0
    return lengths.tolist()


def check(rowptr, col, values, x, reduce, longest=-1):
    """The kernel's (Y, winners) equal the CPU reference path's, bit for bit."""
    m, n = rowptr.numel() - 1, x.shape[1]
    poison(m * max(n, 1) * 2 + 1)
    y, winners = kernels.reduce_rows(x, rowptr, col, values, reduce == "max", longest)
    torch.cuda.synchronize()
    y_cpu, winners_cpu = extreme.forward(x.cpu(), values.cpu(), rowptr.cpu(), col.cpu(), reduce, "reference")
    assert y.dtype == x.dtype and y.shape == winners.shape == (m, n)
    assert torch.equal(winners.cpu(), winners_cpu)
    torch.testing.assert_close(y.cpu(), y_cpu, rtol=0, atol=0, equal_nan=True)
    return y, winners


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
@pytest.mark.parametrize("n", N_SPLIT)
def test_hub_among_short_rows(n, reduce, dtype):
    """One row of HUB nonzeros among 3000 short rows, a quarter of them empty."""
    gen = torch.Generator().manual_seed(n)
    lengths = short_rows(3000, gen)
    lengths[1234] = HUB
    k = 20_000
    rowptr, col, values = csr(lengths, k, gen)
    x = torch.randn(k, n, generator=gen).cuda()
    check(rowptr, col, values.to(dtype), x.to(dtype), reduce)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
@pytest.mark.parametrize("n", [1, 33, 130])
def test_row_lengths_around_the_pieces(n, reduce, dtype):
    """Every length around the bounds, starting at every kind of offset within a chunk (short
    rows of random lengths before each), and long rows next to each other (one chunk ending one
    and holding the head of the next)."""
    gen = torch.Generator().manual_seed(1000 + n)
    lengths = []
    for length in BOUND_LENGTHS:
        for _ in range(3):
            lengths += short_rows(int(torch.randint(0, 40, (1,), generator=gen)), gen, longest=300, empty_fraction=0.2)
            lengths += [length, int(torch.randint(257, 900, (1,), generator=gen))]
    k = 3000
    rowptr, col, values = csr(lengths, k, gen)
    x = torch.randn(k, n, generator=gen).cuda()
    check(rowptr, col, values.to(dtype), x.to(dtype), reduce)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
def test_ties_across_pieces(reduce, dtype):
    """Small integers, so that a long row's extreme recurs in many pieces: the first one wins. With
    all products equal the winner is each row's first nonzero."""
    gen = torch.Generator().manual_seed(7)
    lengths = short_rows(500, gen) + [HUB] + short_rows(500, gen) + [2000, 600, 257]
    k, n = 300, 24
    rowptr, col, _ = csr(lengths, k, gen)
    nnz = col.numel()
    values = torch.randint(-2, 3, (nnz,), generator=gen).float().cuda()
    x = torch.randint(-3, 4, (k, n), generator=gen).float().cuda()
    check(rowptr, col, values.to(dtype), x.to(dtype), reduce)

    _, winners = check(rowptr, col, torch.ones(nnz, device="cuda", dtype=dtype),
                       torch.full((k, n), 0.5, device="cuda", dtype=dtype), reduce)
    nonempty = rowptr[1:] > rowptr[:-1]
    assert torch.equal(winners[nonempty], rowptr[:-1][nonempty, None].expand(-1, n))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
def test_nan_and_infinities_in_long_rows(reduce, dtype):
    """NaN (the first NaN wins, wherever its piece), +-inf among finite products, and columns whose
    products are all -inf or all +inf (the first nonzero wins); positive values, so that no
    product is 0 * inf."""
    gen = torch.Generator().manual_seed(11)
    lengths = short_rows(800, gen) + [HUB] + short_rows(800, gen) + [5000, 700]
    k, n = 20_000, 40
    rowptr, col, _ = csr(lengths, k, gen)
    values = (torch.randn(col.numel(), generator=gen).abs() + 0.1).cuda()
    x = torch.randn(k, n, generator=gen)
    # About 2 NaN per column of the hub (some columns none), more of +-inf.
    x[torch.rand(k, n, generator=gen) < 1e-4] = float("nan")
    x[torch.rand(k, n, generator=gen) < 3e-4] = float("inf")
    x[torch.rand(k, n, generator=gen) < 3e-4] = float("-inf")
    x[:, 0] = float("-inf")
    x[:, 1] = float("inf")
    check(rowptr, col, values.to(dtype), x.cuda().to(dtype), reduce)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduce", EXTREMES)
def test_longest_row_given(reduce, dtype):
    """The longest row, where the caller knows it, only decides whether rows are split: the true
    one, -1 (unknown) and a bound too small (every row walked whole) give the same result."""
    gen = torch.Generator().manual_seed(5)
    lengths = short_rows(1500, gen) + [HUB, 1000] + short_rows(1500, gen, longest=256)
    k, n = 4000, 48
    rowptr, col, values = csr(lengths, k, gen)
    x = torch.randn(k, n, generator=gen).cuda().to(dtype)
    for longest in [-1, HUB, 0]:
        check(rowptr, col, values.to(dtype), x, reduce, longest)
    short = short_rows(3000, gen, longest=256)
    rowptr, col, values = csr(short, k, gen)
    for longest in [-1, max(short)]:
        check(rowptr, col, values.to(dtype), x, reduce, longest)


@pytest.mark.parametrize("reduce", EXTREMES)
def test_split_rows_repeat_bit_for_bit(reduce):
    gen = torch.Generator().manual_seed(3)
    lengths = short_rows(2000, gen) + [HUB, 3000, 1000] + short_rows(2000, gen)
    k, n = 5000, 64
    rowptr, col, values = csr(lengths, k, gen)
    x = torch.randn(k, n, generator=gen).cuda()
    first = kernels.reduce_rows(x, rowptr, col, values, reduce == "max")
    second = kernels.reduce_rows(x, rowptr, col, values, reduce == "max")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
