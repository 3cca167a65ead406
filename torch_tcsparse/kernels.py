"""The CUDA kernels as Python functions: the one module that calls the compiled extension
(``_ext``), with their build state, precision mode and launch shapes.

X and Y are float32, float16 or bfloat16 (Y has X's dtype), and every product is accumulated in
fp32. Precision of the ME-TCF Tensor-Core kernels (``csrc/metcf_spmm.h``, values in X's dtype):

* float32 with TF32 allowed (``torch.backends.cuda.matmul.allow_tf32`` or float32 matmul
  precision "high"/"medium"): operands rounded to TF32; relative error ~1e-4..1e-3 of
  sum |a * x| per output, as torch's own TF32 matmul.
* float32 otherwise: 3xTF32 split (hi*hi + hi*lo + lo*hi), about fp32 accuracy (~1e-6 relative).
* float16 / bfloat16: exact products of the 16-bit operands summed in fp32, one rounding to the
  output dtype at the end (relative 2^-11 / 2^-8 of each output), however long the row.

The rows kernel (``csrc/csr_rows_spmm.h``) sums with plain fp32 FMAs (no TF32 rounding), as does
its scatter of A^T dY (``csrc/csr_rows_scatter.h``). Every binding checks its arguments
(RuntimeError naming the argument).
"""
from __future__ import annotations

import functools

import torch

from . import _ext
from .formats import metcf as _metcf
from .paths import KERNEL_DTYPES, KERNEL_PATHS

# Row windows of a matrix large enough for the widest column slices of every kernel (the launch
# shape of 16-bit kernels depends on the window count; see use_wide_slices in csrc/metcf_spmm.cuh).
MANY_WINDOWS = 1 << 40

available = _ext.available


def usable(x: torch.Tensor) -> bool:
    """Whether the kernels can multiply this operand: on CUDA, in a kernel dtype, built."""
    return usable_for(x.dtype, x.device)


@functools.lru_cache(maxsize=None)
def usable_for(dtype: torch.dtype, device: torch.device) -> bool:
    """``usable`` for operands of ``dtype`` on ``device``: a fact of the process (whether the
    extension builds does not change), kept because reading it costs a first choice more than the
    lookup."""
    return device.type == "cuda" and dtype in KERNEL_DTYPES and available()


# torch.backends.cuda.matmul.allow_tf32 is read through a module __getattr__, a cost paid on every
# float32 product that is comparable to a small graph's kernel; the accessor it calls is cheap.
_cublas_allow_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None)


def tf32_allowed() -> bool:
    """Whether float32 products may round to TF32: torch's cuBLAS flag or matmul precision."""
    allowed = _cublas_allow_tf32() if _cublas_allow_tf32 is not None else torch.backends.cuda.matmul.allow_tf32
    return bool(allowed) or torch.get_float32_matmul_precision() != "highest"


def exact(x: torch.Tensor) -> bool:
    """Whether a float32 product must keep fp32 accuracy (the 3xTF32 split) rather than TF32."""
    return x.dtype == torch.float32 and not tf32_allowed()


def layout_arguments(layout) -> tuple:
    """The ME-TCF layout as the Tensor-Core bindings take it."""
    return (layout.window_offsets, layout.block_offsets, layout.local_ids, layout.block_cols, layout.block_bitmap,
            layout.row_map, layout.chunk_offsets, layout.chunk_row_starts, layout.window, layout.num_rows, layout.num_cols,
            _metcf.BALANCE_CHUNK)


def metcf_spmm(x: torch.Tensor, values: torch.Tensor, arguments: tuple, balanced: bool) -> torch.Tensor:
    """Y = A @ x for A given by ``layout_arguments`` and its values in canonical CSR order, 1-D,
    contiguous and of x's dtype: the kernels read them in place."""
    return _ext.load().spmm(x, values, *arguments, balanced, torch.are_deterministic_algorithms_enabled(),
                            exact(x))


def sddmm(grad_y: torch.Tensor, x: torch.Tensor, layout) -> torch.Tensor:
    """For every nonzero of the ME-TCF ``layout`` in block order, <grad_y[row], x[col]>: summed in
    fp32 and returned in x's dtype."""
    _check_dense(layout, grad_y=(grad_y, layout.num_rows), x=(x, layout.num_cols))
    if grad_y.shape[1] != x.shape[1]:
        raise ValueError(f"grad_y has {grad_y.shape[1]} columns but x has {x.shape[1]}")
    return _ext.load().sddmm(grad_y, x, *layout_arguments(layout)).to(x.dtype)


