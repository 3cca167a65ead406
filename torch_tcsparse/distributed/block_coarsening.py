"""Partitioning blocks of rows without gathering the graph's structure on one rank: each rank
coarsens its own block, the root partitions only the graph of the clusters, and each rank then
refines its rows against its neighbours' parts.

1. Each rank clusters the rows of its block (the multilevel partitioner's size-constrained label
   propagation, :func:`.coarsening.cluster`), level after level, until the block's graph has at
   most ``1 / BLOCK_SHRINK`` of its nodes, keeping a level past the first only while the blocks'
   clusters stay several times as many as the root's partitioner coarsens to: a block clusters
   its rows by the edges it holds, and the root, which sees the edges between blocks, must
   coarsen further itself. The block's columns in other blocks are nodes of that
   graph too, weightless and without edges of their own: rows that share such a neighbour may
   join its cluster, and so one another's, though a block holds only about 1 / P of its rows'
   edges.
2. The ranks number their clusters globally, learn the cluster of every column they reference in
   another block, and sum their edges between clusters. The root receives only the graph of the
   clusters as CSR: each cluster's weights and number of coarse edges, and per distinct pair of
   clusters the column and the weight, each int32 where every rank's values fit (8 bytes a coarse
   edge; int64 else). It partitions that graph with the multilevel partitioner a few times (seeds
   apart), and sends each rank its clusters' parts from the try of the lowest cut.
3. Back down the block's levels, coarsest first, each rank moves whole units (a level's nodes:
   the rows it grouped) to the part they have the most edges into where that gains, in rounds in
   which half of every block's units (by a hash) may move, so that two neighbours never swap at
   once; a rank fills a part only up to its share of the room the part has left under its limit,
   so every part stays within it without a round of agreement. A unit as connected to a lighter
   part as to its own moves there too, at no cost to the cut: the fuller parts it leaves then have
   room for the moves that gain.
4. Last, each rank runs Jet (:mod:`.refinement`) on its block's rows, the parts of its columns
   in other blocks fixed and exchanged between a few passes, within its share of each part's
   room. Jet's moves that lose the cut, and its rebalancing that empties an overfilled part of
   the rows costing least per weight, trade rows that gaining moves never would: with several
   row weights the clusters, grown around hubs with their leaves, leave the root no partition
   that separates the leaves (heavy in rows, light in nonzeros) from the hubs, and Jet does it.

Memory: a rank holds its block's columns once more, as the columns of the graph of step 1 (int32
where its nodes fit), which the clustering, the clusters' graph and both refinements share; its
other arrays are per node, and every pass over its nonzeros goes a chunk of them at a time (the
clusters' graph a range of clusters at a time, as a contraction). With its own CSR (int64
columns) a rank peaks near 25 bytes a nonzero of its block (R-MAT 18 on two CPU ranks, the
chunks shrunk to their proportion of a block of 268M nonzeros).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .coarsening import cluster, coarse_ranges, contract
from .collectives import exchange_counts, from_root, gather_counts, to_root
from .hashing import hash_ids
from .multilevel import _FINEST_TOLERANCE, CONTRACTION_LIMIT, partition_graph
from .refinement import cut_weight, refine
from .row_ranges import RANGE_ENTRIES
from .weighted_graph import WeightedGraph, select

# A block is coarsened until its graph has at most this fraction of its nodes ...
BLOCK_SHRINK = 32
# ... or a level shrinks it by less than this factor.
_STALLED = 0.95
# ... or a level would leave the blocks fewer clusters than this many times the nodes the root's
# partitioner coarsens to: the root then coarsens at least one level (about 4x fewer nodes) seeing
# the edges between blocks. Deeper block levels, blind to those edges, glue thin graphs' clusters
# across their natural cuts (CiteSeer at 2 parts: 58 nonzeros cut from 1,695 clusters of one level,
# 130 from 310 of two, 188 from 120 of three). Twice the limit gives the same levels on CiteSeer
# and Cora, but 4-9% more cut on PubMed (3 parts: 4,318 against 3,952).
_ROOT_COARSENING = 4
_CLUSTER_ROUNDS = 5
# Rounds of the refinement at each level on the way back (halves alternate).
_REFINE_ROUNDS = 16
# Passes of Jet on each block's rows last, the parts of other blocks' rows exchanged between
# them: most of the gain comes in the first (R-MAT 16 at 4 parts, two row weights: cut 949.9K,
# 868.0K, 867.8K, 867.6K after 0-3 passes; 6 passes gain under 0.1% more).
_ROW_PASSES = 3
# Partitions of the clusters' graph the root tries, keeping the one of the lowest cut. Its
# clusters, each grown from a block's share of its rows' edges, are loose, and the cut of the
# partitioner's result on them varies from seed to seed by more than the refinement makes up: the
# lowest there is usually, not always, the lowest after it (the best of 4 against one try, seed
# 0: Cora at 4 parts 1.13x against 1.20x the whole route's cut, Amazon Photo at 2 parts 0.80x
# against 1.09x; still needed with the root coarsening further: 2 tries leave Amazon Photo at 2
# parts 1.50x METIS's cut against 1.18x). The clusters' graph holds a tenth to a third of the
# nonzeros, up to about half on small graphs (CiteSeer, R-MAT 14) whose blocks keep one level.
_ROOT_TRIES = 4
# The largest value the clusters' graph sends to the root as int32.
_INT32_MAX = torch.iinfo(torch.int32).max
# Nonzeros whose temporaries are held at once in the passes over a block's columns.
_ENTRY_CHUNK = RANGE_ENTRIES


class BlockGraph:
    """A block's rows and, after them, its columns in other blocks (weightless nodes without
    edges) as one graph, held once for the clustering and the refinements; and the values of its
    halo nodes, each asked of its block's rank by :meth:`node_values`."""

    def __init__(self, rowptr: Tensor, col: Tensor, bounds: tuple[int, ...], rank: int, group, node_weight: Tensor):
        device = col.device
        first, end, rows = bounds[rank], bounds[rank + 1], bounds[rank + 1] - bounds[rank]
        self.group = group
        # The distinct columns in other blocks, then each nonzero's node: a row of the block, else
        # rows plus its column's index among them. A chunk of nonzeros at a time: the temporaries
        # of the sort stay bounded by the chunk and the halo, however many of the nonzeros lie in
        # other blocks (most of them on many ranks).
        # int64 pieces (a chunk at a time): the columns may come as int32.
        halo = torch.zeros(0, dtype=torch.long, device=device)
        for start in range(0, col.numel(), _ENTRY_CHUNK):
            piece = col[start:start + _ENTRY_CHUNK].long()
            halo = torch.unique(torch.cat([halo, piece[(piece < first) | (piece >= end)]]))
        nodes = rows + halo.numel()
        # int32 where the nodes fit: 4 bytes a nonzero, the only per-nonzero array held past here.
        target = torch.empty(col.numel(), dtype=torch.int32 if nodes <= _INT32_MAX else torch.long, device=device)
        for start in range(0, col.numel(), _ENTRY_CHUNK):
            piece = col[start:start + _ENTRY_CHUNK].long()
            node = piece - first
            outside = (node < 0) | (node >= rows)
            node[outside] = torch.searchsorted(halo, piece[outside]) + rows
            target[start:start + _ENTRY_CHUNK] = node
        self.halo = halo
        node_rowptr = torch.cat([rowptr.long(), rowptr[-1:].long().expand(self.halo.numel())])
        weight = torch.cat([node_weight, node_weight.new_zeros(self.halo.numel(), node_weight.size(1))])
        self.graph = WeightedGraph(node_rowptr, target, None, weight)
        owner = torch.searchsorted(torch.tensor(bounds[1:-1], device=device), self.halo, right=True)
        self.send = torch.bincount(owner, minlength=len(bounds) - 1).tolist()
        self.receive = exchange_counts(self.send, device, group)
        asked = self.halo.new_empty(sum(self.receive))
        dist.all_to_all_single(asked, self.halo, self.receive, self.send, group=group)
        self.asked = asked - first

    def node_values(self, local: Tensor) -> Tensor:
        """For every node of the graph, its entry of its own block's ``local`` (one per row of the
        block, every rank calling with its own): its rows' here, its halo's sent by their owners."""
        answered = local.new_empty(self.halo.numel())
        dist.all_to_all_single(answered, local[self.asked], self.send, self.receive, group=self.group)
        return torch.cat([local, answered])


