"""Row reorderings that densify ME-TCF Tensor-Core blocks.

``reorder(csr, method)`` returns ``perm`` (int64 [num_rows], on the CSR's device) with
``perm[i]`` the original row placed at position ``i``; pass it as ``row_perm`` to
``build_metcf``. ``choose(csr)`` tries several methods and keeps one only when it pays.

Methods: "tca" (DTC-SpMM), "jaccard" (SMaT / Sylos Labini), "shuffle" (Tiled-CSR), "rcm"
(reverse Cuthill-McKee), "community" (Rabbit-order-style modularity agglomeration), "degree",
"hub" (hub sorting), "none". ``symmetric=True`` (square matrices: one permutation for rows and
columns, as for a graph's nodes) makes "rcm", "community", "degree" and "hub" use the pattern of
A + A^T; the similarity methods always compare the rows of A, because only the row grouping
changes the number of blocks (ME-TCF condenses columns per window) and the kernels read X
through original column ids, so applying the permutation to the columns as well costs nothing.
"""
from __future__ import annotations

import torch

from ..formats.csr import CSR
from ..formats.metcf import WINDOWS
from .auto import DEFAULT_CANDIDATES, MIN_GAIN, choose
from .community import community_order
from .degree import degree_order, hub_order
from .jaccard import jaccard_order
from .rcm import rcm_order
from .shuffle import shuffle_order
from .tca import tca_order

METHODS = ("tca", "jaccard", "shuffle", "rcm", "community", "degree", "hub", "none")

__all__ = ["METHODS", "DEFAULT_CANDIDATES", "MIN_GAIN", "reorder", "choose", "check_inputs"]


def check_inputs(csr, window, seed, symmetric) -> None:
    """The checks every public entry point of this package shares."""
    if not isinstance(csr, CSR):
        raise TypeError(f"csr must be a torch_tcsparse CSR, got {type(csr).__name__}")
    if isinstance(window, bool) or window not in WINDOWS:
        raise ValueError(f"window must be one of {WINDOWS}, got {window!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__}")
    if symmetric and csr.num_rows != csr.num_cols:
        raise ValueError(
            f"symmetric reordering needs a square matrix, got {csr.num_rows} x {csr.num_cols}; "
            "pass symmetric=False to reorder rows only"
        )


def reorder(csr: CSR, method: str, symmetric: bool = True, window: int = 16, seed: int = 0) -> torch.Tensor:
    """Row permutation of ``csr`` by ``method``: ``perm[i]`` is the original row at position ``i``.

    Deterministic for a given ``seed`` (and device); runs on the CSR's device.
    """
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"unknown reorder method {method!r}; expected one of {METHODS}")
    check_inputs(csr, window, seed, symmetric)
    device = csr.col.device
    if method == "none" or csr.num_rows == 0:
        return torch.arange(csr.num_rows, device=device)
    if method == "tca":
        return tca_order(csr, window, seed)
    if method == "jaccard":
        return jaccard_order(csr, window, seed)
    if method == "shuffle":
        return shuffle_order(csr, window, seed)
    if method == "rcm":
        return rcm_order(csr, symmetric)
    if method == "community":
        return community_order(csr, symmetric, seed)
    if method == "hub":
        return hub_order(csr, symmetric)
    return degree_order(csr, symmetric)
