"""Training GraphSAGE on sampled batches as per-layer bipartite blocks, the same batches for our
backend and PyG's: a batch's blocks become each backend's ``adj_t`` (``models.batch_adjacency``)
inside the step, so their conversion is part of the step's time."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from examples.sage.models import PYG_FORMATS, batch_adjacency
from torch_tcsparse.loader import SampledBatch


def block_adjacencies(backend: str, batch: SampledBatch, pyg_format: str = "csr") -> list:
    """``(adj_t, num_targets)`` per layer, first layer first, as ``SAGE.forward_blocks`` takes.
    Ours are the batch's own blocks: those of a batch our sampler drew convert without reading
    the device back (``SampledBatch.blocks``)."""
    if backend == "ours" and pyg_format in PYG_FORMATS:
        return [(adj_t, adj_t.shape[0]) for adj_t in batch.blocks()]
    return [(batch_adjacency(backend, edge_index, sizes, pyg_format), sizes[1])
            for edge_index, sizes in batch.layer_edges()]


def train_step(model, optimizer, batch: SampledBatch, x: torch.Tensor, y: torch.Tensor, backend: str,
               pyg_format: str = "csr") -> torch.Tensor:
    """One forward, backward and optimizer step on ``batch`` (``x``, ``y``: the whole graph's
    features and labels, on the batch's device); the loss, left on the device."""
    blocks = block_adjacencies(backend, batch, pyg_format)
    optimizer.zero_grad()
    out = model.forward_blocks(x[batch.nodes], blocks)
    loss = F.cross_entropy(out, y[batch.seeds])
    loss.backward()
    optimizer.step()
    return loss.detach()


def from_pyg_batch(data) -> SampledBatch:
    """A batch of PyG's ``NeighborLoader`` (with pyg-lib, which reports the nodes and edges each
    hop sampled) as a ``SampledBatch``: its nodes (``n_id``), edges and per-hop counts, which
    are already laid out as ours."""
    if getattr(data, "num_sampled_nodes", None) is None or getattr(data, "num_sampled_edges", None) is None:
        raise ValueError("the batch reports no num_sampled_nodes/num_sampled_edges: PyG's NeighborLoader "
                         "gives them with pyg-lib installed")
    return SampledBatch(data.n_id, data.edge_index, tuple(int(n) for n in data.num_sampled_nodes),
                        tuple(int(n) for n in data.num_sampled_edges))
