"""The collectives that partitioning blocks of rows takes: every rank's count, a tensor gathered on
the root or scattered from it in per-rank pieces, and counts exchanged between every pair."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def gather_counts(count: int, device, group) -> tuple[int, ...]:
    """Every rank's ``count``, known on every rank, as bounds: rank r's entries are
    ``bounds[r]:bounds[r + 1]``."""
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, torch.tensor([count], dtype=torch.long, device=device), group=group)
    sizes = [int(c) for c in counts]
    return tuple([0] + torch.tensor(sizes).cumsum(0).tolist())


def to_root(tensor: Tensor, bounds: tuple[int, ...], rank: int, root: int, group) -> Tensor:
    """Every rank's ``tensor`` (``bounds[r + 1] - bounds[r]`` entries on rank r), concatenated on
    the root; empty elsewhere."""
    world = len(bounds) - 1
    send = [0] * world
    send[root] = tensor.numel()
    receive = [bounds[r + 1] - bounds[r] for r in range(world)] if rank == root else [0] * world
    out = tensor.new_empty(sum(receive))
    dist.all_to_all_single(out, tensor.contiguous(), receive, send, group=group)
    return out


def from_root(tensor: Tensor, bounds: tuple[int, ...], rank: int, root: int, group) -> Tensor:
    """The root's ``tensor`` cut by ``bounds``: rank r gets entries ``bounds[r]:bounds[r + 1]``."""
    world = len(bounds) - 1
    sizes = [bounds[r + 1] - bounds[r] for r in range(world)]
    send = sizes if rank == root else [0] * world
    receive = [0] * world
    receive[root] = sizes[rank]
    out = tensor.new_empty(sizes[rank])
    dist.all_to_all_single(out, tensor.contiguous(), receive, send, group=group)
    return out


def exchange_counts(counts: list[int], device, group) -> list[int]:
    """Every rank's count for this rank, from this rank's count for every rank."""
    send = torch.tensor(counts, dtype=torch.long, device=device)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.tolist()
