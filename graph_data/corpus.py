"""A broad corpus of graphs with a fixed split into "fit" and "unseen" families.

Calibration constants, thresholds and design choices may be fitted on "fit" families only; every
benchmark reports "fit" and "unseen" apart, so that a number on "unseen" is a number on graphs
nothing was tuned for. ``SPLIT`` below is the one definition of that split.

Generated families differ in degree distribution (uniform, power law, bounded), community
structure (none, equal blocks, blocks of every size, spatial neighbourhoods), id order (as
generated, shuffled, hubs first) and shape (square graphs; ``RECTANGULAR`` bipartite matrices,
more columns than rows). Each family generates a graph of about a requested number of nonzeros
(``generate(family, nnz, seed, device)``); ``TIERS`` names the sizes a benchmark runs, "small"
being the tier CPU tests run. Every generator is vectorised torch on the CPU or a GPU, seeded and
deterministic on a given device, and returns what ``graph_data.synthetic`` returns: ``(row, col,
num_nodes)``, int64 COO sorted by (row, col) without duplicate pairs or self loops (``band``
keeps its diagonal); a rectangular family returns ``(row, col, (num_rows, num_cols))``.

Real graphs (``graph_data.npz``) join the corpus with their source collection as family (the
file name's prefix: ``planetoid_cora`` is of family ``planetoid``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from graph_data import npz, synthetic

# Each kind of structure has a member on both sides (a Kronecker graph, a mesh, communities, a
# bounded-degree graph), so "unseen" asks whether what was tuned on one member holds on another.
SPLIT = {
    "fit": ("rmat", "sbm", "uniform", "band", "mesh3d", "powerlaw", "bipartite"),
    "unseen": ("kron", "mesh2d", "blocks_noise", "road", "geometric", "sampled"),
}
SPLIT_REASON = ("fit: the suite's families plus a 3D mesh, a power-law configuration model and a "
                "power-law bipartite matrix; unseen: another member of each kind (initiator, mesh, "
                "community sizes, degree, a sampled block's uniform rows), and a spatial family, never "
                "used to tune")
# Rectangular families: bipartite matrices, ``(row, col, (num_rows, num_cols))``. A benchmark
# that permutes rows and columns alike (reordering) asks for square graphs only.
RECTANGULAR = ("bipartite", "sampled")
# Real graphs: the collections the selector's calibration was already measured on are "fit"; a
# collection not listed here is "unseen" (a user's new graphs are, by definition, untuned for).
REAL_FIT_SOURCES = ("geomgcn", "gg", "gnnadvisor", "karateclub", "musae", "ogbl", "planetoid", "snap")

# Target nonzeros per tier. "large" reaches the 60M+ nonzeros where X no longer fits in L2 at
# any N; "small" runs in seconds on a CPU.
TIERS = {
    "small": (20_000, 100_000),
    "medium": (1_000_000, 4_000_000),
    "large": (16_000_000, 64_000_000),
}


def _generator(seed: int, device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _symmetric(row: torch.Tensor, col: torch.Tensor, num_nodes: int):
    return synthetic._canonical(torch.cat([row, col]), torch.cat([col, row]), num_nodes)


def _shuffled(row: torch.Tensor, col: torch.Tensor, num_nodes: int, gen: torch.Generator):
    perm = torch.randperm(num_nodes, generator=gen, device=row.device)
    return _symmetric(perm[row], perm[col], num_nodes)


def _scale_and_factor(nnz: int, per_edge: float, least: int) -> tuple[int, int]:
    """R-MAT's scale and edge factor (``least`` to ``2 * least``) for about ``nnz`` nonzeros, at
    ``per_edge`` nonzeros kept per drawn edge (both directions, less duplicates)."""
    scale = max(4, math.floor(math.log2(max(nnz / (per_edge * least), 16))))
    return scale, max(least, round(nnz / (per_edge * (1 << scale))))


def rmat(nnz: int, seed: int, device):
    """Graph500's initiator, 16 to 32 edges per node, ids shuffled. About 0.9 of the drawn pairs
    survive the removal of duplicates at these scales: 1.8 nonzeros per edge."""
    scale, factor = _scale_and_factor(nnz, 1.8, 16)
    return synthetic.rmat(scale, edge_factor=factor, seed=seed, device=device)


def kron(nnz: int, seed: int, device):
    """A flatter initiator (0.45, 0.15, 0.15, 0.25) with 8 to 16 edges per node, ids shuffled: hubs
    less extreme than Graph500's, more of the edges between mid-degree nodes."""
    scale, factor = _scale_and_factor(nnz, 1.95, 8)
    return synthetic.rmat(scale, edge_factor=factor, a=0.45, b=0.15, c=0.15, seed=seed, device=device)


