"""Rows by decreasing number of nonzeros (ties in row order): windows of equally long rows.

Symmetric mode counts the nonzeros of A + A^T's pattern, a graph's undirected degree.
"""
from __future__ import annotations

import torch

from ..formats.csr import CSR


def degree_order(csr: CSR, symmetric: bool) -> torch.Tensor:
    degree = (csr.rowptr[1:] - csr.rowptr[:-1]).long()
    if symmetric:
        rows, col = csr.row_indices(), csr.col.long()
        width = max(csr.num_cols, 1)
        both = torch.unique(torch.cat([rows * width + col, col * width + rows]))
        degree = torch.bincount(both // width, minlength=csr.num_rows)
    return torch.argsort(-degree, stable=True)
