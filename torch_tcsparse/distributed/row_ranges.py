"""Consecutive ranges of CSR rows holding a bounded number of entries: passes over a part's or a
graph's entries go a range at a time, so that their per-entry temporaries (int64 row ids,
gather indices, keys) stay bounded by the range instead of growing with the nonzeros."""
from __future__ import annotations

import torch
from torch import Tensor

# Entries per range: a few int64 temporaries of this size stay well under a GB.
RANGE_ENTRIES = 1 << 24


def row_ranges(rowptr: Tensor, max_entries: int = RANGE_ENTRIES, max_rows: int | None = None) -> list[tuple[int, int]]:
    """Consecutive row ranges ``(start, end)`` covering every row, of at most ``max_entries``
    entries (a row with more is a range of its own) and ``max_rows`` rows each."""
    num_rows = rowptr.numel() - 1
    total = int(rowptr[-1]) - int(rowptr[0]) if num_rows else 0
    cuts = []
    if total > max_entries:
        targets = torch.arange(max_entries, total, max_entries, device=rowptr.device) + rowptr[0]
        cuts = torch.searchsorted(rowptr, targets, right=True).sub_(1).tolist()
    if max_rows is not None and num_rows > max_rows:
        cuts += list(range(max_rows, num_rows, max_rows))
    bounds = sorted(set([0, *cuts, num_rows]))
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def range_rows(rowptr: Tensor, start: int, end: int) -> Tensor:
    """The row (int64) of each entry of rows start:end."""
    counts = rowptr[start + 1: end + 1] - rowptr[start:end]
    total = int(rowptr[end]) - int(rowptr[start])
    return torch.repeat_interleave(torch.arange(start, end, device=rowptr.device), counts, output_size=total)
