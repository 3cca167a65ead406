"""A multilevel graph partitioner in torch ops: it runs where the graph's tensors are, on a GPU
for graphs of hundreds of millions of nonzeros.

The graph is coarsened by size-constrained label propagation (:mod:`.coarsening`, KaMinPar's
clustering, Gottesbüren et al., 2021) until it has about a hundred nodes per part, partitioned
there by recursive bisection with Fiduccia-Mattheyses on the host (:mod:`.initial_partition`),
and the partition is projected back level by level, refined at each by Jet (:mod:`.refinement`,
Gilbert et al., 2023). Every node carries a weight per constraint, and every part stays within
``(1 + imbalance)`` times its share of each: the partitioner balances, say, a rank's time and
its memory at once.

Memory: the input CSR (columns as given, int32 or int64), the coarse graphs (each a fraction of
the one before), per-node arrays and the temporaries of one chunk of rows
(``row_ranges.RANGE_ENTRIES`` edges) at a time.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .coarsening import cluster, contract, is_symmetric
from .initial_partition import initial_partition
from .refinement import refine
from .weighted_graph import WeightedGraph

# Coarsening stops at this many nodes per part ...
CONTRACTION_LIMIT = 100
# ... or when a level shrinks the graph by less than this factor.
_STALLED = 0.95
_CLUSTER_ROUNDS = 5
# Jet's tolerance of a negative gain: on the coarse levels, and on the input graph.
_COARSE_TOLERANCE = 0.75
_FINEST_TOLERANCE = 0.25
# Tries per bisection of the coarsest graph: under one weight every other one with relaxed moves
# (initial_partition._fm), under several only the strict half; 6 strict either way.
_INITIAL_TRIES = 12


def partition_graph(rowptr: Tensor, col: Tensor, node_weight: Tensor, num_parts: int, imbalance: Tensor,
                    seed: int = 0, edge_weight: Tensor | None = None) -> Tensor:
    """The part (int64, in [0, num_parts)) of every row of a square matrix's CSR, balancing every
    column of ``node_weight`` (int64, [rows, constraints]) to within ``1 + imbalance`` of its
    mean per part, with few weighty edges between parts. Edges count in the direction stored
    (each stored entry weighs its ``edge_weight``, int32 or int64, or 1 without); self-loops
    cost nothing. Arguments are checked by the caller."""
    graph = WeightedGraph(rowptr, col, edge_weight, node_weight)
    n = graph.num_nodes
    if num_parts == 1 or n == 0:
        return torch.zeros(n, dtype=torch.long, device=col.device)
    total = node_weight.sum(0)
    imbalance = imbalance.to(total.device)
    limit = torch.ceil(total.double() * (1 + imbalance) / num_parts).long()
    symmetric = is_symmetric(graph, seed)
    levels: list[tuple[WeightedGraph, Tensor]] = []
    while graph.num_nodes > CONTRACTION_LIMIT * num_parts:
        # Clusters stay under imbalance times the weight of a part of the coarsest graph's split.
        groups = min(num_parts, max(1, graph.num_nodes // CONTRACTION_LIMIT))
        cluster_limit = torch.clamp(torch.floor(total.double() * imbalance / groups), min=1).long()
        labels = cluster(graph, cluster_limit, _CLUSTER_ROUNDS, seed + len(levels))
        coarse, mapping = contract(graph, labels, symmetrize=not levels and not symmetric)
        del labels
        if coarse.num_nodes > _STALLED * graph.num_nodes:
            break
        levels.append((graph, mapping))
        graph = coarse
    mean = torch.ceil(total.double() / num_parts).long()
    part = initial_partition(graph, num_parts, _level_limit(graph, limit, mean), imbalance, seed, _INITIAL_TRIES)
    for finer, mapping in reversed(levels):
        part = part[mapping]
        del mapping
        finest = finer is levels[0][0]
        tolerance = _FINEST_TOLERANCE if finest else _COARSE_TOLERANCE
        refine(finer, part, num_parts, limit if finest else _level_limit(finer, limit, mean), tolerance, seed)
    return part


def _level_limit(graph: WeightedGraph, limit: Tensor, mean: Tensor) -> Tensor:
    """The weight limit on a coarse level: a part may hold its mean plus its heaviest node, where
    that is more than the limit, since coarse nodes may be too heavy to balance finer."""
    return torch.maximum(limit, mean + graph.node_weight.max(0).values)

