"""Partitioning a graph that no process holds whole, and moving rows, features and labels to the
rank of their part.

Every rank starts with a *block*: the rows of a range of original node ids (:func:`block_bounds`),
which it reads or generates itself, with their columns in original ids. :func:`partition_blocks`
gathers the blocks' structure on one rank (the root), which partitions it on its device and
sends every rank the part of each of its rows: the root holds the columns (int32 where the ids
fit: 4 bytes per nonzero) and the row pointers (8 bytes per node) for the time of the partition,
plus the partitioner's own memory, and never the values, features or labels. With
``gather="clusters"`` the root receives only the graph of the clusters each rank makes of its
block (:mod:`.block_coarsening`). :class:`Placement`
then numbers the nodes by part and moves each block's rows, and any per-node tensor, to the rank
of their part, with ``all_to_all_single``: no rank holds more than its block and its part, and,
while it relabels its block's columns, a table of one position per node (4 bytes each).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .checks import check_csr, check_int
from .block_coarsening import coarse_partition_blocks
from .collectives import exchange_counts, from_root, gather_counts, to_root
from .partition import METHODS, check_imbalance, check_row_weights, partition_rows
from .row_ranges import range_rows, row_ranges


# How the root sees the graph while it partitions: every block's structure, or the graph of the
# clusters each rank made of its block. "auto" takes the clusters for the multilevel method (no
# rank then holds the whole structure, for a cut within 1.1x METIS's on the real graphs, as the
# whole structure's) and the structure for METIS and contiguous ranges, which read it whole.
GATHERS = ("auto", "whole", "clusters")
# The methods the clusters route partitions with: the multilevel partitioner's.
CLUSTER_METHODS = ("auto", "multilevel")


def block_bounds(num_nodes: int, world_size: int) -> tuple[int, ...]:
    """Ranges of original ids of equal size (the first ones one longer): rank ``r`` reads or
    generates the rows ``bounds[r]:bounds[r + 1]``."""
    check_int("num_nodes", num_nodes, 0, None)
    check_int("world_size", world_size, 1, None)
    base, extra = divmod(num_nodes, world_size)
    bounds = [0]
    for rank in range(world_size):
        bounds.append(bounds[-1] + base + (rank < extra))
    return tuple(bounds)


def partition_blocks(rowptr: Tensor, col: Tensor, bounds, num_parts: int | None = None, method: str = "auto",
                     seed: int = 0, row_weight: int | tuple[int, ...] = 0,
                     imbalance: float | tuple[float, ...] = 0.03, root: int = 0,
                     group=None, gather: str = "auto") -> Tensor:
    """The part of each row of this rank's block (a collective call). ``rowptr``/``col``: the
    block's rows (``bounds[rank]:bounds[rank + 1]`` of the original ids) with columns in
    original ids. With ``gather="whole"`` the root gathers every block's structure, runs
    ``partition_rows`` (with ``method``, ``seed``, ``row_weight``, ``imbalance``) into
    ``num_parts`` parts (default: one per rank) on the device of its tensors, and sends each rank
    its rows' parts. With ``gather="clusters"`` (the multilevel method only) each rank coarsens
    its own block and the root receives only the graph of the clusters
    (``block_coarsening.coarse_partition_blocks``). ``"auto"`` (the default) is ``"clusters"``
    for the multilevel method and ``"whole"`` for the others (``resolve_gather``)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    bounds = _check_block_bounds(bounds, world)
    check_csr(rowptr, col, None, bounds[rank + 1] - bounds[rank], bounds[-1])
    num_parts = world if num_parts is None else check_int("num_parts", num_parts, 1, None)
    check_int("root", root, 0, world - 1)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    gather = resolve_gather(gather, method)
    if gather == "clusters":
        if method not in CLUSTER_METHODS:
            raise ValueError(f"gather='clusters' partitions with the multilevel method, got method={method!r}")
        row_weights = check_row_weights(row_weight)
        return coarse_partition_blocks(rowptr, col, bounds, num_parts, check_int("seed", seed, 0, None), row_weights,
                                       check_imbalance(imbalance, len(row_weights)), root, group)[0]
    device = rowptr.device
    lengths = rowptr.diff()
    columns = col.to(torch.int32 if bounds[-1] <= torch.iinfo(torch.int32).max else torch.int64)
    gathered_lengths = to_root(lengths, bounds, rank, root, group)
    entry_counts = gather_counts(columns.numel(), device, group)
    gathered_columns = to_root(columns, entry_counts, rank, root, group)
    del columns
    if rank == root:
        whole_rowptr = torch.zeros(bounds[-1] + 1, dtype=torch.long, device=device)
        torch.cumsum(gathered_lengths, 0, out=whole_rowptr[1:])
        del gathered_lengths
        partition = partition_rows(whole_rowptr, gathered_columns, num_parts, method, seed, row_weight, imbalance)
        del whole_rowptr, gathered_columns
        part = partition.part_of_nodes().to(device)
    else:
        part = torch.zeros(0, dtype=torch.long, device=device)
    return from_root(part, bounds, rank, root, group)


