"""Canonical CSR from any input, with the validation every public entry point relies on.

Canonical means: rows ascending, columns ascending inside a row, no duplicate (row, col) pair
(duplicates are summed, as scipy's ``sum_duplicates`` and torch's ``coalesce`` do), index
tensors int32 when every index and the nonzero count fit, int64 otherwise.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..paths import VALUE_DTYPES
from . import native, packed
from .arrays import INT32_MAX, compress, first_of_runs, floor_divide, sort_keys, sort_with_positions
from .packed import bit_width

@dataclass(frozen=True)
class CSR:
    """A canonical CSR matrix of shape ``(num_rows, num_cols)``."""

    rowptr: torch.Tensor
    col: torch.Tensor
    values: torch.Tensor
    num_rows: int
    num_cols: int

    @property
    def nnz(self) -> int:
        return self.col.numel()

    def row_indices(self, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """Row id of every nonzero (int64, or ``dtype``), the COO view of this CSR."""
        rows = torch.arange(self.num_rows, dtype=dtype, device=self.col.device)
        return packed.expand(rows, (self.rowptr[1:] - self.rowptr[:-1]).long(), self.nnz)

    def to(self, device=None, dtype=None) -> "CSR":
        values = self.values.to(device=device, dtype=dtype)
        return CSR(self.rowptr.to(device), self.col.to(device), values, self.num_rows, self.num_cols)


def torch_csr(rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape) -> torch.Tensor:
    """A torch sparse CSR tensor over canonical arrays (already validated: no invariant check)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        # Said where the flag does not reach torch's check (fake tensors under torch.compile).
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        return torch.sparse_csr_tensor(rowptr, col, values, tuple(shape), check_invariants=False)


def scipy_csr(rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape):
    """A scipy CSR matrix over canonical arrays, on the host. 16-bit values come out in float32,
    which holds each exactly: scipy.sparse computes on neither float16 nor bfloat16."""
    import scipy.sparse as sp

    values = values.detach().cpu()
    if values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()
    return sp.csr_matrix((values.numpy(), col.cpu().numpy(), rowptr.cpu().numpy()), shape=tuple(shape))


def index_dtype_for(num_rows: int, num_cols: int, nnz: int) -> torch.dtype:
    return torch.int32 if max(num_rows, num_cols, nnz) <= INT32_MAX else torch.int64


def check_index_tensor(name: str, index: torch.Tensor) -> None:
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(index).__name__}")
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {index.dtype}")
    if index.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor (a shape without data): the conversion reads the indices, "
                         "so build the matrix from a tensor on the CPU or a GPU")


def check_values(values: torch.Tensor, nnz: int, device: torch.device, name: str = "values") -> None:
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(values).__name__}")
    if values.dtype not in VALUE_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {values.dtype}")
    if values.dim() != 1 or values.numel() != nnz:
        raise ValueError(f"{name} must be 1-D with one entry per nonzero ({nnz}), got shape {tuple(values.shape)}")
    if values.device != device:
        raise ValueError(f"{name} is on {values.device} but the indices are on {device}")


def check_range(name: str, index: torch.Tensor, bound: int) -> None:
    """Every entry of ``index`` must lie in [0, bound)."""
    if index.numel() == 0:
        return
    low, high = (int(bound) for bound in torch.aminmax(index))
    if low < 0:
        raise ValueError(f"{name} holds a negative index ({low})")
    if high >= bound:
        raise ValueError(f"{name} holds index {high}, out of range for size {bound}")


def check_size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
        except ImportError:  # pragma: no cover - numpy is a dependency
            pass
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return value


def cast_values(values: torch.Tensor, dtype: torch.dtype, name: str = "values") -> torch.Tensor:
    """``values`` in ``dtype``; ValueError where a finite value is beyond ``dtype``'s range (it would
    silently become inf, e.g. 1e6 in float16)."""
    cast = values.to(dtype)
    if cast.dtype == values.dtype or not bool(torch.isinf(cast).any()):
        return cast
    beyond = torch.nonzero(torch.isinf(cast) & torch.isfinite(values))
    if beyond.numel():
        value = values.reshape(-1)[int(beyond[0])].item()
        raise ValueError(f"{name} holds {value:g}, beyond the range of {dtype} (largest finite value "
                         f"{torch.finfo(dtype).max:g}): it would become inf")
    return cast


