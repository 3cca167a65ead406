"""From canonical CSR and the user's options (window, reorder, symmetric) to a ``Structure``:
the options are checked here, once, for every constructor and for a loaded file."""
from __future__ import annotations

import torch

from .formats.csr import CSR
from .formats.metcf import WINDOWS
from .structure import Structure


def build_structure(csr: CSR, window: int, reorder, symmetric: bool | None, seed: int) -> Structure:
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, got {window}")
    if symmetric is None:
        symmetric = csr.num_rows == csr.num_cols
    if symmetric and csr.num_rows != csr.num_cols:
        raise ValueError(f"symmetric reordering needs a square matrix, got {csr.num_rows} x {csr.num_cols}")
    method, row_perm, share_ratio = choose_order(csr, reorder, symmetric, window, seed)
    col_perm = row_perm if (symmetric and row_perm is not None) else None
    structure = Structure(csr, window, row_perm, col_perm, method, share_ratio)
    structure.prepare_selection()
    return structure


def choose_order(csr: CSR, reorder, symmetric: bool, window: int, seed: int):
    """The method actually used, its row permutation (None for the identity) and the
    permutation's ``rows_share_ratio`` where "auto" already computed it (else None)."""
    if isinstance(reorder, torch.Tensor):
        return "user", checked_permutation(reorder, csr.num_rows, csr.col.device), None
    if reorder in (None, "none"):
        return "none", None, None
    if not isinstance(reorder, str):
        raise TypeError(f"reorder must be a method name or a permutation tensor, got {type(reorder).__name__}")
    from . import reorder as reordering

    if reorder != "auto":
        perm = reordering.reorder(csr, reorder, symmetric=symmetric, window=window, seed=seed)
        return reorder, perm.to(csr.col.device), None
    method, perm, report = reordering.choose(csr, window=window, seed=seed, symmetric=symmetric)
    if method == "none":
        return "none", None, None
    return method, perm.to(csr.col.device), report["methods"][method]["rows_share_ratio"]


def checked_permutation(perm: torch.Tensor, size: int, device) -> torch.Tensor:
    if perm.dtype.is_floating_point or perm.dtype == torch.bool or perm.dim() != 1 or perm.numel() != size:
        raise ValueError(f"a row permutation must be an integer tensor of {size} entries, got {perm.dtype} {tuple(perm.shape)}")
    perm = perm.to(device=device, dtype=torch.long)
    seen = torch.zeros(size, dtype=torch.bool, device=device)
    if size and (int(perm.min()) < 0 or int(perm.max()) >= size):
        raise ValueError(f"row permutation holds an index outside [0, {size})")
    seen[perm] = True
    if not bool(seen.all()):
        raise ValueError("row permutation repeats an index: it is not a permutation")
    return perm
