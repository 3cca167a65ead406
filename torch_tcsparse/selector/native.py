"""The first choice in C++ (``csrc/selector_model.cpp``): what a product pays for when it meets a
new N bucket on a GPU.

The Python model (``model.predict``) costs 50-500 us of interpreter time on a GPU's host, against
products of 13-50 us on the small graphs; issue 6 allows half of one. So on a GPU the choice is
one call into the extension: a matrix's features are handed over once (the conversion's prefix
sums, kept by reference, and the sizes), a calibration's constants once per (N bucket, dtype) and
process, and the call returns the choice (``path``: a product's first choice), or the choice
with every path's predicted time (``choose``: what a trial's shortlist reads). ``path`` passes
only (N bucket, dtype, device): the matrix's candidates and the prices stay in C++, which reads
torch's TF32 and deterministic modes itself, so that a first choice is a few lines of Python
(on an H100 host the Python around the call had cost 8-10 us of a 13 us product). The C++ model
follows the Python one step for step (tests/gpu/test_selector_native.py checks both agree); the
Python model still explains choices, runs without a GPU and is what the calibration fits."""
from __future__ import annotations

import math

import torch

from .. import _ext, csr_rows
from ..paths import KERNEL_DTYPES
from ..formats.metcf import BALANCE_CHUNK, MetcfLayout
from ..kernels import tf32_allowed
from .device import DeviceModel, device_model
from .model import (
    GROUPED_COLUMNS_PER_WARP,
    GROUPED_DIRECT_FIXED_US,
    GROUPED_FIXED_US,
    GROUPED_REFERENCE_SMS,
    GROUPED_STEP_NS,
    ROWS_ORDER_GAIN,
    runnable_paths,
)
from .paths import CALIBRATED_CHOICES, CHOICES
from .schedule import EXACT_JOBS_PER_SLOT
from .shape import MatrixShape


def available() -> bool:
    """Whether the extension (and with it the C++ model) is built and loaded."""
    return _ext.available()


class NativeMatrix:
    """One matrix's features in C++, built on its first choice on a GPU; ``rows``, ``num_cols``,
    ``nnz`` and ``grouped_blocks`` as a ``MatrixShape`` has them (``model.runnable_paths``)."""

    def __init__(self, window: int, num_windows: int, rows: int, cols: int, nnz: int, max_row_nnz: int, prefixes,
                 rows_share_ratio: float = 1.0, grouped_size=None):
        """``prefixes``: (chunks, TC blocks, non-empty windows) before each window, int64 numpy
        arrays of ``num_windows + 1`` entries, kept by reference; ``grouped_size``: (blocks,
        nonzeros left to the rows kernel, every group one chunk), or None without the layout."""
        self.rows, self.num_cols, self.nnz, self.max_row_nnz = rows, cols, nnz, max_row_nnz
        blocks, rest, one_chunk = grouped_size or (-1, 0, False)
        self.grouped_blocks = None if grouped_size is None else blocks
        eager = _ext.load()
        self.handle = eager.SelectorMatrix(window, num_windows, rows, cols, nnz, max_row_nnz, *prefixes,
                                           rows_share_ratio, blocks, rest, one_chunk, BALANCE_CHUNK)
        self._first_path, self._price_paths, self._set_candidates = (
            eager.first_path, eager.price_paths, eager.set_candidates)
        # (dtype, deterministic) -> (candidates, their bits, rows piece): per matrix and dtype, so
        # built with the features for the kernels' dtypes as results are by default.
        self._queries: dict = {}
        for dtype in KERNEL_DTYPES:
            self._query(dtype, False)

    def _query(self, dtype: torch.dtype, deterministic: bool) -> tuple:
        """The candidate paths (``model.runnable_paths``), their bits and the rows path's pieces,
        handed to the C++ matrix too."""
        query = self._queries.get((dtype, deterministic))
        if query is None:
            candidates = runnable_paths(dtype, torch.device("cuda"), self, deterministic)
            query = self._queries[dtype, deterministic] = (
                candidates, sum(1 << CHOICES.index(path) for path in candidates),
                csr_rows.split_piece_nnz(self.nnz, self.max_row_nnz, dtype))
            self._set_candidates(self.handle, dtype, deterministic, query[1], query[2])
        return query

    @classmethod
    def of_layout(cls, layout: MetcfLayout, rows_share_ratio: float, grouped_size) -> "NativeMatrix":
        """From the conversion's host copies (no ``MatrixShape``: its per-window arrays cost a
        small graph's choice several microseconds); a layout without them is read back once."""
        counts = layout.host_counts
        if counts is None:
            shape = MatrixShape.of(layout)
            prefixes, longest = shape._chunk_prefixes, shape.max_row_nnz
        else:
            prefixes, longest = counts.prefixes, counts.max_row_nnz
        return cls(layout.window, layout.num_windows, layout.num_rows, layout.num_cols, layout.nnz, longest, prefixes,
                   rows_share_ratio, grouped_size)

    @classmethod
    def of_shape(cls, shape: MatrixShape) -> "NativeMatrix":
        grouped = None if shape.grouped_blocks is None else (
            shape.grouped_blocks, shape.grouped_rest_nnz, shape.grouped_one_chunk)
        return cls(shape.window, shape.num_windows, shape.rows, shape.num_cols, shape.nnz, shape.max_row_nnz,
                   shape._chunk_prefixes, shape.rows_share_ratio, grouped)

    def path(self, n: int, dtype: torch.dtype, device: torch.device) -> str | None:
        """The path at N bucket ``n`` for X of ``dtype`` on ``device`` (``choose`` without the
        costs): what a product's first choice at that bucket asks for, in one call that reads
        torch's modes itself. None where the C++ model cannot answer alone (another device
        than the prices were registered for, a dtype without kernels): ask ``choose``."""
        code = self._first_path(self.handle, n, dtype, device)
        if code < 0 and dtype in KERNEL_DTYPES:
            self._query(dtype, torch.are_deterministic_algorithms_enabled())
            _context(n, dtype, device)
            code = self._first_path(self.handle, n, dtype, device)
        return CHOICES[code] if code >= 0 else None

    def choose(self, n: int, dtype: torch.dtype, device: torch.device, all_costs: bool = False):
        """(path, predicted us of every path as a tuple in ``CHOICES`` order, the candidate paths)
        at N bucket ``n`` for X of ``dtype`` on ``device``. NaN stands for a path not priced:
        "grouped" without its layout, and, unless ``all_costs``, the kernels where their launch
        and evenly spread work already rule them out (their schedules are then not simulated);
        the costs are None where only "csr" can run."""
        arguments, candidates = self._arguments(n, dtype, device)
        if arguments is None:
            return "csr", None, candidates
        code, costs = self._price_paths(*arguments, all_costs)
        return CHOICES[code], costs, candidates

    def _arguments(self, n: int, dtype: torch.dtype, device: torch.device):
        """(the C++ choice's arguments, or None where only "csr" can run; the candidate paths)."""
        deterministic = torch.are_deterministic_algorithms_enabled()
        candidates, bits, piece_nnz = self._queries.get((dtype, deterministic)) or self._query(dtype, deterministic)
        if candidates == ("csr",):
            return None, candidates
        context = _context(n, dtype, device)
        exact = dtype == torch.float32 and not tf32_allowed()
        return (self.handle, context[0], n, dtype, exact, piece_nnz, bits, context[1]), candidates


