"""The Tensor-Core layout of a matrix built for a few products (``TCSparseTensor.from_batch``):
held in its place until a product needs it, and the path such a matrix takes before then.

A sampled mini-batch is multiplied two or three times (forward, backward) and then dropped, so
the ME-TCF conversion, which costs several SpMMs, would never pay for itself. Such a matrix runs
the CSR "rows" kernel, whose operands are its CSR, and builds the layout only when a product asks
for it: a path the caller names, a gradient of its values (the SDDMM runs in block order), or the
selector once the matrix has run ``BUILD_AFTER_USES`` products, the conversion's price in
products (a matrix that stays is then converted for good, at most doubling what it paid).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from ..formats.csr import CSR
from ..formats.metcf import MetcfLayout, build_layout
from .choice import kernels_usable
from .paths import matrix_paths

# The conversion's price in SpMMs at N = 128: 2 to 16 on the suite's large graphs, about 10 on
# those the Tensor-Core paths win (BENCHMARKS.md, SpMM tables' conversion column).
BUILD_AFTER_USES = 10


class PendingLayout:
    """Stands for the ``MetcfLayout`` of ``csr`` (its values unused) until read: any attribute it
    does not define builds the layout (once) and reads it there, so code holding it where a layout
    is expected works unchanged. Until then its block order is the CSR order: ``csr_gather`` is the
    identity and ``transpose_gather`` (set by a CSR-only transpose) the transpose's link in that
    order. ``on_build`` is called with the layout when it is built."""

    __slots__ = ("_csr", "_window", "_on_build", "_built", "_link", "_partner", "uses", "__weakref__")

    def __init__(self, csr: CSR, window: int, on_build: Callable[[MetcfLayout], None] | None = None):
        self._csr, self._window, self._on_build = csr, window, on_build
        self._built: MetcfLayout | None = None
        self._link: torch.Tensor | None = None
        self._partner = None
        self.uses = 0

    @property
    def is_built(self) -> bool:
        return self._built is not None

    def build(self) -> MetcfLayout:
        """The layout, built on the first call."""
        if self._built is None:
            self._built = build_layout(self._csr, self._window)
            on_build, self._on_build = self._on_build, None
            if on_build is not None:
                on_build(self._built)
        return self._built

    def __getattr__(self, name):
        if name.startswith("_"):
            # Private and special names are not the layout's fields: copy and pickle probe
            # them on an instance whose slots are not set yet.
            raise AttributeError(name)
        return getattr(self.build(), name)

    @property
    def nnz(self) -> int:
        return self._csr.nnz

    @property
    def num_rows(self) -> int:
        return self._csr.num_rows

    @property
    def num_cols(self) -> int:
        return self._csr.num_cols

    @property
    def window(self) -> int:
        return self._window

    @property
    def device(self) -> torch.device:
        return self._csr.col.device

    @property
    def csr_gather(self) -> torch.Tensor:
        if self._built is not None:
            return self._built.csr_gather
        return torch.arange(self.nnz, dtype=torch.int32, device=self.device)

    @property
    def transpose_gather(self) -> torch.Tensor:
        """For each nonzero in our (CSR) order, its position in the transpose's block order: the
        transpose's CSR order while its layout is pending, else through its layout."""
        if self._built is not None:
            return self._built.transpose_gather
        partner = None if self._partner is None else self._partner()
        if self._link is None or partner is None:
            raise ValueError("this pending layout has no transpose linked")
        if partner.is_built:
            return partner.csr_gather.index_select(0, self._link)
        return self._link

    @property
    def partner_positions(self) -> torch.Tensor | None:
        """Where each of our nonzeros is in the linked transpose's CSR order (None if unlinked)."""
        return self._link

    def link_transpose(self, positions: torch.Tensor, partner: "PendingLayout") -> None:
        """Link to the transpose's pending layout ``partner`` (held weakly): our nonzero k is its
        CSR entry ``positions[k]``."""
        self._link, self._partner = positions, weakref.ref(partner)

    def light_path(self, dtype: torch.dtype, device: torch.device) -> str:
        """The path of a product that does not build the layout: the rows kernel where the kernels
        run and the indices are int32, else torch.sparse."""
        rows = kernels_usable(dtype, device) and "rows" in matrix_paths(
            self.num_rows, self.num_cols, self.nnz, False, False)
        return "rows" if rows else "csr"

    def __repr__(self) -> str:
        state = "built" if self.is_built else f"pending after {self.uses} products"
        return f"PendingLayout({self.num_rows} x {self.num_cols}, nnz={self.nnz}, {state})"
