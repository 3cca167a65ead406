"""The binding of the selector's C++ cost model (``csrc/selector_model.cpp`` through its C ABI,
``csrc/selector_capi.cpp``), loaded with ctypes from the library ``build`` makes on first use.

A matrix's features (``MatrixFeatures``: sizes and per-window prefix sums, kept by reference, its
rows pieces and the paths it may take) are handed over once; a calibration's constants once per
(N bucket, dtype, device) (``Prices``); what a choice at an N bucket asks of a device once per
(N bucket, dtype, device, TF32 mode, window count) (``Query``, shared by matrices); then a choice is
one call of four arguments (``choose``). Nothing here models anything: the numbers all come from
C++.
"""
from __future__ import annotations

import ctypes
import math
import threading
import weakref

import numpy as np
import torch

from .. import csr_rows
from ..formats.metcf import BALANCE_CHUNK
from . import build
from .paths import CHOICES, candidate_bits, matrix_paths

_I64, _F64, _PTR = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
_I64P, _F64P = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)
_PIECES = ctypes.c_int64 * 2


class RawExplanation(ctypes.Structure):
    """``TcsExplanation`` of selector_capi.cpp, field for field."""

    _fields_ = [
        ("path", _I64),
        ("costs_us", _F64 * len(CHOICES)),
        ("device_us", _F64 * len(CHOICES)),
        ("ar", _F64),
        ("base_makespan", _F64),
        ("base_work", _F64),
        ("balanced_makespan", _F64),
        ("balanced_work", _F64),
        ("zeroed_windows", _I64),
        ("miss", _F64),
        ("slots", _I64 * 2),
        ("slices", _I64 * 2),
        ("makespans_us", _F64 * 3),
        ("bytes_moved", _F64 * 4),
        ("reason", ctypes.c_char * 512),
    ]


class Query(ctypes.Structure):
    """``TcsQuery`` of selector_capi.cpp: what a choice at N bucket ``n`` asks of a device for X of
    ``value_bytes``, with the kernels' launch shapes (resident warps per SM, column slices) of
    base, then of balanced. Keeps its ``Prices`` alive; ``address`` is what a call hands over."""

    _fields_ = [("prices", _PTR), ("n", _I64), ("value_bytes", _I64), ("launch", _I64 * 4)]

    def __init__(self, prices: "Prices", n: int, value_bytes: int, base: tuple[int, int], balanced: tuple[int, int]):
        super().__init__(prices.handle, n, value_bytes, (_I64 * 4)(*base, *balanced))
        self._prices = prices
        self.address = ctypes.addressof(self)


_SIGNATURES = {
    "tcs_last_error": (ctypes.c_char_p, []),
    "tcs_path_name": (ctypes.c_char_p, [ctypes.c_int]),
    "tcs_prefixes": (None, [_I64P, _I64, _I64, _I64P, _I64P, _I64P]),
    "tcs_matrix_new": (_PTR, [_I64, _I64, _I64, _I64, _I64, _I64, _I64P, _I64P, _I64P, _F64, _I64, _I64,
                              ctypes.c_int, _I64, _I64P]),
    "tcs_matrix_free": (None, [_PTR]),
    "tcs_matrix_summary": (None, [_PTR, _I64P]),
    "tcs_prices_new": (_PTR, [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), _F64P, ctypes.c_int, _I64, _I64, _I64,
                              _I64]),
    "tcs_prices_free": (None, [_PTR]),
    "tcs_choose": (ctypes.c_int, [_PTR, _PTR, ctypes.c_uint, _PTR]),
    "tcs_explain": (None, [_PTR, _PTR, ctypes.c_uint, ctypes.POINTER(RawExplanation)]),
    "tcs_base_launch": (None, [_PTR, _I64, _I64, _F64, _F64P]),
    "tcs_balanced_launch": (None, [_PTR, _I64, _I64, _F64, _F64, _F64P]),
    "tcs_grouped_split": (ctypes.c_int, [_PTR, _PTR, _I64, _I64, ctypes.c_int, _I64P, _I64P]),
    "tcs_default_column_slices": (_I64, [_I64, _I64]),
    "tcs_rows_per_warp": (_I64, [_I64, _I64]),
    "tcs_rows_order_gain": (_F64, [_I64]),
}

