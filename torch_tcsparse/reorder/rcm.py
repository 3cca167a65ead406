"""Reverse Cuthill-McKee, the classic bandwidth-reducing baseline (scipy's, on the CPU).

Symmetric mode runs it on the pattern of A + A^T. Row-only mode runs it on the bipartite graph
[[0, A], [A^T, 0]] and keeps the row vertices in the order it visits them, so rows sharing
columns end up close, for rectangular matrices too.

Cuthill-McKee visits the neighbours a vertex discovers by increasing degree. scipy appends them
in adjacency order and insertion-sorts each batch, which is quadratic in a batch's size: a hub
that discovers a million vertices at once (the in-degree hubs of a directed web or social graph,
once A + A^T joins them to every vertex pointing at them) took minutes. So the graph is first
relabelled by increasing (degree, id), with every adjacency list sorted: each batch then arrives
in degree order, the insertion sorts have nothing to move, and the whole order costs a few
linear passes (every relabelling step is one of scipy's counting-sort conversions, no comparison
sort of the nonzeros). The order is Cuthill-McKee's either way; ties of degree go by vertex id.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import reverse_cuthill_mckee

from ..formats.csr import CSR


def _pattern(csr: CSR, loops: bool) -> sp.csr_matrix:
    """The pattern of ``csr`` on the CPU, in arrays of its own; without its diagonal unless
    ``loops``."""
    col, rowptr = csr.col.cpu().numpy(), csr.rowptr.cpu().numpy()
    pattern = sp.csr_matrix((np.ones(col.size, dtype=np.int8), col, rowptr),
                            shape=(csr.num_rows, csr.num_cols), copy=True)
    # A self loop changes no visiting order, but scipy counts it twice in a vertex's degree.
    if not loops and pattern.diagonal().any():
        row = np.repeat(np.arange(csr.num_rows), np.diff(rowptr))
        pattern.data[pattern.indices == row] = 0
        pattern.eliminate_zeros()
    return pattern


def _by_degree(graph: sp.csr_matrix) -> tuple[sp.csr_matrix, np.ndarray]:
    """``(relabelled, old)``: the symmetric ``graph`` with vertex ``i`` renamed ``rank[i]`` in
    increasing (degree, id) order and sorted adjacency lists; ``old[new]`` is the original id."""
    degree = np.diff(graph.indptr)
    old = np.argsort(degree, kind="stable")
    # Rows in the new order, then a transpose (a counting sort: the new ids come out ascending in
    # every list), then rows in the new order again; the graph is symmetric, so that is P G P^T.
    relabelled = graph[old].T.tocsr()[old]
    return relabelled, old


def rcm_order(csr: CSR, symmetric: bool) -> torch.Tensor:
    pattern = _pattern(csr, loops=not symmetric)
    if symmetric:
        graph = (pattern + pattern.T).tocsr()
    else:
        graph = sp.bmat([[None, pattern], [pattern.T, None]], format="csr")
    relabelled, old = _by_degree(graph)
    order = old[reverse_cuthill_mckee(relabelled, symmetric_mode=True)]
    if not symmetric:
        order = order[order < csr.num_rows]
    return torch.from_numpy(order.astype(np.int64)).to(csr.col.device)
