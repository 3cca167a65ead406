"""Row partitions of a square graph matrix: the multilevel partitioner of this package (on the
device of the graph's tensors), METIS through pymetis, or contiguous ranges.

A partition is an order of the nodes and P + 1 bounds: part ``r`` holds the nodes at positions
``bounds[r]:bounds[r + 1]`` of the order. Every rank numbers nodes by these positions (the
*partition numbering*), so a rank owns one contiguous range and finds the owner of any column
with one binary search over the bounds, without a per-node table of owners.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .checks import check_csr, check_int
from .multilevel import partition_graph

METHODS = ("auto", "multilevel", "metis", "contiguous")
_INSTALL = 'pip install -e ".[distributed]" in a clone of torch_tcsparse, or pip install "pymetis>=2025.2"'
_METIS_TOTAL = (1 << 30) - 1


@dataclass(frozen=True)
class NodePartition:
    """``order[i]``: the original id of the node at position ``i``; part ``r`` holds positions
    ``bounds[r]:bounds[r + 1]``."""

    order: Tensor
    bounds: tuple[int, ...]
    method: str

    @property
    def num_parts(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_nodes(self) -> int:
        return self.order.numel()

    def position(self) -> Tensor:
        """The inverse of ``order``: the position of every original node id."""
        position = torch.empty_like(self.order)
        position[self.order] = torch.arange(self.order.numel(), device=self.order.device)
        return position

    def part_of_nodes(self) -> Tensor:
        """The part of every original node id."""
        part = torch.empty_like(self.order)
        part[self.order] = _part_of_positions(self.bounds, torch.arange(self.num_nodes, device=self.order.device))
        return part

    def nodes(self, rank: int) -> Tensor:
        """Original ids of the nodes part ``rank`` owns, in partition order."""
        check_int("rank", rank, 0, self.num_parts - 1)
        return self.order[self.bounds[rank]: self.bounds[rank + 1]]

    def rows(self, rowptr: Tensor, col: Tensor, values: Tensor | None, rank: int):
        """Part ``rank``'s rows of a global CSR in original numbering, as ``(rowptr, col, values)``
        with columns in partition numbering: what ``GraphPart.from_rows`` takes."""
        check_csr(rowptr, col, values, self.num_nodes)
        rows = self.nodes(rank).to(rowptr.device)
        starts, ends = rowptr[rows].long(), rowptr[rows + 1].long()
        lengths = ends - starts
        local_rowptr = torch.zeros(rows.numel() + 1, dtype=torch.long, device=rowptr.device)
        torch.cumsum(lengths, 0, out=local_rowptr[1:])
        # Entry k of the part sits at starts[row of k] + (k - local_rowptr[row of k]) globally.
        offsets = torch.repeat_interleave(starts - local_rowptr[:-1], lengths)
        entries = torch.arange(int(local_rowptr[-1]), device=rowptr.device) + offsets
        local_col = self.position().to(col.device)[col[entries].long()]
        local_values = None if values is None else values[entries]
        return local_rowptr, local_col, local_values

    def cut_nonzeros(self, rowptr: Tensor, col: Tensor) -> int:
        """Nonzeros whose column lies in another part than their row (a global CSR in original
        numbering): the edge cut the halo exchange pays for."""
        check_csr(rowptr, col, None, self.num_nodes)
        part = _part_of_positions(self.bounds, self.position().to(col.device))
        row = torch.repeat_interleave(torch.arange(rowptr.numel() - 1, device=col.device), rowptr.diff().long())
        return int((part[row] != part[col.long()]).sum())


def _part_of_positions(bounds: tuple[int, ...], positions: Tensor) -> Tensor:
    inner = torch.tensor(bounds[1:-1], dtype=positions.dtype, device=positions.device)
    return torch.searchsorted(inner, positions, right=True)


def partition_rows(rowptr: Tensor, col: Tensor, num_parts: int, method: str = "auto", seed: int = 0,
                   row_weight: int | tuple[int, ...] = 0,
                   imbalance: float | tuple[float, ...] = 0.03) -> NodePartition:
    """Partition the rows of a square graph matrix (CSR in original numbering) into
    ``num_parts`` parts of balanced weight, cutting few of its nonzeros.

    A row weighs its nonzeros plus one (the nonzeros of the row once a self-loop is added), plus
    ``row_weight``: what a row costs beside its nonzeros, in nonzeros. Balancing nonzeros alone
    suits the sparse product; full-graph training also spends time and memory per row
    (activations, their gradients, the optimizer's dense work), which on graphs with many
    low-degree nodes leaves the part with the most rows far slower and larger. A tuple of row
    weights balances each weight at once (say, a row's time and a row's memory relative to a
    nonzero's), every part within ``1 + imbalance`` of its share of each; a tuple of
    imbalances gives each weight its own (a loose bound on memory, which only has to fit, lets a
    tight bound on time cut far fewer nonzeros than both held to the tight one).

    ``method``: ``"multilevel"`` (``"auto"``: this package's multilevel partitioner, in torch
    ops on the device of ``col``, which takes a GPU for graphs of hundreds of millions of
    nonzeros; any number of weights), ``"metis"`` (METIS through pymetis, the
    ``[distributed]`` extra, on one CPU core; one weight) or ``"contiguous"`` (ranges of the
    original order, cut at equal weight; one weight). An entry counts as cut in the direction
    it is stored; the multilevel partitioner tells a symmetric matrix apart and takes every
    other as the union of both directions."""
    check_csr(rowptr, col, None, None)
    check_int("num_parts", num_parts, 1, None)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    check_int("seed", seed, 0, None)
    row_weights = check_row_weights(row_weight)
    imbalances = check_imbalance(imbalance, len(row_weights))
    if method in ("metis", "contiguous") and len(row_weights) > 1:
        raise ValueError(f"method={method!r} balances one weight, got row_weight={row_weight!r} "
                         "(method='multilevel' balances several)")
    degree = rowptr.diff().long()
    if num_parts == 1 or method == "contiguous":
        return _contiguous((degree + 1 + row_weights[0]).cpu(), num_parts)
    if method == "metis":
        return _metis(rowptr, col, (degree + 1 + row_weights[0]).cpu(), num_parts, seed, imbalances[0])
    node_weight = torch.stack([degree + 1 + weight for weight in row_weights], 1)
    part = partition_graph(rowptr, col, node_weight, num_parts, torch.tensor(imbalances, dtype=torch.float64), seed)
    return _from_membership(part, num_parts, "multilevel")


def check_row_weights(row_weight) -> tuple[int, ...]:
    weights = row_weight if isinstance(row_weight, (tuple, list)) else (row_weight,)
    if not weights:
        raise ValueError("row_weight must be an int or a non-empty tuple of ints, got ()")
    return tuple(check_int("row_weight", weight, 0, None) for weight in weights)


def check_imbalance(imbalance, constraints: int) -> tuple[float, ...]:
    """One imbalance per row weight: a float serves every weight, a tuple names each's."""
    values = tuple(imbalance) if isinstance(imbalance, (tuple, list)) else (imbalance,) * constraints
    if len(values) != constraints:
        raise ValueError(f"imbalance must be a float or a tuple of one float per row weight ({constraints}), "
                         f"got {imbalance!r}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise ValueError(f"imbalance must be a float in (0, 1), got {value!r}")
    return tuple(float(value) for value in values)


def _from_membership(membership: Tensor, num_parts: int, method: str) -> NodePartition:
    """The partition of a part per node: nodes ordered by part, each part in id order."""
    membership = membership.cpu()
    order = torch.sort(membership, stable=True).indices
    counts = torch.bincount(membership, minlength=num_parts)
    return NodePartition(order, (0, *torch.cumsum(counts, 0).tolist()), method)


def _contiguous(weights: Tensor, num_parts: int) -> NodePartition:
    total = torch.cumsum(weights, 0)
    targets = torch.arange(1, num_parts, dtype=torch.float64) * (float(total[-1]) / num_parts if total.numel() else 0.0)
    cuts = torch.searchsorted(total.double(), targets, right=True).tolist()
    bounds = (0, *cuts, weights.numel())
    return NodePartition(torch.arange(weights.numel()), bounds, "contiguous")


def _metis(rowptr: Tensor, col: Tensor, weights: Tensor, num_parts: int, seed: int, imbalance: float) -> NodePartition:
    import scipy.sparse as sp

    pymetis = _pymetis()
    num_nodes = weights.numel()
    ones = np.ones(col.numel(), dtype=np.int8)
    matrix = sp.csr_matrix((ones, col.cpu().numpy(), rowptr.cpu().numpy()), shape=(num_nodes, num_nodes))
    # METIS takes an undirected graph without self-loops, each edge stored both ways.
    graph = (matrix + matrix.T).tocsr()
    graph.setdiag(0)
    graph.eliminate_zeros()
    adjacency = pymetis.CSRAdjacency(graph.indptr.astype(np.int64), graph.indices.astype(np.int64))
    # METIS's ufactor: the allowed imbalance in thousandths.
    options = pymetis.Options(seed=seed, ufactor=max(1, round(1000 * imbalance)))
    result = pymetis.part_graph(num_parts, adjacency, vweights=_metis_weights(weights).numpy(), options=options)
    return _from_membership(torch.from_numpy(np.asarray(result.vertex_part, dtype=np.int64)), num_parts, "metis")


def _metis_weights(weights: Tensor) -> Tensor:
    """The weights scaled down (each at least 1) where their sum would not fit METIS's 32-bit
    integers, with room for its partial sums. Raising a weight to 1 adds at most 1 per node:
    the scale leaves that room."""
    total = int(weights.sum())
    if total <= _METIS_TOTAL:
        return weights
    scale = (_METIS_TOTAL - weights.numel()) / total
    return torch.clamp(torch.floor(weights.double() * scale), min=1).long()


def _pymetis():
    try:
        import pymetis
    except ImportError:
        raise ImportError(f"method='metis' partitions with pymetis, which is not installed: {_INSTALL}") from None
    return pymetis
