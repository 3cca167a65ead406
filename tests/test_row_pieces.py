"""The rows path's split of long rows (``csr_rows.row_pieces``): the padded split, sized by bounds
from nnz without reading the device, equals the exact split once its padding is dropped, and
sums every nonzero once when walked as the kernel walks pieces (padding skipped)."""
import pytest
import torch

from torch_tcsparse import csr_rows

from device_reads import DeviceReads


def rowptr_of(degrees) -> torch.Tensor:
    degree = torch.as_tensor(degrees, dtype=torch.long)
    return torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)]).int()


def random_degrees(generator, rows: int, piece_nnz: int) -> list[int]:
    """Empty rows, short rows, rows just over the piece size and a few hubs."""
    kind = torch.randint(0, 4, (rows,), generator=generator)
    short = torch.randint(0, piece_nnz + 1, (rows,), generator=generator)
    over = piece_nnz + 1 + torch.randint(0, 3 * piece_nnz, (rows,), generator=generator)
    hub = torch.where(torch.rand(rows, generator=generator) < 0.05, 10_000, 0)
    return torch.where(kind == 0, 0, torch.where(kind == 1, short, torch.where(kind == 2, over, hub))).tolist()


def walk_pieces(rowptr, col, values, pieces, x) -> torch.Tensor:
    """Y = A @ x as the kernel forms it from ``pieces``: rows up to the piece size whole, split rows
    as the sum of their pieces (each up to piece_nnz nonzeros from its start, within its row),
    padding entries (negative) skipped."""
    rowptr, col = rowptr.long(), col.long()
    degree = rowptr[1:] - rowptr[:-1]
    y = torch.zeros(degree.numel(), x.shape[1], dtype=torch.float64)
    for r in torch.nonzero(degree <= pieces.piece_nnz).flatten().tolist():
        k = slice(int(rowptr[r]), int(rowptr[r + 1]))
        y[r] = values[k].double() @ x[col[k]].double()
    for slot, start in zip(pieces.piece_slots.tolist(), pieces.piece_starts.tolist(), strict=True):
        if start < 0:
            assert slot == csr_rows.PADDING
            continue
        r = int(pieces.split_rows[slot])
        k = slice(start, min(start + pieces.piece_nnz, int(rowptr[r + 1])))
        y[r] += values[k].double() @ x[col[k]].double()
    return y


@pytest.mark.parametrize("piece_nnz", [1, 5, 32, 64, 128, 256])
def test_padded_split_is_the_exact_split_then_padding(piece_nnz):
    generator = torch.Generator().manual_seed(piece_nnz)
    for rows in [1, 2, 7, 40, 300]:
        rowptr = rowptr_of(random_degrees(generator, rows, piece_nnz))
        nnz = int(rowptr[-1])
        exact = csr_rows.row_pieces(rowptr, piece_nnz)
        padded = csr_rows.row_pieces(rowptr, piece_nnz, None, nnz)
        split_bound, pieces_bound = csr_rows.piece_bounds(rows, nnz, piece_nnz)
        assert padded.piece_nnz == piece_nnz
        assert padded.split_rows.numel() == split_bound >= exact.split_rows.numel()
        assert padded.piece_slots.numel() == padded.piece_starts.numel() == pieces_bound >= exact.piece_slots.numel()
        for ours, theirs in zip(padded[:3], exact[:3], strict=True):
            assert ours.dtype == torch.int32
            assert torch.equal(ours[: theirs.numel()], theirs)
            assert (ours[theirs.numel():] == csr_rows.PADDING).all()


@pytest.mark.parametrize("piece_nnz", [1, 3, 32, 256])
def test_bounds_hold_at_their_worst_case(piece_nnz):
    """Rows of piece_nnz + 1 nonzeros make the most split rows and pieces per nonzero: there the
    bounds are met exactly."""
    for rows in [1, 4, 33]:
        rowptr = rowptr_of([piece_nnz + 1] * rows)
        exact = csr_rows.row_pieces(rowptr, piece_nnz)
        bounds = csr_rows.piece_bounds(rows, int(rowptr[-1]), piece_nnz)
        assert bounds == (exact.split_rows.numel(), exact.piece_slots.numel()) == (rows, 2 * rows)


def test_bounds_cover_every_split():
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        piece_nnz = int(torch.randint(1, 70, (1,), generator=generator))
        rows = int(torch.randint(1, 60, (1,), generator=generator))
        degrees = (torch.randint(0, 4 * piece_nnz, (rows,), generator=generator)
                   * (torch.rand(rows, generator=generator) < 0.5)).tolist()
        rowptr = rowptr_of(degrees)
        exact = csr_rows.row_pieces(rowptr, piece_nnz)
        split_bound, pieces_bound = csr_rows.piece_bounds(rows, int(rowptr[-1]), piece_nnz)
        assert exact.split_rows.numel() <= split_bound and exact.piece_slots.numel() <= pieces_bound


def test_too_few_nonzeros_for_a_split_row_give_empty_arrays():
    """Fewer than piece_nnz + 1 nonzeros, or no split (deterministic mode): no entries at all."""
    for degrees, piece_nnz in [([], 32), ([0, 0], 32), ([16, 1, 15], 32), ([5, 10**4], csr_rows.UNSPLIT)]:
        rowptr = rowptr_of(degrees)
        padded = csr_rows.row_pieces(rowptr, piece_nnz, None, int(rowptr[-1]))
        assert all(t.numel() == 0 and t.dtype == torch.int32 for t in padded[:3])


def test_no_split_row_among_enough_nonzeros_gives_padding_only():
    rowptr = rowptr_of([32, 1, 32])
    padded = csr_rows.row_pieces(rowptr, 32, None, int(rowptr[-1]))
    assert [t.numel() for t in padded[:3]] == [3, 3, 1]
    assert all((t == csr_rows.PADDING).all() for t in padded[:3])


@pytest.mark.parametrize("piece_nnz", [1, 5, 32, 256])
def test_padded_pieces_sum_every_nonzero_once(piece_nnz):
    generator = torch.Generator().manual_seed(7)
    degrees = random_degrees(generator, 200, piece_nnz)
    rowptr = rowptr_of(degrees)
    nnz, cols = int(rowptr[-1]), 50
    col = torch.randint(0, cols, (nnz,), generator=generator).int()
    values = torch.randn(nnz, generator=generator)
    x = torch.randn(cols, 3, generator=generator)
    matrix = torch.sparse_csr_tensor(rowptr.long(), col.long(), values.double(), (len(degrees), cols))
    expected = matrix @ x.double()
    for pieces in (csr_rows.row_pieces(rowptr, piece_nnz), csr_rows.row_pieces(rowptr, piece_nnz, None, nnz)):
        torch.testing.assert_close(walk_pieces(rowptr, col, values, pieces, x), expected)


def test_the_padded_split_reads_nothing_from_the_device():
    """On a GPU the exact split waits for its two sizes; the padded one waits for nothing."""
    rowptr = rowptr_of([0, 3, 700, 10_000, 1, 257] * 20)
    nnz = int(rowptr[-1])  # known on the host (the matrix's size)
    with DeviceReads() as reads:
        csr_rows.row_pieces(rowptr, 32, None, nnz)
    assert reads.ops == []
    with DeviceReads() as reads:
        csr_rows.row_pieces(rowptr, 32)
    assert reads.ops == ["tolist"]
