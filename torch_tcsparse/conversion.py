"""From canonical CSR and the user's options (window, reorder, symmetric) to a ``Structure``:
the options are checked here, once, for every constructor and for a loaded file."""
from __future__ import annotations

import numpy as np
import torch

from .formats.csr import CSR
from .formats.metcf import WINDOWS
from .structure import CsrStructure, Structure


def build_structure(csr: CSR, window: int, reorder, symmetric: bool | None, seed: int) -> Structure:
    window, symmetric, seed = check_options(window, symmetric, seed)
    if symmetric is None:
        symmetric = csr.num_rows == csr.num_cols
    if symmetric and csr.num_rows != csr.num_cols:
        raise ValueError(f"symmetric reordering needs a square matrix, got {csr.num_rows} x {csr.num_cols}")
    method, row_perm, share_ratio = choose_order(csr, reorder, symmetric, window, seed)
    col_perm = row_perm if (symmetric and row_perm is not None) else None
    structure = Structure(csr, window, row_perm, col_perm, method, share_ratio)
    structure.prepare_selection()
    return structure


def build_batch_structure(csr: CSR, window: int) -> CsrStructure:
    """The structure of a matrix used a few times (``TCSparseTensor.from_batch``): its CSR, the
    Tensor-Core layout built only when a product needs it (``structure.CsrStructure``)."""
    window, _, _ = check_options(window, None, 0)
    return CsrStructure(csr, window)


def check_options(window, symmetric, seed) -> tuple[int, bool | None, int]:
    """The options as plain Python values; numpy integers and bools are taken as theirs, anything
    else that merely compares equal (``16.0``, ``"yes"``) is refused."""
    if isinstance(window, np.integer):
        window = int(window)
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be an int, one of {WINDOWS}, got {window!r} ({type(window).__name__})")
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, got {window}")
    if isinstance(symmetric, np.bool_):
        symmetric = bool(symmetric)
    if symmetric is not None and not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool or None, got {symmetric!r} ({type(symmetric).__name__})")
    if isinstance(seed, np.integer):
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return window, symmetric, seed


def choose_order(csr: CSR, reorder, symmetric: bool, window: int, seed: int):
    """The method actually used, its row permutation (None for the identity) and the
    permutation's ``rows_share_ratio`` where "auto" already computed it (else None). A numpy
    integer array is a permutation as a tensor is."""
    if isinstance(reorder, np.ndarray):
        if not np.issubdtype(reorder.dtype, np.integer):
            raise TypeError(f"a reorder permutation must hold integers, got a numpy array of dtype {reorder.dtype}")
        reorder = torch.from_numpy(np.ascontiguousarray(reorder, dtype=np.int64))
    if isinstance(reorder, torch.Tensor):
        return "user", checked_permutation(reorder, csr.num_rows, csr.col.device), None
    if reorder in (None, "none"):
        return "none", None, None
    if not isinstance(reorder, str):
        raise TypeError(
            f"reorder must be a method name or a permutation (tensor or numpy integer array), got {type(reorder).__name__}"
        )
    from . import reorder as reordering

    if reorder != "auto":
        perm = reordering.reorder(csr, reorder, symmetric=symmetric, window=window, seed=seed)
        return reorder, perm.to(csr.col.device), None
    method, perm, report = reordering.choose(csr, window=window, seed=seed, symmetric=symmetric)
    if method == "none":
        return "none", None, None
    return method, perm.to(csr.col.device), report["methods"][method]["rows_share_ratio"]


def checked_permutation(perm: torch.Tensor, size: int, device) -> torch.Tensor:
    if perm.is_floating_point() or perm.is_complex() or perm.dtype == torch.bool or perm.dim() != 1 or perm.numel() != size:
        raise ValueError(f"a row permutation must be an integer tensor of {size} entries, got {perm.dtype} {tuple(perm.shape)}")
    perm = perm.to(device=device, dtype=torch.long)
    seen = torch.zeros(size, dtype=torch.bool, device=device)
    if size and (int(perm.min()) < 0 or int(perm.max()) >= size):
        raise ValueError(f"row permutation holds an index outside [0, {size})")
    seen[perm] = True
    if not bool(seen.all()):
        raise ValueError("row permutation repeats an index: it is not a permutation")
    return perm
