"""One rank's part of a row-partitioned graph matrix.

The rank owns the rows (nodes) at positions ``bounds[rank]:bounds[rank + 1]`` of the partition
numbering. Its rows are two ``TCSparseTensor`` blocks: the *interior* ``(own, own)`` over its own
columns, and the *boundary* ``(own, halo)`` over its halo, the other ranks' nodes its rows
reference, ordered by owner rank, then by position. The split lets the interior product run
while the halo rows are still on the link. The send lists say which own rows every other rank
needs; since halo columns come sorted by position, what rank ``s`` receives from rank ``r`` is
exactly the slice of its halo that ``r`` owns, in the order ``r`` sends it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..tensor import TCSparseTensor
from . import exchange
from .checks import check_csr, check_int


class GraphPart:
    """Build it with ``GraphPart.from_rows`` on every rank (a collective call).

    ``overlap``: the product starts the halo exchange, multiplies the interior block meanwhile
    and then the boundary block (``False``, the default: exchange first, then both products; the
    same sums). Off by default until a GPU measurement shows that the overlap pays.
    ``halo_dtype``: ``torch.bfloat16`` or ``torch.float16`` sends the halo rows and their
    gradients in 16 bits, ``None`` in the rows' own dtype."""

    def __init__(self, interior: TCSparseTensor, boundary: TCSparseTensor, halo: Tensor, send_index: Tensor,
                 send_counts: list[int], recv_counts: list[int], bounds: tuple[int, ...], rank: int,
                 peers: exchange.Collective | exchange.EmulatedPeers, overlap: bool = False, halo_dtype=None,
                 transposes: tuple[TCSparseTensor, TCSparseTensor] | None = None):
        self.interior = interior
        self.boundary = boundary
        # The backward pass multiplies by the transposes: built once here, with the part, unless
        # the blocks' own are given (a part sharing the blocks shares them too).
        self.interior_t, self.boundary_t = (interior.t(), boundary.t()) if transposes is None else transposes
        self.halo = halo
        self.send_index = send_index
        self.send_counts = send_counts
        self.recv_counts = recv_counts
        self.bounds = bounds
        self.rank = rank
        self.peers = peers
        self.overlap = _check_overlap(overlap)
        self.halo_dtype = _check_halo_dtype(halo_dtype)
        self._row_counts = None
        self._fixed = None  # (features, their version, their halo rows): fix_features

    @classmethod
    def from_rows(cls, rowptr: Tensor, col: Tensor, values: Tensor | None, bounds, group=None, *,
                  overlap: bool = False, halo_dtype=None, progress=None) -> "GraphPart":
        """This rank's part from its own rows only: ``rowptr`` (own + 1 entries) and ``col``
        (columns in partition numbering, any order, duplicates summed) of the rows at positions
        ``bounds[rank]:bounds[rank + 1]``, ``values`` (default ones, float32). Every rank of
        ``group`` (default: the world) calls it; the tensors' device is the part's, a CUDA
        device with NCCL, the CPU with gloo. ``group`` may also be an ``EmulatedPeers``: the
        part of one rank of P, built and run alone in this process. ``progress``, where given,
        is called on every rank with each stage's name as it ends ("exchange plan", "blocks",
        "transposes"): a build of billions of nonzeros takes minutes, and a caller may log them
        (the calls come at the same points on every rank, so it may run a collective)."""
        _check_overlap(overlap)
        _check_halo_dtype(halo_dtype)
        report = check_progress(progress)
        peers = exchange.peers_of(group)
        bounds = _check_bounds(bounds, peers.world_size)
        rank = peers.rank
        first, end = bounds[rank], bounds[rank + 1]
        check_csr(rowptr, col, values, end - first, bounds[-1])
        peers.check_device(rowptr.device)
        own = (col >= first) & (col < end)
        # Kept in the columns' dtype for the search below, which takes both operands alike.
        halo_ids = torch.unique(col[~own])
        halo = halo_ids.long()
        owners = torch.searchsorted(torch.tensor(bounds[1:-1], device=halo.device), halo, right=True)
        recv = torch.bincount(owners, minlength=len(bounds) - 1)
        recv_counts = recv.tolist()
        send_counts = peers.exchange_counts(recv).tolist()
        requested = peers.exchange_ids(halo, recv_counts, send_counts)
        report("exchange plan")
        interior_col = col[own]
        interior_col = (interior_col - first).to(_index_dtype(end - first))
        interior = _block(rowptr, own, interior_col, values, end - first)
        del interior_col
        boundary_col = torch.searchsorted(halo_ids, col[~own], out_int32=_index_dtype(halo.numel()) == torch.int32)
        del halo_ids
        boundary = _block(rowptr, ~own, boundary_col, values, halo.numel())
        report("blocks")
        part = cls(interior, boundary, halo, requested - first, send_counts, recv_counts, bounds, rank, peers,
                   overlap, halo_dtype)
        report("transposes")
        return part

    @property
    def num_own(self) -> int:
        return self.interior.shape[0]

    @property
    def num_halo(self) -> int:
        return self.halo.numel()

    @property
    def nnz(self) -> int:
        """Stored entries of both blocks."""
        return self.interior.nnz + self.boundary.nnz

    def block_row_counts(self) -> tuple[Tensor, Tensor]:
        """The stored entries of each own row in the interior and in the boundary block (int64)."""
        if self._row_counts is None:
            self._row_counts = (self.interior.csr.rowptr.diff().long(), self.boundary.csr.rowptr.diff().long())
        return self._row_counts

    def row_counts(self) -> Tensor:
        """The stored entries of each own row (int64)."""
        interior, boundary = self.block_row_counts()
        return interior + boundary

    @property
    def first(self) -> int:
        """Partition position of this rank's first row."""
        return self.bounds[self.rank]

    @property
    def device(self) -> torch.device:
        return self.interior.device

    @property
    def dtype(self) -> torch.dtype:
        return self.interior.dtype

    def with_values(self, interior_values: Tensor, boundary_values: Tensor) -> "GraphPart":
        """The same part with new values, each block's in its ``csr`` order (the structures,
        halo and send lists are shared)."""
        return self._replaced(self.interior.with_values(interior_values), self.boundary.with_values(boundary_values))

    def to(self, dtype: torch.dtype) -> "GraphPart":
        """The same part with values cast to ``dtype``."""
        return self._replaced(self.interior.to(dtype), self.boundary.to(dtype))

    def exchanging(self, overlap: bool, halo_dtype, peers=None) -> "GraphPart":
        """The same part (shared blocks) with another exchange: ``overlap`` and ``halo_dtype``
        as ``from_rows`` takes them; ``peers``, where given, in place of the part's own (an
        ``EmulatedPeers``: the rank alone, its epochs waiting for no other rank)."""
        return GraphPart(self.interior, self.boundary, self.halo, self.send_index, self.send_counts, self.recv_counts,
                         self.bounds, self.rank, self.peers if peers is None else peers, overlap, halo_dtype,
                         (self.interior_t, self.boundary_t))

    def _replaced(self, interior: TCSparseTensor, boundary: TCSparseTensor) -> "GraphPart":
        return GraphPart(interior, boundary, self.halo, self.send_index, self.send_counts, self.recv_counts,
                         self.bounds, self.rank, self.peers, self.overlap, self.halo_dtype)

    def gather_halo(self, x: Tensor, halo_dtype=None) -> exchange.Pending:
        """Starts receiving the halo rows of X (``x``: this rank's own rows) from their owners;
        the wait returns them, one row per halo column."""
        return self.peers.start(x.index_select(0, self.send_index), self.send_counts, self.recv_counts, halo_dtype)

    def fix_features(self, x: Tensor) -> None:
        """Marks ``x`` (this rank's rows of the input features) as fixed through training: the
        first product of this part by this very tensor receives its halo rows, and every later
        one reuses them, so they cross the link once, not at every epoch. ``x`` must not require
        grad (no gradient returns through rows received once); a product after an in-place
        change of ``x`` raises (call again to receive them anew)."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.requires_grad:
            raise ValueError("fix_features takes features that stay fixed, but x requires grad")
        if x.dim() != 2 or x.size(0) != self.num_own:
            raise ValueError(f"x must have shape [{self.num_own}, N] (this rank's rows), got {tuple(x.shape)}")
        if x.dtype != self.dtype or x.device != self.device:
            raise ValueError(f"x must be {self.dtype} on {self.device} like the part, got {x.dtype} on {x.device}")
        self._fixed = (x, x._version, None)

    def fixed_halo(self, x: Tensor) -> Tensor | None:
        """The halo rows of ``x`` where ``fix_features`` fixed this very tensor (received at the
        first call: a collective then, as every product is), else None."""
        if self._fixed is None or self._fixed[0] is not x:
            return None
        _, version, halo = self._fixed
        if x._version != version:
            raise ValueError("the features given to fix_features changed in place since; call fix_features "
                             "again to receive their halo rows anew")
        if x.requires_grad:
            # Rows received once return no gradient: the halo's share of it would be lost.
            raise ValueError("the features given to fix_features require grad since; fixed features take none")
        if halo is None:
            halo = self.gather_halo(x.contiguous(), self.halo_dtype).wait()
            self._fixed = (x, version, halo)
        return halo

    def scatter_halo(self, grad_halo: Tensor, halo_dtype=None) -> exchange.Pending:
        """Starts returning the halo gradients to their owners; the wait returns the gradients
        the other ranks hold for this rank's rows ``send_index`` (to be added there)."""
        return self.peers.start(grad_halo, self.recv_counts, self.send_counts, halo_dtype)

    def halo_bytes(self, width: int, element_size: int) -> int:
        """Bytes one exchange of ``width`` columns sends from this rank (its receives are its
        halo rows; summed over the ranks both totals agree)."""
        return sum(self.send_counts) * width * element_size

    def __repr__(self) -> str:
        return (f"GraphPart(rank={self.rank}, rows={self.num_own}, halo={self.num_halo}, "
                f"nnz={self.interior.nnz}+{self.boundary.nnz}, send={sum(self.send_counts)}, dtype={self.dtype}, "
                f"device={self.device}, overlap={self.overlap}, halo_dtype={self.halo_dtype})")


