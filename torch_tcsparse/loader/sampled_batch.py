"""One sampled mini-batch: its nodes, its edges hop by hop, and the bipartite block of each layer."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..conversion import sampled_structures
from ..paths import VALUE_DTYPES
from ..tensor import TCSparseTensor


@dataclass(frozen=True, eq=False)  # fields are tensors: identity is the only equality
class SampledBatch:
    """The neighbourhood of ``batch_size`` seed nodes sampled over ``num_layers`` hops, in the
    layout of PyG's ``NeighborLoader`` output.

    ``nodes``: graph ids of the batch's nodes, the seeds first, then the nodes each hop found
    (slice node features and labels with it). ``edge_index``: ``[2, num_edges]`` batch ids,
    ``edge_index[0]`` the sampled neighbour (source), ``edge_index[1]`` the node it was sampled
    for (target), hop by hop. ``num_sampled_nodes``: the seeds, then the new nodes of each hop;
    ``num_sampled_edges``: the edges of each hop.

    Hop h's targets are the nodes hop h - 1 found, so the edges of the first m hops reach exactly
    the first ``sum(num_sampled_nodes[:m])`` nodes: layer i of L aggregates those edges for
    m = L - i into the nodes the next layer still needs (``layer_edges``, ``blocks``), as PyG's
    ``trim_to_layer`` computes it.

    ``_longest_rows`` is set by ``NeighborSampler`` alone (per hop, the most edges a target
    received): its word that the edges are its own, distinct, in range and ascending by target,
    so ``blocks`` converts them without reading the device back. A batch made otherwise leaves it
    None and its blocks are checked as ``from_batch`` checks any input."""

    nodes: torch.Tensor
    edge_index: torch.Tensor
    num_sampled_nodes: tuple[int, ...]
    num_sampled_edges: tuple[int, ...]
    _longest_rows: tuple[int, ...] | None = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return self.num_sampled_nodes[0]

    @property
    def seeds(self) -> torch.Tensor:
        return self.nodes[: self.batch_size]

    @property
    def num_layers(self) -> int:
        return len(self.num_sampled_edges)

    def layer_edges(self) -> list[tuple[torch.Tensor, tuple[int, int]]]:
        """Per layer, first layer first: ``(edge_index, (num_sources, num_targets))`` of its
        bipartite block (sources and targets both the batch's first nodes; a view of
        ``edge_index``), the form PyG's layers take with ``x = (x_sources, x_targets)``."""
        return [(self.edge_index[:, :num_edges], (num_sources, num_targets))
                for num_sources, num_targets, num_edges in self._layer_sizes()]

    def blocks(self, dtype: torch.dtype | None = None) -> list[TCSparseTensor]:
        """Per layer, first layer first, its block as a ``[num_targets, num_sources]``
        ``TCSparseTensor`` (``from_batch``: CSR only, the Tensor-Core layout left until the matrix
        has run enough products to pay for it), unit weights in ``dtype`` (float32 by default).
        A batch the sampler drew sorts its edges once for all of them, and every later layer's
        block is views of the first's arrays (``conversion.sampled_structures``)."""
        return self._blocks(list(range(self.num_layers)), dtype)

    def block(self, layer: int, dtype: torch.dtype | None = None) -> TCSparseTensor:
        """Layer ``layer``'s block (0: the first layer), as ``blocks`` gives it."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        return self._blocks([layer], dtype)[0]

    def _layer_sizes(self) -> list[tuple[int, int, int]]:
        """Per layer, first layer first: ``(num_sources, num_targets, num_edges)`` of its block."""
        nodes, edges = _running_sums(self.num_sampled_nodes), _running_sums(self.num_sampled_edges)
        return [(nodes[hops + 1], nodes[hops], edges[hops]) for hops in range(self.num_layers, 0, -1)]

    def _blocks(self, layers: list[int], dtype) -> list[TCSparseTensor]:
        """The blocks of ``layers`` (ascending)."""
        sizes = self._layer_sizes()
        if self._longest_rows is None or (dtype is not None and dtype not in VALUE_DTYPES):
            return [TCSparseTensor.from_batch(self.edge_index[:, :num_edges], num_nodes=(num_sources, num_targets),
                                              dtype=dtype)
                    for num_sources, num_targets, num_edges in (sizes[layer] for layer in layers)]
        if not layers:
            return []
        # Layer i's block holds the edges of the first L - i hops; each target's edges come from
        # one hop, so its longest row is the longest of those hops'.
        longest = _running_maxima(self._longest_rows)
        edge_index, first_edges = self.edge_index, sizes[layers[0]][2]
        if edge_index.size(1) != first_edges:
            edge_index = edge_index[:, :first_edges]
        built = sampled_structures(edge_index, [sizes[layer] for layer in layers],
                                   [longest[self.num_layers - layer] for layer in layers], dtype)
        return [TCSparseTensor(structure, values) for structure, values in built]

    def to(self, device) -> "SampledBatch":
        return SampledBatch(self.nodes.to(device), self.edge_index.to(device), self.num_sampled_nodes,
                            self.num_sampled_edges, self._longest_rows)


def _running_sums(counts: tuple[int, ...]) -> list[int]:
    sums = [0]
    for count in counts:
        sums.append(sums[-1] + count)
    return sums


def _running_maxima(counts: tuple[int, ...]) -> list[int]:
    """``maxima[h]``: the largest of the first ``h`` counts (0 for none)."""
    maxima = [0]
    for count in counts:
        maxima.append(max(maxima[-1], count))
    return maxima
