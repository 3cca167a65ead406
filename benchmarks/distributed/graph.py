"""The benchmark's graphs and node data, generated a block of rows at a time: no process needs
the whole graph to hold its rows.

An R-MAT graph (Graph500 parameters, symmetric, no self-loops, no repeated edge) is drawn in
chunks of edges, each from a generator seeded by the chunk's index, so every rank draws the same
edges and keeps those whose row lies in its block. Node ids are scrambled by a bijection of
``[0, 2**scale)`` (odd multiplications, xor-shifts), which spreads the hubs without a table of N
ids. The same device type draws the same graph (CUDA and CPU generators differ). Features and
labels are hashes of the node id: a rank draws its own nodes' wherever they come from.
"""
from __future__ import annotations

import torch
from torch import Tensor

from torch_tcsparse.distributed.hashing import hash_ids

# Graph500's quadrant probabilities (the fourth is 1 - A - B - C).
A, B, C = 0.57, 0.19, 0.19
CHUNK_EDGES = 1 << 24
# Rows of features hashed at a time: their int64 keys stay around a GB at 128 channels.
_FEATURE_CHUNK = 1 << 20


def scramble(ids: Tensor, scale: int) -> Tensor:
    """A fixed bijection of ``[0, 2**scale)``."""
    mask = (1 << scale) - 1
    ids = (ids * 0x9E3779B1) & mask
    ids = ids ^ (ids >> (scale // 2 + 1))
    ids = (ids * 0x85EBCA6B) & mask
    return ids ^ (ids >> (scale // 3 + 1))


def rmat_block(scale: int, edge_factor: int, first: int, end: int, device, seed: int = 1,
               chunk_edges: int = CHUNK_EDGES) -> tuple[Tensor, Tensor]:
    """``(rowptr, col)`` of the rows ``first:end`` of the R-MAT graph (columns ascending, int64)."""
    num_nodes = 1 << scale
    num_edges = edge_factor * num_nodes
    keys = []
    for index, start in enumerate(range(0, num_edges, chunk_edges)):
        count = min(chunk_edges, num_edges - start)
        generator = torch.Generator(device=device)
        generator.manual_seed(seed * 1_000_003 + index)
        row = torch.zeros(count, dtype=torch.long, device=device)
        col = torch.zeros(count, dtype=torch.long, device=device)
        for bit in range(scale):
            draw = torch.rand(count, generator=generator, device=device)
            row |= (draw >= A + B).long() << bit
            col |= (((draw >= A) & (draw < A + B)) | (draw >= A + B + C)).long() << bit
        row, col = scramble(row, scale), scramble(col, scale)
        # Both directions of every edge: the graph is symmetric.
        for source, target in ((row, col), (col, row)):
            keep = (source >= first) & (source < end) & (source != target)
            keys.append((source[keep] - first) * num_nodes + target[keep])
        del row, col
    keys = torch.unique(torch.cat(keys))
    rows = torch.div(keys, num_nodes, rounding_mode="floor")
    col = keys - rows * num_nodes
    rowptr = torch.zeros(end - first + 1, dtype=torch.long, device=device)
    torch.cumsum(torch.bincount(rows, minlength=end - first), 0, out=rowptr[1:])
    return rowptr, col


def node_features(nodes: Tensor, channels: int, seed: int) -> Tensor:
    """Features uniform in [-1, 1) (float32), a hash of (node id, channel, seed)."""
    out = torch.empty(nodes.numel(), channels, device=nodes.device)
    channel = torch.arange(channels, device=nodes.device)
    for start in range(0, nodes.numel(), _FEATURE_CHUNK):
        keys = nodes[start:start + _FEATURE_CHUNK].long().unsqueeze(1) * channels + channel
        out[start:start + _FEATURE_CHUNK] = hash_ids(keys, seed).float() / 2**31 - 1
    return out


def node_labels(nodes: Tensor, classes: int, seed: int) -> Tensor:
    return hash_ids(nodes, seed + 1) % classes
