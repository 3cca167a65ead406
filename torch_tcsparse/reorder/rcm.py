"""Reverse Cuthill-McKee, the classic bandwidth-reducing baseline (scipy, on the CPU).

Symmetric mode runs it on the pattern of A + A^T. Row-only mode runs it on the bipartite graph
[[0, A], [A^T, 0]] and keeps the row vertices in the order it visits them, so rows sharing
columns end up close, for rectangular matrices too.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import reverse_cuthill_mckee

from ..formats.csr import CSR


def _pattern(csr: CSR) -> sp.csr_matrix:
    data = np.ones(csr.nnz, dtype=np.int8)
    return sp.csr_matrix(
        (data, csr.col.cpu().numpy(), csr.rowptr.cpu().numpy()), shape=(csr.num_rows, csr.num_cols)
    )


def rcm_order(csr: CSR, symmetric: bool) -> torch.Tensor:
    pattern = _pattern(csr)
    if symmetric:
        graph = (pattern + pattern.T).tocsr()
        order = reverse_cuthill_mckee(graph, symmetric_mode=True)
    else:
        graph = sp.bmat([[None, pattern], [pattern.T, None]], format="csr")
        order = reverse_cuthill_mckee(graph, symmetric_mode=True)
        order = order[order < csr.num_rows]
    return torch.from_numpy(order.astype(np.int64)).to(csr.col.device)
