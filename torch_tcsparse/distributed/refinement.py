"""Refinement for the multilevel partitioner, after Jet (Gilbert, Madduri, Boman and Rajamanickam,
2023), a refinement built for GPUs: every node moves at once, yet the cut does not oscillate.

One iteration, while the partition is balanced: every unlocked node picks the other part it is
most connected to (its *destination*; its connection to a part is the summed weight of its
edges into it) and becomes a candidate if its gain there is positive, or negative by less than
``tolerance`` times its connection to its own part, which lets the cut climb out of local
minima. Candidates are then filtered (Jet's afterburner): a candidate's gain is recounted as if
the candidates ahead of it (higher gain, then a hash) had already moved, and only those still
gaining move, all at once; they stay put during the next iteration. Moves ignore the weight
limit, except that a move into a part it leaves over the limit must gain more than rebalancing
will lose to make room for it (:mod:`.move_prices`); while a part is over, iterations rebalance
instead, moving the nodes of over-full parts that cost the cut least per weight freed to parts
with room. The best balanced partition seen is kept, and the refinement stops after a number of
iterations without a real improvement, when two rounds (moves, then rebalancing) lower the cut
no further than the two before them, or as soon as a balanced partition repeats one of the two
before it: moves and rebalancing then undo each other in a cycle, whose partitions the best one
already covers.

Connections are counted in a dense ``[rows, parts]`` table, a chunk of rows at a time.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .hashing import hash_ids, random_bits
from .move_prices import worth_rebalancing
from .weighted_graph import WeightedGraph, grouped_order, select, within_group

# Entries of a chunk's connection table (int64): 128 MB.
_TABLE_ENTRIES = 1 << 24
_TIE_BITS = 20
# Iterations without lowering the best cut by this factor end the refinement after PATIENCE.
_PROGRESS = 0.999
PATIENCE = 12
# Rounds (Jet's moves, then rebalancing back to balance) that stop descending end it too: Jet's
# locks alternate its moves between two sets of nodes, so two rounds are one period of the cycle
# in which rebalancing sends back what Jet brought, and a period whose lowest cut is not below
# the period before it by the progress factor ends the level. Periods are compared with each
# other, not with the level's input: negative-gain moves may raise the cut above the input's
# for a few rounds before taking it below.
_PERIOD = 2


def part_weights(graph: WeightedGraph, part: Tensor, num_parts: int) -> Tensor:
    weights = torch.zeros(num_parts, graph.node_weight.size(1), dtype=torch.long, device=graph.device)
    return weights.index_add_(0, part, graph.node_weight)


def cut_weight(graph: WeightedGraph, part: Tensor) -> int:
    """The summed weight of the edges between parts (both directions of an edge counted)."""
    total = 0
    for start, end in graph.chunks():
        row, col, edge_weight = graph.edges(start, end)
        between = part.index_select(0, row) != part.index_select(0, col)
        total += int(between.sum()) if edge_weight is None else int((edge_weight * between).sum())
    return total


def refine(graph: WeightedGraph, part: Tensor, num_parts: int, limit: Tensor, tolerance: float, seed: int,
           max_iterations: int = 100) -> None:
    """Jet's refinement, in place: ``part`` ends as the best balanced partition seen (or, if
    none was balanced, the last). ``limit``: the most a part may weigh per constraint, or one
    such row per part."""
    n = graph.num_nodes
    weights = part_weights(graph, part, num_parts)
    balanced = bool((weights <= limit).all())
    best_cut = cut_weight(graph, part) if balanced else None
    best = part.clone()
    locked = torch.zeros(n, dtype=torch.bool, device=graph.device)
    stale = 0
    round_cuts: list[int] = []
    recent: list[int] = []
    for iteration in range(max_iterations):
        rebalancing = not balanced
        if balanced:
            node, target = _filtered_moves(graph, part, num_parts, weights, limit, locked, tolerance, seed + iteration)
            locked.zero_()
            locked[node] = True
            if node.numel() == 0:
                break
            _apply(graph, part, weights, node, target)
        elif _rebalance(graph, part, num_parts, weights, limit, seed + iteration) == 0:
            break
        balanced = bool((weights <= limit).all())
        stale += 1
        if balanced:
            cut = cut_weight(graph, part)
            if best_cut is None or cut < _PROGRESS * best_cut:
                stale = 0
            if best_cut is None or cut < best_cut:
                best_cut = cut
                best.copy_(part)
            if rebalancing:
                round_cuts = [*round_cuts[1 - 2 * _PERIOD:], cut]
                if not _descending(round_cuts):
                    break
            signature = _signature(part, num_parts, seed)
            if signature in recent:
                break
            recent = [signature, *recent[:1]]
        if stale >= PATIENCE:
            break
    if best_cut is not None:
        part.copy_(best)


def _descending(round_cuts: list[int]) -> bool:
    """Whether the rounds' cuts (oldest first) still descend: the lowest of the last period is
    below the lowest of the period before it by the progress factor (true until two periods)."""
    if len(round_cuts) < 2 * _PERIOD:
        return True
    return min(round_cuts[-_PERIOD:]) < _PROGRESS * min(round_cuts[-2 * _PERIOD:-_PERIOD])


def _signature(part: Tensor, num_parts: int, seed: int) -> int:
    """A hash of the partition: the sum of a 32-bit hash per (node, part); two different
    partitions share it with a chance of about 2**-32."""
    ids = torch.arange(part.numel(), device=part.device)
    return int(hash_ids(ids * num_parts + part, seed).sum())


def _connections(graph: WeightedGraph, start: int, end: int, part: Tensor, num_parts: int) -> Tensor:
    """``[end - start, num_parts]``: each row's connection to each part."""
    row, col, edge_weight = graph.edges(start, end)
    weight = torch.ones(row.numel(), dtype=torch.long, device=row.device) if edge_weight is None else edge_weight
    table = torch.zeros((end - start) * num_parts, dtype=torch.long, device=row.device)
    table.index_add_(0, (row - start) * num_parts + part.index_select(0, col), weight)
    return table.view(end - start, num_parts)


