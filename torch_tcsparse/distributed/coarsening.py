"""Coarsening for the multilevel partitioner: size-constrained label propagation clusters the
nodes, and contraction merges each cluster into one node.

A node joins the neighbouring cluster it is most strongly connected to (the summed weight of its
edges into it), if the cluster stays under a weight limit, for a few rounds. Nodes move in two
halves drawn by a hash per round, a chunk of rows at a time, so that two neighbours rarely swap
clusters with each other in one step. Nodes left alone (the leaves of a hub whose cluster is
full, or nodes without edges) are grouped with the nodes that share their favourite cluster, as
KaMinPar's two-hop clustering does: without it, graphs with many low-degree nodes stop shrinking.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .hashing import hash_ids, random_bits
from .weighted_graph import (WeightedGraph, accept_within_limit, coalesce, coalesce_pieces, ordered_cumsum,
                             segment_offsets, select)

# Fine edges whose coarse edges are gathered and summed at once, in contraction.
_RANGE_EDGES = 1 << 26
# Ratings are packed as rating << _TIE_BITS | random bits, so that ties break at random in one amax.
_TIE_BITS = 20


def cluster(graph: WeightedGraph, limit: Tensor, rounds: int, seed: int) -> Tensor:
    """A cluster label per node (labels are node ids); no cluster's weight exceeds ``limit``
    (int64 per constraint) unless one of its nodes does alone."""
    n = graph.num_nodes
    device = graph.device
    labels = torch.arange(n, device=device)
    weight = graph.node_weight.clone()
    favorite = torch.full((n,), -1, dtype=torch.long, device=device)
    ids = torch.arange(n, device=device)
    for round_ in range(rounds):
        moved = 0
        half_of = hash_ids(ids, seed * 7919 + round_) & 1
        for half in (0, 1):
            movers = half_of == half
            for start, end in graph.chunks():
                moved += _move_chunk(graph, start, end, movers, labels, weight, limit, favorite, seed + round_)
        if moved < max(1, n // 100):
            break
    _merge_singletons(graph, labels, favorite, limit, seed)
    return labels


def _move_chunk(graph: WeightedGraph, start: int, end: int, movers: Tensor, labels: Tensor, weight: Tensor,
                limit: Tensor, favorite: Tensor, seed: int) -> int:
    """Moves the movers of rows start:end to their best cluster with room; returns how many moved.
    Records every such row's favourite cluster, room or not."""
    row, col, edge_weight = graph.edges(start, end)
    row, col, edge_weight = select(movers.index_select(0, row), row, col, edge_weight)
    if row.numel() == 0:
        return 0
    n, rows = graph.num_nodes, end - start
    keys, rating = coalesce((row - start) * n + labels.index_select(0, col), edge_weight)
    del row, col, edge_weight
    local = torch.div(keys, n, rounding_mode="floor")
    label = keys - local * n
    node = local + start
    own = label == labels.index_select(0, node)
    own_rating = torch.zeros(rows, dtype=torch.long, device=keys.device).index_add_(0, *select(own, local, rating))
    score = (rating << _TIE_BITS) | random_bits((keys.numel(),), _TIE_BITS, seed * 65537 + start, keys.device)
    score.masked_fill_(own, -1)
    _, favorite_label = _best(local, score, label, rows)
    favorite[start:end] = torch.where(favorite_label >= 0, favorite_label, favorite[start:end])
    fits = ((weight.index_select(0, label) + graph.node_weight.index_select(0, node)) <= limit).all(1)
    best_score, target = _best(local, score.masked_fill_(~fits, -1), label, rows)
    candidate = (target >= 0) & ((best_score >> _TIE_BITS) > own_rating)
    node, target = select(candidate, torch.arange(start, end, device=keys.device), target)
    node, target = select(accept_within_limit(target, graph.node_weight.index_select(0, node), weight, limit),
                          node, target)
    node_weight = graph.node_weight.index_select(0, node)
    weight.index_add_(0, labels.index_select(0, node), -node_weight).index_add_(0, target, node_weight)
    labels[node] = target
    return node.numel()


