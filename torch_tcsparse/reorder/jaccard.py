"""Sylos Labini's greedy Jaccard clustering, SMaT's preprocessing (Okanovic et al., SC'24, IV-C).

Sequentially: open a cluster at the first unclustered row, let every later row join while its
Jaccard distance to the union of the cluster's rows is below ``tau``, repeat. Clusters have no
size limit and are laid out in the order they were opened, rows inside in row order.

In parallel, rounds of star contraction: each singleton row flips a seeded coin; rows that come
up tails look at candidate clusters (rows and clusters sharing a MinHash value, adjacent in
sorted signature order) and join the one whose union is closest, if closer than ``tau``.
Distances are to the union as it stood at the start of the round; the MinHash of the new union
is the elementwise min, so the next round measures against the grown cluster.
"""
from __future__ import annotations

import torch

from ..formats.csr import CSR
from ._clusters import Clusters, pair_keys
from ._minhash import MASK31, estimated_jaccard, group_signatures, mix31, row_signatures
from .tca import lsh_candidates

NUM_HASHES = 16
BANDS = 8
NEIGHBOURS = 2
ROUNDS = 16
# Join when at least 40% of the union is shared (distance below 0.6): ten-column rows sharing
# six columns with a cluster's union of ten join it.
TAU = 0.6


def jaccard_order(csr: CSR, window: int, seed: int, tau: float = TAU) -> torch.Tensor:
    del window  # SMaT's clusters are unbounded; windows cut them wherever they fall
    device = csr.col.device
    sig = row_signatures(csr, NUM_HASHES, seed)
    clusters = Clusters.singletons(csr.num_rows, device)
    row_ids = torch.arange(csr.num_rows, device=device)
    for step in range(ROUNDS):
        count = clusters.count
        leader = torch.full((count,), csr.num_rows, dtype=torch.long, device=device)
        leader.scatter_reduce_(0, clusters.labels, row_ids, "amin")
        coin = mix31(leader & MASK31, (2 * (seed * 131 + step) + 1, step, 0x2C1B3C6D)) & 1
        satellite = (clusters.size == 1) & (coin == 1)
        group_sig = group_signatures(sig, clusters.labels, count)
        u, v = lsh_candidates(group_sig, torch.arange(count, device=device), BANDS, NEIGHBOURS)
        # Orient every candidate pair from satellite to centre; pairs of two satellites or two
        # centres are dropped.
        sat_u, sat_v = satellite[u], satellite[v]
        joiner = torch.cat([u[sat_u & ~sat_v], v[sat_v & ~sat_u]])
        centre = torch.cat([v[sat_u & ~sat_v], u[sat_v & ~sat_u]])
        similarity = estimated_jaccard(group_sig, joiner, centre)
        close = similarity > 1 - tau
        joiner, centre, similarity = joiner[close], centre[close], similarity[close]
        if joiner.numel() == 0:
            continue
        key = pair_keys(joiner, centre, similarity, seed * 1009 + step)
        best = torch.full((count,), -1, dtype=torch.long, device=device)
        best.scatter_reduce_(0, joiner, key, "amax")
        chosen = torch.nonzero(best[joiner] == key).flatten()
        chosen = chosen[torch.argsort(joiner[chosen], stable=True)]
        joiner, centre = joiner[chosen], centre[chosen]
        first = torch.ones(joiner.numel(), dtype=torch.bool, device=device)
        first[1:] = joiner[1:] != joiner[:-1]
        clusters = clusters.merge(centre[first], joiner[first])

    leader = torch.full((clusters.count,), csr.num_rows, dtype=torch.long, device=device)
    leader.scatter_reduce_(0, clusters.labels, row_ids, "amin")
    return torch.argsort(leader[clusters.labels] * max(csr.num_rows, 1) + row_ids)
