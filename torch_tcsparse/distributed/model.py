"""A cost model of full-graph GCN training on P GPUs: epoch time and memory per GPU from the
partition's per-rank shape (rows, nonzeros, halo rows), one GPU's measured times and memory, and
the link bandwidth.

Epoch time of P ranks = the slowest rank's compute + its halo exchanges + the gradient
all-reduce. A rank's compute is the one-GPU sparse time (its products, measured) scaled by its
share of the nonzeros, plus the one-GPU dense time (the rest of the epoch) scaled by its share
of the rows. An exchange moves the rank's larger side of the halo (rows sent or received) at the
link bandwidth, plus a latency per exchange. Memory per GPU = graph bytes per nonzero times its
nonzeros, plus training bytes per row times its rows, plus the halo buffers of the widest
exchange (the received rows and their copy beside the own rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .checks import check_int
from .partition import NodePartition, _part_of_positions


def product_widths(features: int, hidden: int, classes: int, layers: int) -> list[tuple[int, bool]]:
    """``(width, with_backward)`` of every distributed product of one GCN epoch, as
    ``DistributedGCNConv`` runs them: the narrower side of each layer; the first layer's product
    has no backward when it multiplies the features themselves (they need no gradient)."""
    for name, value in (("features", features), ("hidden", hidden), ("classes", classes), ("layers", layers)):
        check_int(name, value, 1, None)
    sizes = [features] + [hidden] * (layers - 1) + [classes]
    widths = []
    for index, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        widths.append((min(a, b), not (index == 0 and a < b)))
    return widths


def exchanged_width(widths: list[tuple[int, bool]]) -> int:
    """Columns exchanged per epoch: each product's forward, and its backward where it has one."""
    return sum(width * (2 if backward else 1) for width, backward in widths)


@dataclass(frozen=True)
class PartShape:
    """Per-rank rows, nonzeros (self-loops included) and halo rows received and sent."""

    rows: Tensor
    nnz: Tensor
    halo_in: Tensor
    halo_out: Tensor

    @property
    def num_parts(self) -> int:
        return self.rows.numel()


def part_shape(partition: NodePartition, rowptr: Tensor, col: Tensor, self_loops: bool = True) -> PartShape:
    """The shape of every rank's part for a global CSR in original numbering, computed in one
    process (no torch.distributed)."""
    num_parts = partition.num_parts
    part = _part_of_positions(partition.bounds, partition.position().to(col.device))
    lengths = rowptr.diff().long()
    row_part = torch.repeat_interleave(part, lengths)
    col_part = part[col.long()]
    cut = row_part != col_part
    # A halo row is one (receiving part, column) pair; sorted unique keys count each once.
    keys = torch.unique(row_part[cut] * partition.num_nodes + col.long()[cut])
    receiver, column = keys // partition.num_nodes, keys % partition.num_nodes
    bounds = torch.tensor(partition.bounds, device=col.device)
    rows = bounds.diff()
    nnz = torch.zeros(num_parts, dtype=torch.long, device=col.device).index_add_(0, part, lengths)
    if self_loops:
        nnz = nnz + rows
    halo_in = torch.bincount(receiver, minlength=num_parts)
    halo_out = torch.bincount(part[column], minlength=num_parts)
    return PartShape(rows.cpu(), nnz.cpu(), halo_in.cpu(), halo_out.cpu())


@dataclass(frozen=True)
class Measured:
    """One GPU's numbers for the graph and the link's.

    ``sparse_s``: the epoch's products (forward and backward) on the whole graph; ``dense_s``:
    the rest of the one-GPU epoch; ``graph_bytes``: the matrix and its transpose in memory;
    ``train_bytes``: the peak of training above the graph; ``link_bytes_per_s``: all-to-all
    bytes one rank sends per second; ``latency_s``: the fixed cost of one exchange."""

    nodes: int
    nnz: int
    sparse_s: float
    dense_s: float
    graph_bytes: float
    train_bytes: float
    link_bytes_per_s: float
    latency_s: float = 50e-6


@dataclass(frozen=True)
class Prediction:
    parts: int
    epoch_s: float
    compute_s: float
    exchange_s: float
    reduce_s: float
    memory_bytes: float
    halo_rows: int


def predict(shape: PartShape, measured: Measured, widths: list[tuple[int, bool]], parameter_bytes: int,
            element_size: int = 4) -> Prediction:
    """Epoch time and the largest memory per GPU of the ranks of ``shape``."""
    nnz_share = shape.nnz.double() / measured.nnz
    row_share = shape.rows.double() / measured.nodes
    compute = measured.sparse_s * nnz_share + measured.dense_s * row_share
    exchanges = sum(2 if backward else 1 for _, backward in widths)
    halo = torch.maximum(shape.halo_in, shape.halo_out).double()
    exchange = halo * exchanged_width(widths) * element_size / measured.link_bytes_per_s
    if shape.num_parts > 1:
        exchange = exchange + exchanges * measured.latency_s
    parts = shape.num_parts
    reduce = 2 * parameter_bytes * (parts - 1) / parts / measured.link_bytes_per_s if parts > 1 else 0.0
    widest = max(width for width, _ in widths)
    memory = (measured.graph_bytes * nnz_share + measured.train_bytes * row_share
              + 2.0 * shape.halo_in.double() * widest * element_size)
    slowest = int(torch.argmax(compute + exchange))
    return Prediction(parts, float(compute[slowest] + exchange[slowest]) + reduce, float(compute[slowest]),
                      float(exchange[slowest]), reduce, float(memory.max()), int(shape.halo_in.sum()))
