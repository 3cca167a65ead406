"""The rows-order locality feature: distinct columns per group of consecutive rows."""
import torch

from torch_tcsparse.formats.csr import from_coo
from torch_tcsparse.reorder import locality


def pairs(num_pairs):
    """Rows 2i and 2i + 1 of the given order share nothing; row i and row i + num_pairs share
    both columns."""
    rows = torch.arange(2 * num_pairs).repeat_interleave(2)
    cols = (rows % num_pairs) * 2 + torch.tensor([0, 1]).repeat(2 * num_pairs)
    return from_coo(rows, cols, None, 2 * num_pairs, 2 * num_pairs)


def test_distinct_share_counts_columns_per_group(monkeypatch):
    monkeypatch.setattr(locality, "GROUP_ROWS", 2)
    csr = pairs(4)
    assert locality.distinct_share(csr.rowptr, csr.col, csr.num_cols, None) == 1.0
    together = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
    assert locality.distinct_share(csr.rowptr, csr.col, csr.num_cols, together) == 0.5
    assert locality.share_ratio(csr.rowptr, csr.col, csr.num_cols, together) == 0.5


def test_one_group_and_empty_matrix():
    csr = pairs(4)  # 8 rows: one group of GROUP_ROWS, every order alike
    assert locality.share_ratio(csr.rowptr, csr.col, csr.num_cols, torch.randperm(8)) == 1.0
    empty = from_coo(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, 3, 3)
    assert locality.distinct_share(empty.rowptr, empty.col, 3, torch.arange(3)) == 1.0