def uniform(nnz: int, seed: int, device):
    return synthetic.uniform(max(64, nnz // 16), 16, seed=seed, device=device)


def sbm(nnz: int, seed: int, device):
    """Equal blocks of 512 consecutive ids, 90% of the draws inside, ids shuffled."""
    return synthetic.sbm(max(64, nnz // 32), 32, 512, shuffled=True, seed=seed, device=device)


def band(nnz: int, seed: int, device):
    """Half-width 16, the ids in their natural (already optimal) order; deterministic, ``seed``
    unused."""
    return synthetic.band(max(64, nnz // 33), 16, device=device)


def _grid_ids(sides: tuple, device) -> torch.Tensor:
    return torch.arange(math.prod(sides), device=device).view(*sides)


def mesh3d(nnz: int, seed: int, device):
    """A 3D grid with the 7-point stencil's neighbours, ids shuffled."""
    side = max(4, round((nnz / 6) ** (1 / 3)))
    ids = _grid_ids((side, side, side), device)
    pairs = [(ids[1:].flatten(), ids[:-1].flatten()), (ids[:, 1:].flatten(), ids[:, :-1].flatten()),
             (ids[:, :, 1:].flatten(), ids[:, :, :-1].flatten())]
    row, col = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    return _shuffled(row, col, side ** 3, _generator(seed, device))


def mesh2d(nnz: int, seed: int, device):
    """A triangulated 2D grid (right, down and one diagonal: six neighbours inside), ids shuffled."""
    side = max(4, round(math.sqrt(nnz / 6)))
    ids = _grid_ids((side, side), device)
    row = torch.cat([ids[:, 1:].flatten(), ids[1:].flatten(), ids[1:, 1:].flatten()])
    col = torch.cat([ids[:, :-1].flatten(), ids[:-1].flatten(), ids[:-1, :-1].flatten()])
    return _shuffled(row, col, side * side, _generator(seed, device))


def road(nnz: int, seed: int, device):
    """Road-like: a 2D grid keeping 70% of its edges, plus 2% of nodes linked to a node up to
    8 cells away; degrees 1-5, mean about 3, ids shuffled."""
    side = max(4, round(math.sqrt(nnz / 3)))
    gen = _generator(seed, device)
    ids = _grid_ids((side, side), device)
    row = torch.cat([ids[:, 1:].flatten(), ids[1:].flatten()])
    col = torch.cat([ids[:, :-1].flatten(), ids[:-1].flatten()])
    keep = torch.rand(row.numel(), generator=gen, device=device) < 0.7
    row, col = row[keep], col[keep]
    num_nodes = side * side
    starts = torch.randint(0, num_nodes, (max(1, num_nodes // 50),), generator=gen, device=device)
    dx = torch.randint(-8, 9, starts.shape, generator=gen, device=device)
    dy = torch.randint(-8, 9, starts.shape, generator=gen, device=device)
    x = (starts // side + dx).clamp(0, side - 1)
    y = (starts % side + dy).clamp(0, side - 1)
    row, col = torch.cat([row, starts]), torch.cat([col, x * side + y])
    return _shuffled(row, col, num_nodes, gen)


def powerlaw(nnz: int, seed: int, device):
    """Chung-Lu configuration model: expected degrees following a power law of exponent 2.3
    (mean 16), endpoints drawn in proportion; ids in decreasing expected degree, hubs first."""
    num_nodes = max(64, nnz // 14)
    gen = _generator(seed, device)
    weight = torch.arange(1, num_nodes + 1, device=device, dtype=torch.float64).pow(-1 / 1.3)
    cumulative = torch.cumsum(weight / weight.sum(), 0)
    draws = num_nodes * 8
    ends = torch.searchsorted(cumulative, torch.rand(2, draws, generator=gen, device=device, dtype=torch.float64))
    ends = ends.clamp_(max=num_nodes - 1)
    return _symmetric(ends[0], ends[1], num_nodes)


def blocks_noise(nnz: int, seed: int, device):
    """Communities of log-uniform sizes from 16 to 4096 ids, 75% of 12 draws per node inside its
    community, the rest anywhere (the noise), symmetrized, ids shuffled."""
    num_nodes = max(64, nnz // 22)
    gen = _generator(seed, device)
    sizes = torch.exp(torch.empty(num_nodes // 16 + 1, device=device, dtype=torch.float64)
                      .uniform_(math.log(16), math.log(4096), generator=gen)).long()
    ends = torch.cumsum(sizes, 0)
    ends = torch.cat([ends[ends < num_nodes], torch.tensor([num_nodes], device=device)])
    starts = torch.cat([torch.zeros(1, dtype=torch.long, device=device), ends[:-1]])
    node = torch.arange(num_nodes, device=device)
    community = torch.searchsorted(ends, node, right=True)
    row = node.repeat_interleave(12)
    first, width = starts[community[row]], (ends - starts)[community[row]]
    inside = first + (torch.rand(row.numel(), generator=gen, device=device) * width).long()
    anywhere = torch.randint(0, num_nodes, (row.numel(),), generator=gen, device=device)
    col = torch.where(torch.rand(row.numel(), generator=gen, device=device) < 0.75, inside, anywhere)
    return _shuffled(row, col, num_nodes, gen)


def geometric(nnz: int, seed: int, device):
    """Random geometric graph: points uniform in the unit square, linked within radius r, about
    9.4 neighbours each (3 points per r x r cell); ids in generation order, unrelated to position."""
    num_nodes = max(64, round(nnz / 9.4))
    gen = _generator(seed, device)
    cells = max(1, int(math.sqrt(num_nodes / 3)))
    radius = 1.0 / cells
    point = torch.rand(num_nodes, 2, generator=gen, device=device, dtype=torch.float64)
    cell_xy = (point / radius).long().clamp_(max=cells - 1)
    cell = cell_xy[:, 0] * cells + cell_xy[:, 1]
    by_cell = torch.argsort(cell, stable=True)
    count = torch.bincount(cell, minlength=cells * cells)
    start = torch.cumsum(count, 0) - count
    rows, cols = [], []
    # Pairs within radius lie in the same or a neighbouring cell: each of the 9 offsets is one
    # ragged product of a point with the members of one cell.
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            x, y = cell_xy[:, 0] + dx, cell_xy[:, 1] + dy
            valid = torch.nonzero((x >= 0) & (x < cells) & (y >= 0) & (y < cells)).flatten()
            other = x[valid] * cells + y[valid]
            length = count[other]
            source = valid.repeat_interleave(length)
            offset = torch.arange(source.numel(), device=device) - (torch.cumsum(length, 0) - length).repeat_interleave(length)
            target = by_cell[start[other].repeat_interleave(length) + offset]
            close = (point[source] - point[target]).pow(2).sum(1) < radius * radius
            rows.append(source[close])
            cols.append(target[close])
    return synthetic._canonical(torch.cat(rows), torch.cat(cols), num_nodes)


def bipartite(nnz: int, seed: int, device):
    """A user-item-like matrix: 4 columns per row, 8 draws per row, power-law weights on both
    sides (rows' heavier: hub rows), ids shuffled."""
    num_rows = max(64, nnz // 7)
    return synthetic.bipartite(num_rows, 4 * num_rows, 8, seed=seed, device=device)


def sampled(nnz: int, seed: int, device):
    """A sampled mini-batch block: 12 columns drawn per row among 6 columns per row, popular
    columns shared by many rows; row lengths nearly uniform, ids shuffled."""
    num_rows = max(64, nnz // 12)
    return synthetic.sampled_block(num_rows, 6 * num_rows, 12, seed=seed, device=device)


GENERATORS: dict[str, Callable] = {
    "rmat": rmat, "sbm": sbm, "uniform": uniform, "band": band, "mesh3d": mesh3d, "powerlaw": powerlaw,
    "kron": kron, "mesh2d": mesh2d, "blocks_noise": blocks_noise, "road": road, "geometric": geometric,
    "bipartite": bipartite, "sampled": sampled,
}
FAMILIES = tuple(GENERATORS)
SPLITS = ("fit", "unseen")


def split_of(family: str) -> str:
    """"fit" or "unseen" for a generated family or a real graph's source collection."""
    if not isinstance(family, str):
        raise TypeError(f"family must be a str, got {type(family).__name__}")
    for split, families in SPLIT.items():
        if family in families:
            return split
    return "fit" if family in REAL_FIT_SOURCES else "unseen"


def generate(family: str, nnz: int, seed: int = 0, device="cpu"):
    """A graph of ``family`` with about ``nnz`` nonzeros: ``(row, col, num_nodes)``, or for a
    ``RECTANGULAR`` family ``(row, col, (num_rows, num_cols))``."""
    if not isinstance(family, str) or family not in GENERATORS:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if isinstance(nnz, bool) or not isinstance(nnz, int) or nnz < 1:
        raise ValueError(f"nnz must be a positive int, got {nnz!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return GENERATORS[family](nnz, seed, torch.device(device))


@dataclass(frozen=True)
class Entry:
    """One graph of the corpus; ``load(device)`` builds or reads it as ``(row, col, num_nodes)``
    (``(row, col, (num_rows, num_cols))`` for a rectangular family)."""

    name: str
    family: str
    split: str
    nnz_target: int | None  # None for a real graph
    load: Callable


def real_family(stem: str) -> str:
    return stem.split("_", 1)[0]


def real_loader(path):
    """``load(device) -> (row, col, num_nodes)`` of a real graph's ``.npz`` file."""
    def load(device):
        adj = npz.load_adjacency(path).tocoo()
        row, col = torch.from_numpy(adj.row).long(), torch.from_numpy(adj.col).long()
        return row.to(device), col.to(device), adj.shape[0]
    return load


def entries(split: str = "all", tier: str = "small", real: bool = True, seed: int = 0,
            rectangular: bool = True) -> list[Entry]:
    """The corpus's graphs of ``split`` ("fit", "unseen" or "all"): every generated family at
    every size of ``tier`` (the ``RECTANGULAR`` ones only with ``rectangular``), then (with
    ``real``) every real graph ``graph_data.npz`` finds."""
    if split not in (*SPLITS, "all"):
        raise ValueError(f"split must be 'fit', 'unseen' or 'all', got {split!r}")
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {tuple(TIERS)}, got {tier!r}")
    out = []
    for family in FAMILIES:
        if split in ("all", split_of(family)) and (rectangular or family not in RECTANGULAR):
            for target in TIERS[tier]:
                load = lambda device, f=family, t=target: generate(f, t, seed, device)  # noqa: E731
                out.append(Entry(f"{family}_{_short(target)}", family, split_of(family), target, load))
    if real:
        for path in npz.list_graphs():
            family = real_family(path.stem)
            if split in ("all", split_of(family)):
                out.append(Entry(path.stem, family, split_of(family), None, real_loader(path)))
    return out


def _short(nnz: int) -> str:
    return f"{nnz // 1_000_000}M" if nnz >= 1_000_000 else f"{nnz // 1000}k"
