"""MinHash signatures of row column-sets, the similarity sketch shared by the clustering methods.

Every hash is a bijection of the 31-bit column id (multiply by an odd constant, add, xor-shift),
so two rows have the same MinHash value for hash ``k`` exactly when they share the column that
hash ranks first: equal signatures always mean a common column, never a collision. The MinHash
of a union is the elementwise minimum of the members' signatures, which lets a cluster of rows
carry the signature of its column union without touching the nonzeros again.

Signatures are stored as int32, shifted down by 2^31 (order kept): half the bytes to gather when
comparing candidate pairs, which is most of the clustering's work.
"""
from __future__ import annotations

import torch

from ..formats.csr import CSR

MASK31 = (1 << 31) - 1
# Signature of a row without nonzeros: above every hash value, so empty rows agree with each
# other (Jaccard 1: grouping them costs no block) and with no other row. Stored shifted: 0.
EMPTY = 1 << 31
SHIFT = 1 << 31


def hash_params(num_hashes: int, seed: int) -> list[tuple[int, int, int]]:
    """(odd multiplier, offset, second odd multiplier) per hash, drawn on the CPU so every device agrees."""
    gen = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, 1 << 30, (num_hashes, 3), generator=gen).tolist()
    return [(2 * a + 1, b, 2 * c + 1) for a, b, c in draws]


def mix31(x: torch.Tensor, params: tuple[int, int, int]) -> torch.Tensor:
    """A bijection of [0, 2^31) (int64 in, int64 out); products stay below 2^62."""
    mul, add, mul2 = params
    x = (x * mul + add) & MASK31
    x = x ^ (x >> 15)
    x = (x * mul2) & MASK31
    return x ^ (x >> 13)


def row_signatures(csr: CSR, num_hashes: int, seed: int) -> torch.Tensor:
    """int32 [rows, num_hashes]: per row and hash, the minimum hash over the row's columns, minus 2^31."""
    device = csr.col.device
    rows = csr.row_indices()
    col = csr.col.long() & MASK31
    sig = torch.empty(csr.num_rows, num_hashes, dtype=torch.int32, device=device)
    for k, params in enumerate(hash_params(num_hashes, seed)):
        column = torch.full((csr.num_rows,), EMPTY, dtype=torch.long, device=device)
        column.scatter_reduce_(0, rows, mix31(col, params), "amin")
        sig[:, k] = (column - SHIFT).to(torch.int32)
    return sig


def unshifted(sig_column: torch.Tensor) -> torch.Tensor:
    """The int64 hash values in [0, 2^31] of one stored signature column."""
    return sig_column.long() + SHIFT


def group_signatures(sig: torch.Tensor, labels: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Signature of each group's column union: the elementwise minimum over its members."""
    out = torch.full((num_groups, sig.shape[1]), EMPTY - SHIFT, dtype=sig.dtype, device=sig.device)
    return out.scatter_reduce_(0, labels[:, None].expand_as(sig), sig, "amin")


def estimated_jaccard(sig: torch.Tensor, u: torch.Tensor, v: torch.Tensor, chunk: int = 1 << 22) -> torch.Tensor:
    """Fraction of agreeing MinHash values of the pairs (u, v): an unbiased Jaccard estimate.

    Chunked so that 30M candidate pairs with 32 hashes never hold more than 128M booleans at once.
    """
    out = torch.empty(u.numel(), dtype=torch.float32, device=sig.device)
    for start in range(0, u.numel(), chunk):
        stop = start + chunk
        agree = (sig[u[start:stop]] == sig[v[start:stop]]).sum(dim=1, dtype=torch.int32)
        out[start:stop] = agree / sig.shape[1]
    return out
