"""Synthetic graphs for tests and benchmarks, vectorized torch (CPU or, with ``device='cuda'``, GPU).

Every generator returns ``(row, col, num_nodes)``: int64 COO sorted by (row, col) with no duplicate
pair, ready for ``formats.csr.from_coo``. Self loops are dropped except in ``band``. The rectangular
generators (``bipartite``, ``sampled_block``) return ``(row, col, (num_rows, num_cols))``.
"""
from __future__ import annotations

import torch


def _generator(seed: int, device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _canonical(row: torch.Tensor, col: torch.Tensor, num_nodes: int, drop_self_loops: bool = True):
    if drop_self_loops:
        keep = row != col
        row, col = row[keep], col[keep]
    key = torch.unique(row * num_nodes + col)  # sorted, duplicates removed
    return key // num_nodes, key % num_nodes, num_nodes


def _relabel(row: torch.Tensor, col: torch.Tensor, num_nodes: int, gen: torch.Generator):
    perm = torch.randperm(num_nodes, generator=gen, device=row.device)
    return perm[row], perm[col]


def rmat(scale: int, edge_factor: int = 16, a: float = 0.57, b: float = 0.19, c: float = 0.19, seed: int = 0,
         shuffle: bool = True, symmetrize: bool = True, device="cpu"):
    """R-MAT (Graph500 parameters by default): 2**scale nodes, edge_factor * 2**scale drawn edges."""
    if not 0 < a + b + c < 1:
        raise ValueError(f"a + b + c must lie in (0, 1), got {a + b + c}")
    num_nodes = 1 << scale
    num_edges = edge_factor * num_nodes
    gen = _generator(seed, device)
    row = torch.zeros(num_edges, dtype=torch.long, device=device)
    col = torch.zeros(num_edges, dtype=torch.long, device=device)
    for bit in range(scale):
        r = torch.rand(num_edges, generator=gen, device=device)
        # Quadrants: [0, a) top-left, [a, a+b) top-right, [a+b, a+b+c) bottom-left, rest bottom-right.
        down = r >= a + b
        right = ((r >= a) & (r < a + b)) | (r >= a + b + c)
        row |= down.long() << bit
        col |= right.long() << bit
    if shuffle:
        row, col = _relabel(row, col, num_nodes, gen)
    if symmetrize:
        row, col = torch.cat([row, col]), torch.cat([col, row])
    return _canonical(row, col, num_nodes)


def uniform(n: int, degree: int, seed: int = 0, device="cpu"):
    """Each node links to ``degree`` columns drawn uniformly (duplicates and self loops dropped)."""
    gen = _generator(seed, device)
    row = torch.arange(n, device=device).repeat_interleave(degree)
    col = torch.randint(0, n, (n * degree,), generator=gen, device=device)
    return _canonical(row, col, n)


def sbm(n: int, degree: int, block_size: int, shuffled: bool = True, p_in: float = 0.9, seed: int = 0, device="cpu"):
    """Stochastic block model: ``degree`` draws per node, a fraction ``p_in`` inside the node's block
    of ``block_size`` consecutive ids, the rest uniform; ``shuffled`` relabels ids at random."""
    gen = _generator(seed, device)
    row = torch.arange(n, device=device).repeat_interleave(degree)
    m = row.numel()
    start = (row // block_size) * block_size
    size = torch.clamp(n - start, max=block_size)
    inside = (torch.rand(m, generator=gen, device=device) * size).long() + start
    anywhere = torch.randint(0, n, (m,), generator=gen, device=device)
    col = torch.where(torch.rand(m, generator=gen, device=device) < p_in, inside, anywhere)
    if shuffled:
        row, col = _relabel(row, col, n, gen)
    return _canonical(row, col, n)


def band(n: int, b: int, device="cpu"):
    """Band matrix: every (i, j) with |i - j| <= b, diagonal included."""
    offsets = torch.arange(-b, b + 1, device=device)
    row = torch.arange(n, device=device).repeat_interleave(offsets.numel())
    col = row + offsets.repeat(n)
    keep = (col >= 0) & (col < n)
    return _canonical(row[keep], col[keep], n, drop_self_loops=False)


def _power_law_ids(count: int, num_ids: int, exponent: float, gen: torch.Generator, device):
    """``count`` ids in [0, num_ids) drawn with weights (rank + 1)^-exponent over ranks assigned to
    ids at random, so that popular ids are scattered (no structure in the id order)."""
    weight = torch.arange(1, num_ids + 1, device=device, dtype=torch.float64).pow(-exponent)
    cumulative = torch.cumsum(weight / weight.sum(), 0)
    rank = torch.searchsorted(cumulative, torch.rand(count, generator=gen, device=device, dtype=torch.float64))
    return torch.randperm(num_ids, generator=gen, device=device)[rank.clamp_(max=num_ids - 1)]


def _canonical_rectangular(row: torch.Tensor, col: torch.Tensor, num_rows: int, num_cols: int):
    key = torch.unique(row * num_cols + col)  # sorted, duplicates removed
    return key // num_cols, key % num_cols, (num_rows, num_cols)


def bipartite(num_rows: int, num_cols: int, degree: int, row_exponent: float = 0.8, col_exponent: float = 0.6,
              seed: int = 0, device="cpu"):
    """A rectangular (bipartite, user-item-like) matrix: ``num_rows * degree`` pairs, rows and
    columns each drawn with power-law weights (``_power_law_ids``), duplicates dropped. Returns
    ``(row, col, (num_rows, num_cols))``."""
    gen = _generator(seed, device)
    draws = num_rows * degree
    row = _power_law_ids(draws, num_rows, row_exponent, gen, device)
    col = _power_law_ids(draws, num_cols, col_exponent, gen, device)
    return _canonical_rectangular(row, col, num_rows, num_cols)


def sampled_block(num_rows: int, num_cols: int, fanout: int, col_exponent: float = 0.6, seed: int = 0, device="cpu"):
    """A sampled mini-batch block: every row (a target node) draws ``fanout`` columns (source
    nodes) with power-law popularity, duplicates dropped, so row lengths are nearly uniform and
    columns are shared unevenly. Returns ``(row, col, (num_rows, num_cols))``."""
    gen = _generator(seed, device)
    row = torch.arange(num_rows, device=device).repeat_interleave(fanout)
    col = _power_law_ids(row.numel(), num_cols, col_exponent, gen, device)
    return _canonical_rectangular(row, col, num_rows, num_cols)