def accumulation_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype duplicates are summed in: float64 when any of ``dtypes`` is float64, else float32,
    so that a 16-bit sum of many duplicates neither saturates nor loses its low bits (the result
    is rounded once, to the value dtype)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def from_coo(
    row: torch.Tensor,
    col: torch.Tensor,
    values: torch.Tensor | None,
    num_rows: int,
    num_cols: int,
    dtype: torch.dtype | None = None,
    names: tuple[str, str, str] = ("row", "col", "values"),
) -> CSR:
    """Canonical CSR from COO triplets; duplicate (row, col) pairs are summed in
    ``accumulation_dtype`` and rounded once. The values come out in ``dtype`` (default: the
    dtype of ``values``, float32 without values); ValueError where one is beyond its range.
    ``names`` are what error messages call the three arrays (the caller's own names for them)."""
    row_name, col_name, values_name = names
    check_index_tensor(row_name, row)
    check_index_tensor(col_name, col)
    num_rows, num_cols = check_size("num_rows", num_rows), check_size("num_cols", num_cols)
    if row.dim() != 1 or col.dim() != 1 or row.numel() != col.numel():
        raise ValueError(
            f"row and col must be 1-D of equal length, got shapes {tuple(row.shape)} and {tuple(col.shape)}"
        )
    if row.device != col.device:
        raise ValueError(f"row is on {row.device} but col is on {col.device}")
    device = row.device
    if values is not None:
        check_values(values, row.numel(), device)
    if dtype is None:
        dtype = torch.float32 if values is None else values.dtype
    if dtype not in VALUE_DTYPES:
        raise TypeError(f"dtype must be float16, bfloat16, float32 or float64, got {dtype}")
    check_range(row_name, row, num_rows)
    check_range(col_name, col, num_cols)

    with_order = values is not None
    lib = native.usable(row, col)
    if lib is not None:
        index_dtype = index_dtype_for(num_rows, num_cols, row.numel())
        order_dtype = (torch.int32 if row.numel() <= INT32_MAX else torch.int64) if with_order else None
        rowptr, col, first, repeated, targets = native.coo_sort(lib, row, col, num_rows, num_cols, index_dtype,
                                                                order_dtype)
    else:
        rowptr, col, first, repeated, targets = _sorted_by_keys(row, col, num_rows, num_cols, with_order)
    values = _merged_values(values, first, repeated, targets, col.numel(), dtype, device, values_name)
    del first, repeated, targets
    index_dtype = index_dtype_for(num_rows, num_cols, col.numel())
    return CSR(rowptr.to(index_dtype), col.to(index_dtype), values, num_rows, num_cols)


def _sorted_by_keys(row: torch.Tensor, col: torch.Tensor, num_rows: int, num_cols: int, with_order: bool):
    """What ``native.coo_sort`` returns, through one sort of int64 row-major keys (the route of a
    GPU, and of a CPU without the compiled passes): rowptr (int64), the distinct entries' columns,
    the position of each one's first entry (where ``with_order``), the positions of the repeated
    entries and the distinct entry each adds to (None and None where nothing repeats)."""
    # Row-major keys row * width + col. A power-of-two width (wherever row and column bits fit
    # 63) splits them back with a shift and a mask: no integer division per nonzero.
    col_bits = bit_width(num_cols - 1)
    shift = col_bits if bit_width(num_rows - 1) + col_bits <= packed.KEY_BITS else None
    width = max(num_cols, 1) if shift is None else 1 << shift
    counts = torch.bincount(row, minlength=num_rows) if row.numel() else row.new_zeros(num_rows, dtype=torch.long)
    key = row.to(torch.long) * width
    keys, cols = packed.host(key), packed.host(col)
    for start, stop in packed.slices(key.numel()):  # an int32 col whole would be widened to a copy
        keys[start:stop] += cols[start:stop]
    del keys, cols
    if with_order:
        key, order = sort_with_positions(key, num_rows * width)
    else:
        key, order = sort_keys(key), None
    is_first = first_of_runs(key)
    repeated = targets = None
    if not bool(is_first.all()):
        is_repeat = ~is_first
        counts -= torch.bincount(_rows_of(compress(key, is_repeat), width, shift), minlength=num_rows)
        # The k-th repeat (from 0) at position p adds to distinct entry p - k - 1.
        targets = torch.nonzero(is_repeat).view(-1)
        targets -= torch.arange(1, targets.numel() + 1, device=targets.device)
        if order is not None:
            repeated, order = compress(order, is_repeat), compress(order, is_first)
        key = compress(key, is_first)
    del is_first
    rowptr = _exclusive_cumsum(counts)
    if shift is None:
        key -= _rows_of(key, width, shift).mul_(width)
        return rowptr, key, order, repeated, targets
    # The column is the key's low bits: cast first where they fit int32 (the cast keeps the low 32
    # bits), so the mask runs over half the bytes and no int64 copy is made.
    col = key.to(torch.int32) if num_cols - 1 <= INT32_MAX else key
    del key
    return rowptr, col.bitwise_and_(width - 1), order, repeated, targets


