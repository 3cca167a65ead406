"""The CPU conversion's compiled passes (``csrc/cpu_transpose.cpp``, ``csrc/cpu_metcf.cpp``),
loaded with ctypes from the library ``native_build`` makes on first use: COO entries into
canonical CSR, the transpose of a canonical CSR, the link between the block orders of a matrix
and of its transpose, and the ME-TCF layout. They sort by counting (COO entries by buckets of
rows, then by row and each row by column in cache; the transpose by buckets of columns, then by
column in cache; the layout one window's nonzeros at a time) where the torch build sorts every
nonzero through int64 keys, and run on torch's thread count.

Where no compiler is found or the build fails, ``library()`` is None and the callers take their
torch route, which builds the same arrays entry for entry: the compiled passes only make the CPU
faster."""
from __future__ import annotations

import ctypes
import threading

import torch

from .. import native_build

CPU_PASSES = native_build.Library(
    "libtcsparse_cpu.so", ("cpu_transpose.cpp", "cpu_metcf.cpp"), ("cpu_parallel.h",),
    "the CPU conversion's native code"
)
# Columns the layout pass takes: a window's keys are column << 4 | row in window, in 64 bits.
MAX_COLUMNS = 2**59

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "tcs_coo_sort": [_I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR],
    "tcs_merge_repeats": [_I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR],
    "tcs_csr_transpose": [_I64, _I64, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR],
    "tcs_link_gathers": [_I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR],
    "tcs_metcf_count": [_I64, _I64, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR],
    "tcs_metcf_fill": [_I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR,
                       _PTR, _PTR, _PTR],
}
# What a negative return code of each pass means.
_ERRORS = {
    "tcs_coo_sort": {-1: "a column index out of range", -5: "a row index out of range"},
    "tcs_merge_repeats": {-3: "a count of repeats that disagrees with the entries"},
    "tcs_csr_transpose": {-1: "a column index out of range", -2: "a row pointer out of order or range"},
    "tcs_link_gathers": {-3: "an index out of range of the nonzeros"},
    "tcs_metcf_count": {-1: "a column index out of range", -3: "a row (row_map, rowptr) out of range"},
    "tcs_metcf_fill": {-1: "a column index out of range", -3: "a row (row_map, rowptr) out of range",
                       -4: "window offsets that disagree with the matrix"},
}

# tcsparse::cpu::kNoMemory of csrc/cpu_parallel.h.
NO_MEMORY = -100

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_tried = False


def library() -> ctypes.CDLL | None:
    """The compiled passes, built on the first call of the process; None where they cannot be."""
    global _library, _tried
    if not _tried:
        with _lock:
            if not _tried:
                try:
                    lib = ctypes.CDLL(str(native_build.build(CPU_PASSES)))
                except (RuntimeError, OSError):
                    lib = None
                if lib is not None:
                    for name, arguments in _SIGNATURES.items():
                        function = getattr(lib, name)
                        function.restype, function.argtypes = _I64, arguments
                _library, _tried = lib, True
    return _library


def usable(*tensors: torch.Tensor) -> ctypes.CDLL | None:
    """The library where every one of ``tensors`` is on the CPU and it is built, else None."""
    if any(t.device.type != "cpu" for t in tensors):
        return None
    return library()


def _address(tensor: torch.Tensor | None):
    return None if tensor is None else tensor.data_ptr()


def _call(lib: ctypes.CDLL, name: str, *arguments) -> int:
    code = getattr(lib, name)(*arguments)
    if code == NO_MEMORY:
        raise MemoryError(f"{name}: out of memory for its scratch arrays")
    if code < 0:
        raise ValueError(f"{name}: {_ERRORS[name].get(code, f'error {code}')}")
    return code


def _threads() -> int:
    """The passes use as many threads as torch's intra-op ops (``torch.set_num_threads``)."""
    return torch.get_num_threads()


