"""One rank's part of a row-partitioned graph matrix.

The rank owns the rows (nodes) at positions ``bounds[rank]:bounds[rank + 1]`` of the partition
numbering. Its matrix is a ``TCSparseTensor`` of shape ``(own, own + halo)``: columns
``0..own-1`` are its own nodes, the rest its halo, the other ranks' nodes its rows reference,
ordered by owner rank, then by position. The send lists say which own rows every other rank
needs; since halo columns come sorted by position, what rank ``s`` receives from rank ``r`` is
exactly the slice of its halo that ``r`` owns, in the order ``r`` sends it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..tensor import TCSparseTensor
from . import exchange
from .checks import check_csr, check_int


class GraphPart:
    """Build it with ``GraphPart.from_rows`` on every rank (a collective call)."""

    def __init__(self, matrix: TCSparseTensor, halo: Tensor, send_index: Tensor, send_counts: list[int],
                 recv_counts: list[int], bounds: tuple[int, ...], rank: int, group):
        self.matrix = matrix
        # The backward pass multiplies by the transpose: built once here, with the part.
        self.matrix_t = matrix.t()
        self.halo = halo
        self.send_index = send_index
        self.send_counts = send_counts
        self.recv_counts = recv_counts
        self.bounds = bounds
        self.rank = rank
        self.group = group

    @classmethod
    def from_rows(cls, rowptr: Tensor, col: Tensor, values: Tensor | None, bounds, group=None) -> "GraphPart":
        """This rank's part from its own rows only: ``rowptr`` (own + 1 entries) and ``col``
        (columns in partition numbering, any order, duplicates summed) of the rows at positions
        ``bounds[rank]:bounds[rank + 1]``, ``values`` (default ones, float32). Every rank of
        ``group`` (default: the world) calls it; the tensors' device is the part's, a CUDA
        device with NCCL, the CPU with gloo."""
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("GraphPart.from_rows needs torch.distributed initialized (dist.init_process_group)")
        bounds = _check_bounds(bounds, dist.get_world_size(group))
        rank = dist.get_rank(group)
        first, end = bounds[rank], bounds[rank + 1]
        check_csr(rowptr, col, values, end - first, bounds[-1])
        _check_device(rowptr.device, group)
        col = col.long()
        own = (col >= first) & (col < end)
        halo = torch.unique(col[~own])
        local_col = torch.where(own, col - first, (end - first) + torch.searchsorted(halo, col))
        owners = torch.searchsorted(torch.tensor(bounds[1:-1], device=halo.device), halo, right=True)
        recv = torch.bincount(owners, minlength=len(bounds) - 1)
        recv_counts = recv.tolist()
        send_counts = exchange.exchange_counts(recv, group).tolist()
        requested = exchange.exchange_ids(halo, recv_counts, send_counts, group)
        if values is None:
            values = torch.ones(col.numel(), dtype=torch.float32, device=col.device)
        matrix = TCSparseTensor.from_csr(rowptr, local_col, values, shape=(end - first, end - first + halo.numel()))
        return cls(matrix, halo, requested - first, send_counts, recv_counts, bounds, rank, group)

    @property
    def num_own(self) -> int:
        return self.matrix.shape[0]

    @property
    def num_halo(self) -> int:
        return self.halo.numel()

    @property
    def first(self) -> int:
        """Partition position of this rank's first row."""
        return self.bounds[self.rank]

    @property
    def device(self) -> torch.device:
        return self.matrix.device

    @property
    def dtype(self) -> torch.dtype:
        return self.matrix.dtype

    def with_values(self, values: Tensor) -> "GraphPart":
        """The same part with new values in ``matrix.csr`` order (the structure, halo and send
        lists are shared)."""
        return self._replaced(self.matrix.with_values(values))

    def to(self, dtype: torch.dtype) -> "GraphPart":
        """The same part with values cast to ``dtype``."""
        return self._replaced(self.matrix.to(dtype))

    def _replaced(self, matrix: TCSparseTensor) -> "GraphPart":
        return GraphPart(matrix, self.halo, self.send_index, self.send_counts, self.recv_counts, self.bounds,
                         self.rank, self.group)

    def gather_halo(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """The halo rows of X (``x``: this rank's own rows), from their owners; received into
        ``out`` when given."""
        return exchange.send_halo(x, self.send_index, self.send_counts, self.recv_counts, self.group, out)

    def scatter_halo(self, grad_halo: Tensor, grad_own: Tensor) -> Tensor:
        """``grad_own`` plus the halo gradients the other ranks hold for this rank's rows."""
        return exchange.return_halo(grad_halo, self.send_index, self.send_counts, self.recv_counts, self.group,
                                    grad_own)

    def halo_bytes(self, width: int, element_size: int) -> int:
        """Bytes one exchange of ``width`` columns sends from this rank (its receives are its
        halo rows; summed over the ranks both totals agree)."""
        return sum(self.send_counts) * width * element_size

    def __repr__(self) -> str:
        return (f"GraphPart(rank={self.rank}, rows={self.num_own}, halo={self.num_halo}, nnz={self.matrix.nnz}, "
                f"send={sum(self.send_counts)}, dtype={self.dtype}, device={self.device})")


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


def _check_device(device: torch.device, group) -> None:
    backend = dist.get_backend(group)
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"the NCCL backend exchanges CUDA tensors, but the rows are on {device}")
    if backend == "gloo" and device.type != "cpu":
        raise ValueError(f"the gloo backend exchanges CPU tensors here, but the rows are on {device}")
