"""Synthetic graphs for tests and benchmarks, vectorized torch (CPU or, with ``device='cuda'``, GPU).

Every generator returns ``(row, col, num_nodes)``: int64 COO sorted by (row, col) with no duplicate
pair, ready for ``formats.csr.from_coo``; ``planted_classes`` adds node features and labels. Self
loops are dropped except in ``band``. The rectangular generators (``bipartite``, ``sampled_block``)
return ``(row, col, (num_rows, num_cols))``.
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


def planted_classes(num_nodes: int, num_classes: int, num_features: int, avg_degree: float,
                    homophily: float = 0.2, feature_signal: float = 0.25, degree_exponent: float = 3.3,
                    seed: int = 0, device="cpu"):
    """A node-classification graph: ``(row, col, num_nodes, x, y)``, the graph as the other
    generators return it (symmetric), float32 features ``x`` [num_nodes, num_features] and int64
    class labels ``y``, all made on ``device`` (2.4M nodes and 120M nonzeros in seconds on a GPU).

    Each node draws a class and a Pareto weight, its expected degree up to a constant (density
    ``w ** -degree_exponent``: a power-law spread of degrees, hubs included; 3.3 puts the largest
    degree of 2.4M nodes at about ogbn-products' 17k). ``avg_degree * num_nodes / 2`` edges join a node drawn by
    weight to, with probability ``homophily``, a node of its class drawn by weight, else to any
    node drawn by weight (self loops and repeats dropped, so the mean degree falls a little
    short). Features are ``feature_signal * centroid[class] + N(0, 1)``: weak alone, so the
    neighbours' features carry the signal a GNN has to aggregate (with the defaults a linear
    model of the features and their 1- and 2-hop means is far ahead of one of the features)."""
    for name, value in (("num_nodes", num_nodes), ("num_classes", num_classes), ("num_features", num_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise ValueError(f"{name} must be an int >= 2, got {value!r}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must lie in [0, 1], got {homophily}")
    if not avg_degree > 0:
        raise ValueError(f"avg_degree must be positive, got {avg_degree}")
    if not degree_exponent > 1:
        raise ValueError(f"degree_exponent must exceed 1, got {degree_exponent}")
    gen = _generator(seed, device)
    y = torch.randint(0, num_classes, (num_nodes,), generator=gen, device=device)
    uniform = torch.rand(num_nodes, generator=gen, device=device, dtype=torch.float64)
    weight = (1.0 - uniform).pow(-1.0 / (degree_exponent - 1.0))
    # Nodes ordered by class: a class is a contiguous run, so a draw by weight inside one class is
    # a search in the running sum of weights between the run's two ends.
    order = torch.argsort(y, stable=True)
    running = torch.cumsum(weight[order], 0)
    class_end = torch.cumsum(torch.bincount(y, minlength=num_classes), 0)
    class_hi = running[class_end - 1]
    class_lo = torch.cat([running.new_zeros(1), class_hi[:-1]])

    def by_weight(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        target = lo + torch.rand(lo.shape, generator=gen, device=device, dtype=torch.float64) * (hi - lo)
        return order[torch.searchsorted(running, target, right=True).clamp(max=num_nodes - 1)]

    num_draws = int(num_nodes * avg_degree / 2)
    total = running[-1].expand(num_draws)
    source = by_weight(torch.zeros_like(total), total)
    same = torch.rand(num_draws, generator=gen, device=device) < homophily
    source_class = y[source]
    target = torch.where(same, by_weight(class_lo[source_class], class_hi[source_class]),
                         by_weight(torch.zeros_like(total), total))
    row, col, _ = _canonical(torch.cat([source, target]), torch.cat([target, source]), num_nodes)
    centroids = torch.randn(num_classes, num_features, generator=gen, device=device)
    x = feature_signal * centroids[y] + torch.randn(num_nodes, num_features, generator=gen, device=device)
    return row, col, num_nodes, x, y


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