def _rows_of(key: torch.Tensor, width: int, shift: int | None) -> torch.Tensor:
    """Rows of row-major keys (a new tensor)."""
    return floor_divide(key, width) if shift is None else key >> shift


def _merged_values(values: torch.Tensor | None, first: torch.Tensor | None, repeated: torch.Tensor | None,
                   targets: torch.Tensor | None, distinct: int, dtype: torch.dtype, device: torch.device, name: str):
    """Values in ``dtype`` of the ``distinct`` entries: the values at ``first`` (ones without
    values), each repeated entry's (at ``repeated``) added to its distinct entry (``targets``), in
    ``accumulation_dtype`` and rounded once, as scipy's ``sum_duplicates`` sums from the first, on
    ``device``; a ValueError where one is beyond ``dtype``'s range (``name``: what error messages
    call the values). Differentiable for the values."""
    if values is None:
        if targets is None:
            return torch.ones(distinct, dtype=dtype, device=device)
        # Each distinct entry counts one, plus one per repeat.
        run_dtype = torch.int32 if distinct <= INT32_MAX else torch.int64
        counts = torch.ones(distinct, dtype=run_dtype, device=device)
        counts.index_add_(0, targets, torch.ones_like(targets, dtype=run_dtype))
        return cast_values(counts, dtype, "the count of a repeated entry")
    if targets is None:
        return cast_values(values.index_select(0, first), dtype, name)
    accumulate = accumulation_dtype(values.dtype, dtype)
    # index_select gives a tensor of its own: adding into it in place keeps autograd's graph intact.
    summed = values.index_select(0, first).to(accumulate)
    summed.index_add_(0, targets, values.index_select(0, repeated).to(accumulate))
    return cast_values(summed, dtype, f"{name} (summed over repeated entries)")


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(counts.numel() + 1, dtype=torch.long, device=counts.device)
    torch.cumsum(counts, 0, out=out[1:])
    return out


def from_csr_arrays(
    rowptr: torch.Tensor,
    col: torch.Tensor,
    values: torch.Tensor | None,
    num_rows: int | None,
    num_cols: int,
    dtype: torch.dtype | None = None,
) -> CSR:
    """Canonical CSR from (possibly unsorted, duplicated) CSR arrays, every array validated;
    ``dtype`` as for ``from_coo``."""
    check_index_tensor("rowptr", rowptr)
    check_index_tensor("col", col)
    if rowptr.dim() != 1 or rowptr.numel() < 1:
        raise ValueError(f"rowptr must be 1-D with num_rows + 1 entries, got shape {tuple(rowptr.shape)}")
    rowptr = rowptr.long()  # differences of small unsigned types would wrap around
    if num_rows is None:
        num_rows = rowptr.numel() - 1
    num_rows = check_size("num_rows", num_rows)
    if rowptr.numel() != num_rows + 1:
        raise ValueError(f"rowptr has {rowptr.numel()} entries, expected num_rows + 1 = {num_rows + 1}")
    if col.dim() != 1:
        raise ValueError(f"col must be 1-D, got shape {tuple(col.shape)}")
    if int(rowptr[0]) != 0:
        raise ValueError(f"rowptr must start at 0, got {int(rowptr[0])}")
    if int(rowptr[-1]) != col.numel():
        raise ValueError(f"rowptr ends at {int(rowptr[-1])} but col holds {col.numel()} entries")
    steps = rowptr[1:] - rowptr[:-1]
    if steps.numel() and int(steps.min()) < 0:
        bad = int(torch.nonzero(steps < 0)[0])
        raise ValueError(f"rowptr must be non-decreasing; it falls at row {bad}")
    if rowptr.device != col.device:
        raise ValueError(f"rowptr is on {rowptr.device} but col is on {col.device}")
    # Row ids in int32 where they fit: half the bytes of an int64 id per nonzero.
    rows = torch.arange(num_rows, dtype=torch.int32 if num_rows <= INT32_MAX else torch.int64, device=col.device)
    return from_coo(packed.expand(rows, steps, col.numel()), col, values, num_rows, num_cols, dtype)


