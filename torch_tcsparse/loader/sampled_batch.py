"""One sampled mini-batch: its nodes, its edges hop by hop, and the bipartite block of each layer."""
from __future__ import annotations

from dataclasses import dataclass

import torch

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
    ``trim_to_layer`` computes it."""

    nodes: torch.Tensor
    edge_index: torch.Tensor
    num_sampled_nodes: tuple[int, ...]
    num_sampled_edges: tuple[int, ...]

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
        nodes, edges = _running_sums(self.num_sampled_nodes), _running_sums(self.num_sampled_edges)
        return [(self.edge_index[:, : edges[hops]], (nodes[hops + 1], nodes[hops]))
                for hops in range(self.num_layers, 0, -1)]

    def blocks(self, dtype: torch.dtype | None = None) -> list[TCSparseTensor]:
        """Per layer, first layer first, its block as a ``[num_targets, num_sources]``
        ``TCSparseTensor`` (``from_batch``: CSR only, the Tensor-Core layout left until the matrix
        has run enough products to pay for it), unit weights in ``dtype`` (float32 by default)."""
        return [TCSparseTensor.from_batch(edge_index, num_nodes=sizes, dtype=dtype)
                for edge_index, sizes in self.layer_edges()]

    def to(self, device) -> "SampledBatch":
        return SampledBatch(self.nodes.to(device), self.edge_index.to(device), self.num_sampled_nodes,
                            self.num_sampled_edges)


def _running_sums(counts: tuple[int, ...]) -> list[int]:
    sums = [0]
    for count in counts:
        sums.append(sums[-1] + count)
    return sums
