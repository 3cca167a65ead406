"""Parallel agglomeration of rows into clusters: the engine behind "tca" and "shuffle".

The papers merge clusters one pair at a time from a priority queue. Here every round takes all
*locally dominant* candidate pairs at once (a pair that is the best of both its clusters) and
merges them: sequential greedy matching would also take exactly those pairs first, so iterating
rounds follows the greedy order while each round is a handful of sorts and scatters on the
device. A cluster records the order its members arrived in (``rank``), the analogue of the
papers' list concatenation on Merge(Ci, Cj).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._minhash import MASK31, mix31

# Weights in [0, 1] are quantised to 20 bits above a 31-bit tie-break hash, so one int64 key
# orders candidate pairs by weight first and breaks ties pseudo-randomly (but per seed).
WEIGHT_BITS = 20


@dataclass
class Clusters:
    """``labels[row]`` is the cluster of each row (0..count-1), ``rank[row]`` its place inside it."""

    labels: torch.Tensor
    rank: torch.Tensor
    size: torch.Tensor

    @classmethod
    def singletons(cls, num_items: int, device) -> "Clusters":
        labels = torch.arange(num_items, device=device)
        return cls(labels, torch.zeros_like(labels), torch.ones_like(labels))

    @property
    def count(self) -> int:
        return self.size.numel()

    def merge(self, keep: torch.Tensor, absorbed: torch.Tensor) -> "Clusters":
        """Merge each ``absorbed[i]`` into ``keep[i]`` (a matching or a star: ``absorbed`` distinct)."""
        count = self.count
        parent = torch.arange(count, device=self.size.device)
        parent[absorbed] = keep
        # Absorbed members queue behind the keeper's; several absorbed into one keeper queue in
        # the order they are listed.
        order = torch.argsort(keep * count + absorbed)
        keep_sorted, absorbed_sorted = keep[order], absorbed[order]
        sizes = self.size[absorbed_sorted]
        before = torch.cumsum(sizes, 0) - sizes
        first_of_keeper = torch.searchsorted(keep_sorted, keep_sorted)
        offset = torch.zeros(count, dtype=torch.long, device=parent.device)
        offset[absorbed_sorted] = self.size[keep_sorted] + before - before[first_of_keeper]
        rank = self.rank + offset[self.labels]
        is_root = parent == torch.arange(count, device=parent.device)
        new_id = torch.cumsum(is_root.long(), 0) - 1
        labels = new_id[parent[self.labels]]
        size = torch.bincount(labels, minlength=int(is_root.sum()))
        return Clusters(labels, rank, size)


    def split_oversize(self, cap: int) -> "Clusters":
        """Cut every cluster above ``cap`` rows after its first ``cap`` arrivals; the rest become new clusters."""
        over = self.size > cap
        if not bool(over.any()):
            return self
        count = self.count
        tail_id = torch.full((count,), -1, dtype=torch.long, device=self.size.device)
        tail_id[over] = count + torch.arange(int(over.sum()), device=self.size.device)
        moves = (self.rank >= cap) & over[self.labels]
        labels = torch.where(moves, tail_id[self.labels], self.labels)
        rank = torch.where(moves, self.rank - cap, self.rank)
        size = torch.bincount(labels, minlength=count + int(over.sum()))
        return Clusters(labels, rank, size)


def pair_keys(u: torch.Tensor, v: torch.Tensor, weight: torch.Tensor, salt: int) -> torch.Tensor:
    """Unique-ish int64 priority per unordered pair: quantised weight, then a seeded hash."""
    low, high = torch.minimum(u, v), torch.maximum(u, v)
    tie = mix31((low * 0x9E3779B1 + high) & MASK31, (2 * salt + 1, salt, 0x5BD1E995))
    quantised = (weight.clamp(0, 1) * ((1 << WEIGHT_BITS) - 1)).round().long()
    return (quantised << 31) | tie


def dominant_matching(u: torch.Tensor, v: torch.Tensor, key: torch.Tensor, count: int, sweeps: int = 4):
    """Pairs (keep, absorbed) whose key is the maximum at both ends: a matching, in parallel.

    Each sweep drops the pairs touching a cluster matched by an earlier sweep and matches again
    among the rest, as the sequential greedy would go on down its queue: one sweep alone leaves
    clusters whose best partner was taken unmatched until the next round.
    """
    keeps, absorbeds = [], []
    matched = torch.zeros(count, dtype=torch.bool, device=key.device)
    for _ in range(sweeps):
        free = ~matched[u] & ~matched[v] & (u != v)
        u, v, key = u[free], v[free], key[free]
        if u.numel() == 0:
            break
        best = torch.full((count,), -1, dtype=torch.long, device=key.device)
        best.scatter_reduce_(0, u, key, "amax")
        best.scatter_reduce_(0, v, key, "amax")
        chosen = (best[u] == key) & (best[v] == key)
        low = torch.minimum(u[chosen], v[chosen])
        high = torch.maximum(u[chosen], v[chosen])
        pair = torch.unique(low * count + high)
        low, high = pair // count, pair % count
        # Two different pairs can share a key only through a tie-hash collision; drop both then.
        hits = torch.bincount(torch.cat([low, high]), minlength=count)
        ok = (hits[low] == 1) & (hits[high] == 1)
        low, high = low[ok], high[ok]
        if low.numel() == 0:
            break
        matched[low] = True
        matched[high] = True
        keeps.append(low)
        absorbeds.append(high)
    if not keeps:
        return u[:0], u[:0]
    return torch.cat(keeps), torch.cat(absorbeds)


def offset_pairs(order: torch.Tensor, offsets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs of items 1..offsets apart in ``order``: the neighbours a sorted sweep would compare."""
    us, vs = [], []
    for d in range(1, offsets + 1):
        us.append(order[:-d])
        vs.append(order[d:])
    return torch.cat(us), torch.cat(vs)


