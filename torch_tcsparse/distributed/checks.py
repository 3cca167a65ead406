"""Argument checks shared by the partitioner, the graph parts and the layers."""
from __future__ import annotations

import torch
from torch import Tensor

from ..paths import VALUE_DTYPES


def check_int(name: str, value, low: int | None, high: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return value


def check_index(name: str, index) -> None:
    if not isinstance(index, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(index).__name__}")
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(index.shape)}")


def check_csr(rowptr, col, values, num_rows: int | None = None, num_cols: int | None = None) -> int:
    """Checks CSR arrays (columns in any order, duplicates allowed); returns the row count.
    Columns must lie in [0, num_cols), by default [0, num_rows) (a square matrix)."""
    check_index("rowptr", rowptr)
    check_index("col", col)
    if rowptr.numel() == 0 or int(rowptr[0]) != 0:
        raise ValueError(f"rowptr must start with 0 (one entry per row plus one), got {rowptr[:1].tolist()}")
    rows = rowptr.numel() - 1
    if num_rows is not None and rows != num_rows:
        raise ValueError(f"rowptr describes {rows} rows, expected {num_rows}")
    if bool((rowptr.diff() < 0).any()):
        raise ValueError("rowptr must be non-decreasing")
    if int(rowptr[-1]) != col.numel():
        raise ValueError(f"rowptr ends at {int(rowptr[-1])} but col holds {col.numel()} entries")
    if col.device != rowptr.device:
        raise ValueError(f"col is on {col.device} but rowptr is on {rowptr.device}")
    bound = rows if num_cols is None else num_cols
    if col.numel():
        low, high = (int(v) for v in torch.aminmax(col))
        if low < 0 or high >= bound:
            raise ValueError(f"col holds {low if low < 0 else high}, out of range for {bound} columns")
    if values is not None:
        if not isinstance(values, Tensor):
            raise TypeError(f"values must be a torch.Tensor or None, got {type(values).__name__}")
        if values.dtype not in VALUE_DTYPES:
            raise TypeError(f"values must be one of {VALUE_DTYPES}, got dtype {values.dtype}")
        if values.shape != col.shape:
            raise ValueError(f"values must have one entry per column index ({col.numel()}), got shape {tuple(values.shape)}")
        if values.device != col.device:
            raise ValueError(f"values is on {values.device} but col is on {col.device}")
    return rows