def _best(segment_row: Tensor, score: Tensor, label: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """Per row, the highest non-negative score among its segments and that segment's label
    (-1 and -1 where the row has none)."""
    best = torch.full((rows,), -1, dtype=torch.long, device=score.device)
    best.scatter_reduce_(0, segment_row, score, "amax")
    hit = (score >= 0) & (score == best[segment_row])
    chosen = torch.full((rows,), -1, dtype=torch.long, device=score.device)
    chosen.scatter_reduce_(0, segment_row[hit], label[hit], "amax")
    return best, chosen


def _merge_singletons(graph: WeightedGraph, labels: Tensor, favorite: Tensor, limit: Tensor, seed: int) -> None:
    """Groups the nodes alone in their cluster by favourite cluster (nodes without edges form
    one group), into clusters of at most ``limit``."""
    n = graph.num_nodes
    members = torch.bincount(labels, minlength=n)
    alone = (members[labels] == 1).nonzero().squeeze(1)
    # A node of more than half the limit could not share a cluster with a node of the same size.
    share = (graph.node_weight[alone].double() / limit.double()).amax(1)
    alone, share = alone[share <= 0.5], share[share <= 0.5]
    if alone.numel() < 2:
        return
    group = favorite[alone]
    group = torch.where(group < 0, n, group)
    # Within a group, nodes in hash order fill clusters of half the limit in turn.
    key = group * (1 << 32) + hash_ids(alone, seed)
    order = torch.sort(key).indices
    alone, group, share = alone[order], group[order], share[order]
    # Shares are ratios: a bucket's edge falls where their rounded running sum crosses a half.
    cumulative = ordered_cumsum(share)
    segment, starts = segment_offsets(group)
    before = (cumulative[starts] - share[starts])[segment]
    bucket = torch.floor((cumulative - before) * 2).long()
    key = segment * (2 * n + 2) + bucket
    bucket_of, first = segment_offsets(key)
    labels[alone] = alone[first][bucket_of]


def contract(graph: WeightedGraph, labels: Tensor, symmetrize: bool) -> tuple[WeightedGraph, Tensor]:
    """The graph of the clusters (edge weights summed, edges inside a cluster dropped) and the
    coarse node of every node. ``symmetrize`` adds every edge's reverse: the coarse graph of a
    directed graph is then undirected, an edge weighing the directed edges between its ends.

    The coarse rows are built a range at a time, each range's edges gathered from every chunk of
    the fine graph and summed: the edges between clusters, before they are summed, are held for
    one range (about ``_RANGE_EDGES``) instead of for the whole graph."""
    n = graph.num_nodes
    device = graph.device
    present = torch.zeros(n, dtype=torch.bool, device=device)
    present[labels] = True
    new_id = torch.cumsum(present, 0).sub_(1)
    num_coarse = int(new_id[-1]) + 1 if n else 0
    mapping = new_id[labels]
    del present, new_id
    node_weight = torch.zeros(num_coarse, graph.node_weight.size(1), dtype=torch.long, device=device)
    node_weight.index_add_(0, mapping, graph.node_weight)
    load = torch.zeros(num_coarse, dtype=torch.long, device=device).index_add_(0, mapping, graph.rowptr.diff())
    index_dtype = torch.int32 if num_coarse <= torch.iinfo(torch.int32).max else torch.int64
    counts, cols, weights = [], [], []
    for range_counts, range_cols, sums in coarse_ranges(graph, mapping, num_coarse, load, symmetrize, index_dtype):
        counts.append(range_counts)
        cols.append(range_cols)
        weights.append(sums)
    rowptr = torch.zeros(num_coarse + 1, dtype=torch.long, device=device)
    if counts:
        torch.cumsum(torch.cat(counts), 0, out=rowptr[1:])
    col = torch.cat(cols) if cols else torch.zeros(0, dtype=index_dtype, device=device)
    weight = torch.cat(weights) if weights else torch.zeros(0, dtype=torch.long, device=device)
    return WeightedGraph(rowptr, col, weight, node_weight), mapping


def coarse_ranges(graph: WeightedGraph, mapping: Tensor, num_coarse: int, load: Tensor, symmetrize: bool,
                  index_dtype: torch.dtype, first: int = 0):
    """The coarse rows ``first + i`` (``load``: the fine edges of each) as CSR pieces, a range of
    about ``_RANGE_EDGES`` fine edges at a time: per range the edge count of each of its rows
    (int64), the columns of its edges (``index_dtype``, ascending within a row, distinct) and
    their summed weights."""
    for low, high in _coarse_ranges(load * (2 if symmetrize else 1), _RANGE_EDGES):
        keys, sums = _range_edges(graph, mapping, num_coarse, first + low, first + high, symmetrize)
        row = torch.div(keys, num_coarse, rounding_mode="floor")
        cols = (keys - row * num_coarse).to(index_dtype)
        counts = torch.bincount(row - (first + low), minlength=high - low)
        # Not held while the next range's edges are gathered.
        del keys, row
        yield counts, cols, sums


def _coarse_ranges(load: Tensor, budget: int) -> list[tuple[int, int]]:
    """Consecutive coarse-row ranges of about ``budget`` fine edges each."""
    num_coarse = load.numel()
    total = int(load.sum())
    if total <= budget:
        return [(0, num_coarse)] if num_coarse else []
    cumulative = torch.cumsum(load, 0)
    targets = torch.arange(budget, total, budget, device=load.device)
    cuts = torch.searchsorted(cumulative, targets, right=True).tolist()
    bounds = sorted(set([0, *cuts, num_coarse]))
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _range_edges(graph: WeightedGraph, mapping: Tensor, num_coarse: int, low: int, high: int,
                 symmetrize: bool) -> tuple[Tensor, Tensor]:
    """The distinct keys ``row * num_coarse + col`` (ascending) of the coarse edges whose row
    lies in ``low:high``, and their summed weights."""
    keys, sums = [], []
    for start, end in graph.chunks():
        row, col, edge_weight = graph.edges(start, end)
        coarse_row, coarse_col = mapping.index_select(0, row), mapping.index_select(0, col)
        del row, col
        between = coarse_row != coarse_col
        for source, target in ((coarse_row, coarse_col), (coarse_col, coarse_row)) if symmetrize else (
                (coarse_row, coarse_col),):
            source, target, kept_weight = select(between & (source >= low) & (source < high), source, target,
                                                 edge_weight)
            chunk_keys, chunk_sums = coalesce(source * num_coarse + target, kept_weight)
            keys.append(chunk_keys)
            sums.append(chunk_sums)
    if len(keys) == 1:
        return keys[0], sums[0]
    # The chunks' pieces are freed as soon as they are concatenated.
    return coalesce_pieces(keys, sums)


def is_symmetric(graph: WeightedGraph, seed: int = 0) -> bool:
    """Whether the edges (with multiplicity and weights) equal their reverses, tested by comparing
    the sums of a hash of every edge and of its reverse: equal multisets give equal sums, and
    different ones equal sums with a chance of about 2**-32."""
    n = graph.num_nodes
    forward = backward = 0
    for start, end in graph.chunks():
        row, col, edge_weight = graph.edges(start, end)
        weight = 1 if edge_weight is None else edge_weight
        forward += int((hash_ids(row * n + col, seed) * weight).sum())
        backward += int((hash_ids(col * n + row, seed) * weight).sum())
    return forward == backward
