"""Degree orders.

"degree": rows by decreasing number of nonzeros (ties in row order): windows of equally long
rows, and the hubs, which share many columns, side by side.

"hub" (hub sorting, Zhang et al., "Making caches work for graph analytics", BigData'17): only
the rows longer than the mean move to the front, by decreasing length; the others keep their
given relative order, so whatever locality the given ids carry survives for the bulk of rows
while the hubs' columns are read together.

Symmetric mode counts the nonzeros of A + A^T's pattern, a graph's undirected degree.
"""
from __future__ import annotations

import numpy as np
import torch

from ..formats.csr import CSR
from .rcm import _pattern


def _degree(csr: CSR, symmetric: bool) -> torch.Tensor:
    degree = (csr.rowptr[1:] - csr.rowptr[:-1]).long()
    if symmetric and csr.col.device.type == "cpu":
        # scipy's A + A^T merges sorted rows in linear time; a sort of twice the nonzeros (below)
        # took ten times as long on a CPU. The counts are the same integers either way.
        pattern = _pattern(csr, loops=True)
        return torch.from_numpy(np.diff((pattern + pattern.T).tocsr().indptr).astype(np.int64))
    if symmetric:
        rows, col = csr.row_indices(), csr.col.long()
        width = max(csr.num_cols, 1)
        both = torch.unique(torch.cat([rows * width + col, col * width + rows]))
        degree = torch.bincount(both // width, minlength=csr.num_rows)
    return degree


def degree_order(csr: CSR, symmetric: bool) -> torch.Tensor:
    return torch.argsort(-_degree(csr, symmetric), stable=True)


def hub_order(csr: CSR, symmetric: bool) -> torch.Tensor:
    degree = _degree(csr, symmetric)
    hub = degree.double() > degree.double().mean()
    # Non-hubs share the key 0 and keep their order under the stable sort.
    return torch.argsort(torch.where(hub, -degree, torch.zeros_like(degree)), stable=True)