def union_sizes(rows: torch.Tensor, col: torch.Tensor, labels: torch.Tensor, count: int, num_cols: int) -> torch.Tensor:
    """Exact number of distinct columns of every cluster (int64 [count])."""
    width = max(num_cols, 1)
    pairs = torch.unique(labels[rows] * width + col)
    return torch.bincount(pairs // width, minlength=count)


def fit_pairs(clusters: Clusters, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial clusters paired so that their sizes add up to exactly ``cap`` (one full window)."""
    size = clusters.size
    partial = torch.nonzero(size < cap).flatten()
    s = size[partial]
    order = torch.argsort(s * clusters.count + partial)
    partial, s = partial[order], s[order]
    counts = torch.bincount(s, minlength=cap + 1)
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(partial.numel(), device=size.device) - start[s]
    complement = cap - s
    smaller = (s < complement) & (rank < counts[complement])
    partner = start[complement] + rank
    # Clusters of exactly half a window pair up among themselves: ranks 0-1, 2-3, ...
    halves = (s == complement) & (rank % 2 == 0) & (rank + 1 < counts[s])
    a = torch.cat([partial[smaller], partial[halves]])
    b = torch.cat([partial[partner[smaller]], partial[torch.nonzero(halves).flatten() + 1]])
    return a, b


def extreme_pairs(clusters: Clusters, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest partial cluster with the smallest, second largest with second smallest, ... when they fit."""
    size = clusters.size
    partial = torch.nonzero(size < cap).flatten()
    if partial.numel() < 2:
        return partial[:0], partial[:0]
    s = size[partial]
    pairable = s + s.min() <= cap
    partial, s = partial[pairable], s[pairable]
    order = torch.argsort(s * clusters.count + partial)
    partial, s = partial[order], s[order]
    half = partial.numel() // 2
    small, large = partial[:half], partial.flip(0)[:half]
    fits = s[:half] + s.flip(0)[:half] <= cap
    return large[fits], small[fits]


def pack_windows(clusters: Clusters, cap: int, max_rounds: int = 32) -> Clusters:
    """Combine partial clusters into clusters of ``cap`` rows so windows line up with clusters.

    Exact complements first (a 10-row and a 6-row cluster fill one window), then largest with
    smallest; whatever is left cannot pair (every two sizes add to more than ``cap``).
    """
    for _ in range(max_rounds):
        a, b = fit_pairs(clusters, cap)
        if a.numel() == 0:
            a, b = extreme_pairs(clusters, cap)
        if a.numel() == 0:
            break
        clusters = clusters.merge(a, b)
    return clusters


def row_order(clusters: Clusters, cluster_position: torch.Tensor) -> torch.Tensor:
    """Rows sorted by their cluster's position, then by arrival inside the cluster."""
    n = clusters.labels.numel()
    key = cluster_position[clusters.labels] * max(n, 1) + clusters.rank
    return torch.argsort(key)


def full_first_positions(clusters: Clusters, cap: int, key: torch.Tensor) -> torch.Tensor:
    """Position of every cluster: full clusters first (ordered by ``key``), partial ones after.

    Putting every leftover partial cluster after the full ones keeps every full cluster on a
    window boundary; only the leftovers straddle windows.
    """
    partial = (clusters.size < cap).long()
    order = torch.argsort(partial * (key.max() + 1 if key.numel() else 1) + key, stable=True)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=order.device)
    return position
