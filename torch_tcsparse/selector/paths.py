"""The paths the selector ranks, those a matrix may take, and the N buckets a choice is cached for."""
from __future__ import annotations

import functools

import torch

from ..formats.csr import index_dtype_for
from ..paths import KERNEL_PATHS as KERNEL_CHOICES
from ..paths import SELECTOR_PATHS as CHOICES

# The paths whose constants a calibration file holds ("grouped" has in-code constants: csrc/selector_model.h).
CALIBRATED_CHOICES = ("base", "balanced", "csr", "rows")
BUCKETS = (32, 64, 128, 256)


def n_bucket(n: int) -> int:
    """The N a choice is computed and cached for: the next power of two, at least 32."""
    if n < 1:
        raise ValueError(f"N must be positive, got {n}")
    return BUCKETS[0] if n <= BUCKETS[0] else 1 << (n - 1).bit_length()


def matrix_paths(rows: int, cols: int, nnz: int, has_grouped: bool, deterministic: bool) -> tuple:
    """The paths a matrix may take where the kernels run: "rows" where its indices are int32
    (under 2^31 rows, columns and nonzeros), "grouped" where it has a grouped layout and results
    need not be deterministic (its chunks add atomically), the others always."""
    return _matrix_paths(index_dtype_for(rows, cols, nnz) == torch.int32, has_grouped and not deterministic)


@functools.lru_cache(maxsize=None)
def _matrix_paths(int32_indices: bool, grouped: bool) -> tuple:
    return tuple(p for p in CHOICES if (p != "rows" or int32_indices) and (p != "grouped" or grouped))


def candidate_bits(candidates) -> int:
    """``candidates`` as the C++ model takes them: bit p set where path ``CHOICES[p]`` may run."""
    return _bits(tuple(candidates))


@functools.lru_cache(maxsize=64)
def _bits(candidates: tuple) -> int:
    return sum(1 << CHOICES.index(path) for path in candidates)
