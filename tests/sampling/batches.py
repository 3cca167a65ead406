"""The invariants every sampled batch keeps, checked against its sampler's graph."""
import torch

from torch_tcsparse.loader import NeighborSampler, SampledBatch


def check_batch(sampler: NeighborSampler, batch: SampledBatch, seeds: torch.Tensor):
    """Every invariant of a sampled batch against the sampler's graph (on any device)."""
    assert bool((sampler._slot == -1).all())
    rowptr, col = sampler.rowptr.cpu(), sampler.col.cpu()
    batch, seeds = batch.to("cpu"), seeds.cpu()
    degree = rowptr[1:] - rowptr[:-1]
    graph_edges = set(zip(torch.repeat_interleave(torch.arange(sampler.num_nodes), degree).tolist(), col.tolist()))
    nodes = batch.nodes
    assert torch.equal(batch.seeds, seeds) and torch.unique(nodes).numel() == nodes.numel()
    assert sum(batch.num_sampled_nodes) == nodes.numel()
    assert sum(batch.num_sampled_edges) == batch.edge_index.size(1)
    offsets = [0]
    for count in batch.num_sampled_nodes:
        offsets.append(offsets[-1] + count)
    edge_start = 0
    for hop, (k, num_edges) in enumerate(zip(sampler.num_neighbors, batch.num_sampled_edges)):
        source, target = batch.edge_index[:, edge_start: edge_start + num_edges]
        edge_start += num_edges
        # Targets: the nodes the previous hop found; sources: any node found up to this hop.
        frontier = range(offsets[hop], offsets[hop + 1])
        assert bool(((target >= frontier.start) & (target < frontier.stop)).all())
        assert num_edges == 0 or int(source.max()) < offsets[hop + 2]
        counts = torch.bincount(target - frontier.start, minlength=len(frontier))
        wanted = degree[nodes[frontier.start: frontier.stop]]
        assert torch.equal(counts, wanted if k < 0 else wanted.clamp(max=k))
        pairs = list(zip(nodes[target].tolist(), nodes[source].tolist()))
        assert len(set(pairs)) == len(pairs), "a neighbour drawn twice"
        assert all(pair in graph_edges for pair in pairs)
        # The nodes this hop found are exactly its sources that no earlier hop had found.
        new = nodes[offsets[hop + 1]: offsets[hop + 2]]
        found_here = torch.unique(source[source >= offsets[hop + 1]])
        assert torch.equal(found_here, torch.arange(offsets[hop + 1], offsets[hop + 2]))
        assert torch.equal(new, torch.sort(new).values)
