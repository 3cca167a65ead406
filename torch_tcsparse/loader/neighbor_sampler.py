"""Neighbour sampling of mini-batches on the graph's device, in torch ops (no pyg-lib needed)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .neighbor_choice import choose_neighbors
from .sampled_batch import SampledBatch

# Nodes are keyed target * num_nodes + source while a graph is made canonical.
_MAX_NODES = 3_037_000_499  # floor(sqrt(2**63 - 1))


class NeighborSampler:
    """Samples what PyG's ``NeighborLoader`` samples, on the graph's own device: from the seed
    nodes, hop by hop, up to ``num_neighbors[h]`` neighbours of every node the previous hop found
    (-1: all of them), drawn uniformly without replacement; a node already in the batch keeps its
    id. ``sample`` returns a ``SampledBatch``, whose ``blocks()`` are the per-layer bipartite
    matrices.

    The graph is a canonical CSR by target (``rowptr`` over nodes, ``col`` the neighbours whose
    messages a node receives, strictly ascending within a row): ``A.csr.rowptr, A.csr.col`` of a
    ``TCSparseTensor`` adjacency ``A[target, source]``, or ``from_edge_index``. The loops run
    over hops and fan-out steps, never over nodes, and every array stays on the graph's device.
    A sampler keeps one node-sized scratch array, so one sampler serves one thread at a time."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, num_neighbors: Sequence[int]):
        _check_index("rowptr", rowptr)
        _check_index("col", col)
        if rowptr.device != col.device:
            raise ValueError(f"rowptr and col must share a device, got {rowptr.device} and {col.device}")
        if rowptr.numel() < 1:
            raise ValueError("rowptr must hold at least one entry (0 for a graph of no nodes)")
        self.num_neighbors = _check_num_neighbors(num_neighbors)
        self.rowptr, self.col = rowptr.long(), col
        self.num_nodes = rowptr.numel() - 1
        _check_canonical(self.rowptr, col, self.num_nodes)
        # Batch id of every node in the batch being sampled, -1 elsewhere (reset after each batch).
        self._slot = torch.full((self.num_nodes,), -1, dtype=torch.long, device=col.device)

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_neighbors: Sequence[int],
                        num_nodes: int | None = None) -> "NeighborSampler":
        """From a PyG ``edge_index`` (``edge_index[0]`` source, ``edge_index[1]`` target); repeated
        edges count once. ``num_nodes`` defaults to the largest id plus one."""
        _check_index("edge_index", edge_index)
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index must have shape [2, num_edges], got {list(edge_index.shape)}")
        largest = int(edge_index.max()) + 1 if edge_index.numel() else 0
        if num_nodes is None:
            num_nodes = largest
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or not 0 <= num_nodes <= _MAX_NODES:
            raise ValueError(f"num_nodes must be an int in [0, {_MAX_NODES}], got {num_nodes!r}")
        if edge_index.numel() and (int(edge_index.min()) < 0 or largest > num_nodes):
            raise ValueError(f"edge_index holds ids outside [0, {num_nodes}): "
                             f"[{int(edge_index.min())}, {largest - 1}]")
        source, target = edge_index.long()
        key = torch.unique(target * num_nodes + source)  # sorted by target, then source
        counts = torch.bincount(key // num_nodes, minlength=num_nodes)
        rowptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        return cls(rowptr, key % num_nodes, num_neighbors)

    @property
    def device(self) -> torch.device:
        return self.col.device

    def sample(self, seeds: torch.Tensor, generator: torch.Generator | None = None) -> SampledBatch:
        """The batch of ``seeds`` (distinct node ids on the graph's device); random draws from
        ``generator`` (a generator of that device; torch's default one if None), so a seeded
        generator gives the same batch every time."""
        _check_index("seeds", seeds)
        if seeds.dim() != 1:
            raise ValueError(f"seeds must be one-dimensional, got shape {list(seeds.shape)}")
        if seeds.device != self.device:
            raise ValueError(f"seeds must be on the graph's device {self.device}, got {seeds.device}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        if generator is not None and indexed_device(generator.device) != indexed_device(self.device):
            raise ValueError(f"generator must be a generator of the graph's device {self.device}, got one of "
                             f"{generator.device}")
        seeds = seeds.long()
        if seeds.numel() and (int(seeds.min()) < 0 or int(seeds.max()) >= self.num_nodes):
            raise ValueError(f"seeds must lie in [0, {self.num_nodes}), got [{int(seeds.min())}, {int(seeds.max())}]")
        if torch.unique(seeds).numel() != seeds.numel():
            raise ValueError("seeds must be distinct: a repeated seed would be one node of the batch twice")
        found = [seeds]
        try:
            return self._sample(found, generator)
        finally:
            self._slot[torch.cat(found)] = -1

    def _sample(self, found: list[torch.Tensor], generator) -> SampledBatch:
        """Hop by hop; ``found`` collects each hop's new nodes as they are numbered."""
        slot, count = self._slot, found[0].numel()
        slot[found[0]] = torch.arange(count, device=self.device)
        frontier_start, edges, num_edges, longest_rows = 0, [], [], []
        for k in self.num_neighbors:
            frontier = found[-1]
            owner, neighbor, longest = choose_neighbors(self.rowptr, self.col, frontier, k, generator)
            longest_rows.append(longest)
            new = torch.unique(neighbor[slot[neighbor] < 0])
            slot[new] = torch.arange(count, count + new.numel(), device=self.device)
            found.append(new)
            # The frontier is the previous hop's new nodes: batch ids frontier_start onwards.
            edges.append(torch.stack([slot[neighbor], owner + frontier_start]))
            num_edges.append(owner.numel())
            frontier_start, count = count, count + new.numel()
        edge_index = torch.cat(edges, dim=1) if edges else torch.zeros(2, 0, dtype=torch.long, device=self.device)
        return SampledBatch(torch.cat(found), edge_index, tuple(part.numel() for part in found), tuple(num_edges),
                            _longest_rows=tuple(longest_rows))


def _check_index(name: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {tensor.dtype}")


def _check_num_neighbors(num_neighbors) -> tuple[int, ...]:
    if isinstance(num_neighbors, (str, bytes)) or not isinstance(num_neighbors, Sequence):
        raise TypeError(f"num_neighbors must be a sequence of ints, one per hop, got {num_neighbors!r}")
    counts = tuple(num_neighbors)
    if not counts or any(isinstance(k, bool) or not isinstance(k, int) or (k < 1 and k != -1) for k in counts):
        raise ValueError(f"num_neighbors must be one or more counts, each >= 1 or -1 (all), got {num_neighbors!r}")
    return counts


def _check_canonical(rowptr: torch.Tensor, col: torch.Tensor, num_nodes: int) -> None:
    if rowptr.dim() != 1 or col.dim() != 1:
        raise ValueError(f"rowptr and col must be one-dimensional, got shapes {list(rowptr.shape)} and "
                         f"{list(col.shape)}")
    if int(rowptr[0]) != 0 or int(rowptr[-1]) != col.numel():
        raise ValueError(f"rowptr must run from 0 to len(col) = {col.numel()}, got {int(rowptr[0])} .. "
                         f"{int(rowptr[-1])}")
    if bool((rowptr[1:] < rowptr[:-1]).any()):
        raise ValueError("rowptr must not decrease: row i holds col[rowptr[i]:rowptr[i + 1]]")
    if col.numel() == 0:
        return
    if int(col.min()) < 0 or int(col.max()) >= num_nodes:
        raise ValueError(f"col must hold node ids in [0, {num_nodes}), got [{int(col.min())}, {int(col.max())}]")
    # Within a row, each neighbour strictly after the last: sorted, none repeated.
    starts_row = torch.zeros(col.numel(), dtype=torch.bool, device=col.device)
    starts_row[rowptr[:-1][rowptr[:-1] < col.numel()]] = True
    if bool(((col[1:] <= col[:-1]) & ~starts_row[1:]).any()):
        raise ValueError("col must be strictly ascending within each row (a canonical CSR, as A.csr gives): "
                         "a repeated neighbour would be drawn twice")


def indexed_device(device: torch.device) -> torch.device:
    """``device`` with its index: ``torch.Generator("cuda")`` names no index, meaning the current one."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
