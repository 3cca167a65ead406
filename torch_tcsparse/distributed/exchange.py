"""The halo exchange: rows of X each rank sends to the ranks whose rows reference them, one
``all_to_all_single`` per product, and the same route backwards for their gradients."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def send_halo(x: Tensor, send_index: Tensor, send_counts: list[int], recv_counts: list[int], group,
              out: Tensor | None = None) -> Tensor:
    """This rank's halo rows, ordered by owner rank, then by the owner's row order; written into
    ``out`` (contiguous, one row per halo row) when given."""
    outgoing = x.index_select(0, send_index)
    incoming = x.new_empty((sum(recv_counts), *x.shape[1:])) if out is None else out
    dist.all_to_all_single(incoming, outgoing, recv_counts, send_counts, group=group)
    return incoming


def return_halo(grad_halo: Tensor, send_index: Tensor, send_counts: list[int], recv_counts: list[int], group,
                grad_own: Tensor) -> Tensor:
    """``grad_own`` plus the halo gradients the other ranks computed for this rank's rows."""
    incoming = grad_halo.new_empty((sum(send_counts), *grad_halo.shape[1:]))
    dist.all_to_all_single(incoming, grad_halo.contiguous(), send_counts, recv_counts, group=group)
    return grad_own.index_add(0, send_index, incoming)


def exchange_counts(counts: Tensor, group) -> Tensor:
    """Everyone's count for this rank, from this rank's count for everyone."""
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    return received


def exchange_ids(ids: Tensor, send_counts: list[int], recv_counts: list[int], group) -> Tensor:
    received = ids.new_empty(sum(recv_counts))
    dist.all_to_all_single(received, ids, recv_counts, send_counts, group=group)
    return received
