"""TCU-Cache-Aware reordering (DTC-SpMM, ASPLOS'24, section 4.3, Algorithm 1), vectorized.

Hierarchy I: rows with high Jaccard similarity are merged, most similar pair first, into
clusters of at most ``window`` rows (one ME-TCF row window), so each window condenses few
distinct columns into few Tensor-Core blocks. Hierarchy II: the resulting windows are merged the
same way into groups of ``group`` windows with similar column sets, which run as neighbouring
thread blocks and share rows of X in L2.

Differences from the paper, for speed and for the ME-TCF layout:
- Candidate pairs come from sorting cluster MinHash signatures: for each of ``bands`` hashes,
  clusters sharing that hash's minimum (hence a column) are adjacent after sorting by it and
  the next hash, and each cluster is paired with its next ``neighbours`` in that order. Rounds
  recompute the signatures of merged clusters (the MinHash of a union is the elementwise min),
  so candidates follow the clusters as they grow instead of being fixed once.
- Merging takes every locally dominant pair per round (see ``_clusters``) and never exceeds
  ``window`` rows, where Algorithm 1 may overshoot and retire the cluster.
- Leftover partial clusters are packed into full windows (exact complements first) so every
  cluster starts on a window boundary: a 15-row cluster would otherwise shift all later ones.
"""
from __future__ import annotations

import torch

from ..formats.csr import CSR
from ._clusters import Clusters, dominant_matching, full_first_positions, offset_pairs, pack_windows, pair_keys, row_order
from ._minhash import estimated_jaccard, group_signatures, row_signatures, unshifted

# 32 hashes and 16 sorted bands rather than 16 and 8: fewer blocks on the real graphs and R-MAT
# for about 4x the candidate work, still a few sorts and gathers per round (docs/DECISIONS.md).
NUM_HASHES = 32
BANDS = 16
NEIGHBOURS = 2
# Hierarchy I needs log2(16) = 4 rounds when every merge doubles a cluster, but a round only
# takes locally dominant pairs, so a power-law graph leaves many rows outside full windows after
# a few dozen rounds. Late rounds touch only the few unfinished clusters, so they are cheap, and
# 48 rounds give fewer blocks than 24 (docs/DECISIONS.md).
ROUNDS_ROWS = 48
ROUNDS_GROUPS = 10
# Windows per cache group: about one wave of thread blocks on a GPU of 132 SMs.
GROUP_WINDOWS = 128


def lsh_candidates(sig: torch.Tensor, active: torch.Tensor, bands: int, neighbours: int):
    """Pairs of active clusters that share a MinHash value and sit close in sorted signature order."""
    us, vs = [], []
    num_hashes = sig.shape[1]
    for band in range(bands):
        first = unshifted(sig[active, band % num_hashes])
        second = unshifted(sig[active, (band + 1) % num_hashes])
        # The secondary hash loses its lowest bit so the key fits int64 (EMPTY is 2^31); a stable
        # sort keeps ties in id order, so the candidates (and the result) are the same on every run.
        order = active[torch.argsort((first << 31) | (second >> 1), stable=True)]
        u, v = offset_pairs(order, neighbours)
        same = sig[u, band % num_hashes] == sig[v, band % num_hashes]
        us.append(u[same])
        vs.append(v[same])
    u, v = torch.cat(us), torch.cat(vs)
    # Similar clusters meet in many bands: about half the pairs are repeats, dropped before the
    # 32-hash comparison that dominates a round.
    width = int(sig.shape[0])
    pair = torch.unique(torch.minimum(u, v) * width + torch.maximum(u, v))
    return pair // width, pair % width


def agglomerate(clusters: Clusters, sig: torch.Tensor, cap: int, rounds: int, seed: int, split: bool) -> Clusters:
    """Merge the most similar clusters (estimated Jaccard of their unions), at most ``cap`` members each.

    With ``split``, two partial clusters may merge past ``cap`` and the merged cluster is cut
    after its first ``cap`` rows: two 13-row halves of one community become a full window and
    a 10-row rest instead of both staying stuck below ``cap``.
    """
    limit = 2 * cap - 2 if split else cap
    for step in range(rounds):
        count = clusters.count
        active = torch.nonzero(clusters.size < cap).flatten()
        if active.numel() < 2:
            break
        group_sig = group_signatures(sig, clusters.labels, count)
        u, v = lsh_candidates(group_sig, active, BANDS, NEIGHBOURS)
        fits = clusters.size[u] + clusters.size[v] <= limit
        u, v = u[fits], v[fits]
        if u.numel() == 0:
            break
        weight = estimated_jaccard(group_sig, u, v)
        keep, absorbed = dominant_matching(u, v, pair_keys(u, v, weight, seed * 1009 + step), count)
        if keep.numel() == 0:
            break
        clusters = clusters.merge(keep, absorbed)
        if split:
            clusters = clusters.split_oversize(cap)
    return clusters


def tca_order(csr: CSR, window: int, seed: int, group: int = GROUP_WINDOWS) -> torch.Tensor:
    sig = row_signatures(csr, NUM_HASHES, seed)
    device = sig.device

    rows = agglomerate(Clusters.singletons(csr.num_rows, device), sig, window, ROUNDS_ROWS, seed, split=True)
    rows = pack_windows(rows, window)

    # Hierarchy II over the windows (full clusters): groups of up to ``group`` windows.
    window_sig = group_signatures(sig, rows.labels, rows.count)
    full = torch.nonzero(rows.size == window).flatten()
    groups = agglomerate(
        Clusters.singletons(full.numel(), device), window_sig[full], group, ROUNDS_GROUPS, seed + 1, split=False
    )
    window_key = torch.zeros(rows.count, dtype=torch.long, device=device)
    window_key[full] = groups.labels * max(full.numel(), 1) + groups.rank
    partial = torch.nonzero(rows.size < window).flatten()
    window_key[partial] = torch.arange(partial.numel(), device=device)
    return row_order(rows, full_first_positions(rows, window, window_key))
