"""The value-independent part of a TCSparseTensor: CSR indices, permutation, ME-TCF layout, and
the transpose built on first need. Tensors that differ only in values (``with_values``) share one
``Structure``, so conversion and transposition are paid once."""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from . import csr_rows
from .formats import native
from .formats.arrays import INT32_MAX
from .formats.csr import CSR, transpose_pattern
from .formats import grouped as grouped_format
from .formats.grouped import GroupedLayout, build_grouped, group_pairs, may_pay, split_sizes
from .formats.metcf import build_layout
from .reorder.locality import share_ratio
from .selector import MatrixFeatures, SelectionCache, device_model, grouped_split
from .selector.pending import PendingLayout


def _transpose_in_blocks(csr: CSR, csr_gather: torch.Tensor):
    """rowptr and col of the transpose's CSR, and for each of its nonzeros the position of that
    entry in ``csr`` (int32 where the nonzeros' count fits) and its place in our block order
    (``csr_gather`` read in that order)."""
    lib = native.usable(csr.col, csr.rowptr, csr_gather)
    order_dtype = torch.int32 if csr.nnz <= INT32_MAX else torch.int64
    if lib is not None:
        return native.csr_transpose(lib, csr.rowptr, csr.col, csr.num_rows, csr.num_cols, order_dtype,
                                    carried=csr_gather)
    rowptr_t, col_t, order = transpose_pattern(csr)
    # index_select takes the int32 order as it is (indexing with it would copy it to int64 first).
    return rowptr_t, col_t, order, csr_gather.index_select(0, order)


def _linked_gathers(ours: torch.Tensor, theirs: torch.Tensor, both: bool):
    """``ours`` and ``theirs``: the places in our block order and in the transpose's of each of
    the transpose's CSR entries. Returns ``gather[ours[p]] = theirs[p]`` (our layout's
    ``transpose_gather``) and, where ``both``, its inverse (the transpose's; else None)."""
    lib = native.usable(ours, theirs)
    if lib is not None:
        return native.link_gathers(lib, ours, theirs, both)
    # index_add_ takes the int32 indices as they are (assignment would copy them to int64); the
    # indices are permutations, so adding onto zeros is the assignment.
    gather = torch.zeros_like(theirs).index_add_(0, ours, theirs)
    gather_t = torch.zeros_like(ours).index_add_(0, theirs, ours) if both else None
    return gather, gather_t


class RowsCsr(NamedTuple):
    """The CSR of the "rows" kernel: its rows in the order the warps take them, original column
    ids; ``gather`` (canonical nonzero of each entry) and ``row_map`` (Y row of each row) are
    None when that is the canonical order."""

    rowptr: torch.Tensor
    col: torch.Tensor
    gather: torch.Tensor | None
    row_map: torch.Tensor | None


