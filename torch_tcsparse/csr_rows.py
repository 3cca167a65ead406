"""How the ``"rows"`` path (``engines/rows.py``, the CUDA-core CSR kernel of
``csrc/csr_rows_spmm.cu``) splits long rows, and the row-permuted CSR a reordered matrix runs it on.
The kernel packs short rows several to a warp by itself; only rows longer than the piece size
need the split, a warp per piece.

The split into pieces depends only on ``rowptr``: ``row_pieces`` builds it once per matrix and
the matrix's structure keeps it. Where the longest row is known it reads the number of long rows
and of their pieces back (one host read); where it is not (a transpose built in a backward pass),
it sizes the arrays by bounds from the number of nonzeros (``piece_bounds``) and pads them.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .formats.csr import INT32_MAX

# Nonzeros per piece: rows longer than this are split and their pieces summed with atomics
# (longer pieces left R-MAT's hubs to few warps; see docs/DECISIONS.md). It is the size on graphs of LARGE_NNZ nonzeros or more, and the one the op path (tcsparse::spmm) uses:
# its pieces travel without their size. Smaller graphs take smaller pieces (``split_piece_nnz``).
PIECE_NNZ = 256
MEDIUM_NNZ = 1 << 20
LARGE_NNZ = 1 << 24
# Deterministic mode: no row is split, so every output is one warp's sum in an order fixed by the
# matrix and the launch.
UNSPLIT = INT32_MAX
# Entries of padded RowPieces arrays past the split (``padded_row_pieces``): no piece, no row.
PADDING = -1


class RowPieces(NamedTuple):
    """Every piece of the rows longer than ``piece_nnz`` (``split_rows``, ascending): its row as
    an index into ``split_rows`` (``piece_slots``) and its first nonzero (``piece_starts``), all
    int32. Shorter rows are one piece each and need no entry. The pieces are listed by rank
    (every split row's first piece, then every second piece, ...), so pieces of one row run apart
    in time and their atomics rarely meet. Padded arrays (sized by ``piece_bounds``) end with
    ``PADDING`` in every array: pieces and split rows the kernel skips."""

    piece_slots: torch.Tensor
    piece_starts: torch.Tensor
    split_rows: torch.Tensor
    piece_nnz: int


def row_pieces(rowptr: torch.Tensor, piece_nnz: int = PIECE_NNZ, max_row_nnz: int | None = None,
               nnz: int | None = None) -> RowPieces:
    """The split of ``rowptr``'s rows; ``max_row_nnz``, where known, spares a matrix without long
    rows the host read that counts them. Where it is unknown and ``nnz`` (``rowptr[-1]``, known
    on the host) is given, the split takes no host read: ``padded_row_pieces``."""
    if max_row_nnz is not None and max_row_nnz <= piece_nnz:
        empty = torch.empty(0, dtype=torch.int32, device=rowptr.device)
        return RowPieces(empty, empty, empty, piece_nnz)
    if max_row_nnz is None and nnz is not None:
        return padded_row_pieces(rowptr, nnz, piece_nnz)
    degree = rowptr[1:] - rowptr[:-1]
    long_rows = degree > piece_nnz
    pieces = torch.where(long_rows, (degree.long() + piece_nnz - 1) // piece_nnz, 0)
    # Both sizes in one host read (on a GPU, one wait for the device), where nonzero and each
    # repeat_interleave would read one.
    num_split, num_pieces = torch.stack([long_rows.sum(), pieces.sum()]).tolist()
    split_rows = torch.nonzero_static(long_rows, size=num_split).flatten()
    count = pieces[split_rows]
    slots = torch.arange(num_split, device=rowptr.device).repeat_interleave(count, output_size=num_pieces)
    first_piece = torch.cumsum(count, 0) - count
    rank = (torch.arange(num_pieces, device=rowptr.device)
            - first_piece.repeat_interleave(count, output_size=num_pieces))
    order = torch.argsort(rank * max(1, split_rows.numel()) + slots)
    slots, rank = slots[order], rank[order]
    starts = rowptr[split_rows].long()[slots] + rank * piece_nnz
    return RowPieces(slots.int(), starts.int(), split_rows.int(), piece_nnz)


def piece_bounds(num_rows: int, nnz: int, piece_nnz: int) -> tuple[int, int]:
    """At most how many of ``num_rows`` rows holding ``nnz`` nonzeros are longer than
    ``piece_nnz``, and at most how many pieces they make. A split row holds d >= piece_nnz + 1
    nonzeros, so there are at most nnz // (piece_nnz + 1) of them; its ceil(d / piece_nnz)
    pieces are at most d / piece_nnz + 1 (summed: nnz // piece_nnz + split rows) and at most
    2 d / (piece_nnz + 1) (equal at d = piece_nnz + 1; summed: 2 nnz // (piece_nnz + 1))."""
    split = min(num_rows, nnz // (piece_nnz + 1))
    return split, min(nnz // piece_nnz + split, 2 * nnz // (piece_nnz + 1)) if split else 0


def padded_row_pieces(rowptr: torch.Tensor, nnz: int, piece_nnz: int = PIECE_NNZ) -> RowPieces:
    """``row_pieces`` of a CSR of ``nnz`` nonzeros without reading the device: the arrays hold
    ``piece_bounds`` entries, the split rows and the pieces (in ``row_pieces``'s order) first and
    ``PADDING`` after. The kernel's warps for the padding exit at once: a few microseconds of
    idle warps where a host read would stall the queue of a backward pass."""
    device = rowptr.device
    num_bound, pieces_bound = piece_bounds(rowptr.numel() - 1, nnz, piece_nnz)
    if num_bound == 0:
        empty = torch.empty(0, dtype=torch.int32, device=device)
        return RowPieces(empty, empty, empty, piece_nnz)
    degree = rowptr[1:] - rowptr[:-1]
    long_rows = degree > piece_nnz
    split_rows = torch.nonzero_static(long_rows, size=num_bound, fill_value=PADDING).flatten()
    real_row = split_rows >= 0
    row = split_rows.clamp(min=0)
    count = torch.where(real_row, (degree[row].long() + piece_nnz - 1) // piece_nnz, 0)
    # The padding's pieces go to one more slot, num_bound, so that the repeats fill the bound.
    count = torch.cat([count, pieces_bound - count.sum().view(1)])
    slots = torch.arange(num_bound + 1, device=device).repeat_interleave(count, output_size=pieces_bound)
    first_piece = torch.cumsum(count, 0) - count
    rank = (torch.arange(pieces_bound, device=device)
            - first_piece.repeat_interleave(count, output_size=pieces_bound))
    real = slots < num_bound
    # By rank, then slot, as row_pieces orders them; the padding last.
    key = torch.where(real, rank * max(1, num_bound) + slots, pieces_bound * (num_bound + 1))
    order = torch.argsort(key)
    slots, rank, real = slots[order], rank[order], real[order]
    first = torch.cat([rowptr[row].long(), slots.new_zeros(1)])
    starts = torch.where(real, first[slots] + rank * piece_nnz, PADDING)
    slots = torch.where(real, slots, PADDING)
    return RowPieces(slots.int(), starts.int(), split_rows.int(), piece_nnz)


def piece_size() -> int:
    """Nonzeros per piece of the op path for a product run now: no row is split under
    deterministic algorithms."""
    return UNSPLIT if torch.are_deterministic_algorithms_enabled() else PIECE_NNZ


def reads_longest_row(nnz: int, dtype: torch.dtype) -> bool:
    """Whether ``split_piece_nnz`` needs the longest row for a matrix of ``nnz`` nonzeros and X
    of ``dtype``: only 16-bit X on graphs under MEDIUM_NNZ does, so other products leave it
    unread where reading it would wait for the device (a CSR-only transpose's)."""
    return nnz < MEDIUM_NNZ and dtype.itemsize < 4


def split_piece_nnz(nnz: int, max_row_nnz: int | None, dtype: torch.dtype) -> int:
    """Nonzeros per piece of a matrix of ``nnz`` nonzeros whose longest row has ``max_row_nnz``,
    for X of ``dtype`` (``max_row_nnz`` is needed where ``reads_longest_row``; None elsewhere
    where unknown).

    A warp walks its piece a few nonzeros per step, each step a round trip to L2, so on a graph
    too small to fill the GPU many times over the longest piece sets the time; smaller pieces
    cost atomics, and a 16-bit step takes twice the nonzeros. In 16 bits, graphs whose longest
    row is under PIECE_NNZ stay whole: smaller pieces were as often slower as faster there. The
    measurements behind the sizes are in docs/DECISIONS.md."""
    if nnz >= LARGE_NNZ:
        return PIECE_NNZ
    if nnz >= MEDIUM_NNZ:
        return 128
    if reads_longest_row(nnz, dtype):
        return PIECE_NNZ if max_row_nnz <= PIECE_NNZ else 64
    return 32


def product_piece_nnz(nnz: int, max_row_nnz: int | None, dtype: torch.dtype) -> int:
    """``split_piece_nnz`` for a product run now: no row is split under deterministic algorithms."""
    return UNSPLIT if torch.are_deterministic_algorithms_enabled() else split_piece_nnz(nnz, max_row_nnz, dtype)


def check_indices(rowptr: torch.Tensor) -> None:
    """The kernel reads int32 indices (X's dtype and device are checked with the path)."""
    if rowptr.dtype != torch.int32:
        raise ValueError(f"path 'rows' needs int32 indices (under 2^31 nonzeros), got {rowptr.dtype}")


def permuted_rows(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CSR's rows in the order ``perm`` (``perm[i]``: the row placed at ``i``), with the
    original column ids: (rowptr, col, gather), gather[k] the canonical nonzero at position k
    (int32, like the indices)."""
    degree = (rowptr[1:] - rowptr[:-1]).long()[perm]
    starts = torch.cumsum(degree, 0) - degree
    gather = torch.repeat_interleave(rowptr[:-1].long()[perm] - starts, degree)
    gather += torch.arange(gather.numel(), device=gather.device)
    permuted_rowptr = torch.cat([starts, degree.sum().view(1)]).to(rowptr.dtype)
    return permuted_rowptr, col[gather], gather.to(rowptr.dtype)
