"""The value-independent part of a TCSparseTensor: CSR indices, permutation, ME-TCF layout, the
transpose built on first need, and what engines derive from the indices (``kept``). Tensors that
differ only in values (``with_values``) share one ``Structure``, so conversion and transposition
are paid once."""
from __future__ import annotations

import weakref

import torch

from .engines.grouped import grouped_layout
from .engines.tensor_core import block_order
from .formats import native
from .formats.arrays import INT32_MAX
from .formats.csr import CSR, transpose_pattern
from .formats.grouped import may_pay
from .formats.metcf import MetcfLayout, build_layout
from .reorder.locality import share_ratio
from .selector import SelectionCache

# The conversion's price in SpMMs at N = 128: 2 to 16 on the suite's large graphs, about 10 on
# those the Tensor-Core paths win (BENCHMARKS.md, SpMM tables' conversion column). A matrix
# built for a few products (``CsrStructure``) builds its Tensor-Core layout after that many.
BUILD_AFTER_USES = 10


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


class _GroupedSize:
    """``grouped_size`` of the structures that share one selection cache, read through weak
    references: a structure holds its cache, and a bound method held there would hold the
    structure back (a reference cycle, which keeps the index arrays until the cycle collector
    runs). Any structure of the group that is still alive answers (they share the layout)."""

    def __init__(self, structure: "Structure"):
        self.structures = [weakref.ref(structure)]

    def add(self, structure: "Structure") -> None:
        self.structures.append(weakref.ref(structure))

    def __call__(self):
        for ref in self.structures:
            structure = ref()
            if structure is not None:
                return structure.grouped_size()
        return None


class Structure:
    """Indices of a sparse matrix in canonical CSR and ME-TCF. ``layout.csr_gather`` links the
    two orders of the values: CSR-order values are ``block_values[csr_gather]``."""

    layout_pending = False  # the layout is built with the structure (see CsrStructure)
    # Backward passes whose dX went through this matrix (``product.scatters_transpose``: the first
    # scatters, later ones build the transpose); a copy on another device counts its own.
    backward_passes = 0

    def __init__(self, csr: CSR, window: int, row_perm: torch.Tensor | None, col_perm: torch.Tensor | None, method: str,
                 rows_share_ratio: float | None = None):
        self.num_rows, self.num_cols = csr.num_rows, csr.num_cols
        self.rowptr, self.col = csr.rowptr, csr.col
        self.window = window
        self.row_perm, self.col_perm = row_perm, col_perm
        self.method = method
        self.layout = build_layout(csr, window, row_perm)
        # What is built from the indices on first need (the transpose, each engine's index arrays):
        # kept here, and built anew for a copy on another device.
        self._derived: dict = {}
        if rows_share_ratio is None:  # not given by the caller ("auto" predicts with it)
            rows_share_ratio = 1.0 if row_perm is None else share_ratio(csr.rowptr, csr.col, csr.num_cols, row_perm)
        self.selection = SelectionCache(rows_share_ratio, _GroupedSize(self))

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

    def kept(self, key, build):
        """The item ``key`` derived from the indices (an engine's index arrays, a row scale, ...),
        built by ``build()`` on first need and kept."""
        item = self._derived.get(key)
        if item is None:
            item = self._derived[key] = build()
        return item

    def to_block_order(self, csr_values: torch.Tensor) -> torch.Tensor:
        """CSR-order values in the layout's block order (the order ``transpose_gather`` links)."""
        return block_order(csr_values, self.layout)

    def transpose_values(self, csr_values: torch.Tensor) -> torch.Tensor:
        """Our CSR-order values in the transpose's CSR order (differentiable), through the block
        orders: the links the layouts keep anyway, so no CSR-to-CSR order is stored."""
        layout_t = self.transposed().layout
        block_values_t = self.to_block_order(csr_values).index_select(0, layout_t.transpose_gather)
        return block_values_t.index_select(0, layout_t.csr_gather)

    def linked_transpose(self) -> "Structure | None":
        """The transpose linked to this structure, or None (never built, or dropped by its users)."""
        link = self._derived.get("transpose")
        return link() if isinstance(link, weakref.ref) else link

    def link_transpose(self, t: "Structure") -> None:
        """Links ``t`` as our transpose: we hold it and it refers back to us weakly. A matrix and its
        transpose then form no reference cycle, so their index arrays (gigabytes on a large graph)
        are freed when their last user drops them, not at the cycle collector's next pass."""
        self._derived["transpose"] = t
        t._derived["transpose"] = weakref.ref(self)

    def max_row_nnz(self) -> int:
        """Nonzeros of the longest row, from the conversion's host copies (read back once for a
        layout without them)."""
        return self.kept("max_row_nnz", self._longest_row)

    def known_max_row_nnz(self) -> int | None:
        """``max_row_nnz`` where it is known without reading the device, else None."""
        known = self._derived.get("max_row_nnz")
        if known is None and not self.layout_pending and self.layout.host_counts is not None:
            return self.max_row_nnz()
        return known

    def _longest_row(self) -> int:
        counts = self.layout.host_counts
        if counts is not None:
            return counts.max_row_nnz
        return int((self.rowptr[1:] - self.rowptr[:-1]).max()) if self.num_rows else 0

    def grouped_size(self) -> tuple[int, int, bool] | None:
        """(blocks of the grouped layout, nonzeros it leaves to the rows kernel, whether every
        group is one chunk) for the selector, or None where the path cannot pay
        (``formats.grouped.may_pay``: the windows of a group share few columns) or the indices
        need int64. Builds the layout where it may pay (milliseconds, once per matrix)."""
        if not may_pay(self.nnz, self.layout.num_blocks) or self.col.dtype != torch.int32:
            return None
        layout = grouped_layout(self)
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
        linked = self.linked_transpose()
        if linked is not None:
            return linked, None
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
        self.link_transpose(t)
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
        shared.layout = self.layout
        shared._derived = {key: item for key, item in self._derived.items() if key != "transpose"}
        if isinstance(self.selection._grouped_size, _GroupedSize):
            self.selection._grouped_size.add(shared)
        return shared

    def to(self, device) -> "Structure":
        """A copy on ``device``; a transpose already built moves along, still linked."""
        moved = self._moved(device)
        t = self.linked_transpose()
        if t is not None:
            # Shared index arrays stay shared (the moved layout carries the moved gather).
            moved_t = moved._sharing_indices() if t.layout.block_cols is self.layout.block_cols else t._moved(device)
            moved.link_transpose(moved_t)
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
        moved.backward_passes = 0
        # Its own choices: its features come from the moved layout, and its grouped layout is
        # built on its device.
        moved.selection = SelectionCache(self.selection.rows_share_ratio, _GroupedSize(moved))
        return moved

    def stats(self, value_bytes: int = 4) -> dict:
        return {**self.layout.stats(value_bytes), "reorder": self.method}


