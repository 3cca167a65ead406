"""Mini-batches of sampled neighbourhoods as per-layer bipartite blocks, drawn on the graph's
device in torch ops: ``NeighborSampler`` samples a batch of seeds into a ``SampledBatch``,
``BlockLoader`` runs an epoch of them.

    sampler = NeighborSampler.from_edge_index(edge_index, num_neighbors=[15, 10, 5])
    for batch in BlockLoader(sampler, train_idx, batch_size=1024, shuffle=True):
        x = features[batch.nodes]
        for conv, adj_t in zip(convs, batch.blocks()):
            x = conv((x, x[: adj_t.size(0)]), adj_t)    # x[: batch.batch_size] at the end
        loss = F.cross_entropy(x, labels[batch.seeds])
"""
from .block_loader import BlockLoader
from .neighbor_sampler import NeighborSampler
from .sampled_batch import SampledBatch

__all__ = ["BlockLoader", "NeighborSampler", "SampledBatch"]