def csr_rows_spmm(x, rowptr, col, values, pieces, num_cols: int, bias=None, row_map=None, addend=None) -> torch.Tensor:
    """Y = A @ x (+ bias on every row) for the CSR (rowptr, col, values) split by ``pieces``
    (``csr_rows.RowPieces``); x may be a column slice of a wider tensor (any row stride), Y is
    contiguous. ``row_map`` (int32, a permutation) writes CSR row i to row ``row_map[i]`` of Y.
    ``addend`` (fp32, Y's shape and row order) is added to Y before its one rounding: another
    kernel's sums over the same Y."""
    return _ext.load().csr_rows_spmm(x, rowptr, col, values, pieces.piece_slots, pieces.piece_starts,
                                     pieces.split_rows, num_cols, pieces.piece_nnz, bias, row_map, addend)


def csr_rows_scatter(grad_y, rowptr, col, values, pieces, num_cols: int, row_map=None) -> torch.Tensor:
    """dX = A^T grad_y [num_cols, N] from ``csr_rows_spmm``'s operands (A's rows as that kernel
    reads them: ``row_map`` sends CSR row i's gradient from row ``row_map[i]`` of grad_y): each
    row piece adds its nonzeros' products into dX by fp32 atomics, whose order, and so the last
    bits of the sums, may change from call to call. dX in grad_y's dtype, rounded once."""
    return _ext.load().csr_rows_scatter(grad_y, rowptr, col, values, pieces.piece_slots, pieces.piece_starts,
                                        pieces.split_rows, num_cols, pieces.piece_nnz, row_map)


def grouped_spmm(x, fragments, arrays, num_rows: int, bias, keep_fp32: bool) -> torch.Tensor:
    """The grouped layout's Tensor-Core sums (``csrc/grouped_spmm.h``): Y in x's dtype, or with
    ``keep_fp32`` the unrounded float32 sums another kernel adds to."""
    return _ext.load().grouped_spmm(x, fragments, *arrays, num_rows, exact(x), bias, keep_fp32)


def attention_spmm(weights, x, col, edge_ids, pieces, num_rows: int) -> torch.Tensor:
    """Multi-head weighted sums over row pieces (``csrc/attention.h``): out[i, h] = sum over the
    edges (i, j) of weights[e, h] * x[j, h]; ``edge_ids`` reads the weights through edge ids
    (the transpose's product), None in order."""
    return _ext.load().attention_spmm(weights, x, col, edge_ids, pieces.begin, pieces.row, pieces.slot,
                                      pieces.split_rows, pieces.split_begin, pieces.num_slots, num_rows)


def attention_sddmm(a, b, row, col) -> torch.Tensor:
    """Multi-head edge dots (``csrc/attention.h``): out[e, h] = <a[row[e], h], b[col[e], h]>."""
    return _ext.load().attention_sddmm(a, b, row, col)


def attention_row_sums(values, edge_ids, pieces, num_rows: int) -> torch.Tensor:
    """Per-head row sums (``csrc/attention.h``): out[i, h] = sum over the edges of row i of
    values[e, h], read through ``edge_ids`` (the transpose's sums), None in order."""
    return _ext.load().attention_row_sums(values, edge_ids, pieces.begin, pieces.row, pieces.slot, pieces.split_rows,
                                          pieces.split_begin, pieces.num_slots, num_rows)


def attention_softmax(dot: bool, first, second, col, pieces, parameter: float) -> torch.Tensor:
    """Attention weights [E, heads] (``csrc/edge_softmax.h``): the softmax over each row of the
    edges' scores formed in the kernel, GAT's ``leaky_relu(first[j] + second[i], parameter)``
    (``second`` may be None) or, with ``dot``, ``parameter * <first[i], second[j]>``."""
    return _ext.load().attention_softmax(dot, first, second, col, pieces.begin, pieces.row, pieces.slot,
                                         pieces.split_rows, pieces.split_begin, pieces.num_slots, float(parameter))


def attention_softmax_backward(dot: bool, alpha, grad_alpha, first, second, col, pieces, parameter: float,
                               num_rows: int, grad_dst: bool) -> list[torch.Tensor]:
    """[the scores' gradient before their last step] of ``attention_softmax``, and with
    ``grad_dst`` (GAT's second array given) its row sums."""
    return _ext.load().attention_softmax_backward(dot, alpha, grad_alpha, first, second, col, pieces.begin, pieces.row,
                                                  pieces.slot, pieces.split_rows, pieces.split_begin, pieces.num_slots,
                                                  float(parameter), num_rows, grad_dst)