def _block(rowptr: Tensor, keep: Tensor, col: Tensor, values: Tensor | None, num_cols: int) -> TCSparseTensor:
    """The entries ``keep`` of a CSR as a ``TCSparseTensor``; ``col`` holds their columns. The
    kept entries' row pointers are a running count of the mask (int32 where it fits) read at
    the row starts: no int64 row index per entry."""
    count_dtype = _index_dtype(keep.numel())
    kept = torch.zeros(keep.numel() + 1, dtype=count_dtype, device=keep.device)
    torch.cumsum(keep, 0, dtype=count_dtype, out=kept[1:])
    block_rowptr = kept[rowptr]
    del kept
    block_values = (torch.ones(col.numel(), dtype=torch.float32, device=col.device) if values is None
                    else values[keep])
    return TCSparseTensor.from_csr(block_rowptr, col, block_values, shape=(rowptr.numel() - 1, num_cols))


def _index_dtype(bound: int) -> torch.dtype:
    """int32 where every index below ``bound`` fits it."""
    return torch.int32 if bound <= torch.iinfo(torch.int32).max else torch.int64


def check_progress(progress):
    """``progress`` as a function of the stage's name (None: one that does nothing)."""
    if progress is None:
        return lambda stage: None
    if not callable(progress):
        raise TypeError(f"progress must be a function of the stage's name or None, got {type(progress).__name__}")
    return progress


def _check_overlap(overlap) -> bool:
    if not isinstance(overlap, bool):
        raise TypeError(f"overlap must be a bool, got {type(overlap).__name__}")
    return overlap


def _check_halo_dtype(halo_dtype):
    if not any(halo_dtype is choice for choice in exchange.HALO_DTYPES):
        raise ValueError(f"halo_dtype must be one of {exchange.HALO_DTYPES}, got {halo_dtype!r}")
    return halo_dtype


def _check_bounds(bounds, world_size: int) -> tuple[int, ...]:
    if isinstance(bounds, Tensor):
        bounds = bounds.tolist()
    if not isinstance(bounds, (tuple, list)):
        raise TypeError(f"bounds must be a sequence of ints, got {type(bounds).__name__}")
    bounds = tuple(check_int("bounds entry", b, 0, None) for b in bounds)
    if len(bounds) != world_size + 1:
        raise ValueError(f"bounds must have world_size + 1 = {world_size + 1} entries, got {len(bounds)}")
    if bounds[0] != 0 or any(b > c for b, c in zip(bounds, bounds[1:])):
        raise ValueError(f"bounds must start at 0 and never decrease, got {bounds}")
    return bounds