_lock = threading.Lock()
_library = None


def library() -> ctypes.CDLL:
    """The C++ model, built on the first call of the process (``build``) and loaded."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                lib = ctypes.CDLL(str(build.build()))
                for name, (result, arguments) in _SIGNATURES.items():
                    function = getattr(lib, name)
                    function.restype, function.argtypes = result, arguments
                _check_paths(lib)
                _library = lib
    return _library


def _check_paths(lib: ctypes.CDLL) -> None:
    """The model's costs and choices are indexed by its enum Path: its order must be ``CHOICES``."""
    names = []
    while (name := lib.tcs_path_name(len(names))) is not None:
        names.append(name.decode())
    if tuple(names) != CHOICES:
        raise RuntimeError(f"the selector model's paths {names} do not match the library's {list(CHOICES)}")


def _int64_pointer(array: np.ndarray):
    return array.ctypes.data_as(_I64P)


def _checked(handle, what: str):
    if not handle:
        raise ValueError(f"{what}: {library().tcs_last_error().decode()}")
    return handle


class MatrixFeatures:
    """One matrix's features in C++: sizes, the per-window prefix sums of its ME-TCF layout
    (chunks, TC blocks and non-empty windows before each window, int64, kept by reference), the
    order's ``rows_share_ratio`` and its grouped layout's size (``grouped_blocks`` None: the path
    cannot pay). With them, what does not depend on N: the rows path's pieces for X of 4 bytes and
    of 2 (``piece_nnz``), and the paths the matrix may take where the kernels run, as the model's
    candidate bits (``candidates[deterministic]``)."""

    def __init__(self, window: int, num_windows: int, rows: int, cols: int, nnz: int, max_row_nnz: int, prefixes,
                 rows_share_ratio: float = 1.0, grouped_blocks: int | None = None, grouped_rest_nnz: int = 0,
                 grouped_one_chunk: bool = False):
        for name, value in (("num_windows", num_windows), ("rows", rows), ("cols", cols), ("nnz", nnz),
                            ("max_row_nnz", max_row_nnz)):
            if not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if window not in (8, 16):
            raise ValueError(f"window must be 8 or 16, got {window!r}")
        arrays = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in prefixes)
        if len(arrays) != 3 or any(a.shape != (num_windows + 1,) for a in arrays):
            raise ValueError(f"prefixes must be three arrays of num_windows + 1 = {num_windows + 1} entries")
        self.window, self.num_windows, self.rows, self.num_cols = int(window), int(num_windows), int(rows), int(cols)
        self.nnz, self.max_row_nnz = int(nnz), int(max_row_nnz)
        self.rows_share_ratio = float(rows_share_ratio)
        self.grouped_blocks = None if grouped_blocks is None else int(grouped_blocks)
        self.grouped_rest_nnz, self.grouped_one_chunk = int(grouped_rest_nnz), bool(grouped_one_chunk)
        self.prefixes = arrays
        self.piece_nnz = (csr_rows.split_piece_nnz(self.nnz, self.max_row_nnz, torch.float32),
                          csr_rows.split_piece_nnz(self.nnz, self.max_row_nnz, torch.float16))
        grouped = self.grouped_blocks is not None
        self.candidates = (candidate_bits(matrix_paths(self.rows, self.num_cols, self.nnz, grouped, False)),
                           candidate_bits(matrix_paths(self.rows, self.num_cols, self.nnz, grouped, True)))
        lib = library()
        self.handle = _checked(lib.tcs_matrix_new(
            self.window, self.num_windows, self.rows, self.num_cols, self.nnz, self.max_row_nnz,
            *(_int64_pointer(a) for a in arrays), self.rows_share_ratio,
            -1 if grouped_blocks is None else self.grouped_blocks, self.grouped_rest_nnz, int(self.grouped_one_chunk),
            BALANCE_CHUNK, _PIECES(*self.piece_nnz)), "matrix features")
        weakref.finalize(self, lib.tcs_matrix_free, self.handle)
        summary = (ctypes.c_int64 * 7)()
        lib.tcs_matrix_summary(self.handle, summary)
        self.summary = dict(zip(("tc_blocks", "max_blocks", "max_single_chunk_blocks", "empty_windows", "chunks",
                                 "split_windows", "chunks_of_split_windows"), summary))

    @classmethod
    def of_window_blocks(cls, window: int, window_blocks, rows: int, nnz: int, max_row_nnz: int,
                         cols: int | None = None, **features) -> "MatrixFeatures":
        """From TC blocks per window (``features``: ``rows_share_ratio`` and the grouped layout's
        size); ``cols`` None: as many as rows."""
        blocks = np.ascontiguousarray(window_blocks, dtype=np.int64)
        if blocks.ndim != 1 or (blocks < 0).any():
            raise ValueError(f"window_blocks must be a 1-D array of non-negative counts, got {window_blocks!r}")
        prefixes = tuple(np.empty(blocks.size + 1, dtype=np.int64) for _ in range(3))
        library().tcs_prefixes(_int64_pointer(blocks), blocks.size, BALANCE_CHUNK, *map(_int64_pointer, prefixes))
        return cls(window, blocks.size, rows, rows if cols is None else cols, nnz, max_row_nnz, prefixes, **features)

    @classmethod
    def of_layout(cls, layout, **features) -> "MatrixFeatures":
        """From an ME-TCF layout's host copies (the conversion's); a layout without them (rebuilt
        from its tensors) is read back from the device once."""
        counts = layout.host_counts
        if counts is not None:
            return cls(layout.window, layout.num_windows, layout.num_rows, layout.num_cols, layout.nnz,
                       counts.max_row_nnz, counts.prefixes, **features)
        offsets, rowptr = layout.window_offsets, layout.csr_rowptr
        longest = int((rowptr[1:] - rowptr[:-1]).max()) if layout.num_rows else 0
        blocks = (offsets[1:] - offsets[:-1]).cpu().numpy()
        return cls.of_window_blocks(layout.window, blocks, layout.num_rows, layout.nnz, longest, layout.num_cols,
                                    **features)

    @property
    def window_blocks(self) -> np.ndarray:
        return np.diff(self.prefixes[1])

    @property
    def tc_blocks(self) -> int:
        return self.summary["tc_blocks"]

    def replace(self, **changes) -> "MatrixFeatures":
        """The same matrix with some sizes or features changed (the prefix sums shared)."""
        fields = {"window": self.window, "num_windows": self.num_windows, "rows": self.rows, "cols": self.num_cols,
                  "nnz": self.nnz, "max_row_nnz": self.max_row_nnz, "prefixes": self.prefixes,
                  "rows_share_ratio": self.rows_share_ratio, "grouped_blocks": self.grouped_blocks,
                  "grouped_rest_nnz": self.grouped_rest_nnz, "grouped_one_chunk": self.grouped_one_chunk}
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"unknown features {sorted(unknown)}")
        return MatrixFeatures(**{**fields, **changes})

    def base_launch(self, slices: int, slots: int, block_units: float) -> tuple[float, float]:
        """(makespan, work) of the base kernel in TC-block units, list-scheduled on ``slots``."""
        out = (ctypes.c_double * 2)()
        library().tcs_base_launch(self.handle, slices, slots, block_units, out)
        return out[0], out[1]

    def balanced_launch(self, slices: int, slots: int, segment_units: float, split_units: float):
        """(makespan, work, zeroed windows) of the balanced kernel's grid in TC-block units."""
        out = (ctypes.c_double * 3)()
        library().tcs_balanced_launch(self.handle, slices, slots, segment_units, split_units, out)
        return out[0], out[1], int(out[2])


