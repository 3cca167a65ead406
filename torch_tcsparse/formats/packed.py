"""Primitives of the conversion over keys that pack several indices into one int64 (each index in
its own bit field), so that one in-place sort of distinct integers orders the nonzeros by all of
them at once and the fields come back with shifts and masks. On the CPU the heavy ones go through
numpy (sharing memory with the tensors), which runs them several times faster than torch;
elsewhere through torch.
"""
from __future__ import annotations

import numpy as np
import torch

# Bits of an int64 key that a sort orders as unsigned: the sign bit stays clear.
KEY_BITS = 63
# Entries per slice in passes that would otherwise hold int64 temporaries over every nonzero.
SLICE = 1 << 21


def bit_width(largest: int) -> int:
    """Bits of a field holding values in [0, largest] (zero bits where only 0 occurs)."""
    return max(int(largest), 0).bit_length()


def slices(total: int):
    """(start, stop) of consecutive slices of at most ``SLICE`` entries covering [0, total)."""
    for start in range(0, total, SLICE):
        yield start, min(start + SLICE, total)


def expand(values: torch.Tensor, counts: torch.Tensor, total: int) -> torch.Tensor:
    """``values[i]`` repeated ``counts[i]`` times (``total`` entries in all), in ``values``' dtype."""
    if values.device.type == "cpu":
        return torch.from_numpy(np.repeat(values.numpy(), counts.numpy()))
    return values.repeat_interleave(counts.long(), output_size=total)


def stable_order(values: torch.Tensor, bound: int, dtype: torch.dtype) -> torch.Tensor:
    """Positions (in ``dtype``) of the integers ``values`` (in [0, bound)) in stable ascending
    order. On the CPU, where a value and its position fit 63 bits together, one in-place sort of
    ``value << bits | position``, its keys built in slices (an int32 operand whole would be
    widened to an int64 copy); elsewhere a stable torch sort."""
    n = values.numel()
    bits = bit_width(n - 1)
    if values.device.type != "cpu" or bit_width(bound - 1) + bits > KEY_BITS:
        return torch.sort(values, stable=True).indices.to(dtype)
    key = torch.empty(n, dtype=torch.int64)
    keys, array = key.numpy(), values.numpy()
    for start, stop in slices(n):
        part = keys[start:stop]
        np.left_shift(array[start:stop], bits, out=part, dtype=np.int64)
        part |= np.arange(start, stop, dtype=np.int64)
    keys.sort()
    # The cast keeps the low 32 bits, all a position's where ``dtype`` is int32: no int64 copy.
    return key.to(dtype).bitwise_and_((1 << bits) - 1)


def host(tensor: torch.Tensor):
    """``tensor`` as a numpy array sharing its memory on the CPU, itself elsewhere: the per-slice
    arithmetic runs on either through operators and the helpers below. On the CPU numpy's
    single-threaded ops are not held up by an OpenMP team waiting for a descheduled thread (the
    machines are shared), and numpy widens mixed integer operands in buffers, not whole copies."""
    return tensor.numpy() if tensor.device.type == "cpu" else tensor


def as_tensor(array) -> torch.Tensor:
    return torch.from_numpy(array) if isinstance(array, np.ndarray) else array


def arange(start: int, stop: int, like):
    """int64 ``start, ..., stop - 1`` where ``like`` lives."""
    if isinstance(like, np.ndarray):
        return np.arange(start, stop, dtype=np.int64)
    return torch.arange(start, stop, device=like.device)


def cast(array, dtype: torch.dtype):
    """``array`` in ``dtype`` (a new array; integer casts keep the low bits)."""
    if isinstance(array, np.ndarray):
        return array.astype(torch.empty(0, dtype=dtype).numpy().dtype)
    return array.to(dtype, copy=True)


def take(array, index):
    """``array[index]`` for a 1-D index."""
    if isinstance(array, np.ndarray):
        return np.take(array, index)
    return array.index_select(0, index)


def popcount(words):
    """Set bits of every entry of int32 ``words`` (all 32 bits), or of non-negative int64 ``words``
    below 2**32: uint8 for a CPU tensor or numpy array, int64 elsewhere."""
    if isinstance(words, np.ndarray) or words.device.type == "cpu":
        array = host(words) if isinstance(words, torch.Tensor) else words
        counts = np.bitwise_count(array.view(np.uint32 if array.dtype == np.int32 else np.uint64))
        return torch.from_numpy(counts) if isinstance(words, torch.Tensor) else counts
    x = words.long() & 0xFFFFFFFF
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24) & 0xFF