class Structure:
    """Indices of a sparse matrix in canonical CSR and ME-TCF. ``layout.csr_gather`` links the
    two orders of the values: CSR-order values are ``block_values[csr_gather]``."""

    def __init__(self, csr: CSR, window: int, row_perm: torch.Tensor | None, col_perm: torch.Tensor | None, method: str,
                 rows_share_ratio: float | None = None):
        self.num_rows, self.num_cols = csr.num_rows, csr.num_cols
        self.rowptr, self.col = csr.rowptr, csr.col
        self.window = window
        self.row_perm, self.col_perm = row_perm, col_perm
        self.method = method
        self.layout = build_layout(csr, window, row_perm)
        # What is built from the indices on first need (the transpose, the rows kernel's CSR and
        # splits, the grouped layout): kept here, and built anew for a copy on another device.
        self._derived: dict = {}
        if rows_share_ratio is None:  # not given by the caller ("auto" predicts with it)
            rows_share_ratio = 1.0 if row_perm is None else share_ratio(csr.rowptr, csr.col, csr.num_cols, row_perm)
        self.selection = SelectionCache(rows_share_ratio, self.grouped_size)

    def prepare_selection(self) -> None:
        """On a GPU, the selector's features now, with the user's conversion or move (milliseconds):
        they cost a small graph one or two of its SpMMs, which its first product would otherwise pay
        on top of the choice. On the CPU they wait for a product (or ``explain``); so do a
        transpose's, which a backward pass runs on the forward's path without a choice."""
        if self.device.type == "cuda":
            self.selection.prepare(self.layout)

    @property
    def nnz(self) -> int:
        return self.col.numel()

    @property
    def device(self) -> torch.device:
        return self.col.device

    def _kept(self, key, build):
        """The derived item ``key``, built by ``build()`` on first need."""
        item = self._derived.get(key)
        if item is None:
            item = self._derived[key] = build()
        return item

    def to_block_order(self, csr_values: torch.Tensor) -> torch.Tensor:
        """CSR-order values in block order (the kernels'), scattered through ``csr_gather``:
        differentiable, and no inverse permutation kept (it would be an index per nonzero)."""
        gather = self.layout.csr_gather
        if csr_values.device.type == "cpu":
            # index_put copies the int32 index to int64 (8 bytes per nonzero) on the CPU; adding
            # into -0.0 reads it as it is and is exact (-0.0 + v is v, signed zeros included).
            # On a GPU index_add is an atomic add, where index_put is a plain store.
            return csr_values.new_full(csr_values.shape, -0.0).index_add(0, gather, csr_values)
        return csr_values.new_empty(csr_values.shape).index_put((gather,), csr_values)

    def row_pieces(self, piece_nnz: int, canonical: bool = False) -> csr_rows.RowPieces:
        """The "rows" kernel's split of the rows of ``rows_csr`` into pieces of ``piece_nnz``
        nonzeros, built on first need (a host sync) and kept. ``canonical``: of the canonical
        CSR instead (what ``tcsparse::spmm`` reads); the same for a matrix in its given order."""
        of_canonical = canonical and self.row_perm is not None

        def build() -> csr_rows.RowPieces:
            rowptr = self.rowptr if of_canonical else self.rows_csr().rowptr
            return csr_rows.row_pieces(rowptr, piece_nnz, self.max_row_nnz())

        return self._kept(("row_pieces", piece_nnz, of_canonical), build)

    def max_row_nnz(self) -> int:
        """Nonzeros of the longest row, from the conversion's host copies (read back once for a
        layout without them)."""
        return self._kept("max_row_nnz", self._longest_row)

    def _longest_row(self) -> int:
        counts = self.layout.host_counts
        if counts is not None:
            return counts.max_row_nnz
        return int((self.rowptr[1:] - self.rowptr[:-1]).max()) if self.num_rows else 0

    def rows_csr(self) -> RowsCsr:
        """The CSR the "rows" kernel reads: ours, or for a reordered matrix a copy with the rows
        in the reordering's order (built on first need and kept: a contiguous stream of indices
        in the order the warps take them, faster than reading ours through an order index)."""
        return self._kept("rows_csr", self._build_rows_csr)

    def _build_rows_csr(self) -> RowsCsr:
        if self.row_perm is None:
            return RowsCsr(self.rowptr, self.col, None, None)
        rowptr, col, gather = csr_rows.permuted_rows(self.rowptr, self.col, self.row_perm)
        return RowsCsr(rowptr, col, gather, self.layout.row_map[: self.num_rows])

    def grouped(self) -> GroupedLayout:
        """The layout of the "grouped" path, in our row order, built on first need and kept: its
        split between the Tensor-Core layout and the rows kernel's rest is the one the selector
        prices fastest (``formats.grouped.SPLIT_THRESHOLDS``)."""
        return self._kept("grouped", self._build_grouped)

    def _build_grouped(self) -> GroupedLayout:
        if self.col.dtype != torch.int32:
            raise ValueError(f"path 'grouped' needs int32 indices (under 2^31 nonzeros), got {self.col.dtype}")
        pairs = group_pairs(self.rowptr, self.col, self.num_rows, self.num_cols, self.row_perm)
        features = MatrixFeatures.of_layout(self.layout, rows_share_ratio=self.selection.rows_share_ratio)
        threshold = grouped_split(split_sizes(pairs, grouped_format.SPLIT_THRESHOLDS), features,
                                  device_model(self.device))
        return build_grouped(self.rowptr, self.col, self.num_rows, self.num_cols, self.row_perm,
                             min_pair_nnz=threshold, pairs=pairs)

    def grouped_pieces(self) -> csr_rows.RowPieces:
        """The rows kernel's split of the grouped layout's rest, built on first need and kept."""
        return self._kept("grouped_pieces", lambda: csr_rows.row_pieces(self.grouped().rest.rowptr))

    def grouped_size(self) -> tuple[int, int, bool] | None:
        """(blocks of the grouped layout, nonzeros it leaves to the rows kernel, whether every
        group is one chunk) for the selector, or None where the path cannot pay
        (``formats.grouped.may_pay``: the windows of a group share few columns) or the indices
        need int64. Builds the layout where it may pay (milliseconds, once per matrix)."""
        if not may_pay(self.nnz, self.layout.num_blocks) or self.col.dtype != torch.int32:
            return None
        layout = self.grouped()
        return layout.num_blocks, layout.rest_nnz, layout.one_chunk_per_group

    def csr(self, values: torch.Tensor) -> CSR:
        return CSR(self.rowptr, self.col, values, self.num_rows, self.num_cols)

    def transposed(self) -> "Structure":
        """The transpose's structure, its block order linked to ours through the layouts'
        ``transpose_gather`` (what the kernels' backward and ``TCSparseTensor.t`` read)."""
        return self.transposed_with_order()[0]

    def transposed_with_order(self) -> tuple["Structure", torch.Tensor | None]:
        """``transposed()``, and where this call built it, the order its build sorted by (entry p
        of the transpose's CSR is our CSR entry ``order[p]``; None where it was built before). No
        one keeps the order: it is its caller's to use once (``TCSparseTensor.t`` gathers the
        values of a new transpose with it, in one pass)."""
        if "transpose" in self._derived:
            return self._derived["transpose"], None
        rowptr_t, col_t, order, ours_in_blocks = _transpose_in_blocks(self.csr(None), self.layout.csr_gather)
        # A structure reads only the indices: the values are never written, so never paged in.
        csr_t = CSR(rowptr_t, col_t, torch.empty(self.nnz, device=self.device), self.num_cols, self.num_rows)
        del rowptr_t, col_t
        shared = self._pattern_is_symmetric(csr_t)
        if shared:
            t = self._sharing_indices()
        else:
            t = Structure(csr_t, self.window, self.col_perm, self.row_perm, self.method)
        del csr_t
        # Entry (i, j) <-> (j, i) of a symmetric pattern is an involution, and so is the gather: its
        # own inverse, one copy serves both directions.
        gather, gather_t = _linked_gathers(ours_in_blocks, t.layout.csr_gather, not shared)
        del ours_in_blocks
        if shared:
            gather_t = gather
        t.layout = t.layout.with_transpose_gather(gather_t)
        self.layout = self.layout.with_transpose_gather(gather)
        t._derived["transpose"], self._derived["transpose"] = self, t
        return t, order

    def _pattern_is_symmetric(self, csr_t: CSR) -> bool:
        """Whether the transpose has our sparsity pattern and our permutations, so that its
        layout is ours entry for entry (graph adjacencies of undirected graphs: GCN's)."""
        if self.num_rows != self.num_cols:
            return False
        if (self.row_perm is None) != (self.col_perm is None):
            return False
        if self.row_perm is not None and not torch.equal(self.row_perm, self.col_perm):
            return False
        return torch.equal(csr_t.rowptr, self.rowptr) and torch.equal(csr_t.col, self.col)

    def _sharing_indices(self) -> "Structure":
        """The transpose of a pattern-symmetric matrix: a Structure over the same index arrays
        (CSR, layout), so A^T costs no second conversion and no second copy; only
        the values' order differs, which ``transposed`` links as for any transpose."""
        shared = object.__new__(Structure)
        shared.__dict__.update(self.__dict__)  # the selection cache too: same blocks, same choices
        shared._derived = {key: item for key, item in self._derived.items() if key != "transpose"}
        return shared

    def to(self, device) -> "Structure":
        """A copy on ``device``; a transpose already built moves along, still linked."""
        moved = self._moved(device)
        t = self._derived.get("transpose")
        if t is not None:
            # Shared index arrays stay shared (the moved layout carries the moved gather).
            moved_t = moved._sharing_indices() if t.layout.block_cols is self.layout.block_cols else t._moved(device)
            moved._derived["transpose"], moved_t._derived["transpose"] = moved_t, moved
        moved.prepare_selection()
        return moved

    def _moved(self, device) -> "Structure":
        moved = object.__new__(Structure)
        moved.__dict__.update(self.__dict__)
        moved.rowptr, moved.col = self.rowptr.to(device), self.col.to(device)
        moved.layout = self.layout.to(device)
        moved.row_perm = None if self.row_perm is None else self.row_perm.to(device)
        moved.col_perm = None if self.col_perm is None else self.col_perm.to(device)
        moved._derived = {}
        # Its own choices: its features come from the moved layout, and its grouped layout is
        # built on its device.
        moved.selection = SelectionCache(self.selection.rows_share_ratio, moved.grouped_size)
        return moved

    def stats(self, value_bytes: int = 4) -> dict:
        return {**self.layout.stats(value_bytes), "reorder": self.method}


