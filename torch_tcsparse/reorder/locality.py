"""How well a row order lets the "rows" kernel find rows of X in L2.

The rows kernel gathers a row of X per nonzero; warps side by side take consecutive rows (in a
reordered matrix's order, see ``Structure.rows_csr``), so a row of X needed by several rows close
in that order is read from DRAM once. ``distinct_share`` counts, per group of ``GROUP_ROWS``
consecutive rows, the distinct columns, over the nonzeros: 1 when no two rows of a group share a
column, small when they share most. On R-MAT, the shuffled SBM and a uniform graph every order
that lowered it made the product faster, and the times ranked the orders as the shares did
(docs/DECISIONS.md). The row count per group is the scale that ranks the SBM's orders too: its
rows hold 600 nonzeros, and much larger groups no longer tell its orders apart.
"""
from __future__ import annotations

import torch

GROUP_ROWS = 1024


def distinct_share(rowptr: torch.Tensor, col: torch.Tensor, num_cols: int, perm: torch.Tensor | None) -> float:
    """Distinct (group, column) pairs over the nonzeros, rows taken in the order ``perm``
    (``perm[i]``: the row at position ``i``; None: as given). One sort of the nonzeros."""
    nnz = col.numel()
    if nnz == 0:
        return 1.0
    degree = (rowptr[1:] - rowptr[:-1]).long()
    rows = torch.arange(degree.numel(), device=col.device)
    position = rows if perm is None else torch.empty_like(rows).scatter_(0, perm.long(), rows)
    keys = (position // GROUP_ROWS).repeat_interleave(degree) * max(num_cols, 1) + col.long()
    return torch.unique(keys).numel() / nnz


def share_ratio(rowptr: torch.Tensor, col: torch.Tensor, num_cols: int, perm: torch.Tensor,
                given_share: float | None = None) -> float:
    """``distinct_share`` in the order ``perm`` over that in the given order (``given_share``, when
    the caller already has it): below 1 when the order brings rows that share columns together
    (what the selector's rows cost reads)."""
    if given_share is None:
        given_share = distinct_share(rowptr, col, num_cols, None)
    return distinct_share(rowptr, col, num_cols, perm) / given_share
