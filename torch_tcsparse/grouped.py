"""The ``"grouped"`` path: the Tensor-Core kernel of ``csrc/grouped_spmm.h`` on the grouped
layout (``formats/grouped.py``), whose 8-column blocks are shared by the four 16-row windows of
a group of 64 rows, so each row of X gathered for a block serves four windows. The nonzeros the
layout leaves out (pairs of a group and a column holding too few to pay for a gather) go through
the CUDA-core "rows" kernel, which adds the Tensor-Core sums before rounding Y once.

It serves dense-ish graphs (ogbl-ddi, dense communities, band matrices), where nearly every
window of a group touches the same columns. Values reach the kernel as fragments in X's dtype
(``formats.grouped.fragment_values``); products are summed in fp32 (TF32 or 3xTF32 for float32 X, as the ME-TCF kernels);
chunks of a group's blocks run on different warps and add their sums atomically (a 16-bit Y where
every group is one chunk is written by its warps directly), so the result is not bitwise
reproducible: the selector leaves the path out under deterministic algorithms.
"""
from __future__ import annotations

import torch

from . import _ext, csr_rows
from .formats.grouped import GroupedLayout
from .kernels import tf32_allowed


def spmm(x: torch.Tensor, layout: GroupedLayout, fragments: torch.Tensor, bias: torch.Tensor | None = None,
         rest_values: torch.Tensor | None = None, rest_pieces: csr_rows.RowPieces | None = None) -> torch.Tensor:
    """Y = A @ x (+ bias on every row) with A given by ``layout`` and its ``fragments``
    (``formats.grouped.fragment_values``, x's dtype), and where the layout has a ``rest``, its
    values (x's dtype, in the rest's order) and its split into pieces (``csr_rows.row_pieces``);
    Y has x's dtype."""
    exact = x.dtype == torch.float32 and not tf32_allowed()
    grouped_spmm = _ext.eager().grouped_spmm
    rest = layout.rest
    if rest is None:
        return grouped_spmm(x, fragments, *layout.kernel_arrays(), layout.num_rows, exact, bias, False)
    sums = grouped_spmm(x, fragments, *layout.kernel_arrays(), layout.num_rows, exact, None, True)
    return csr_rows.spmm(x, rest.rowptr, rest.col, rest_values, rest_pieces, layout.num_cols, bias, rest.row_map,
                         addend=sums)
