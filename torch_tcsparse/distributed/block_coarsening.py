"""Partitioning blocks of rows without gathering the graph: each rank coarsens its own block, and
the root partitions only the graph of the blocks' clusters.

Each rank clusters the rows of its block by the edges inside the block (the multilevel
partitioner's size-constrained label propagation, :func:`.coarsening.cluster`), level after
level, until its block has at most ``1 / BLOCK_SHRINK`` of its rows as clusters. The ranks then
number their clusters globally, learn the cluster of every column they reference in another
block (one ``all_to_all_single`` each way), and sum their edges between clusters; the root
receives only those coarse edges (two int64 per distinct pair of clusters) and the clusters'
weights, partitions that graph with the multilevel partitioner, and sends each rank the parts
of its clusters. A row takes its cluster's part.

What this gives up against gathering the whole structure: the finest levels are clustered inside
each block only, and are not refined after the coarse partition is projected back, so the cut is
that of the coarse partition (no fine-level moves).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .coarsening import cluster, contract
from .collectives import exchange_counts, from_root, gather_counts, to_root
from .hashing import hash_ids
from .multilevel import partition_graph
from .weighted_graph import WeightedGraph

# A block is coarsened until it has at most this fraction of its rows as clusters ...
BLOCK_SHRINK = 32
# ... or a level shrinks it by less than this factor.
_STALLED = 0.95
_CLUSTER_ROUNDS = 5
# Rounds of the block refinement after the coarse partition is projected back (two per half).
_REFINE_ROUNDS = 16


def coarse_partition_blocks(rowptr: Tensor, col: Tensor, bounds: tuple[int, ...], num_parts: int, seed: int,
                            row_weights: tuple[int, ...], imbalance: float, root: int, group) -> tuple[Tensor, int]:
    """(the part of each row of this rank's block, the coarse edges the root received; 0 on the
    other ranks). Arguments as ``placement.partition_blocks`` checked them."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    device = col.device
    first, end = bounds[rank], bounds[rank + 1]
    rows = end - first
    degree = rowptr.diff().long()
    node_weight = torch.stack([degree + 1 + weight for weight in row_weights], 1)
    total = node_weight.sum(0)
    dist.all_reduce(total, group=group)
    cluster_limit = torch.clamp(torch.floor(total.double() * imbalance / num_parts), min=1).long()

    columns = col.long()
    row_of = torch.repeat_interleave(torch.arange(rows, device=device), degree, output_size=columns.numel())
    inside = (columns >= first) & (columns < end)
    mapping = _block_clusters(row_of, columns, inside, first, node_weight, cluster_limit, seed)
    num_clusters = int(mapping.max()) + 1 if rows else 0

    offsets = gather_counts(num_clusters, rank, root, world, device, group)
    cluster_of_row = mapping + offsets[rank]
    cluster_of_col = torch.empty_like(columns)
    cluster_of_col[inside] = cluster_of_row[columns[inside] - first]
    cluster_of_col[~inside] = _remote_clusters(columns[~inside], cluster_of_row, bounds, rank, group)

    coarse_rows = cluster_of_row[row_of]
    between = coarse_rows != cluster_of_col
    keys, key_weights = torch.unique(coarse_rows[between] * offsets[-1] + cluster_of_col[between],
                                     return_counts=True)
    cluster_weight = torch.zeros(num_clusters, node_weight.size(1), dtype=torch.long, device=device)
    cluster_weight.index_add_(0, mapping, node_weight)
    del row_of, inside, cluster_of_col, coarse_rows, between

    edge_bounds = gather_counts(keys.numel(), rank, root, world, device, group)
    gathered_keys = to_root(keys, edge_bounds, rank, root, group)
    gathered_weights = to_root(key_weights.long(), edge_bounds, rank, root, group)
    constraints = node_weight.size(1)
    gathered_node_weight = to_root(cluster_weight.reshape(-1), tuple(b * constraints for b in offsets), rank, root,
                                    group)
    received = 0
    if rank == root:
        received = gathered_keys.numel()
        part = _partition_coarse(gathered_keys, gathered_weights, gathered_node_weight.view(-1, constraints),
                                 offsets[-1], num_parts, imbalance, seed)
    else:
        part = torch.zeros(0, dtype=torch.long, device=device)
    part_of_cluster = from_root(part, offsets, rank, root, group)
    part_of_rows = part_of_cluster[mapping]
    limit = torch.ceil(total.double() * (1 + imbalance) / num_parts).long()
    _refine_rows(part_of_rows, columns, degree, node_weight, limit, num_parts, bounds, rank, seed, group)
    return part_of_rows, received


