"""Tiny graph generators for the reordering tests (the package's synthetic module is not needed)."""
from __future__ import annotations

import torch

from torch_tcsparse.formats.csr import CSR, from_coo


def sbm(num_nodes: int, community: int, p_in: float, out_degree: float, seed: int, shuffle: bool) -> CSR:
    """Undirected planted partition: dense communities of ``community`` consecutive nodes plus random edges."""
    gen = torch.Generator().manual_seed(seed)
    blocks = num_nodes // community
    inside = int(p_in * community * community * blocks / 2)
    block = torch.randint(0, blocks, (inside,), generator=gen)
    row = block * community + torch.randint(0, community, (inside,), generator=gen)
    col = block * community + torch.randint(0, community, (inside,), generator=gen)
    across = int(out_degree * num_nodes / 2)
    row = torch.cat([row, torch.randint(0, num_nodes, (across,), generator=gen)])
    col = torch.cat([col, torch.randint(0, num_nodes, (across,), generator=gen)])
    if shuffle:
        relabel = torch.randperm(num_nodes, generator=gen)
        row, col = relabel[row], relabel[col]
    return from_coo(torch.cat([row, col]), torch.cat([col, row]), None, num_nodes, num_nodes)


def band(num_nodes: int, half_width: int) -> CSR:
    """Every node linked to the ``half_width`` nodes on each side: the order is already optimal."""
    offsets = torch.arange(-half_width, half_width + 1)
    row = torch.arange(num_nodes).repeat_interleave(offsets.numel())
    col = row + offsets.repeat(num_nodes)
    keep = (col >= 0) & (col < num_nodes)
    return from_coo(row[keep], col[keep], None, num_nodes, num_nodes)


def random_rectangular(num_rows: int, num_cols: int, nnz: int, seed: int) -> CSR:
    gen = torch.Generator().manual_seed(seed)
    row = torch.randint(0, num_rows, (nnz,), generator=gen)
    col = torch.randint(0, num_cols, (nnz,), generator=gen)
    values = torch.randn(nnz, generator=gen, dtype=torch.float64).float()
    return from_coo(row, col, values, num_rows, num_cols)


def directed_powerlaw(num_nodes: int, out_degree: int, exponent: float, seed: int) -> CSR:
    """A directed graph like a web or social graph: every node points at ``out_degree`` targets
    drawn with power-law popularity (``exponent`` of the in-degrees), so a few nodes are pointed at
    by a large share of all the others; ids shuffled. A large ``exponent`` draws targets nearly
    uniformly: the same size without hubs."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.arange(1, num_nodes + 1, dtype=torch.float64).pow(-1 / (exponent - 1))
    cumulative = torch.cumsum(weight / weight.sum(), 0)
    row = torch.arange(num_nodes).repeat_interleave(out_degree)
    draw = torch.rand(row.numel(), generator=gen, dtype=torch.float64)
    col = torch.searchsorted(cumulative, draw).clamp_(max=num_nodes - 1)
    relabel = torch.randperm(num_nodes, generator=gen)
    row, col = relabel[row], relabel[col]
    keep = row != col
    return from_coo(row[keep], col[keep], None, num_nodes, num_nodes)