# (N bucket, dtype, device) -> (its prices, CUDA index): what a choice looks up once per call.
_contexts: dict = {}


def _context(n: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """The context of (``n``, ``dtype``, ``device``), built and registered with the C++ model for
    its first choices (``NativeMatrix.path``) on first need."""
    context = _contexts.get((n, dtype, device))
    if context is None:
        model = device_model(device)
        context = _contexts[n, dtype, device] = (prices(model, n, dtype), model.cuda_index)
        _ext.load().register_prices(n, dtype, model.cuda_index, context[0])
    return context


def costs_by_path(costs: tuple) -> dict:
    """The predicted times of ``NativeMatrix.choose`` by path, unpriced paths left out."""
    return {path: cost for path, cost in zip(CHOICES, costs) if not math.isnan(cost)}


def prices(model: DeviceModel, n: int, dtype: torch.dtype):
    """``model``'s constants of N bucket ``n`` and ``dtype`` in C++ (kept per process by the
    choices' ``_contexts``)."""
    calibration = model.calibration
    size = 4 if dtype.itemsize >= 4 else 2
    return _ext.load().SelectorPrices(
        {path: calibration.constants(path, n, dtype) for path in CALIBRATED_CHOICES},
        {"step_ns": GROUPED_STEP_NS[size], "fixed_us": GROUPED_FIXED_US[size],
         "direct_fixed_us": GROUPED_DIRECT_FIXED_US, "reference_sms": GROUPED_REFERENCE_SMS},
        {"by_cost": calibration.kernel_rule == "cost", "ar_threshold": calibration.ar_threshold,
         "csr_margin_base": calibration.csr_margin["base"],
         "csr_margin_balanced": calibration.csr_margin["balanced"],
         "rows_margin": calibration.rows_margin, "rows_order_gain": ROWS_ORDER_GAIN},
        {"sm_count": model.sm_count, "l2_bytes": model.l2_bytes, "chunk": BALANCE_CHUNK,
         "exact_jobs_per_slot": EXACT_JOBS_PER_SLOT, "rest_piece_nnz": csr_rows.PIECE_NNZ,
         "grouped_column_step": GROUPED_COLUMNS_PER_WARP},
    )
