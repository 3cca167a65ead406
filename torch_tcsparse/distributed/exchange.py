"""The halo exchange: rows of X each rank sends to the ranks whose rows reference them, one
``all_to_all_single`` per product, and the same route backwards for their gradients.

Each exchange starts asynchronously and returns a :class:`Pending`; the caller multiplies what
needs no halo meanwhile and waits only when it needs the received rows. Rows may travel in a
16-bit dtype (``halo_dtype``): they are cast before sending and cast back on arrival, halving
the bytes on the link at the cost of rounding the halo rows once per exchange.
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


def start(rows: Tensor, send_counts: list[int], recv_counts: list[int], group, halo_dtype=None) -> Pending:
    """Sends ``rows`` (``send_counts[r]`` of them to rank ``r``, in order) and receives
    ``recv_counts[r]`` rows from rank ``r``, without waiting for the transfer."""
    outgoing = rows.contiguous() if halo_dtype is None else rows.to(halo_dtype)
    incoming = outgoing.new_empty((sum(recv_counts), *rows.shape[1:]))
    work = dist.all_to_all_single(incoming, outgoing, recv_counts, send_counts, group=group, async_op=True)
    return Pending(work, incoming, outgoing, rows.dtype)


def send_halo(x: Tensor, send_index: Tensor, send_counts: list[int], recv_counts: list[int], group,
              halo_dtype=None) -> Pending:
    """Starts sending this rank's rows ``send_index`` of ``x``; the wait returns this rank's halo
    rows, ordered by owner rank, then by the owner's row order."""
    return start(x.index_select(0, send_index), send_counts, recv_counts, group, halo_dtype)


def return_halo(grad_halo: Tensor, send_counts: list[int], recv_counts: list[int], group, halo_dtype=None) -> Pending:
    """Starts sending the halo gradients back to their owners; the wait returns the gradients the
    other ranks computed for this rank's rows ``send_index``, in its order (to be added there)."""
    return start(grad_halo, recv_counts, send_counts, group, halo_dtype)


def exchange_counts(counts: Tensor, group) -> Tensor:
    """Everyone's count for this rank, from this rank's count for everyone."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    return received


def exchange_ids(ids: Tensor, send_counts: list[int], recv_counts: list[int], group) -> Tensor:
    received = ids.new_empty(sum(recv_counts))
    dist.all_to_all_single(received, ids, recv_counts, send_counts, group=group)
    return received
