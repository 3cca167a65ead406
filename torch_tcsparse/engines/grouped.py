"""The ``"grouped"`` path: the Tensor-Core kernel of ``csrc/grouped_spmm.h`` on the grouped layout
(``formats/grouped.py``), whose 8-column blocks are shared by the four 16-row windows of a group
of 64 rows, so each row of X gathered for a block serves four windows. The nonzeros the layout
leaves out (pairs of a group and a column holding too few to pay for a gather) go through the
rows kernel, which adds the Tensor-Core sums before rounding Y once.

Values reach the kernel as fragments in X's dtype (``formats.grouped.fragment_values``); chunks
of a group's blocks add their sums atomically, so the result is not bitwise reproducible: under
deterministic algorithms a product runs ``"base"`` instead (``product.choose_path``). Its layout
does not travel with a matrix that ``torch.compile`` takes as an input (it is built only where the
selector prices it), so compiled products run ``"base"`` instead too.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import csr_rows, kernels
from ..formats import grouped as grouped_format
from ..formats.grouped import GroupedLayout, build_grouped, group_pairs, split_sizes
from ..selector import MatrixFeatures, device_model, grouped_split
from .base import Engine


class GroupedIndices(NamedTuple):
    layout: GroupedLayout
    fragment_index: torch.Tensor  # where each nonzero goes among the fragments, for the dtype's size
    rest_pieces: csr_rows.RowPieces | None  # the split of the rest's rows (None: no rest)


class GroupedEngine(Engine):
    name = operand_key = "grouped"
    traceable = False

    def index_key(self, structure, dtype):
        return ("grouped", dtype.itemsize)

    def build_indices(self, structure, dtype):
        layout = grouped_layout(structure)
        rest = None if layout.rest is None else csr_rows.row_pieces(layout.rest.rowptr)
        return GroupedIndices(layout, grouped_format.fragment_index(layout, dtype.itemsize), rest)

    def operands(self, indices, values):
        layout = indices.layout
        fragments = grouped_format.fragment_values(layout, indices.fragment_index, values)
        rest_values = None if layout.rest is None else values.index_select(0, layout.rest.gather)
        return indices, fragments, rest_values

    def run(self, x, operands, bias):
        indices, fragments, rest_values = operands
        layout = indices.layout
        arrays = layout.kernel_arrays()
        rest = layout.rest
        if rest is None:
            return kernels.grouped_spmm(x, fragments, arrays, layout.num_rows, bias, keep_fp32=False)
        sums = kernels.grouped_spmm(x, fragments, arrays, layout.num_rows, None, keep_fp32=True)
        return kernels.csr_rows_spmm(x, rest.rowptr, rest.col, rest_values, indices.rest_pieces, layout.num_cols, bias,
                                     rest.row_map, addend=sums)


def grouped_layout(structure) -> GroupedLayout:
    """The grouped layout of ``structure`` in its row order, built on first need and kept: its split
    between the Tensor-Core layout and the rows kernel's rest is the one the selector prices
    fastest (``formats.grouped.SPLIT_THRESHOLDS``)."""
    return structure.kept(("grouped_layout",), lambda: _build_layout(structure))


def _build_layout(structure) -> GroupedLayout:
    if structure.col.dtype != torch.int32:
        raise ValueError(f"path 'grouped' needs int32 indices (under 2^31 nonzeros), got {structure.col.dtype}")
    pairs = group_pairs(structure.rowptr, structure.col, structure.num_rows, structure.num_cols, structure.row_perm)
    features = MatrixFeatures.of_layout(structure.layout, rows_share_ratio=structure.selection.rows_share_ratio)
    threshold = grouped_split(split_sizes(pairs, grouped_format.SPLIT_THRESHOLDS), features,
                              device_model(structure.device))
    return build_grouped(structure.rowptr, structure.col, structure.num_rows, structure.num_cols, structure.row_perm,
                         min_pair_nnz=threshold, pairs=pairs)


GROUPED = GroupedEngine()
