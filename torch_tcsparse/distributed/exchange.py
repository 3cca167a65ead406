"""The halo exchange: rows of X each rank sends to the ranks whose rows reference them, one
``all_to_all_single`` per product, and the same route backwards for their gradients.

Each exchange starts asynchronously and returns a :class:`Pending`; the caller multiplies what
needs no halo meanwhile and waits only when it needs the received rows. Rows may travel in a
16-bit dtype (``halo_dtype``): they are cast before sending and cast back on arrival, halving
the bytes on the link at the cost of rounding the halo rows once per exchange.

A part talks to its peers through :class:`Collective` (the ranks of a process group) or
:class:`EmulatedPeers` (one rank of P alone in its process, for measuring a rank's memory and
compute on one device: the other ranks' requests are given, and the rows a rank would receive
are copies of rows it holds, of the same number and width).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

HALO_DTYPES = (None, torch.bfloat16, torch.float16)


class Pending:
    """An exchange under way; :meth:`wait` returns the received rows in ``dtype``."""

    def __init__(self, work, incoming: Tensor, outgoing: Tensor, dtype: torch.dtype):
        self.work = work
        self.incoming = incoming
        # The sent rows must outlive the transfer: the caller may drop its own reference.
        self.outgoing = outgoing
        self.dtype = dtype

    def wait(self) -> Tensor:
        if self.work is not None:
            self.work.wait()
        self.outgoing = None
        return self.incoming.to(self.dtype)


class Collective:
    """The ranks of ``group`` (default: the world), through torch.distributed."""

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("a distributed part needs torch.distributed initialized (dist.init_process_group)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def check_device(self, device: torch.device) -> None:
        backend = dist.get_backend(self.group)
        if backend == "nccl" and device.type != "cuda":
            raise ValueError(f"the NCCL backend exchanges CUDA tensors, but the rows are on {device}")
        if backend == "gloo" and device.type != "cpu":
            raise ValueError(f"the gloo backend exchanges CPU tensors here, but the rows are on {device}")

    def exchange_counts(self, counts: Tensor) -> Tensor:
        """Everyone's count for this rank, from this rank's count for everyone."""
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        return received

    def exchange_ids(self, ids: Tensor, send_counts: list[int], recv_counts: list[int]) -> Tensor:
        received = ids.new_empty(sum(recv_counts))
        dist.all_to_all_single(received, ids, recv_counts, send_counts, group=self.group)
        return received

    def start(self, rows: Tensor, send_counts: list[int], recv_counts: list[int], halo_dtype=None) -> Pending:
        """Sends ``rows`` (``send_counts[r]`` of them to rank ``r``, in order) and receives
        ``recv_counts[r]`` rows from rank ``r``, without waiting for the transfer."""
        outgoing = rows.contiguous() if halo_dtype is None else rows.to(halo_dtype)
        incoming = outgoing.new_empty((sum(recv_counts), *rows.shape[1:]))
        work = dist.all_to_all_single(incoming, outgoing, recv_counts, send_counts, group=self.group, async_op=True)
        return Pending(work, incoming, outgoing, rows.dtype)


class EmulatedPeers:
    """Rank ``rank`` of ``world_size`` alone in this process. ``requested[s]``: the ids (partition
    positions, ascending) rank ``s`` needs from this rank, as the real ranks would send them at
    build time. An exchange sends nothing: what would arrive is a copy of the outgoing rows,
    repeated or cut to the number of rows expected (zeros if none go out), so buffers, copies and
    casts weigh what they would on a real rank; only the transfer is missing."""

    def __init__(self, rank: int, world_size: int, requested: list[Tensor]):
        if not 0 <= rank < world_size or len(requested) != world_size:
            raise ValueError(f"rank must be in [0, {world_size}) and requested must hold {world_size} id lists, "
                             f"got rank {rank} and {len(requested)} lists")
        self.rank = rank
        self.world_size = world_size
        self.requested = requested

    def check_device(self, device: torch.device) -> None:
        """Any device: nothing leaves it."""

    def exchange_counts(self, counts: Tensor) -> Tensor:
        return torch.tensor([ids.numel() for ids in self.requested], dtype=counts.dtype, device=counts.device)

    def exchange_ids(self, ids: Tensor, send_counts: list[int], recv_counts: list[int]) -> Tensor:
        return torch.cat([requested.to(device=ids.device, dtype=ids.dtype) for requested in self.requested])

    def start(self, rows: Tensor, send_counts: list[int], recv_counts: list[int], halo_dtype=None) -> Pending:
        outgoing = rows.contiguous() if halo_dtype is None else rows.to(halo_dtype)
        expected = sum(recv_counts)
        if outgoing.size(0) == 0:
            incoming = outgoing.new_zeros((expected, *rows.shape[1:]))
        else:
            source = torch.arange(expected, device=rows.device) % outgoing.size(0)
            incoming = outgoing.index_select(0, source)
        return Pending(None, incoming, outgoing, rows.dtype)


def peers_of(group) -> Collective | EmulatedPeers:
    """The peers of a process group (None: the world); peers given are returned as they are."""
    return group if isinstance(group, (Collective, EmulatedPeers)) else Collective(group)