def reduce_rows(x, rowptr, col, values, is_max: bool, longest: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(Y, the winning nonzero of every output) of the max/min product (``csrc/reduce_rows.h``);
    ``longest``, the nonzeros of the longest row where known (-1: unknown), spares a matrix without
    long rows the launches that cut them into pieces."""
    return _ext.load().reduce_rows(x, rowptr, col, values, is_max, longest)


def reduce_rows_backward(grad_y, winners, col, values, x, needs_x: bool,
                         needs_values: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX, d(values)) of the max/min product whose winners ``reduce_rows`` gave, as float32 sums
    added atomically (``csrc/reduce_rows_backward.cu``); one not wanted comes back empty."""
    return _ext.load().reduce_rows_backward(grad_y, winners, col, values, x, needs_x, needs_values)


def sorted_row_limit() -> int:
    """The longest row ``sort_row_sources`` takes (``csrc/sampled_columns.h``: kSortedRowLimit)."""
    return _ext.load().sorted_row_limit


def sorts_row_sources(source: torch.Tensor, longest: int) -> bool:
    """Whether ``sort_row_sources`` takes these int64 sources, rows of at most ``longest``."""
    return (source.device.type == "cuda" and source.dtype == torch.int64 and available()
            and longest <= sorted_row_limit())


def sort_row_sources(rowptr, source, longest: int) -> torch.Tensor:
    """A sampled block's columns: each row's sources ascending, in rowptr's index type."""
    return _ext.load().sort_row_sources(rowptr, source, longest)


def row_scale(rowptr: torch.Tensor, nnz: int, dtype: torch.dtype) -> torch.Tensor:
    """The mean's row scale of a CUDA CSR: 1 / (nonzeros of its row) for each of its ``nnz``
    nonzeros, in CSR order, in ``dtype`` (float32 or float64), one launch (``csrc/row_scale.h``)."""
    return _ext.load().row_scale(rowptr, nnz, dtype)


def metcf_row_map(perm, num_rows: int, window: int):
    """The conversion's first step (``csrc/metcf_convert.h``): window slot of every row and back."""
    return _ext.load().metcf_row_map(perm, num_rows, window)


def metcf_count(rowptr, col, row_map, slot_of_row, window: int, chunk: int):
    """The conversion's second step: blocks and chunks per window, and the longest row."""
    return _ext.load().metcf_count(rowptr, col, row_map, slot_of_row, window, chunk)


def metcf_fill(*arguments):
    """The conversion's last step: the layout's arrays."""
    return _ext.load().metcf_fill(*arguments)


def _check_dense(layout, **dense) -> None:
    """Each dense operand: one of KERNEL_DTYPES (all the same), 2-D with the given rows, on the
    layout's CUDA device."""
    if layout.device.type != "cuda":
        raise ValueError(f"the kernels need a CUDA layout, got one on {layout.device}")
    dtypes = set()
    for name, (t, rows) in dense.items():
        if not isinstance(t, torch.Tensor) or t.dtype not in KERNEL_DTYPES:
            raise TypeError(f"{name} must be a float32, float16 or bfloat16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        dtypes.add(t.dtype)
        if t.dim() != 2 or t.shape[0] != rows:
            raise ValueError(f"{name} must be 2-D with {rows} rows, got shape {tuple(t.shape)}")
        if t.device != layout.device:
            raise ValueError(f"{name} is on {t.device} but the layout is on {layout.device}")
    if len(dtypes) > 1:
        raise TypeError(f"the dense operands must share one dtype, got {sorted(map(str, dtypes))}")


def _launch_shape(kernel: str, n: int, dtype: torch.dtype, num_windows: int) -> list[int]:
    if kernel not in KERNEL_PATHS:
        raise ValueError(f"kernel must be one of {KERNEL_PATHS}, got {kernel!r}")
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"dtype must be one of {KERNEL_DTYPES}, got {dtype}")
    exact_fp32 = dtype == torch.float32 and not tf32_allowed()
    return list(_ext.load().launch_shape(16, int(num_windows), int(n), kernel == "balanced", exact_fp32, dtype))


def occupancy(kernel: str, n: int, dtype: torch.dtype = torch.float32, num_windows: int = MANY_WINDOWS) -> int:
    """Warps of ``kernel``'s SpMM resident per SM at N = n for X of ``dtype`` on a matrix of
    ``num_windows`` row windows, on the current CUDA device."""
    return _launch_shape(kernel, n, dtype, num_windows)[0]


def column_slices(kernel: str, n: int, dtype: torch.dtype = torch.float32, num_windows: int = MANY_WINDOWS) -> int:
    """Warps per row window (base) or chunk (balanced) along N at N = n for X of ``dtype``."""
    return _launch_shape(kernel, n, dtype, num_windows)[1]