def checked_canonical(rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, num_rows: int,
                      num_cols: int) -> CSR:
    """The CSR of arrays that must be canonical already (a saved matrix's), in the canonical index
    dtype; ValueError where they are not. Checked in slices, without a sort or a copy beyond the
    index dtype's: what a load costs stays in proportion to the file."""
    check_index_tensor("rowptr", rowptr)
    check_index_tensor("col", col)
    index_dtype = index_dtype_for(num_rows, num_cols, col.numel())
    rowptr, col = rowptr.to(index_dtype).contiguous(), col.to(index_dtype).contiguous()
    check_values(values, col.numel(), col.device)
    if rowptr.device != col.device:
        raise ValueError(f"rowptr is on {rowptr.device} but col is on {col.device}")
    if rowptr.dim() != 1 or rowptr.numel() != num_rows + 1:
        raise ValueError(f"rowptr has {rowptr.numel()} entries, expected num_rows + 1 = {num_rows + 1}")
    if int(rowptr[0]) != 0:
        raise ValueError(f"rowptr must start at 0, got {int(rowptr[0])}")
    if int(rowptr[-1]) != col.numel():
        raise ValueError(f"rowptr ends at {int(rowptr[-1])} but col holds {col.numel()} entries")
    for start, stop in _check_slices(num_rows):
        falls = torch.nonzero(rowptr[start + 1:stop + 1] < rowptr[start:stop])
        if falls.numel():
            raise ValueError(f"rowptr must be non-decreasing; it falls at row {start + int(falls[0])}")
    check_range("col", col, num_cols)
    # Inside a row the columns rise strictly: a column at or below its predecessor starts a row.
    for start, stop in _check_slices(col.numel() - 1):
        drops = torch.nonzero(col[start + 1:stop + 1] <= col[start:stop]).view(-1).add_(start + 1)
        rows = torch.searchsorted(rowptr, drops).clamp_(max=num_rows)
        if drops.numel() and not bool((rowptr[rows] == drops).all()):
            raise ValueError("the CSR is not canonical: columns unsorted or repeated inside a row")
    return CSR(rowptr, col, values.contiguous(), num_rows, num_cols)


def _check_slices(total: int):
    """(start, stop) of slices covering [0, total) small enough that a check's int64 temporaries
    over one slice stay within a few MB."""
    step = 2**18
    for start in range(0, max(total, 0), step):
        yield start, min(start + step, total)


def transpose_pattern(csr: CSR) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rowptr and col of the transpose's CSR, and for each of its nonzeros the position of that
    entry in ``csr`` (the indices in the index dtype, the positions in int32 where the nonzeros'
    count fits). A stable sort by column keeps each column's rows ascending, as the rows are in
    ``csr``: the transpose of a canonical CSR is canonical with one sort of the column ids, no
    row * width + col key and no second canonicalisation. On the CPU, the compiled counting sort
    of ``csrc/cpu_transpose.cpp`` where it is built (``native``), with the same result."""
    order_dtype = torch.int32 if csr.nnz <= INT32_MAX else torch.int64
    lib = native.usable(csr.col, csr.rowptr)
    if lib is not None:
        rowptr, col, order, _ = native.csr_transpose(lib, csr.rowptr, csr.col, csr.num_rows, csr.num_cols,
                                                     order_dtype)
        return rowptr, col, order
    order = packed.stable_order(csr.col, csr.num_cols, order_dtype)
    if csr.col.device.type == "cpu":
        rowptr = _exclusive_cumsum(torch.bincount(csr.col, minlength=csr.num_cols)).to(csr.rowptr.dtype)
    else:
        # bincount on a GPU reads the largest id back to size its output; the ids in sorted order
        # give each column's start without a read.
        starts = torch.arange(csr.num_cols + 1, dtype=csr.col.dtype, device=csr.col.device)
        rowptr = torch.searchsorted(csr.col.index_select(0, order), starts,
                                    out_int32=csr.rowptr.dtype == torch.int32).to(csr.rowptr.dtype)
    return rowptr, csr.row_indices(csr.col.dtype).index_select(0, order), order


def transpose(csr: CSR) -> tuple[CSR, torch.Tensor]:
    """CSR of the transpose, and for each of its nonzeros the position of that entry in ``csr``;
    see ``transpose_pattern``."""
    rowptr, col, order = transpose_pattern(csr)
    return CSR(rowptr, col, csr.values.index_select(0, order), csr.num_cols, csr.num_rows), order