def resolve_gather(gather: str, method: str) -> str:
    """``"whole"`` or ``"clusters"``: what ``partition_blocks`` does with ``gather`` and ``method``."""
    if gather not in GATHERS:
        raise ValueError(f"gather must be one of {GATHERS}, got {gather!r}")
    if gather == "auto":
        return "clusters" if method in CLUSTER_METHODS else "whole"
    return gather


def _check_block_bounds(bounds, world_size: int) -> tuple[int, ...]:
    if not isinstance(bounds, (tuple, list)) or len(bounds) != world_size + 1:
        raise ValueError(f"bounds must be world_size + 1 = {world_size + 1} ints, got {bounds!r}")
    bounds = tuple(check_int("bounds entry", b, 0, None) for b in bounds)
    if bounds[0] != 0 or any(b > c for b, c in zip(bounds, bounds[1:])):
        raise ValueError(f"bounds must start at 0 and never decrease, got {bounds}")
    return bounds


class Placement:
    """Where the rows of this rank's block go (a collective to build): ``part`` holds the part of
    each row of the block ``block[rank]:block[rank + 1]`` of original ids; rank ``p`` holds part
    ``p``. Nodes are numbered by part (``bounds``: the partition's bounds), within a part by the
    rank of their block, then by original id: each rank receives its rows in that order from the
    blocks, with no sorting."""

    def __init__(self, part: Tensor, block: tuple[int, ...], group=None):
        self.group = group
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.block = _check_block_bounds(block, world)
        self.first = self.block[rank]
        if part.dim() != 1 or part.numel() != self.block[rank + 1] - self.first:
            raise ValueError(f"part must hold one entry per row of this rank's block "
                             f"({self.block[rank + 1] - self.first}), got shape {tuple(part.shape)}")
        if part.numel() and (int(part.min()) < 0 or int(part.max()) >= world):
            raise ValueError(f"part entries must lie in [0, {world}), got {int(part.min())}..{int(part.max())}")
        device = part.device
        counts = torch.bincount(part, minlength=world)
        table = [torch.zeros(world, dtype=torch.long, device=device) for _ in range(world)]
        dist.all_gather(table, counts, group=group)
        # table[r][p]: rows of rank r's block in part p.
        table = torch.stack(table).cpu()
        self.bounds = tuple([0] + torch.cumsum(table.sum(0), 0).tolist())
        self.send_counts = table[rank].tolist()
        self.recv_counts = table[:, rank].tolist()
        self.order = torch.sort(part, stable=True).indices
        # Position of each block row: its part's start, the rows of that part in earlier blocks,
        # then its place among its block's rows of that part.
        before = torch.cumsum(table, 0)[rank] - table[rank]
        starts = torch.tensor(self.bounds[:-1], dtype=torch.long) + before
        within = torch.arange(part.numel(), device=device) - (torch.cumsum(counts, 0) - counts)[part[self.order]]
        self.position = torch.empty_like(part)
        self.position[self.order] = starts.to(device)[part[self.order]] + within

    @property
    def num_own(self) -> int:
        """Rows this rank holds once placed."""
        return sum(self.recv_counts)

    def move(self, rows: Tensor) -> Tensor:
        """The rows of this rank's part, from every rank's ``rows`` (one per row of its block,
        any trailing shape), in position order."""
        if rows.size(0) != self.order.numel():
            raise ValueError(f"rows must have one entry per row of this rank's block ({self.order.numel()}), "
                             f"got {rows.size(0)}")
        out = rows.new_empty((self.num_own, *rows.shape[1:]))
        dist.all_to_all_single(out, rows.index_select(0, self.order), self.recv_counts, self.send_counts,
                               group=self.group)
        return out

    def move_csr(self, rowptr: Tensor, col: Tensor, values: Tensor | None = None):
        """This rank's rows as ``(rowptr, col, values)``, columns in partition positions (int32
        where they fit), from every rank's block rows with columns in original ids: what
        ``GraphPart.from_rows`` takes. The block's entries are relabeled and gathered into the
        send buffers a range of rows at a time."""
        check_csr(rowptr, col, values, self.order.numel(), self.block[-1])
        rowptr = rowptr.long()
        table = self._position_table(col)
        lengths = rowptr.diff()
        moved_lengths = self.move(lengths)
        # The block's rows in send order, as a CSR whose entries are gathered range by range.
        sent_lengths = lengths.index_select(0, self.order)
        sent_rowptr = torch.zeros(self.order.numel() + 1, dtype=torch.long, device=col.device)
        torch.cumsum(sent_lengths, 0, out=sent_rowptr[1:])
        sources = rowptr[:-1].index_select(0, self.order) - sent_rowptr[:-1]
        sent_col = table.new_empty(col.numel())
        sent_values = None if values is None else values.new_empty(values.numel())
        for start, end in row_ranges(sent_rowptr):
            lo, hi = int(sent_rowptr[start]), int(sent_rowptr[end])
            entries = sources[range_rows(sent_rowptr, start, end)] + torch.arange(lo, hi, device=col.device)
            sent_col[lo:hi] = table[col[entries].long()]
            if values is not None:
                sent_values[lo:hi] = values[entries]
        del table, sources
        per_rank = [int(n) for n in _segment_sums(sent_lengths, self.send_counts)]
        per_rank_in = exchange_counts(per_rank, col.device, self.group)
        moved_col = self._exchange(sent_col, per_rank, per_rank_in)
        del sent_col
        moved_values = None if values is None else self._exchange(sent_values, per_rank, per_rank_in)
        moved_rowptr = torch.zeros(self.num_own + 1, dtype=torch.long, device=col.device)
        torch.cumsum(moved_lengths, 0, out=moved_rowptr[1:])
        return moved_rowptr, moved_col, moved_values

    def _exchange(self, tensor: Tensor, send: list[int], receive: list[int]) -> Tensor:
        out = tensor.new_empty(sum(receive))
        dist.all_to_all_single(out, tensor, receive, send, group=self.group)
        return out

    def _position_table(self, col: Tensor) -> Tensor:
        """A table from original id to partition position (int32 where positions fit; -1 where
        unknown), filled for the columns of ``col``, whose positions are asked from the ranks
        whose blocks hold them. One entry per node: a rank needs no sort of its entries."""
        num_nodes = self.block[-1]
        present = torch.zeros(num_nodes, dtype=torch.bool, device=col.device)
        present[col.long()] = True
        ids = present.nonzero().squeeze(1)
        del present
        inner = torch.tensor(self.block[1:-1], dtype=torch.long, device=col.device)
        asked = torch.bincount(torch.searchsorted(inner, ids, right=True), minlength=len(self.block) - 1).tolist()
        asked_of_me = exchange_counts(asked, col.device, self.group)
        requested = self._exchange(ids, asked, asked_of_me)
        answers = self.position.index_select(0, requested - self.first)
        dtype = torch.int32 if num_nodes <= torch.iinfo(torch.int32).max else torch.int64
        table = torch.full((num_nodes,), -1, dtype=dtype, device=col.device)
        table[ids] = self._exchange(answers, asked_of_me, asked).to(dtype)
        return table


def _segment_sums(values: Tensor, counts: list[int]) -> Tensor:
    """The sums of consecutive runs of ``counts[r]`` entries."""
    ends = torch.cumsum(torch.tensor(counts, dtype=torch.long), 0)
    cumulative = torch.cat([values.new_zeros(1), torch.cumsum(values, 0)]).cpu()
    return cumulative[ends] - cumulative[ends - torch.tensor(counts, dtype=torch.long)]