def _table_chunks(graph: WeightedGraph, num_parts: int) -> list[tuple[int, int]]:
    return graph.chunks(max_rows=max(1, _TABLE_ENTRIES // num_parts))


def _tie_noise(start: int, end: int, num_parts: int, seed: int, device) -> Tensor:
    return random_bits((end - start, num_parts), _TIE_BITS, seed * 65537 + start, device)


def _filtered_moves(graph: WeightedGraph, part: Tensor, num_parts: int, weights: Tensor, limit: Tensor,
                    locked: Tensor, tolerance: float, seed: int) -> tuple[Tensor, Tensor]:
    """Jet's candidates and afterburner, then the moves worth their rebalancing: the nodes to
    move and their destinations."""
    n = graph.num_nodes
    destination = torch.full((n,), -1, dtype=torch.long, device=graph.device)
    gain = torch.zeros(n, dtype=torch.long, device=graph.device)
    loss = torch.zeros(n, dtype=torch.long, device=graph.device)
    free = ~locked
    for start, end in _table_chunks(graph, num_parts):
        # Locked nodes are counted too: their loss prices the rebalancing of their part.
        table = _connections(graph, start, end, part, num_parts)
        own_part = part[start:end].unsqueeze(1)
        own = table.gather(1, own_part).squeeze(1)
        score = torch.where(table > 0, (table << _TIE_BITS) | _tie_noise(start, end, num_parts, seed, graph.device), -1)
        score.scatter_(1, own_part, -1)
        best, target = score.max(1)
        chunk_gain = (best >> _TIE_BITS) - own
        candidate = free[start:end] & (best >= 0) & ((chunk_gain >= 0) | (-chunk_gain < (tolerance * own).floor()))
        destination[start:end] = torch.where(candidate, target, -1)
        gain[start:end] = chunk_gain
        loss[start:end] = own - (best >> _TIE_BITS).clamp_(min=0)
    candidate = destination >= 0
    if not bool(candidate.any()):
        return candidate.nonzero().squeeze(1), destination[:0]
    rank = random_bits((n,), 31, seed, graph.device)
    recounted = torch.zeros(n, dtype=torch.long, device=graph.device)
    for start, end in graph.chunks():
        row, col, edge_weight = graph.edges(start, end)
        row, col, edge_weight = select(candidate.index_select(0, row), row, col, edge_weight)
        gain_row, gain_col = gain.index_select(0, row), gain.index_select(0, col)
        ahead = (gain_col > gain_row) | ((gain_col == gain_row) & (rank.index_select(0, col) > rank.index_select(0, row)))
        ahead &= candidate.index_select(0, col)
        del gain_row, gain_col
        neighbour_part = torch.where(ahead, destination.index_select(0, col), part.index_select(0, col))
        change = ((neighbour_part == destination.index_select(0, row)).long()
                  - (neighbour_part == part.index_select(0, row)).long())
        recounted.index_add_(0, row, change if edge_weight is None else change * edge_weight)
    move = candidate & (recounted > 0)
    node = move.nonzero().squeeze(1)
    target = destination[node]
    keep = worth_rebalancing(graph, part, weights, limit, node, target, recounted[node], loss)
    return node[keep], target[keep]


def _rebalance(graph: WeightedGraph, part: Tensor, num_parts: int, weights: Tensor, limit: Tensor, seed: int,
               rounds: int = 4) -> int:
    """Moves nodes out of the parts over ``limit``, in place; returns how many moved.

    Balance is measured by the parts' excess over the limit, summed over parts and constraints
    relative to the limit. A node of an over-full part may move where the excess it adds there
    is under half of what it removes at home, to the part with room it is most connected to,
    else to the one it is most connected to. Per over-full part, the nodes that lose the least
    cut per weight freed go first, until its excess is covered; per target, moves are taken while
    the excess they remove stays over twice the excess they add. Parts over on different
    constraints (one on nonzeros, one on rows) thus trade nodes instead of blocking each other.
    A few rounds, the weights and connections updated after each; each round chooses among the
    candidates of every over-full part at once, their connections counted a group at a time."""
    moved = 0
    for _ in range(rounds):
        over = ((weights - limit) > 0).any(1)
        if not bool(over.any()):
            break
        # Candidates of all groups are chosen from together: Jet priced its moves against the
        # cheapest room of the whole part, and a part may span several groups (R-MAT's hub part
        # holds most of the edges), whose first alone would otherwise pay for all of its room.
        found = []
        candidates = over[part].nonzero().squeeze(1)
        for group in graph.node_groups(candidates, max_rows=max(1, _TABLE_ENTRIES // num_parts)):
            local, col, weight = graph.edges_of(group)
            table = torch.zeros(group.numel() * num_parts, dtype=torch.long, device=group.device)
            table = table.index_add_(0, local * num_parts + part[col], weight).view(group.numel(), num_parts)
            del local, col, weight
            noise = random_bits(tuple(table.shape), _TIE_BITS, seed * 65537 + int(group[0]), group.device)
            found.append(_rebalancing_candidates(graph, group, table, noise, part, weights, limit))
            del table, noise
        node, target, gain, reduction = (torch.cat(column) for column in zip(*found))
        node, target = _chosen_moves(graph, part, weights, limit, node, target, gain, reduction)
        if node.numel() == 0:
            break
        _apply(graph, part, weights, node, target)
        moved += node.numel()
    return moved


def _rebalancing_candidates(graph: WeightedGraph, node: Tensor, table: Tensor, noise: Tensor, part: Tensor,
                            weights: Tensor, limit: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For nodes of over-full parts: those with an allowed target, the target, the gain and the
    relative excess the move removes at home."""
    limit_f = limit.double()
    excess = (weights - limit).clamp_(min=0)
    own_part = part[node]
    own = table.gather(1, own_part.unsqueeze(1)).squeeze(1)
    node_weight = graph.node_weight[node]
    own_limit = _of_parts(limit, own_part)
    left = (weights[own_part] - node_weight - own_limit).clamp_(min=0)
    reduction = ((excess[own_part] - left) / own_limit.double()).sum(1)
    added = (weights.unsqueeze(0) + node_weight.unsqueeze(1) - limit).clamp_(min=0) - excess.unsqueeze(0)
    increase = (added / limit_f).sum(2)
    allowed = 2 * increase < reduction.unsqueeze(1)
    allowed.scatter_(1, own_part.unsqueeze(1), False)
    fits = (increase == 0).long() << 62
    score = torch.where(allowed, fits | (table << _TIE_BITS) | noise, -1)
    best, target = score.max(1)
    move = best >= 0
    gain = table.gather(1, target.unsqueeze(1)).squeeze(1) - own
    return node[move], target[move], gain[move], reduction[move]


def _chosen_moves(graph: WeightedGraph, part: Tensor, weights: Tensor, limit: Tensor, node: Tensor, target: Tensor,
                  gain: Tensor, reduction: Tensor) -> tuple[Tensor, Tensor]:
    """Of the candidate moves: per source part, those of highest gain per weight freed until
    its excess is covered; then per target, in the same order, while they remove over twice the
    excess they add there."""
    if node.numel() == 0:
        return node, target
    excess = (weights - limit).clamp_(min=0)
    node_weight = graph.node_weight[node]
    source = part[node]
    # Gain per weight freed (relative to the limit, on the constraints over it at home): the
    # cheapest room first, as Jet's moves were priced (move_prices).
    scale = (excess > 0).double() / limit.expand_as(weights).double()
    freed = (node_weight * scale.index_select(0, source)).sum(1)
    gain = torch.where(freed > 0, gain / freed.clamp(min=1e-300), -torch.inf)
    order, segment, starts = grouped_order(source, gain)
    before = within_group(node_weight[order], segment, starts) - node_weight[order]
    sorted_excess = excess[source[order]]
    needed = torch.zeros(node.numel(), dtype=torch.bool, device=node.device)
    needed[order] = ((before < sorted_excess) & (sorted_excess > 0)).any(1)
    node, target, gain, reduction, node_weight = (t[needed] for t in (node, target, gain, reduction, node_weight))
    order, segment, starts = grouped_order(target, gain)
    sorted_target = target[order]
    cumulative = within_group(node_weight[order], segment, starts)
    target_limit = _of_parts(limit, sorted_target)
    added = (((weights[sorted_target] + cumulative - target_limit).clamp_(min=0) - excess[sorted_target])
             / target_limit.double()).sum(1)
    removed = within_group(reduction[order], segment, starts)
    failed = within_group((2 * added >= removed).long(), segment, starts)
    accepted = torch.zeros(node.numel(), dtype=torch.bool, device=node.device)
    accepted[order] = failed == 0
    return node[accepted], target[accepted]


def _of_parts(limit: Tensor, parts: Tensor) -> Tensor:
    """The limit of each of ``parts``: ``limit`` is one per constraint, or one row per part."""
    return limit if limit.dim() == 1 else limit.index_select(0, parts)


def _apply(graph: WeightedGraph, part: Tensor, weights: Tensor, node: Tensor, target: Tensor) -> None:
    node_weight = graph.node_weight[node]
    weights.index_add_(0, part[node], -node_weight).index_add_(0, target, node_weight)
    part[node] = target
