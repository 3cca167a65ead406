"""The diagonal of a ``TCSparseTensor`` ``adj_t`` completed: an entry (i, i) for every
i < min(rows, cols), the pattern PyG's ``add_self_loops`` gives a torch.sparse matrix (GCN
normalization, ClusterGCN) and the one GATConv attends over (PyG removes the loops, then adds one
per node). Positions say where each entry went, so that values follow in ``A.csr`` order."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..tensor import TCSparseTensor


class CompletedDiagonal(NamedTuple):
    """``matrix``: adj_t's pattern with every diagonal entry (adj_t itself when it has them all;
    else built once, its values zero). ``kept``: the position in ``matrix`` of each of adj_t's
    entries (None: the same positions). ``diagonal``: the position of (i, i) for each i."""

    matrix: TCSparseTensor
    kept: Tensor | None
    diagonal: Tensor


def diagonal_positions(matrix: TCSparseTensor) -> Tensor:
    """Positions (``A.csr`` order) of the matrix's diagonal entries, by row."""
    csr = matrix.csr
    return torch.nonzero(csr.row_indices() == csr.col.long()).squeeze(1)


def complete_diagonal(adj: TCSparseTensor) -> CompletedDiagonal:
    csr = adj.csr
    n = min(csr.num_rows, csr.num_cols)
    row, col = csr.row_indices(), csr.col.long()
    on_diagonal = torch.nonzero(row == col).squeeze(1)
    has_loop = torch.zeros(n, dtype=torch.bool, device=col.device)
    has_loop[row[on_diagonal]] = True
    missing = torch.nonzero(~has_loop).squeeze(1)
    if missing.numel() == 0:
        return CompletedDiagonal(adj, None, on_diagonal)
    # Every (row, col) key is distinct, so one sort places each new (i, i) inside its row.
    rows, cols = torch.cat([row, missing]), torch.cat([col, missing])
    order = torch.argsort(rows * csr.num_cols + cols)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=order.device)
    kept, inserted = position[: csr.nnz], position[csr.nnz:]
    diagonal = torch.empty(n, dtype=torch.long, device=col.device)
    diagonal[row[on_diagonal]] = kept[on_diagonal]
    diagonal[missing] = inserted
    before = torch.searchsorted(missing, torch.arange(csr.num_rows + 1, device=col.device))
    rowptr = csr.rowptr.long() + before
    matrix = _built_like(adj, rowptr, cols[order])
    return CompletedDiagonal(matrix, kept, diagonal)


def _built_like(adj: TCSparseTensor, rowptr: Tensor, col: Tensor) -> TCSparseTensor:
    """A matrix of adj_t's shape and dtype over new canonical indices, zero values, in adj_t's
    window and row order: a reordered adj_t keeps its order, since a diagonal added to it leaves
    the locality its order was chosen for."""
    structure = adj._structure
    values = torch.zeros(col.numel(), dtype=adj.dtype, device=col.device)
    reorder = "none" if structure.row_perm is None else structure.row_perm
    return TCSparseTensor.from_csr(rowptr, col, values, tuple(adj.shape), window=structure.window, reorder=reorder)
