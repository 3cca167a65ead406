"""The graphs the multilevel partitioner works on: CSR with integer edge weights and a vector of
integer weights per node (one entry per balance constraint), on any device.

Integer weights keep every sum exact and independent of the order in which a GPU's atomics add
them, so a partition does not change from run to run. The few running sums of floating-point
ratios (prices and shares relative to a limit) go through :func:`ordered_cumsum`, which adds
them in the same order on every run. Passes over the edges go a chunk of rows
at a time (:meth:`WeightedGraph.chunks`), which bounds their temporaries by the chunk, not by the
graph's nonzeros.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .row_ranges import RANGE_ENTRIES, range_rows, row_ranges


@dataclass
class WeightedGraph:
    """``rowptr`` (int64, n + 1), ``col`` (int32 or int64), ``edge_weight`` (int32 or int64 per
    edge, or None: every edge weighs 1) and ``node_weight`` (int64, [n, constraints]). Edges and
    their weights are read as int64, so every sum of them is."""

    rowptr: Tensor
    col: Tensor
    edge_weight: Tensor | None
    node_weight: Tensor

    @property
    def num_nodes(self) -> int:
        return self.rowptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    @property
    def device(self) -> torch.device:
        return self.col.device

    def chunks(self, max_edges: int | None = None, max_rows: int | None = None) -> list[tuple[int, int]]:
        """Consecutive row ranges ``(start, end)`` of at most ``max_edges`` edges (default
        ``RANGE_ENTRIES``, read at the call; a row with more edges is a range of its own) and
        ``max_rows`` rows each."""
        return row_ranges(self.rowptr, RANGE_ENTRIES if max_edges is None else max_edges, max_rows)

    def edges(self, start: int, end: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Rows (int64, global ids), columns (int64) and weights (int64) of the edges of rows
        start:end."""
        first, last = int(self.rowptr[start]), int(self.rowptr[end])
        row = range_rows(self.rowptr, start, end)
        col = self.col[first:last].long()
        weight = None if self.edge_weight is None else self.edge_weight[first:last].long()
        return row, col, weight

    def node_groups(self, nodes: Tensor, max_edges: int | None = None, max_rows: int | None = None) -> list[Tensor]:
        """``nodes`` (ascending ids) in consecutive groups of at most ``max_edges`` edges (default
        as :meth:`chunks`; a node with more is a group of its own) and ``max_rows`` nodes."""
        group_rowptr = torch.zeros(nodes.numel() + 1, dtype=torch.long, device=nodes.device)
        torch.cumsum(self.rowptr[nodes + 1] - self.rowptr[nodes], 0, out=group_rowptr[1:])
        return [nodes[a:b] for a, b in row_ranges(group_rowptr, RANGE_ENTRIES if max_edges is None else max_edges,
                                                  max_rows)]

    def edges_of(self, nodes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The edges of the rows ``nodes``: each one's index in ``nodes``, its column (int64) and
        its weight (int64; ones where the graph has none)."""
        starts = self.rowptr[nodes]
        degree = self.rowptr[nodes + 1] - starts
        total = int(degree.sum())
        local = torch.repeat_interleave(torch.arange(nodes.numel(), device=nodes.device), degree, output_size=total)
        offsets = torch.cumsum(degree, 0) - degree
        entries = (starts - offsets)[local] + torch.arange(total, device=nodes.device)
        weight = (torch.ones(total, dtype=torch.long, device=nodes.device) if self.edge_weight is None
                  else self.edge_weight[entries].long())
        return local, self.col[entries].long(), weight



def select(mask: Tensor, *tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """The entries of each tensor where ``mask`` holds (None stays None): one ``nonzero`` and an
    ``index_select`` per tensor, faster than a boolean index per tensor."""
    index = mask.nonzero().squeeze(1)
    return tuple(None if t is None else t.index_select(0, index) for t in tensors)


def coalesce(keys: Tensor, weights: Tensor | None) -> tuple[Tensor, Tensor]:
    """Distinct ``keys`` (ascending) and the summed weight of each (ones where ``weights`` is None)."""
    if weights is None:
        # Counting needs no sort order: a sort of the keys alone, faster on a GPU than with indices.
        return torch.unique(keys, return_counts=True)
    return coalesce_pieces([keys], [weights])


def coalesce_pieces(keys: list[Tensor], weights: list[Tensor]) -> tuple[Tensor, Tensor]:
    """:func:`coalesce` of the concatenated pieces (with weights), emptying both lists: each
    array is freed as soon as it is dead (the pieces once concatenated, the keys once sorted, the
    sort's indices once the weights are in key order), where nothing else holds it."""
    merged = keys[0] if len(keys) == 1 else torch.cat(keys)
    keys.clear()
    sorted_keys, order = torch.sort(merged)
    del merged
    if sorted_keys.numel() == 0:
        weights.clear()
        return sorted_keys, torch.zeros(0, dtype=torch.long, device=sorted_keys.device)
    merged = weights[0] if len(weights) == 1 else torch.cat(weights)
    weights.clear()
    sorted_weights = merged.index_select(0, order)
    del merged, order
    first = torch.ones(sorted_keys.numel(), dtype=torch.bool, device=sorted_keys.device)
    torch.ne(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    starts = first.nonzero().squeeze(1)
    segment = torch.cumsum(first, 0).sub_(1)
    del first
    summed = torch.zeros(starts.numel(), dtype=torch.long, device=sorted_keys.device)
    summed.index_add_(0, segment, sorted_weights)
    return sorted_keys.index_select(0, starts), summed


def accept_within_limit(target: Tensor, node_weight: Tensor, weight: Tensor, limit: Tensor,
                        priority: Tensor | None = None) -> Tensor:
    """Which of the moves of nodes weighing ``node_weight`` into ``target`` to make: per target,
    in order of ``priority`` (highest first; else of arrival), each while the target's
    ``weight`` plus the moves taken so far and itself stays within ``limit`` on every constraint."""
    order = torch.arange(target.numel(), device=target.device)
    if priority is not None:
        order = torch.sort(priority, descending=True, stable=True).indices
    order = order[torch.sort(target[order], stable=True).indices]
    sorted_target = target[order]
    sorted_weight = node_weight[order]
    cumulative = torch.cumsum(sorted_weight, 0)
    segment, starts = segment_offsets(sorted_target)
    within = cumulative - (cumulative[starts] - sorted_weight[starts])[segment]
    accepted = torch.zeros(target.numel(), dtype=torch.bool, device=target.device)
    accepted[order] = ((weight[sorted_target] + within) <= limit).all(1)
    return accepted


def grouped_order(group: Tensor, priority: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """An order of the entries by group, then by priority (highest first); each entry's group
    index in that order and where each group starts."""
    order = torch.sort(priority, descending=True, stable=True).indices
    order = order[torch.sort(group[order], stable=True).indices]
    segment, starts = segment_offsets(group[order])
    return order, segment, starts


def within_group(values: Tensor, segment: Tensor, starts: Tensor) -> Tensor:
    """The running sum of ``values`` (in group order) restarted at each group."""
    cumulative = ordered_cumsum(values)
    return cumulative - (cumulative[starts] - values[starts])[segment]


def ordered_cumsum(values: Tensor) -> Tensor:
    """``torch.cumsum(values, 0)``, rounded the same way on every run. On CUDA, torch.cumsum of a
    1-D tensor is CUB's single-pass scan, whose blocks take their prefix from whichever earlier
    blocks have finished: floating-point sums are grouped, and so rounded, differently from run
    to run, and a rounded running sum compared with a limit decides moves. Integers add exactly
    in any order and the CPU adds in index order, so both keep torch.cumsum; floating-point
    values elsewhere take :func:`fixed_order_cumsum`."""
    if values.is_floating_point() and not _adds_in_order(values.device):
        return fixed_order_cumsum(values)
    return torch.cumsum(values, 0)


def _adds_in_order(device: torch.device) -> bool:
    """Whether torch.cumsum on ``device`` groups its floating-point additions the same way on
    every run: the CPU's adds one entry after the other."""
    return device.type == "cpu"


def fixed_order_cumsum(values: Tensor) -> Tensor:
    """The running sums of ``values`` along dim 0 by Hillis and Steele's scan: in round k every
    entry adds the entry 2**k before it, in ceil(log2 n) rounds of elementwise adds, so every sum
    is grouped by the entries' positions alone. Two buffers of the input's size; on a GPU the
    rounds cost a few passes over memory, far less than the partitioner's passes over the edges."""
    current = values.clone()
    n = values.size(0) if values.dim() else 0
    spare = torch.empty_like(current) if n > 1 else current
    shift = 1
    while shift < n:
        spare[:shift] = current[:shift]
        torch.add(current[shift:], current[:-shift], out=spare[shift:])
        current, spare = spare, current
        shift <<= 1
    return current


def segment_offsets(sorted_keys: Tensor) -> tuple[Tensor, Tensor]:
    """For keys sorted ascending: the index of each key's run and the position of each run's
    first key."""
    first = torch.ones(sorted_keys.numel(), dtype=torch.bool, device=sorted_keys.device)
    if sorted_keys.numel():
        torch.ne(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    return torch.cumsum(first, 0).sub_(1), first.nonzero().squeeze(1)
