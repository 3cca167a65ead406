"""Mini-batches of seed nodes, each sampled into a ``SampledBatch``: an epoch's loop."""
from __future__ import annotations

import torch

from .neighbor_sampler import NeighborSampler, indexed_device


class BlockLoader:
    """Iterates over ``input_nodes`` (all nodes if None) in batches of ``batch_size`` seeds and
    yields each batch sampled by ``sampler``, as PyG's ``NeighborLoader`` iterates (``shuffle``
    draws a new order every epoch; ``drop_last`` drops a short last batch). Shuffling and
    sampling draw from ``generator`` (of the sampler's device), so a seeded generator repeats
    the epochs exactly."""

    def __init__(self, sampler: NeighborSampler, input_nodes: torch.Tensor | None = None, batch_size: int = 1,
                 shuffle: bool = False, drop_last: bool = False, generator: torch.Generator | None = None):
        if not isinstance(sampler, NeighborSampler):
            raise TypeError(f"sampler must be a NeighborSampler, got {type(sampler).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if input_nodes is None:
            input_nodes = torch.arange(sampler.num_nodes, device=sampler.device)
        elif not isinstance(input_nodes, torch.Tensor) or input_nodes.dim() != 1:
            raise TypeError(f"input_nodes must be a one-dimensional tensor of node ids, got {input_nodes!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        if generator is not None and indexed_device(generator.device) != indexed_device(sampler.device):
            raise ValueError(f"generator must be a generator of the sampler's device {sampler.device}, got one of "
                             f"{generator.device}")
        self.sampler, self.batch_size = sampler, batch_size
        self.input_nodes = input_nodes.to(sampler.device)
        self.shuffle, self.drop_last, self.generator = shuffle, drop_last, generator

    def __len__(self) -> int:
        whole, rest = divmod(self.input_nodes.numel(), self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def __iter__(self):
        nodes = self.input_nodes
        if self.shuffle:
            nodes = nodes[torch.randperm(nodes.numel(), generator=self.generator, device=nodes.device)]
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield self.sampler.sample(nodes[start: start + self.batch_size], self.generator)
