"""Saved TCSparseTensors: only the canonical CSR, the permutation and the options travel; on load
every array is validated and the layout rebuilt, so a crafted file cannot plant out-of-range
indices in a kernel's input."""
from __future__ import annotations

import torch

from .conversion import build_structure
from .formats.csr import from_csr_arrays

SAVE_FORMAT_VERSION = 1


def state_of(structure, values: torch.Tensor) -> dict:
    """What ``torch.save`` stores of a matrix with this structure and CSR-order values."""
    s = structure
    return {
        "version": SAVE_FORMAT_VERSION,
        "shape": (s.num_rows, s.num_cols),
        "rowptr": s.rowptr,
        "col": s.col,
        "values": values.detach(),
        "window": s.window,
        "row_perm": s.row_perm,
        "symmetric": s.col_perm is not None,
        "method": s.method,
    }


def rebuild(state: dict):
    """The matrix a saved ``state`` describes, validated; ``ValueError`` for a corrupted file."""
    from .tensor import TCSparseTensor

    if not isinstance(state, dict) or state.get("version") != SAVE_FORMAT_VERSION:
        raise ValueError(f"not a saved TCSparseTensor of format version {SAVE_FORMAT_VERSION}")
    try:
        num_rows, num_cols = (int(v) for v in state["shape"])
        values, row_perm = state["values"], state["row_perm"]
        if not isinstance(values, torch.Tensor) or not (row_perm is None or isinstance(row_perm, torch.Tensor)):
            raise TypeError("values and row_perm must be tensors")
        csr = from_csr_arrays(state["rowptr"], state["col"], values, num_rows, num_cols, values.dtype)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"corrupted TCSparseTensor file: {error}") from error
    if csr.nnz != values.numel() or not torch.equal(csr.col.long(), state["col"].long()):
        raise ValueError("corrupted TCSparseTensor file: its CSR is not canonical (unsorted or duplicated)")
    reorder = "none" if row_perm is None else row_perm
    try:
        structure = build_structure(csr, state["window"], reorder, bool(state["symmetric"]), 0)
    except (TypeError, ValueError) as error:
        raise ValueError(f"corrupted TCSparseTensor file: {error}") from error
    structure.method = str(state["method"])
    return TCSparseTensor(structure, csr.values)


torch.serialization.add_safe_globals([rebuild])