def _checked_csr(rowptr: torch.Tensor, col: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR arrays, contiguous; ValueError where they do not fit together."""
    if rowptr.numel() != num_rows + 1 or rowptr.dtype != col.dtype or col.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"rowptr must hold num_rows + 1 = {num_rows + 1} entries of col's dtype (int32 or int64), "
                         f"got {rowptr.numel()} of {rowptr.dtype} (col: {col.dtype})")
    return rowptr.contiguous(), col.contiguous()


def _checked_row_map(row_map: torch.Tensor, num_rows: int, window: int) -> torch.Tensor:
    windows = -(-num_rows // window)
    if row_map.dtype != torch.int32 or row_map.numel() != windows * window:
        raise ValueError(f"row_map must hold {windows * window} int32 slots, got {row_map.numel()} of {row_map.dtype}")
    return row_map.contiguous()


def coo_sort(lib: ctypes.CDLL, row: torch.Tensor, col: torch.Tensor, num_rows: int, num_cols: int,
             index_dtype: torch.dtype, order_dtype: torch.dtype | None):
    """COO entries in canonical CSR order, repeated (row, column) pairs merged: rowptr (int64), the
    distinct entries' columns (in ``index_dtype``) and, where ``order_dtype`` is given, the
    position of each one's first entry; the position of every repeated entry (in order) and the
    distinct entry it adds to (int64), None and None where nothing repeats."""
    row, col = _checked_indices(row), _checked_indices(col)
    nnz = col.numel()
    if row.numel() != nnz:
        raise ValueError(f"row and col must hold as many entries, got {row.numel()} and {nnz}")
    rowptr = torch.empty(num_rows + 1, dtype=torch.int64)
    col_out = torch.empty(nnz, dtype=index_dtype)
    order = None if order_dtype is None else torch.empty(nnz, dtype=order_dtype)
    order_bytes = 8 if order is None else order.element_size()
    repeats = _call(lib, "tcs_coo_sort", row.element_size(), col.element_size(), col_out.element_size(), order_bytes,
                    _threads(), num_rows, num_cols, nnz, *map(_address, (row, col, rowptr, col_out, order)))
    if repeats == 0:
        return rowptr, col_out, order, None, None
    repeat_order = None if order is None else torch.empty(repeats, dtype=order_dtype)
    repeat_target = torch.empty(repeats, dtype=torch.int64)
    distinct = _call(lib, "tcs_merge_repeats", col_out.element_size(), order_bytes, num_rows, repeats,
                     *map(_address, (rowptr, col_out, order, repeat_order, repeat_target)))
    # Copies of the distinct entries, so that the arrays of every entry are freed.
    order = None if order is None else order[:distinct].clone()
    return rowptr, col_out[:distinct].clone(), order, repeat_order, repeat_target


def _checked_indices(index: torch.Tensor) -> torch.Tensor:
    """``index`` contiguous in int32 or int64 (other integer dtypes widened to int64)."""
    return index.contiguous() if index.dtype in (torch.int32, torch.int64) else index.to(torch.int64)


def csr_transpose(lib: ctypes.CDLL, rowptr: torch.Tensor, col: torch.Tensor, num_rows: int, num_cols: int,
                  order_dtype: torch.dtype | None, carried: torch.Tensor | None = None):
    """rowptr and col of the transpose of a canonical CSR (in its index dtype), and for each of the
    transpose's nonzeros the position of that entry in the CSR (``order``, in ``order_dtype``; None
    where that is None) and ``carried`` (one int32 or int64 entry per nonzero) at that position
    (None where ``carried`` is)."""
    rowptr, col = _checked_csr(rowptr, col, num_rows)
    nnz = col.numel()
    if carried is not None:
        carried = carried.contiguous()
        if carried.numel() != nnz or carried.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"carried must hold one int32 or int64 entry per nonzero ({nnz}), "
                             f"got {carried.numel()} of {carried.dtype}")
    rowptr_t = torch.empty(num_cols + 1, dtype=col.dtype)
    col_t = torch.empty(nnz, dtype=col.dtype)
    order = None if order_dtype is None else torch.empty(nnz, dtype=order_dtype)
    carried_t = None if carried is None else torch.empty_like(carried)
    widths = (8 if t is None else t.element_size() for t in (order, carried))
    _call(lib, "tcs_csr_transpose", col.element_size(), *widths, _threads(), num_rows, num_cols, nnz,
          *map(_address, (rowptr, col, rowptr_t, col_t, order, carried, carried_t)))
    return rowptr_t, col_t, order, carried_t


def link_gathers(lib: ctypes.CDLL, ours: torch.Tensor, theirs: torch.Tensor,
                 both: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``gather`` with ``gather[ours[p]] = theirs[p]`` and, where ``both``, its inverse
    ``gather_t`` (None otherwise): permutations of the nonzeros in their dtype."""
    ours, theirs = ours.contiguous(), theirs.contiguous()
    nnz = ours.numel()
    if theirs.numel() != nnz or ours.dtype != theirs.dtype or ours.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ours and theirs must hold as many entries of one int32 or int64 dtype, got "
                         f"{nnz} of {ours.dtype} and {theirs.numel()} of {theirs.dtype}")
    gather = torch.empty_like(ours)
    gather_t = torch.empty_like(ours) if both else None
    _call(lib, "tcs_link_gathers", ours.element_size(), _threads(), nnz,
          *map(_address, (ours, theirs, gather, gather_t)))
    return gather, gather_t


