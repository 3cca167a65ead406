"""GCN normalization of a row-partitioned graph, ``D^-1/2 (A + fill I) D^-1/2`` as PyG's
``gcn_norm`` computes it, from each rank's own rows: a row's degree is its own row sum, and the
degrees of the halo columns arrive through the same halo exchange as the features."""
from __future__ import annotations

import torch
from torch import Tensor

from ..nn._checks import check_flag
from ..nn.normalization import compute_dtype
from .checks import check_csr
from .exchange import peers_of
from .part import GraphPart, _check_bounds, check_progress
from .row_ranges import range_rows, row_ranges


def gcn_part(rowptr: Tensor, col: Tensor, values: Tensor | None, bounds, group=None, improved: bool = False,
             add_self_loops: bool = True, *, overlap: bool = False, halo_dtype=None, progress=None) -> GraphPart:
    """``GraphPart.from_rows`` of the normalized adjacency: rows ``A[target, source]`` of this
    rank (columns in partition numbering), with the missing self-loops added (weight 2 if
    ``improved`` else 1; a row that has its self-loop keeps its weight, as in PyG) and every
    entry scaled by ``deg(source)^-1/2 deg(target)^-1/2``, computed in float32 (float64 for
    float64 values) and rounded once to the values' dtype. ``overlap`` and ``halo_dtype``: the
    part's exchange (``GraphPart``); the degrees always travel in the compute dtype. A collective
    call (``group`` as ``GraphPart.from_rows`` takes it). ``progress``: as ``from_rows`` takes
    it, called with "self-loops" first and "normalization" last."""
    check_flag("improved", improved)
    check_flag("add_self_loops", add_self_loops)
    report = check_progress(progress)
    peers = peers_of(group)
    bounds = _check_bounds(bounds, peers.world_size)
    first, end = bounds[peers.rank], bounds[peers.rank + 1]
    num_rows = check_csr(rowptr, col, values, end - first, bounds[-1])
    if values is None:
        values = torch.ones(col.numel(), dtype=torch.float32, device=col.device)
    if add_self_loops:
        rowptr, col, values = _with_self_loops(rowptr, col, values, first, num_rows, 2.0 if improved else 1.0)
    report("self-loops")
    part = GraphPart.from_rows(rowptr, col, values, bounds, peers, overlap=overlap, halo_dtype=halo_dtype,
                               progress=report)
    interior, boundary = part.interior.csr, part.boundary.csr
    compute = compute_dtype(interior.values.dtype)
    interior_weight, boundary_weight = interior.values.to(compute), boundary.values.to(compute)
    interior_row, boundary_row = interior.row_indices(), boundary.row_indices()
    degree = torch.zeros(num_rows, dtype=compute, device=interior_weight.device)
    degree.index_add_(0, interior_row, interior_weight).index_add_(0, boundary_row, boundary_weight)
    inv_sqrt = degree.pow(-0.5)
    inv_sqrt.masked_fill_(inv_sqrt == float("inf"), 0.0)
    halo_inv_sqrt = part.gather_halo(inv_sqrt.unsqueeze(1)).wait().squeeze(1)
    # PyG's order of the products: deg(source)^-1/2 * weight * deg(target)^-1/2.
    interior_values = inv_sqrt[interior.col.long()] * interior_weight * inv_sqrt[interior_row]
    boundary_values = halo_inv_sqrt[boundary.col.long()] * boundary_weight * inv_sqrt[boundary_row]
    dtype = interior.values.dtype
    part = part.with_values(interior_values.to(dtype), boundary_values.to(dtype))
    report("normalization")
    return part


def _with_self_loops(rowptr: Tensor, col: Tensor, values: Tensor, first: int, num_rows: int, fill: float):
    """The rows with a self-loop of weight ``fill`` after the entries of every row that has none;
    entries keep their order and their columns' dtype. A range of rows at a time, without
    sorting: no per-entry temporaries of the whole part."""
    rowptr = rowptr.long()
    has_loop = torch.zeros(num_rows, dtype=torch.bool, device=col.device)
    ranges = row_ranges(rowptr)
    for start, end in ranges:
        row = range_rows(rowptr, start, end)
        has_loop[row[col[int(rowptr[start]):int(rowptr[end])] == row + first]] = True
    missing = ~has_loop
    added = torch.cumsum(missing, 0)
    new_rowptr = rowptr.clone()
    new_rowptr[1:] += added
    total = int(new_rowptr[-1])
    new_col, new_values = col.new_empty(total), values.new_empty(total)
    for start, end in ranges:
        lo, hi = int(rowptr[start]), int(rowptr[end])
        # An entry moves by the self-loops added to the rows before its own.
        shift = (added - missing.long())[range_rows(rowptr, start, end)]
        position = torch.arange(lo, hi, device=col.device) + shift
        new_col[position] = col[lo:hi]
        new_values[position] = values[lo:hi]
    loops = missing.nonzero().squeeze(1)
    new_col[new_rowptr[loops + 1] - 1] = (loops + first).to(col.dtype)
    new_values[new_rowptr[loops + 1] - 1] = fill
    return new_rowptr, new_col, new_values