class Prices:
    """A calibration's constants for one N bucket and dtype on one device, in C++. ``constants``:
    path -> name -> value (``Calibration.constants``); ``rule``: ``by_cost``, ``ar_threshold``,
    ``csr_margin_base``, ``csr_margin_balanced``, ``rows_margin``."""

    def __init__(self, constants: dict, rule: dict, sm_count: int, l2_bytes: int, rest_piece_nnz: int):
        names, values = [], []
        for group, table in constants.items():
            for name, value in table.items():
                names.append(f"{group}.{name}".encode())
                values.append(float(value))
        for name in ("ar_threshold", "csr_margin_base", "csr_margin_balanced", "rows_margin"):
            names.append(f"rule.{name}".encode())
            values.append(float(rule[name]))
        lib = library()
        self.handle = _checked(lib.tcs_prices_new(
            len(names), (ctypes.c_char_p * len(names))(*names), (ctypes.c_double * len(values))(*values),
            int(bool(rule["by_cost"])), int(sm_count), int(l2_bytes), BALANCE_CHUNK, int(rest_piece_nnz)),
            "calibration")
        weakref.finalize(self, lib.tcs_prices_free, self.handle)


def choose(features: MatrixFeatures, query: Query, candidates: int) -> str:
    """The path among ``candidates`` (``candidate_bits``) for ``query``, the kernels priced only
    where the choice depends on them."""
    return CHOICES[library().tcs_choose(features.handle, query.address, candidates, None)]


