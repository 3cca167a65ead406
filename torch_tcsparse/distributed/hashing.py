"""Draws for the distributed layers and the partitioner: a 32-bit integer hash on int64 tensors
(Wellons' lowbias32 shape), for draws that depend on a node's id rather than on which rank holds
it (dropout masks, which half of the nodes moves in a round), and seeded random tie-breakers.

Multipliers below 2**31 keep every product of 32-bit words below 2**63, so no step overflows
int64 and every shift is a logical one, on any device."""
from __future__ import annotations

import torch
from torch import Tensor

MASK = (1 << 32) - 1
_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D)


def mix_(words: Tensor) -> Tensor:
    """Hashes 32-bit words (int64, in [0, 2**32)) in place."""
    for multiplier in _MULTIPLIERS:
        words.bitwise_xor_(words >> 16).mul_(multiplier).bitwise_and_(MASK)
    return words.bitwise_xor_(words >> 16)


def hash_ids(ids: Tensor, seed: int) -> Tensor:
    """A 32-bit hash (int64) of each id and ``seed``; ids of any size (both halves are mixed)."""
    ids = ids.long()
    words = mix_(ids.bitwise_and(MASK).bitwise_xor_(seed & MASK))
    return mix_(words.bitwise_xor_(ids >> 32))


def random_bits(shape: tuple[int, ...], bits: int, seed: int, device) -> Tensor:
    """Random int64 in [0, 2**bits), the same for the same seed on one kind of device."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return torch.randint(0, 1 << bits, shape, generator=generator, device=device)
