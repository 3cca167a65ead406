"""A cost model of full-graph GCN training on P GPUs: epoch time and memory per GPU from the
partition's per-rank shape (rows, nonzeros, halo rows), one GPU's measured times and memory, and
the link bandwidth.

Epoch time of P ranks = the slowest rank's compute + its halo exchanges + the gradient
all-reduce. A rank's compute is the one-GPU sparse time (its products, measured) scaled by its
share of the nonzeros, plus the one-GPU dense time (the rest of the epoch) scaled by its share
of the rows, plus the passes over memory that splitting its rows into two blocks adds
(``split_bytes``) at the device's copy bandwidth. An exchange moves the rank's larger side of
the halo (rows sent or received) at the link bandwidth, plus a latency per exchange. Memory per
GPU = its graph plus the peak of its epoch. The graph: the one-GPU graph's bytes per nonzero for
the interior block's nonzeros (a symmetric block, whose transpose shares its index arrays, as
the whole graph's does) and twice that for the boundary block's (its transpose is a second
structure). The epoch: the tensors the training allocates, term by term (``memory.gcn_epoch``:
rows, halo rows received and sent, layer widths). The exchange is not overlapped in the model:
it predicts the ``overlap=False`` epoch, which bounds the overlapped one from above.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .checks import check_int
from .memory import gcn_epoch
from .partition import NodePartition


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
    """Columns exchanged per epoch: the forward and backward of each product that has a
    backward. One without multiplies the input features, whose halo rows cross the link once,
    before training (``GraphPart.fix_features``)."""
    return sum(2 * width for width, backward in widths if backward)


@dataclass(frozen=True)
class PartShape:
    """Per-rank rows, nonzeros (self-loops included), halo rows received and sent, and the
    nonzeros in halo columns (the boundary block's)."""

    rows: Tensor
    nnz: Tensor
    halo_in: Tensor
    halo_out: Tensor
    cut: Tensor

    @property
    def num_parts(self) -> int:
        return self.rows.numel()


def part_shape(partition: NodePartition, rowptr: Tensor, col: Tensor, self_loops: bool = True) -> PartShape:
    """The shape of every rank's part for a global CSR in original numbering, computed in one
    process (no torch.distributed). One pass per part over its own entries only: the time
    follows the nonzeros, not the nodes times the parts, and the memory one part's entries."""
    num_parts = partition.num_parts
    position = partition.position().to(col.device)
    inner = torch.tensor(partition.bounds[1:-1], dtype=torch.long, device=col.device)
    lengths = rowptr.diff().long()
    rows = torch.tensor(partition.bounds).diff()
    nnz = torch.zeros(num_parts, dtype=torch.long)
    halo_in = torch.zeros(num_parts, dtype=torch.long)
    cut = torch.zeros(num_parts, dtype=torch.long)
    halo_out = torch.zeros(num_parts, dtype=torch.long, device=col.device)
    for rank in range(num_parts):
        first, end = partition.bounds[rank], partition.bounds[rank + 1]
        nodes = partition.nodes(rank).to(rowptr.device)
        starts, counts = rowptr[nodes].long(), lengths[nodes]
        # Entry k of the part sits at starts[row of k] + (k - first entry of that row in the part).
        offsets = torch.cumsum(counts, 0) - counts
        entries = torch.repeat_interleave(starts - offsets, counts) + torch.arange(int(counts.sum()), device=rowptr.device)
        columns = position[col[entries].long()]
        outside = columns[(columns < first) | (columns >= end)]
        halo = _distinct(outside)
        nnz[rank] = entries.numel()
        cut[rank] = outside.numel()
        halo_in[rank] = halo.numel()
        halo_out += torch.bincount(torch.searchsorted(inner, halo, right=True), minlength=num_parts)
    if self_loops:
        nnz = nnz + rows
    return PartShape(rows, nnz, halo_in, halo_out.cpu(), cut)


def _distinct(values: Tensor) -> Tensor:
    """The distinct values, ascending. On the CPU through numpy, whose sort runs several times
    faster than torch's there."""
    if values.device.type == "cpu":
        return torch.from_numpy(np.unique(values.numpy()))
    return torch.unique(values)


@dataclass(frozen=True)
class Measured:
    """One GPU's numbers for the graph and the link's.

    ``sparse_s``: the epoch's products (forward and backward) on the whole graph; ``dense_s``:
    the rest of the one-GPU epoch; ``graph_bytes``: the matrix and its transpose in memory;
    ``link_bytes_per_s``: all-to-all bytes one rank sends per second; ``latency_s``: the fixed
    cost of one exchange; ``copy_bytes_per_s``: the device's copy bandwidth (bytes read plus
    written), infinite where not measured (the split's passes then cost nothing)."""

    nodes: int
    nnz: int
    sparse_s: float
    dense_s: float
    graph_bytes: float
    link_bytes_per_s: float
    latency_s: float = 50e-6
    copy_bytes_per_s: float = float("inf")


@dataclass(frozen=True)
class RankPrediction:
    """Per rank (tensors of P entries): ``compute_s`` (its products and dense work),
    ``exchange_s`` (its halo exchanges, not overlapped), ``interior_s`` (its interior block's
    products, behind which an exchange can hide) and ``memory_bytes``."""

    compute_s: Tensor
    exchange_s: Tensor
    interior_s: Tensor
    memory_bytes: Tensor


@dataclass(frozen=True)
class Prediction:
    """``epoch_s``: the exchange after the products' start (``overlap=False``);
    ``overlapped_epoch_s``: each exchange hidden behind the interior block's products, up to
    their time."""

    parts: int
    epoch_s: float
    compute_s: float
    exchange_s: float
    reduce_s: float
    memory_bytes: float
    halo_rows: int
    overlapped_epoch_s: float


def predict_ranks(shape: PartShape, measured: Measured, network: tuple[int, int, int, int], element_size: int = 4,
                  emulated: bool = False, mask_kernel: bool = True) -> RankPrediction:
    """Every rank's compute, exchange and memory for the part shapes ``shape``; ``network``:
    the GCN's (features, hidden, classes, layers); ``emulated``: the ranks run through
    ``EmulatedPeers`` (their receives gather from the rows sent); ``mask_kernel``: dropout's
    mask drawn in one kernel, as on GPUs (``dropout_kernel``)."""
    widths = product_widths(*network)
    nnz_share = shape.nnz.double() / measured.nnz
    row_share = shape.rows.double() / measured.nodes
    compute = measured.sparse_s * nnz_share + measured.dense_s * row_share
    if shape.num_parts > 1:
        compute = compute + split_bytes(shape, widths, element_size, emulated) / measured.copy_bytes_per_s
    exchanges = sum(2 for _, backward in widths if backward)
    halo = torch.maximum(shape.halo_in, shape.halo_out).double()
    exchange = halo * exchanged_width(widths) * element_size / measured.link_bytes_per_s
    if shape.num_parts > 1:
        exchange = exchange + exchanges * measured.latency_s
    memory = graph_bytes(shape, measured) + torch.tensor(
        [float(gcn_epoch(int(rows), int(halo_in), int(halo_out), *network, element_size=element_size,
                         emulated=emulated, mask_kernel=mask_kernel).peak)
         for rows, halo_in, halo_out in zip(shape.rows, shape.halo_in, shape.halo_out)], dtype=torch.float64)
    interior = measured.sparse_s * (shape.nnz - shape.cut).double() / measured.nnz
    return RankPrediction(compute, exchange, interior, memory)


def split_bytes(shape: PartShape, widths: list[tuple[int, bool]], element_size: int = 4,
                emulated: bool = False) -> Tensor:
    """Bytes every rank reads and writes per epoch because its rows are split into an interior
    and a boundary block, which one GPU's single product does not: each product's boundary block
    writes every own row and is added to the interior's (four passes over the own rows at the
    product's width); each exchanged product gathers the rows it sends and, backward, adds the
    gradients returned for them (two and three passes over those rows). ``emulated``: the
    received rows are copies gathered from the sent ones (two passes over each, both ways)."""
    forward = sum(width for width, _ in widths)
    exchanged = sum(width for width, backward in widths if backward)
    sent, received = shape.halo_out.double(), shape.halo_in.double()
    passes = 4 * shape.rows.double() * forward + 5 * sent * exchanged
    if emulated:
        passes = passes + 2 * (received + sent) * exchanged
    return element_size * passes


def graph_bytes(shape: PartShape, measured: Measured) -> Tensor:
    """Every rank's part in memory: the interior block at the one-GPU graph's bytes per nonzero
    (both symmetric, each sharing its index arrays with its transpose), the boundary block at
    twice that (its transpose has arrays of its own)."""
    per_nonzero = measured.graph_bytes / measured.nnz
    return per_nonzero * ((shape.nnz - shape.cut) + 2 * shape.cut).double()


def predict(shape: PartShape, measured: Measured, network: tuple[int, int, int, int], parameter_bytes: int,
            element_size: int = 4) -> Prediction:
    """Epoch time and the largest memory per GPU of the ranks of ``shape`` (``network`` as
    ``predict_ranks`` takes it)."""
    ranks = predict_ranks(shape, measured, network, element_size)
    parts = shape.num_parts
    reduce = 2 * parameter_bytes * (parts - 1) / parts / measured.link_bytes_per_s if parts > 1 else 0.0
    overlapped = ranks.compute_s + ranks.exchange_s - torch.minimum(ranks.exchange_s, ranks.interior_s)
    total = ranks.compute_s + ranks.exchange_s
    slowest = int(torch.argmax(total))
    return Prediction(parts, float(total[slowest]) + reduce, float(ranks.compute_s[slowest]),
                      float(ranks.exchange_s[slowest]), reduce, float(ranks.memory_bytes.max()),
                      int(shape.halo_in.sum()), float(overlapped.max()) + reduce)