class CsrStructure(Structure):
    """A structure that holds the CSR alone until a product needs the Tensor-Core layout: what
    ``TCSparseTensor.from_batch`` builds for a matrix multiplied a few times (a sampled mini-batch
    or one of its blocks, multiplied two or three times and dropped), for which the conversion
    (several SpMMs' time) would never pay. Its products run the CSR "rows" kernel (or
    torch.sparse) while ``layout_pending``; ``product.choose_path`` counts them in ``uses`` and
    builds the layout once the matrix has run ``BUILD_AFTER_USES`` products, the conversion's
    price (a matrix that stays is then converted for good, at most doubling what it paid). Reading
    ``layout`` builds it, as a path named by the caller or a gradient of the values does.

    Its transpose is a CSR-only structure too (one sort of the column ids), the two linked through
    their CSR orders (``transposed_with_order``: one gather of the values); building either
    layout unlinks the pair, and the next transpose is built as any matrix's."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, num_rows: int, num_cols: int, window: int,
                 max_row_nnz: int | None = None):
        self.num_rows, self.num_cols = num_rows, num_cols
        self.rowptr, self.col = rowptr, col
        self.window = window
        self.row_perm = self.col_perm = None
        self.method = "none"
        # ``max_row_nnz``: the longest row where the conversion read it (else read on first need).
        self._derived: dict = {} if max_row_nnz is None else {"max_row_nnz": max_row_nnz}
        self._layout: MetcfLayout | None = None
        # While linked to a CSR-only transpose: entry p of its CSR is our CSR entry order[p].
        self._transpose_order: torch.Tensor | None = None
        self.uses = 0
        self.selection = SelectionCache(1.0, _GroupedSize(self))

    @property
    def layout_pending(self) -> bool:
        return self._layout is None

    @property
    def layout(self) -> MetcfLayout:
        """The Tensor-Core layout, built on the first read."""
        if self._layout is None:
            index_only = CSR(self.rowptr, self.col, self.col.new_empty(0), self.num_rows, self.num_cols)
            self._layout = build_layout(index_only, self.window)
            self._unlink()
        return self._layout

    @layout.setter
    def layout(self, layout: MetcfLayout) -> None:
        self._layout = layout

    def _unlink(self) -> None:
        transpose = self.linked_transpose()
        self._derived.pop("transpose", None)
        if isinstance(transpose, CsrStructure) and transpose.layout_pending:
            transpose._derived.pop("transpose", None)
            transpose._transpose_order = None
        self._transpose_order = None

    def prepare_selection(self) -> None:
        """Nothing while the layout is pending: the selector's features are read from it."""
        if self._layout is not None:
            super().prepare_selection()

    def _longest_row(self) -> int:
        if self._layout is not None:
            return super()._longest_row()
        return int((self.rowptr[1:] - self.rowptr[:-1]).max()) if self.num_rows else 0

    def transpose_values(self, csr_values: torch.Tensor) -> torch.Tensor:
        if self._layout is not None:
            return super().transpose_values(csr_values)
        return csr_values.index_select(0, self.transposed_with_order()[1])

    def transposed_with_order(self) -> tuple["Structure", torch.Tensor | None]:
        """While the layout is pending, the CSR-only transpose and, at every call, the order that
        links the two CSRs (entry p of the transpose's is our entry ``order[p]``)."""
        if self._layout is not None:
            return super().transposed_with_order()
        t = self.transposed()
        return t, self._transpose_order

    def transposed(self) -> "Structure":
        if self._layout is not None:
            return super().transposed()
        t = self.linked_transpose()
        if t is None:
            rowptr_t, col_t, order = transpose_pattern(self.csr(None))
            t = CsrStructure(rowptr_t, col_t, self.num_cols, self.num_rows, self.window)
            # The way back is the inverse permutation. index_add_ onto zeros takes the int32
            # positions as they are (a permutation: the sum is the assignment).
            positions = torch.arange(order.numel(), dtype=order.dtype, device=order.device)
            t._transpose_order = torch.zeros_like(order).index_add_(0, order, positions)
            self._transpose_order = order
            self.link_transpose(t)
        return t

    def to(self, device) -> "CsrStructure":
        """A copy on ``device``, CSR only where the layout is still pending."""
        if self._layout is not None:
            return super().to(device)
        return CsrStructure(self.rowptr.to(device), self.col.to(device), self.num_rows, self.num_cols, self.window,
                            self._derived.get("max_row_nnz"))

    def _moved(self, device) -> "Structure":
        if self._layout is not None:
            return super()._moved(device)
        return self.to(device)
