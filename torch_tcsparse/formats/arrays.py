"""Array primitives of the conversion that torch runs several times slower than numpy on the CPU
(sorts, boolean selection, integer division): on the CPU they go through numpy, sharing memory
with the tensors; on other devices through torch."""
from __future__ import annotations

import numpy as np
import torch

INT32_MAX = 2**31 - 1


def sort_keys(key: torch.Tensor) -> torch.Tensor:
    """``key`` ascending. On the CPU ``key`` is sorted in place (numpy's vectorized sort: no copy
    and several times faster than torch's radix sort, which also builds an int64 order)."""
    if key.device.type == "cpu":
        key.numpy().sort()
        return key
    return torch.sort(key).values


def sort_with_positions(
    key: torch.Tensor, key_bound: int, positions: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``key`` (int64 in [0, key_bound), consumed) sorted stably, and ``positions`` (values in
    [0, len(key)), default: the positions 0, 1, ...) in the same order, in the index dtype.
    Keys given with ``positions`` must be distinct (ties would come in the order of their
    positions, not in the order given).

    On the CPU, where each key and its position fit together in 63 bits, both travel as one int64
    ``key << bits | position``: one in-place numpy sort of distinct values, stable by
    construction, with no int64 order and no copy of the keys. Elsewhere a stable torch sort."""
    n = key.numel()
    position_dtype = torch.int32 if n <= INT32_MAX else torch.int64
    bits = max(n - 1, 1).bit_length()
    if key.device.type == "cpu" and max(key_bound - 1, 1).bit_length() + bits <= 63:
        key <<= bits
        key |= torch.arange(n, dtype=position_dtype) if positions is None else positions
        key.numpy().sort()
        # The cast keeps the low 32 bits (int32 positions have at most 31 bits): no int64 copy.
        positions = key.to(position_dtype).bitwise_and_((1 << bits) - 1)
        key >>= bits
        return key, positions
    key, order = torch.sort(key, stable=True)
    if positions is None:
        return key, order.to(position_dtype)
    return key, positions[order].to(position_dtype)


def first_of_runs(key: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the entries of sorted ``key`` that differ from their predecessor."""
    is_first = torch.ones(key.numel(), dtype=torch.bool, device=key.device)
    torch.ne(key[1:], key[:-1], out=is_first[1:])
    return is_first


def compress(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values[mask]``."""
    if values.device.type == "cpu":
        return torch.from_numpy(values.numpy()[mask.numpy()])
    return values[mask]


def floor_divide(values: torch.Tensor, divisor: int) -> torch.Tensor:
    """``values // divisor`` for non-negative integers."""
    if values.device.type == "cpu":
        return torch.from_numpy(values.numpy() // divisor)
    return torch.div(values, divisor, rounding_mode="floor")

