"""The ``"grouped"`` path: the Tensor-Core kernel of ``csrc/grouped_spmm.h`` on the grouped layout
(``formats/grouped.py``), whose 8-column blocks are shared by the four 16-row windows of a group
of 64 rows, so each row of X gathered for a block serves four windows. The nonzeros the layout
leaves out (pairs of a group and a column holding too few to pay for a gather) go through the
rows kernel, which adds the Tensor-Core sums before rounding Y once.

Values reach the kernel as fragments in X's dtype (``formats.grouped.fragment_values``); chunks
of a group's blocks add their sums atomically, so the result is not bitwise reproducible: under
deterministic algorithms the product runs ``"base"`` (``product.py``). The op that
``torch.compile`` traces carries the ME-TCF arrays only, so there this path runs ``"base"`` too
(``ops.spmm``); this engine has no ``from_layout``.
"""
from __future__ import annotations

import torch

from .. import _ext, csr_rows
from ..formats.grouped import GroupedLayout, fragment_values
from ..kernels import tf32_allowed
from . import rows
from .base import Engine


def launch(x: torch.Tensor, layout: GroupedLayout, fragments: torch.Tensor, bias: torch.Tensor | None = None,
           rest_values: torch.Tensor | None = None, rest_pieces: csr_rows.RowPieces | None = None) -> torch.Tensor:
    """Y = A @ x (+ bias on every row) with A given by ``layout`` and its ``fragments`` (x's
    dtype), and where the layout has a ``rest``, its values (x's dtype, in the rest's order) and
    its split into pieces (``csr_rows.row_pieces``)."""
    exact = x.dtype == torch.float32 and not tf32_allowed()
    grouped_spmm = _ext.load().grouped_spmm
    rest = layout.rest
    if rest is None:
        return grouped_spmm(x, fragments, *layout.kernel_arrays(), layout.num_rows, exact, bias, False)
    sums = grouped_spmm(x, fragments, *layout.kernel_arrays(), layout.num_rows, exact, None, True)
    return rows.launch(x, rest.rowptr, rest.col, rest_values, rest_pieces, layout.num_cols, bias, rest.row_map,
                       addend=sums)


class GroupedEngine(Engine):
    name = operand_key = "grouped"

    def prepare(self, structure, values):
        layout = structure.grouped()
        if layout.rest is None:
            return layout, fragment_values(layout, values), None, None
        rest_values = values[layout.rest.gather.long()]
        return layout, fragment_values(layout, values), rest_values, structure.grouped_pieces()

    def run(self, x, operands, bias):
        layout, fragments, rest_values, rest_pieces = operands
        return launch(x, layout, fragments, bias, rest_values, rest_pieces)


GROUPED = GroupedEngine()
