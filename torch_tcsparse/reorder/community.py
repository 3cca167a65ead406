"""Community order, in the spirit of Rabbit order (Arai et al., IPDPS'16), vectorised.

Rabbit order merges each vertex into the neighbour that raises modularity most and numbers the
vertices by a depth-first walk of the resulting merge tree: members of a community are
contiguous, and so are the members of each of its sub-communities. Rows that share columns then
sit side by side at every scale, which is what lets the rows kernel find X in L2 and the
Tensor-Core windows condense few columns.

Here each round merges many clusters at once. A seeded coin makes every cluster a receiver or a
sender for the round; each sender joins the receiver neighbour with the highest modularity gain
``w(a, b) - d(a) d(b) / 2m`` (if positive), so merges form stars and never chains. A cluster
records the order its members arrived in (``Clusters.rank``): the star's receiver first, then
each sender's members, which is the depth-first order of the merge tree. The cluster-level edge
list is contracted after every round (inner edges dropped, parallel edges summed), so later rounds
cost less than the first. Rows are finally sorted by (community, rank).

Symmetric mode runs on the pattern of A + A^T; row-only mode on the bipartite graph of rows and
columns (one vertex per row and per column, one edge per nonzero), keeping the rows in their
order, so that rows sharing columns join the same community for rectangular matrices too.
"""
from __future__ import annotations

import torch

from ..formats.csr import CSR
from ._clusters import Clusters
from ._minhash import MASK31, mix31

# A round at least halves the senders that have a positive gain: 32 rounds cover graphs far
# beyond 2^32 vertices' worth of halvings, and rounds stop early once nothing merges.
ROUNDS = 32


def _edges(csr: CSR, symmetric: bool):
    """(u, v, vertices, row vertices): both directions of every edge, no self loops."""
    rows, col = csr.row_indices(), csr.col.long()
    if symmetric:
        u, v, vertices = torch.cat([rows, col]), torch.cat([col, rows]), csr.num_rows
    else:
        shifted = col + csr.num_rows
        u, v, vertices = torch.cat([rows, shifted]), torch.cat([shifted, rows]), csr.num_rows + csr.num_cols
    keep = u != v
    return u[keep], v[keep], vertices


def _contract(u: torch.Tensor, v: torch.Tensor, w: torch.Tensor, count: int):
    """Parallel edges summed, edges inside a cluster dropped."""
    keep = u != v
    key, inverse = torch.unique(u[keep] * count + v[keep], return_inverse=True)
    weight = torch.zeros(key.numel(), dtype=w.dtype, device=w.device).index_add_(0, inverse, w[keep])
    return key // count, key % count, weight


def community_order(csr: CSR, symmetric: bool, seed: int, rounds: int = ROUNDS) -> torch.Tensor:
    u, v, vertices = _edges(csr, symmetric)
    device = u.device
    clusters = Clusters.singletons(vertices, device)
    u, v, w = _contract(u, v, torch.ones(u.numel(), dtype=torch.float64, device=device), vertices)
    degree = torch.zeros(vertices, dtype=torch.float64, device=device).index_add_(0, u, w)
    total = float(degree.sum())
    for step in range(rounds):
        if u.numel() == 0:
            break
        count = clusters.count
        ids = torch.arange(count, device=device)
        receiver = (mix31(ids & MASK31, (2 * (seed * 131 + step) + 1, step, 0x2C1B3C6D)) & 1) == 1
        gain = w - degree[u] * degree[v] / total
        candidate = ~receiver[u] & receiver[v] & (gain > 0)
        a, b, gain = u[candidate], v[candidate], gain[candidate]
        if a.numel() == 0:
            continue
        best = torch.full((count,), float("-inf"), dtype=torch.float64, device=device)
        best.scatter_reduce_(0, a, gain, "amax")
        top = gain == best[a]
        a, b = a[top], b[top]
        # Ties: the lowest receiver id, so the result does not depend on the sort's stability.
        order = torch.argsort(a * count + b)
        a, b = a[order], b[order]
        first = torch.ones(a.numel(), dtype=torch.bool, device=device)
        first[1:] = a[1:] != a[:-1]
        absorbed, keep = a[first], b[first]
        before = clusters
        clusters = clusters.merge(keep, absorbed)
        # Old cluster -> new cluster, read off any member of each.
        mapping = torch.empty(count, dtype=torch.long, device=device)
        mapping[before.labels] = clusters.labels
        merged_degree = torch.zeros(clusters.count, dtype=torch.float64, device=device)
        degree = merged_degree.index_add_(0, mapping, degree)
        u, v, w = _contract(mapping[u], mapping[v], w, clusters.count)
    n = csr.num_rows
    key = clusters.labels[:n] * max(vertices, 1) + clusters.rank[:n]
    return torch.argsort(key)
