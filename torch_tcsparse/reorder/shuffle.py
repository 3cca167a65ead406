"""Tiled-CSR row shuffle (Xue et al., ICCD'23, section III-B/C, Algorithms 1-3), vectorized.

Rows are presorted by the sum of their squared column ids, which puts rows with similar column
sets close together; each row then only looks for partners within a bounded distance in that
order. Two clusters join when they are *similar* (their union is less than ``1 + threshold``
times the larger of the two: Algorithm 2) or *complementary* (their union still fits in
``complement_width`` columns: Algorithm 3, one 8-column TC block here), up to ``window`` rows.

The paper fills one slot at a time while scanning; here all clusters look at their
``neighbours`` nearest clusters in presorted order at once, and every round merges the locally
dominant acceptable pairs (see ``_clusters``). Union sizes are the exact distinct-column counts
of both clusters, combined through the MinHash Jaccard estimate: |A u B| = (|A| + |B|) / (1 + J).
"""
from __future__ import annotations

import torch

from ..formats.csr import CSR
from ..formats.metcf import BLOCK_WIDTH
from ._clusters import Clusters, dominant_matching, full_first_positions, offset_pairs, pack_windows, pair_keys, row_order, union_sizes
from ._minhash import estimated_jaccard, group_signatures, row_signatures

NUM_HASHES = 16
NEIGHBOURS = 8
ROUNDS = 24
# Similar when the union grows the larger row by less than 50%: two rows of 10 columns sharing
# 7 of them (union 13) match, sharing 4 (union 16) do not.
THRESHOLD = 0.5


def presort_key(csr: CSR) -> torch.Tensor:
    """Sum of squared column ids per row (float64: 2M columns squared times 1e5 nonzeros fit)."""
    col = csr.col.double()
    key = torch.zeros(csr.num_rows, dtype=torch.float64, device=col.device)
    return key.index_add_(0, csr.row_indices(), col * col)


def shuffle_order(csr: CSR, window: int, seed: int, threshold: float = THRESHOLD,
                  complement_width: int = BLOCK_WIDTH) -> torch.Tensor:
    device = csr.col.device
    rows_of_nnz, col = csr.row_indices(), csr.col.long()
    sig = row_signatures(csr, NUM_HASHES, seed)
    presorted = torch.argsort(presort_key(csr), stable=True)
    position = torch.empty_like(presorted)
    position[presorted] = torch.arange(csr.num_rows, device=device)

    clusters = Clusters.singletons(csr.num_rows, device)
    for step in range(ROUNDS):
        count = clusters.count
        first = torch.full((count,), csr.num_rows, dtype=torch.long, device=device)
        first.scatter_reduce_(0, clusters.labels, position, "amin")
        active = torch.nonzero(clusters.size < window).flatten()
        if active.numel() < 2:
            break
        u, v = offset_pairs(active[torch.argsort(first[active])], NEIGHBOURS)
        fits = clusters.size[u] + clusters.size[v] <= window
        u, v = u[fits], v[fits]
        if u.numel() == 0:
            break
        group_sig = group_signatures(sig, clusters.labels, count)
        distinct = union_sizes(rows_of_nnz, col, clusters.labels, count, csr.num_cols).double()
        jaccard = estimated_jaccard(group_sig, u, v)
        union = (distinct[u] + distinct[v]) / (1 + jaccard.double())
        similar = union < (1 + threshold) * torch.maximum(distinct[u], distinct[v])
        complementary = union <= complement_width
        ok = similar | complementary
        u, v, jaccard = u[ok], v[ok], jaccard[ok]
        keep, absorbed = dominant_matching(u, v, pair_keys(u, v, jaccard, seed * 1009 + step), count)
        if keep.numel() == 0:
            break
        clusters = clusters.merge(keep, absorbed)

    clusters = pack_windows(clusters, window)
    first = torch.full((clusters.count,), csr.num_rows, dtype=torch.long, device=device)
    first.scatter_reduce_(0, clusters.labels, position, "amin")
    return row_order(clusters, full_first_positions(clusters, window, first))