def _refine_rows(part: Tensor, columns: Tensor, degree: Tensor, node_weight: Tensor, limit: Tensor, num_parts: int,
                 bounds: tuple[int, ...], rank: int, seed: int, group) -> None:
    """Moves rows of this block, in place, to the part they have the most edges into where that
    gains, as every rank does at once: half of the rows (by a hash) may move in a round, so that
    two neighbours never swap at once, and each rank may fill a part only up to its share of the
    room the part has left under ``limit``. The parts of other blocks' columns are asked of their
    ranks at every round."""
    world = len(bounds) - 1
    device = part.device
    rows = part.numel()
    first = bounds[rank]
    row_of = torch.repeat_interleave(torch.arange(rows, device=device), degree, output_size=columns.numel())
    inside = (columns >= first) & (columns < bounds[rank + 1])
    outside_ids, outside_inverse = torch.unique(columns[~inside], return_inverse=True)
    owner = torch.searchsorted(torch.tensor(bounds[1:-1], device=device), outside_ids, right=True)
    send = torch.bincount(owner, minlength=world).tolist()
    receive = exchange_counts(send, device, group)
    asked = outside_ids.new_empty(sum(receive))
    dist.all_to_all_single(asked, outside_ids, receive, send, group=group)
    asked -= first
    ids = torch.arange(rows, device=device)
    for round_ in range(_REFINE_ROUNDS):
        answers = part[asked]
        outside_parts = outside_ids.new_empty(outside_ids.numel())
        dist.all_to_all_single(outside_parts, answers, send, receive, group=group)
        part_of_col = torch.empty_like(columns)
        part_of_col[inside] = part[columns[inside] - first]
        part_of_col[~inside] = outside_parts[outside_inverse]
        table = torch.zeros(rows * num_parts, dtype=torch.long, device=device)
        table.index_add_(0, row_of * num_parts + part_of_col, torch.ones_like(row_of))
        table = table.view(rows, num_parts)
        own = table.gather(1, part.unsqueeze(1)).squeeze(1)
        # Ties between parts break at random: connections doubled, plus a bit per (row, part).
        tie = hash_ids(ids.unsqueeze(1) * num_parts + torch.arange(num_parts, device=device), seed + round_) & 1
        best = (table * 2 + tie).argmax(1)
        gain = table.gather(1, best.unsqueeze(1)).squeeze(1) - own
        movers = (gain > 0) & (best != part) & ((hash_ids(ids, seed * 7919 + round_) & 1) == round_ % 2)
        weights = torch.zeros(num_parts, node_weight.size(1), dtype=torch.long, device=device)
        weights.index_add_(0, part, node_weight)
        dist.all_reduce(weights, group=group)
        room = torch.clamp(limit - weights, min=0) // world
        candidates = torch.nonzero(movers).squeeze(1)
        if candidates.numel():
            order = torch.argsort(gain[candidates], descending=True, stable=True)
            candidates = candidates[order]
            target = best[candidates]
            by_target = torch.argsort(target, stable=True)
            candidates, target = candidates[by_target], target[by_target]
            used = node_weight[candidates]
            starts = torch.searchsorted(target, torch.arange(num_parts, device=device))
            running = torch.cumsum(used, 0)
            before = torch.where(starts.unsqueeze(1) > 0, running[(starts - 1).clamp(min=0)], 0)
            within = running - before[target]
            accepted = (within <= room[target]).all(1)
            part[candidates[accepted]] = target[accepted]


def _block_clusters(row_of: Tensor, columns: Tensor, inside: Tensor, first: int, node_weight: Tensor,
                    limit: Tensor, seed: int) -> Tensor:
    """The cluster (0..k-1) of every row of a block. The block's columns in other blocks are nodes
    of the clustered graph too, weightless and without edges of their own: rows that share such a
    neighbour may join its cluster, and so one another's, though no edge inside the block joins
    them (a block holds about 1 / P of its rows' edges)."""
    rows = node_weight.size(0)
    device = node_weight.device
    halo, halo_index = torch.unique(columns[~inside], return_inverse=True)
    target = torch.empty_like(columns)
    target[inside] = columns[inside] - first
    target[~inside] = rows + halo_index
    nodes = rows + halo.numel()
    counts = torch.bincount(row_of, minlength=nodes)
    rowptr = torch.zeros(nodes + 1, dtype=torch.long, device=device)
    torch.cumsum(counts, 0, out=rowptr[1:])
    weight = torch.cat([node_weight, node_weight.new_zeros(halo.numel(), node_weight.size(1))])
    graph = WeightedGraph(rowptr, target, None, weight)
    mapping = torch.arange(nodes, device=device)
    level = 0
    while graph.num_nodes > max(1, nodes // BLOCK_SHRINK):
        labels = cluster(graph, limit, _CLUSTER_ROUNDS, seed + level)
        coarse, level_mapping = contract(graph, labels, symmetrize=level == 0)
        if coarse.num_nodes > _STALLED * graph.num_nodes:
            break
        mapping = level_mapping[mapping]
        graph = coarse
        level += 1
    return torch.unique(mapping[:rows], return_inverse=True)[1]


def _remote_clusters(columns: Tensor, cluster_of_row: Tensor, bounds: tuple[int, ...], rank: int, group) -> Tensor:
    """The global cluster of each of ``columns`` (ids in other ranks' blocks): each distinct id is
    asked of its block's rank once."""
    world = len(bounds) - 1
    device = columns.device
    ids, inverse = torch.unique(columns, return_inverse=True)
    owner = torch.searchsorted(torch.tensor(bounds[1:-1], device=device), ids, right=True)
    send = torch.bincount(owner, minlength=world).tolist()
    receive = exchange_counts(send, device, group)
    asked = ids.new_empty(sum(receive))
    dist.all_to_all_single(asked, ids, receive, send, group=group)
    answers = cluster_of_row[asked - bounds[rank]]
    clusters = ids.new_empty(ids.numel())
    dist.all_to_all_single(clusters, answers, send, receive, group=group)
    return clusters[inverse]


def _partition_coarse(keys: Tensor, weights: Tensor, node_weight: Tensor, num_clusters: int, num_parts: int,
                      imbalance: float, seed: int) -> Tensor:
    """The part of every cluster, from the clusters' edges as sorted keys row * n + col."""
    row = torch.div(keys, num_clusters, rounding_mode="floor")
    col = keys - row * num_clusters
    rowptr = torch.zeros(num_clusters + 1, dtype=torch.long, device=keys.device)
    torch.cumsum(torch.bincount(row, minlength=num_clusters), 0, out=rowptr[1:])
    imbalances = torch.full((node_weight.size(1),), float(imbalance), dtype=torch.float64)
    return partition_graph(rowptr, col, node_weight, num_parts, imbalances, seed, edge_weight=weights)