def coarse_partition_blocks(rowptr: Tensor, col: Tensor, bounds: tuple[int, ...], num_parts: int, seed: int,
                            row_weights: tuple[int, ...], imbalances: tuple[float, ...], root: int,
                            group) -> tuple[Tensor, int]:
    """(the part of each row of this rank's block, the coarse edges the root received; 0 on the
    other ranks). Arguments as ``placement.partition_blocks`` checked them."""
    rank = dist.get_rank(group)
    device = col.device
    rows = bounds[rank + 1] - bounds[rank]
    degree = rowptr.diff().long()
    node_weight = torch.stack([degree + 1 + weight for weight in row_weights], 1)
    total = node_weight.sum(0)
    dist.all_reduce(total, group=group)
    imbalance = torch.tensor(imbalances, dtype=torch.float64, device=device)
    block = BlockGraph(rowptr, col, bounds, rank, group, node_weight)

    cluster_limit = torch.clamp(torch.floor(total.double() * imbalance / num_parts), min=1).long()
    world = dist.get_world_size(group)
    min_clusters = -(-_ROOT_COARSENING * CONTRACTION_LIMIT * num_parts // world)
    levels = _block_clusters(block.graph, rows, cluster_limit, seed, min_clusters)
    mapping = levels[-1]
    num_clusters = int(mapping.max()) + 1 if rows else 0
    offsets = gather_counts(num_clusters, device, group)
    # The root receives this block's rows of the clusters' graph as CSR: the number of edges of
    # each cluster, and per edge its column and weight, 32-bit where they fit (8 bytes a coarse
    # edge against an int64 key and weight's 16). Every rank must send the dtype the root
    # receives: columns and counts stay under the number of clusters, which all ranks know; the
    # weights fit where the largest of any rank's does (one all-reduce).
    index_dtype = torch.int32 if offsets[-1] <= _INT32_MAX else torch.long
    ends, key_weights, edges_of_cluster = _clusters_graph(block, mapping, degree, offsets, rank, index_dtype)
    heaviest = torch.tensor([int(key_weights.max()) if key_weights.numel() else 0], device=device)
    dist.all_reduce(heaviest, op=dist.ReduceOp.MAX, group=group)
    key_weights = key_weights.to(torch.int32 if int(heaviest) <= _INT32_MAX else torch.long)
    cluster_weight = torch.zeros(num_clusters, node_weight.size(1), dtype=torch.long, device=device)
    cluster_weight.index_add_(0, mapping, node_weight)

    edge_bounds = gather_counts(ends.numel(), device, group)
    gathered_ends = to_root(ends, edge_bounds, rank, root, group)
    gathered_weights = to_root(key_weights, edge_bounds, rank, root, group)
    gathered_edges_of_cluster = to_root(edges_of_cluster, offsets, rank, root, group)
    constraints = node_weight.size(1)
    weight_bounds = tuple(b * constraints for b in offsets)
    gathered_node_weight = to_root(cluster_weight.reshape(-1), weight_bounds, rank, root, group)
    del ends, key_weights, edges_of_cluster
    received = 0
    if rank == root:
        received = gathered_ends.numel()
        coarse_rowptr = torch.zeros(offsets[-1] + 1, dtype=torch.long, device=device)
        torch.cumsum(gathered_edges_of_cluster, 0, out=coarse_rowptr[1:])
        del gathered_edges_of_cluster
        part = _partition_clusters(WeightedGraph(coarse_rowptr, gathered_ends, gathered_weights,
                                                 gathered_node_weight.view(-1, constraints)),
                                   num_parts, imbalance, seed)
        del coarse_rowptr
    else:
        part = torch.zeros(0, dtype=torch.long, device=device)
    del gathered_ends, gathered_weights, gathered_node_weight
    part_of_rows = from_root(part, offsets, rank, root, group)[mapping]
    limit = torch.ceil(total.double() * (1 + imbalance) / num_parts).long()
    # Every rank refines as many levels (each a collective), its coarsest units repeated where its
    # block coarsened in fewer.
    passes = torch.tensor([len(levels)], device=device)
    dist.all_reduce(passes, op=dist.ReduceOp.MAX, group=group)
    unit_levels = [torch.arange(rows, device=device)] + levels[:-1]
    unit_levels += [unit_levels[-1]] * (int(passes) - len(unit_levels))
    for units in reversed(unit_levels):
        _refine_units(part_of_rows, units, block, node_weight, limit, num_parts, seed, group)
    _refine_rows(part_of_rows, block, node_weight, limit, num_parts, seed, group)
    return part_of_rows, received


def _clusters_graph(block: BlockGraph, mapping: Tensor, degree: Tensor, offsets: tuple[int, ...], rank: int,
                    index_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """This block's rows of the clusters' graph (``mapping``: the block's cluster of each row,
    ``offsets``: every rank's first cluster): per edge its column (``index_dtype``) and weight
    (int64), and the number of edges of each cluster. Built a range of clusters at a time from
    chunks of the block's nonzeros, as a contraction: its keys, before they are summed, are held
    for one range, not for the block."""
    num_clusters = offsets[rank + 1] - offsets[rank]
    cluster_of_node = block.node_values(mapping + offsets[rank])
    load = torch.zeros(num_clusters, dtype=torch.long, device=degree.device).index_add_(0, mapping, degree)
    ends, weights, counts = [], [], []
    for range_counts, range_ends, sums in coarse_ranges(block.graph, cluster_of_node, offsets[-1], load, False,
                                                         index_dtype, offsets[rank]):
        counts.append(range_counts.to(index_dtype))
        ends.append(range_ends)
        weights.append(sums)
    if not ends:
        empty = torch.zeros(0, dtype=index_dtype, device=degree.device)
        return empty, empty.long(), empty
    return torch.cat(ends), torch.cat(weights), torch.cat(counts)


def _block_clusters(graph: WeightedGraph, rows: int, limit: Tensor, seed: int, min_clusters: int) -> list[Tensor]:
    """The node (0..k-1) of every row of the block at each level of its coarsening, finest first,
    the last the clusters; its columns in other blocks (the graph's nodes after its ``rows``) take
    part as weightless nodes without edges. A level past the first that leaves the rows in fewer
    than ``min_clusters`` clusters is dropped, and the coarsening ends."""
    device = graph.device
    nodes = graph.num_nodes
    mapping = torch.arange(nodes, device=device)
    levels = []
    while graph.num_nodes > max(1, nodes // BLOCK_SHRINK):
        labels = cluster(graph, limit, _CLUSTER_ROUNDS, seed + len(levels))
        coarse, level_mapping = contract(graph, labels, symmetrize=not levels)
        del labels
        if coarse.num_nodes > _STALLED * graph.num_nodes:
            break
        coarse_mapping = level_mapping[mapping]
        clusters, level = torch.unique(coarse_mapping[:rows], return_inverse=True)
        if levels and clusters.numel() < min_clusters:
            break
        mapping = coarse_mapping
        levels.append(level)
        graph = coarse
    return levels or [torch.arange(rows, device=device)]


def _refine_rows(part: Tensor, block: BlockGraph, node_weight: Tensor, limit: Tensor, num_parts: int, seed: int,
                 group) -> None:
    """Jet (``refinement.refine``) on each block's rows, in place, the parts of its columns in
    other blocks fixed, for ``_ROW_PASSES`` passes. Each rank's weight in a part may grow by its
    share of the room the part has left under the limit (or must shrink by its share of the
    excess), so the parts stay within the limit without agreement between ranks. Unlike the moves
    of whole units, Jet moves rows that lose the cut and then empties the parts they overfill of
    the rows that cost least per weight freed: with several row weights it trades a part's
    leaves of degree one or two (heavy in rows, light in nonzeros) for hubs, which moves that
    each gain never do. Rows of two blocks may move against each other in one pass: of the
    passes, the partition within the limit (else of the least excess) of the lowest cut is kept."""
    world = dist.get_world_size(group)
    device = part.device
    rows = part.numel()
    best_part, best = part.clone(), None
    for pass_ in range(_ROW_PASSES + 1):
        full = block.node_values(part)
        own = torch.zeros(num_parts, node_weight.size(1), dtype=torch.long, device=device)
        own.index_add_(0, part, node_weight)
        # The parts' weights and the cut, in one all-reduce.
        totals = torch.cat([own.reshape(-1), torch.tensor([cut_weight(block.graph, full)], device=device)])
        dist.all_reduce(totals, group=group)
        weights, cut = totals[:-1].view_as(own), int(totals[-1])
        excess = float(((weights - limit).clamp(min=0).double() / limit.double()).sum())
        if best is None or (excess, cut) < best:
            best = (excess, cut)
            best_part.copy_(part)
        if pass_ == _ROW_PASSES:
            break
        local_limit = (own + torch.div(limit - weights, world, rounding_mode="floor")).clamp(min=0)
        # Jet's tolerance of a negative gain: the multilevel partitioner's on its input graph.
        refine(block.graph, full, num_parts, local_limit, _FINEST_TOLERANCE, seed * _ROW_PASSES + pass_)
        part.copy_(full[:rows])
    part.copy_(best_part)


def _partition_clusters(graph: WeightedGraph, num_parts: int, imbalances: Tensor, seed: int) -> Tensor:
    """The part of every cluster of the clusters' graph: of ``_ROOT_TRIES`` runs of the multilevel
    partitioner, the one of the lowest cut (the first of them on a tie)."""
    best, best_cut = None, None
    for attempt in range(_ROOT_TRIES):
        part = partition_graph(graph.rowptr, graph.col, graph.node_weight, num_parts, imbalances,
                               seed * _ROOT_TRIES + attempt, edge_weight=graph.edge_weight)
        cut = cut_weight(graph, part)
        if best_cut is None or cut < best_cut:
            best, best_cut = part, cut
    return best


def _refine_units(part: Tensor, units: Tensor, block: BlockGraph, node_weight: Tensor, limit: Tensor,
                  num_parts: int, seed: int, group) -> None:
    """Step 3 of the module's description on ``part`` in place, moving whole units (``units``:
    the unit of every row, all rows of a unit in one part), the coarsest level's first."""
    world = dist.get_world_size(group)
    device = part.device
    num_units = int(units.max()) + 1 if units.numel() else 0
    ids = torch.arange(num_units, device=device)
    part_ids = torch.arange(num_parts, device=device)
    unit_weight = torch.zeros(num_units, node_weight.size(1), dtype=torch.long, device=device)
    unit_weight.index_add_(0, units, node_weight)
    # The unit of every node of the block's graph; its halo's are none (-1).
    node_units = torch.cat([units, units.new_full((block.halo.numel(),), -1)])
    chunks = block.graph.chunks()
    unit_part = torch.zeros(num_units, dtype=torch.long, device=device)
    unit_part[units] = part
    for round_ in range(_REFINE_ROUNDS):
        table = _unit_connections(block.graph, chunks, node_units, block.node_values(part), num_units, num_parts)
        # Ties between parts break at random: connections doubled, plus a bit per (unit, part).
        tie = hash_ids(ids.unsqueeze(1) * num_parts + part_ids, seed + round_) & 1
        best = (table * 2 + tie).argmax(1)
        own = table.gather(1, unit_part.unsqueeze(1)).squeeze(1)
        gain = table.gather(1, best.unsqueeze(1)).squeeze(1) - own
        weights = torch.zeros(num_parts, node_weight.size(1), dtype=torch.long, device=device)
        weights.index_add_(0, part, node_weight)
        dist.all_reduce(weights, group=group)
        room = torch.clamp(limit - weights, min=0) // world
        # Moves of no gain that leave the parts more even: to the lightest part (by its fullest
        # constraint) the unit is as connected to as to its own, if that part stays lighter than
        # its own part was. Without them a part at its limit takes no unit that would gain there
        # while another part has room to spare (Coauthor CS at 3 and 4 parts: 1.17x and 1.15x
        # the whole route's cut, 1.01x and 1.07x with them).
        load = (weights.double() / limit.double()).amax(1)
        level = (table == own.unsqueeze(1)) & (part_ids != unit_part.unsqueeze(1))
        lightest = torch.where(level, load, torch.inf).argmin(1)
        after = ((weights[lightest] + unit_weight).double() / limit.double()).amax(1)
        evening = (gain == 0) & level.any(1) & (after < load[unit_part])
        best = torch.where(evening, lightest, best)
        half = (hash_ids(ids, seed * 7919 + round_) & 1) == round_ % 2
        candidates = torch.nonzero(((gain > 0) | evening) & half).squeeze(1)
        if not candidates.numel():
            continue
        # By target part, the highest gains first (moves that only even the parts last); each part
        # takes the longest prefix that fits.
        candidates = candidates[torch.argsort(gain[candidates], descending=True, stable=True)]
        candidates = candidates[torch.argsort(best[candidates], stable=True)]
        target = best[candidates]
        running = torch.cumsum(unit_weight[candidates], 0)
        starts = torch.searchsorted(target, part_ids)
        before = torch.where((starts > 0).unsqueeze(1), running[(starts - 1).clamp(min=0)], 0)
        accepted = (running - before[target] <= room[target]).all(1)
        unit_part[candidates[accepted]] = target[accepted]
        part.copy_(unit_part[units])


def _unit_connections(graph: WeightedGraph, chunks: list[tuple[int, int]], node_units: Tensor, node_part: Tensor,
                      num_units: int, num_parts: int) -> Tensor:
    """``[num_units, num_parts]``: each unit's edges into each part, a chunk of the block's
    nonzeros at a time (their temporaries bounded by the chunk). An edge inside a unit moves with
    it: it counts toward no part."""
    table = torch.zeros(num_units * num_parts, dtype=torch.long, device=node_part.device)
    for start, end in chunks:
        row, col, _ = graph.edges(start, end)
        unit_of_row = node_units.index_select(0, row)
        del row
        unit_of_row, col = select(unit_of_row != node_units.index_select(0, col), unit_of_row, col)
        table.index_add_(0, unit_of_row * num_parts + node_part.index_select(0, col), torch.ones_like(unit_of_row))
        del unit_of_row, col
    return table.view(num_units, num_parts)
