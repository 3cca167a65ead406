"""Which of Jet's moves are worth the rebalancing they cause.

Jet moves nodes regardless of the weight limit, and rebalancing then empties the parts it
overfilled, moving out the nodes that cost the cut least. On graphs with many nodes of one or two
edges (R-MAT's leaves of hubs) both steps move the same kind of node: Jet brings leaves next to
their hub (gain 1 each), rebalancing sends leaves away (loss 1 each), and the two undo each other
for as long as the cut creeps down by a few edges per round. A move into a part that ends over
its limit is therefore kept only where its gain beats what it costs to make room: the loss per
weight of the cheapest nodes staying in that part, taken until their weight covers the part's
excess (the price rebalancing pays for the last unit of room), times the move's weight. Moves into
parts that stay within their limit are all kept.

Weight is measured relative to the target's limit, summed over the constraints it exceeds:
rebalancing frees those, and a node's weight on the others does not help.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .weighted_graph import WeightedGraph, grouped_order, within_group


def worth_rebalancing(graph: WeightedGraph, part: Tensor, weights: Tensor, limit: Tensor, node: Tensor,
                      target: Tensor, gain: Tensor, loss: Tensor) -> Tensor:
    """Which of the moves (``node`` to ``target``, of positive ``gain``) to keep, given the
    parts' ``weights`` before them, the ``limit`` (one per constraint, or a row per part) and
    every node's ``loss`` (>= 0) if it left its part for the one it is most connected to."""
    node_weight = graph.node_weight[node]
    left = weights.clone().index_add_(0, part[node], -node_weight)
    part_limit = limit.expand_as(weights).double()
    over = left.index_add(0, target, node_weight) > part_limit
    if not bool(over.any()):
        return torch.ones(node.numel(), dtype=torch.bool, device=node.device)
    # Relative weight per unit of each exceeded constraint; zero on the others.
    scale = over.double() / part_limit
    size = (node_weight * scale.index_select(0, target)).sum(1)
    value = gain / size.clamp(min=1e-300)
    # Per target, the moves of most gain per weight first; each is priced at the excess that it
    # and the moves before it leave.
    order, segment, starts = grouped_order(target, value)
    sorted_target = target[order]
    arrived = within_group(node_weight[order], segment, starts)
    excess = ((left.index_select(0, sorted_target) + arrived - part_limit.index_select(0, sorted_target)).clamp_(min=0)
              * scale.index_select(0, sorted_target)).sum(1)
    keep = torch.zeros(node.numel(), dtype=torch.bool, device=node.device)
    keep[order] = value[order] > _room_price(graph, part, node, loss, scale, sorted_target, excess)
    return keep


def _room_price(graph: WeightedGraph, part: Tensor, node: Tensor, loss: Tensor, scale: Tensor, wanted: Tensor,
                excess: Tensor) -> Tensor:
    """For each part in ``wanted`` and relative ``excess`` there: the loss per relative weight
    of the last of its staying nodes, cheapest first, needed to cover the excess (zero for no
    excess, infinite where the staying nodes cannot cover it)."""
    staying = torch.ones(part.numel(), dtype=torch.bool, device=part.device)
    staying[node] = False
    staying &= (scale > 0).any(1).index_select(0, part)
    stay = staying.nonzero().squeeze(1)
    if stay.numel() == 0:
        return torch.where(excess > 0, torch.inf, 0.0)
    stay_part = part.index_select(0, stay)
    size = (graph.node_weight.index_select(0, stay) * scale.index_select(0, stay_part)).sum(1)
    # A node that frees nothing of the excess never helps, whatever it costs.
    ratio = torch.where(size > 0, loss.index_select(0, stay) / size.clamp(min=1e-300), torch.inf)
    order, segment, starts = grouped_order(stay_part, -ratio)  # cheapest first
    sorted_part = stay_part[order]
    freed = within_group(size[order], segment, starts)
    # One ascending key over all parts: a part's offset is above any part's freed weight.
    span = float(freed.max()) + 1
    position = torch.searchsorted(sorted_part * span + freed, wanted * span + excess)
    last = position.clamp(max=stay.numel() - 1)
    # Past its own part's nodes, the excess cannot be covered.
    covered = (position < stay.numel()) & (sorted_part[last] == wanted)
    price = torch.where(covered, ratio[order][last], torch.inf)
    return torch.where(excess > 0, price, 0.0)