def metcf_blocks(lib: ctypes.CDLL, rowptr: torch.Tensor, col: torch.Tensor, row_map: torch.Tensor, num_rows: int,
                 num_cols: int, window: int) -> torch.Tensor:
    """TC blocks of every window (int64) of the ME-TCF layout whose window slots ``row_map`` fills."""
    rowptr, col = _checked_csr(rowptr, col, num_rows)
    row_map = _checked_row_map(row_map, num_rows, window)
    num_windows = row_map.numel() // window
    blocks = torch.empty(num_windows, dtype=torch.int64)
    _call(lib, "tcs_metcf_count", col.element_size(), _threads(), num_rows, num_cols, col.numel(), window, num_windows,
          *map(_address, (rowptr, col, row_map, blocks)))
    return blocks


def metcf_fill(lib: ctypes.CDLL, rowptr: torch.Tensor, col: torch.Tensor, row_map: torch.Tensor, num_rows: int,
               num_cols: int, window: int, window_offsets: torch.Tensor, num_blocks: int, gather_dtype: torch.dtype):
    """block_cols, block_bitmap, block_offsets, local_ids and csr_gather of the ME-TCF layout."""
    rowptr, col = _checked_csr(rowptr, col, num_rows)
    row_map = _checked_row_map(row_map, num_rows, window)
    window_offsets = window_offsets.to(torch.int32).contiguous()
    if window_offsets.numel() != row_map.numel() // window + 1:
        raise ValueError(f"window_offsets must hold windows + 1 = {row_map.numel() // window + 1} entries, "
                         f"got {window_offsets.numel()}")
    nnz = col.numel()
    block_cols = torch.empty(num_blocks * 8, dtype=torch.int32)
    bitmap = torch.empty(num_blocks * 4, dtype=torch.int32)
    block_offsets = torch.empty(num_blocks + 1, dtype=torch.int32)
    local_ids = torch.empty(nnz, dtype=torch.uint8)
    csr_gather = torch.empty(nnz, dtype=gather_dtype)
    _call(lib, "tcs_metcf_fill", col.element_size(), csr_gather.element_size(), _threads(), num_rows, num_cols, nnz,
          window, row_map.numel() // window, *map(_address, (rowptr, col, row_map, window_offsets)), num_blocks,
          *map(_address, (block_cols, bitmap, block_offsets, local_ids, csr_gather)))
    return block_cols, bitmap, block_offsets, local_ids, csr_gather