class CsrStructure(Structure):
    """A structure that holds the CSR alone until a product needs the Tensor-Core layout
    (``selector.pending``): what ``TCSparseTensor.from_batch`` builds for a matrix used a few
    times. Its transpose is a CSR-only structure too (one sort of the column ids), the two linked
    through their CSR orders (``transposed_with_order``: one gather of the values); building either layout unlinks
    the pair, and the next transpose is built as any matrix's. Values in block order
    (``to_block_order``) are the built layout's: its callers read the layout next."""

    def __init__(self, csr: CSR, window: int, max_row_nnz: int | None = None):
        self.num_rows, self.num_cols = csr.num_rows, csr.num_cols
        self.rowptr, self.col = csr.rowptr, csr.col
        self.window = window
        self.row_perm = self.col_perm = None
        self.method = "none"
        # ``max_row_nnz``: the longest row where the conversion read it (else read on first need).
        self._derived: dict = {} if max_row_nnz is None else {"max_row_nnz": max_row_nnz}
        self._layout = None
        # A weak link: the pending layout lives in products' autograd state, which must not keep
        # the structure (and its index arrays) alive.
        index_only = CSR(csr.rowptr, csr.col, csr.col.new_empty(0), csr.num_rows, csr.num_cols)
        self._pending = PendingLayout(index_only, window, _weak_call(self, "_layout_built"))
        self.selection = SelectionCache(1.0, self.grouped_size)

    @property
    def layout(self):
        return self._pending if self._layout is None else self._layout

    @layout.setter
    def layout(self, layout) -> None:
        self._layout = layout

    def _layout_built(self, layout) -> None:
        self._layout = layout
        transpose = self._derived.pop("transpose", None)
        if transpose is not None:
            transpose._derived.pop("transpose", None)

    def prepare_selection(self) -> None:
        """Nothing while the layout is pending: the selector's features are read from it."""
        if self._layout is not None:
            super().prepare_selection()

    def _longest_row(self) -> int:
        if self._layout is not None:
            return super()._longest_row()
        return int((self.rowptr[1:] - self.rowptr[:-1]).max()) if self.num_rows else 0

    def to_block_order(self, csr_values: torch.Tensor) -> torch.Tensor:
        """As any structure's: the layout built first, since callers read it after the values."""
        self._pending.build()
        return super().to_block_order(csr_values)

    def transposed_with_order(self) -> tuple["Structure", torch.Tensor | None]:
        """While the layout is pending, the CSR-only transpose and, at every call, the order that
        links the two CSRs (entry p of the transpose's is our entry ``order[p]``)."""
        if self._layout is not None:
            return super().transposed_with_order()
        t = self.transposed()
        return t, t.layout.partner_positions

    def transposed(self) -> "Structure":
        if self._layout is not None:
            return super().transposed()
        t = self._derived.get("transpose")
        if t is None:
            rowptr_t, col_t, order = transpose_pattern(self.csr(None))
            t = CsrStructure(CSR(rowptr_t, col_t, col_t.new_empty(0), self.num_cols, self.num_rows), self.window)
            # Entry p of the transpose's CSR is our entry order[p]; the way back is its inverse.
            # index_add_ onto zeros takes the int32 positions as they are (a permutation: the
            # sum is the assignment).
            positions = torch.arange(order.numel(), dtype=order.dtype, device=order.device)
            inverse = torch.zeros_like(order).index_add_(0, order, positions)
            t._pending.link_transpose(order, self._pending)
            self._pending.link_transpose(inverse, t._pending)
            t._derived["transpose"], self._derived["transpose"] = self, t
        return t

    def to(self, device) -> "CsrStructure":
        """A copy on ``device``, CSR only where the layout is still pending."""
        if self._layout is not None:
            return super().to(device)
        return CsrStructure(CSR(self.rowptr.to(device), self.col.to(device), None, self.num_rows, self.num_cols),
                            self.window, self._derived.get("max_row_nnz"))

    def _moved(self, device) -> "Structure":
        if self._layout is not None:
            return super()._moved(device)
        return self.to(device)

    def _sharing_indices(self) -> "Structure":
        shared = super()._sharing_indices()
        shared.layout = self.layout
        return shared


def _weak_call(owner, method: str):
    """``owner.<method>(*args)`` while ``owner`` is alive, without keeping it alive."""
    ref = weakref.ref(owner)

    def call(*args):
        target = ref()
        if target is not None:
            getattr(target, method)(*args)

    return call
