"""Uniform draws of neighbours without replacement for many nodes at once, in torch ops.

Each node of a frontier keeps all its neighbours when it has at most ``k``, else ``k`` of them
drawn uniformly without replacement. The draw is Robert Floyd's algorithm run on every such node
together: ``k`` vectorized steps, each one random number per node and a comparison with the
picks so far, so the work is ``k**2`` per node whatever its degree (a hub of a million
neighbours costs what a node of ``k + 1`` costs), where random keys sorted per row would cost the
whole neighbourhood.
"""
from __future__ import annotations

import torch


def floyd_offsets(degree: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """``[len(degree), k]`` distinct offsets in ``[0, degree[i])`` per row, each k-subset equally
    likely (Floyd: for j = n - k .. n - 1, draw t in [0, j]; keep t unless already kept, else j).
    Every ``degree`` must exceed ``k``."""
    picks = degree.new_empty(degree.numel(), k)
    for step in range(k):
        last = degree - k + step
        # float64 draws resolve [0, last] for any degree an int64 CSR holds to within 2**-53
        # of uniform; the clamp guards the product rounding up to last + 1.
        drawn = torch.rand(degree.numel(), dtype=torch.float64, device=degree.device, generator=generator)
        t = torch.minimum((drawn * (last + 1).double()).long(), last)
        taken = (picks[:, :step] == t.unsqueeze(1)).any(dim=1)
        picks[:, step] = torch.where(taken, last, t)
    return picks


def choose_neighbors(rowptr: torch.Tensor, col: torch.Tensor, frontier: torch.Tensor, k: int,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(owner, neighbor, longest)``: the neighbours kept for each node of ``frontier`` (its
    position in ``frontier`` and the neighbour's id), grouped by owner in frontier order, and the
    most any node kept. ``k < 0`` keeps every neighbour."""
    start = rowptr[frontier]
    degree = rowptr[frontier + 1] - start
    kept = degree if k < 0 else degree.clamp(max=k)
    positions = torch.arange(frontier.numel(), device=frontier.device)
    # One host read gives the edge count, which repeat_interleave would read anyway, and the
    # longest row of the hop's block, which the block's products then need not read back.
    total, longest = torch.stack([kept.sum(), kept.max()]).tolist() if kept.numel() else (0, 0)
    owner = torch.repeat_interleave(positions, kept, output_size=total)
    rank = torch.arange(owner.numel(), device=owner.device) - (kept.cumsum(0) - kept)[owner]
    offset = rank
    if k >= 0:
        drawn = degree > k
        picks = floyd_offsets(degree[drawn], k, generator)
        # Rows that draw read their row of picks at their ranks (0 .. k-1); the others read a row
        # of zeros appended at the end, and keep their rank.
        pick_row = torch.where(drawn, drawn.long().cumsum(0) - 1, picks.size(0))
        picks = torch.cat([picks, picks.new_zeros(1, k)]).view(-1)
        offset = torch.where(drawn[owner], picks[pick_row[owner] * k + rank], rank)
    return owner, col[start[owner] + offset].long(), longest