def choose_with_costs(features: MatrixFeatures, query: Query, candidates: int) -> tuple[str, dict]:
    """(path, predicted us of every path priced)."""
    costs = (ctypes.c_double * len(CHOICES))()
    code = library().tcs_choose(features.handle, query.address, candidates, ctypes.addressof(costs))
    return CHOICES[code], {path: cost for path, cost in zip(CHOICES, costs) if not math.isnan(cost)}


def explain(features: MatrixFeatures, query: Query, candidates: int) -> RawExplanation:
    out = RawExplanation()
    library().tcs_explain(features.handle, query.address, candidates, ctypes.byref(out))
    return out


def grouped_split(features: MatrixFeatures, prices: Prices, n: int, value_bytes: int, splits) -> int:
    """The index of the (blocks, rest nonzeros) split of ``splits`` with the least predicted time."""
    blocks = np.ascontiguousarray([b for b, _ in splits], dtype=np.int64)
    rests = np.ascontiguousarray([r for _, r in splits], dtype=np.int64)
    return library().tcs_grouped_split(features.handle, prices.handle, n, value_bytes, len(splits),
                                       _int64_pointer(blocks), _int64_pointer(rests))


def default_column_slices(n: int, value_bytes: int) -> int:
    """Warps per window along N without a CUDA device to ask (the dispatch rule of the kernels)."""
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    return int(library().tcs_default_column_slices(n, value_bytes))


def rows_per_warp(n: int, value_bytes: int) -> int:
    """Rows the rows kernel packs into one warp at N columns of ``value_bytes`` elements: what its
    per-row price is divided by (one warp's price)."""
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    return int(library().tcs_rows_per_warp(n, value_bytes))


def rows_in_order(miss: float, rows_share_ratio: float, value_bytes: int) -> float:
    """The factor the model scales the rows kernel's time by in a row order whose neighbouring
    rows share columns (``rows_order_gain`` of ``selector_model.h``): what a fit of its prices
    divides out."""
    return 1.0 - float(library().tcs_rows_order_gain(value_bytes)) * miss * (1.0 - rows_share_ratio)
