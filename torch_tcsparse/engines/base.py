"""What every engine provides."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..formats.metcf import MetcfLayout
    from ..structure import Structure


class Engine:
    """One path of ``A @ X``. ``operand_key`` names the operands it reads: engines that read the
    same ones (base and balanced) share a key, so a matrix builds them once."""

    name: str
    operand_key: str

    def prepare(self, structure: "Structure", values: torch.Tensor):
        """The operands of the matrix (``structure``, CSR-order ``values`` in X's dtype), built
        once and kept by the matrix while its values do not change."""
        raise NotImplementedError

    def from_layout(self, layout: "MetcfLayout", block_values: torch.Tensor, row_pieces: list[torch.Tensor]):
        """The operands from the ME-TCF arrays and block-order values that ``tcsparse::spmm``
        carries (``row_pieces``: see ``ops.spmm``)."""
        raise NotImplementedError

    def run(self, x: torch.Tensor, operands, bias: torch.Tensor | None) -> torch.Tensor:
        """A @ x (+ bias on every row) for a 2-D x of the matrix's dtype and device."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<engine {self.name!r}>"
