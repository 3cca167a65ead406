"""BCSR: the matrix cut into a grid of dense ``block_shape`` tiles, only nonzero tiles stored.

The tile is the A operand of one ``mma.sync``: 16x8 for TF32 ``m16n8k8``, 16x16 for fp16/bf16
``m16n8k16`` (SMaT, SC'24). Unlike ME-TCF, columns are not condensed: a tile covers ``bw``
consecutive columns, so the column order (a reordering) changes the tile count.

============== ======== ========================= ======================================
name           dtype    shape                     meaning
============== ======== ========================= ======================================
block_rowptr   int32    [block_rows + 1]          first tile of each row of tiles
block_col      int32    [tiles]                   column of each tile, in tile units
values         values'  [tiles, bh, bw]           dense tiles, zeros where A has none
============== ======== ========================= ======================================
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .csr import CSR
from .metcf import row_slots

BLOCK_SHAPES = ((16, 8), (16, 16))


@dataclass(frozen=True)
class BCSR:
    block_shape: tuple[int, int]
    num_rows: int
    num_cols: int
    block_rowptr: torch.Tensor
    block_col: torch.Tensor
    values: torch.Tensor
    nnz: int

    @property
    def num_blocks(self) -> int:
        return self.block_col.numel()

    def to_dense(self, row_perm: torch.Tensor | None = None) -> torch.Tensor:
        """The matrix in original row order (``row_perm`` as given to ``build_bcsr``)."""
        bh, bw = self.block_shape
        block_rows = self.block_rowptr.numel() - 1
        padded = torch.zeros(block_rows * bh, -(-self.num_cols // bw) * bw, dtype=self.values.dtype, device=self.values.device)
        counts = (self.block_rowptr[1:] - self.block_rowptr[:-1]).long()
        tile_row = torch.arange(block_rows, device=counts.device).repeat_interleave(counts, output_size=self.num_blocks)
        view = padded.view(block_rows, bh, -1, bw).permute(0, 2, 1, 3)
        view[tile_row, self.block_col.long()] = self.values
        slots = padded[: self.num_rows, : self.num_cols]
        if row_perm is None:
            return slots.clone()
        dense = torch.empty_like(slots)
        dense[row_perm.long()] = slots
        return dense

    def stats(self) -> dict:
        bh, bw = self.block_shape
        blocks = self.num_blocks
        value_bytes = self.values.element_size()
        bcsr_bytes = self.block_rowptr.numel() * 4 + blocks * 4 + self.values.numel() * value_bytes
        csr_bytes = (self.num_rows + 1) * 4 + self.nnz * (4 + value_bytes)
        return {
            "block_shape": self.block_shape,
            "tc_blocks": blocks,
            "mean_nnz_per_block": self.nnz / blocks if blocks else 0.0,
            "fill": self.nnz / (blocks * bh * bw) if blocks else 0.0,
            "bytes": bcsr_bytes,
            "csr_bytes": csr_bytes,
            "bytes_vs_csr": bcsr_bytes / csr_bytes,
        }


def build_bcsr(csr: CSR, block_shape=(16, 8), row_perm: torch.Tensor | None = None) -> BCSR:
    """BCSR of ``csr`` with rows placed in the order ``row_perm`` (``row_perm[i]`` = original row
    at position i), vectorized on the CSR's device."""
    block_shape = tuple(block_shape)
    if block_shape not in BLOCK_SHAPES:
        raise ValueError(f"block_shape must be one of {BLOCK_SHAPES}, got {block_shape}")
    bh, bw = block_shape
    device = csr.col.device
    block_rows, block_cols = -(-csr.num_rows // bh), max(1, -(-csr.num_cols // bw))
    slot = row_slots(csr.num_rows, row_perm, device)[csr.row_indices()]
    col = csr.col.long()
    tile_key, tile_of_nnz = torch.unique((slot // bh) * block_cols + col // bw, return_inverse=True)
    values = torch.zeros(tile_key.numel(), bh, bw, dtype=csr.values.dtype, device=device)
    values[tile_of_nnz, slot % bh, col % bw] = csr.values
    counts = torch.bincount(tile_key // block_cols, minlength=block_rows)
    block_rowptr = torch.zeros(block_rows + 1, dtype=torch.long, device=device)
    torch.cumsum(counts, 0, out=block_rowptr[1:])
    return BCSR(
        block_shape,
        csr.num_rows,
        csr.num_cols,
        block_rowptr.to(torch.int32),
        (tile_key % block_cols).to(torch.int32),
        values,
        csr.nnz,
    )
