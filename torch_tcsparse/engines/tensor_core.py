"""The ``"base"`` and ``"balanced"`` paths: the ME-TCF Tensor-Core kernels of
``csrc/metcf_spmm.cuh`` (base: a warp per row window and column slice; balanced: fixed chunks of
TC blocks per warp, cut windows summed with atomics). The values reach the kernels as float32
in block order; products are summed in fp32 (see ``kernels.py`` for the precision)."""
from __future__ import annotations

import torch

from .. import _ext
from ..formats.metcf import MetcfLayout
from ..kernels import layout_arguments, tf32_allowed
from .base import Engine


def launch(x: torch.Tensor, values: torch.Tensor, layout: MetcfLayout, balanced: bool) -> torch.Tensor:
    """Y = A @ x for A given by ``layout`` and its float32 block-order ``values``; the binding
    checks every argument (RuntimeError naming it)."""
    return _ext.load().spmm(
        x,
        values,
        *layout_arguments(layout),
        balanced,
        torch.are_deterministic_algorithms_enabled(),
        not tf32_allowed(),
    )


class TensorCoreEngine(Engine):
    operand_key = "tensor_core"

    def __init__(self, name: str, balanced: bool):
        self.name, self.balanced = name, balanced

    def prepare(self, structure, values):
        return structure.to_block_order(values).float(), structure.layout

    def from_layout(self, layout, block_values, row_pieces):
        return block_values.float(), layout

    def run(self, x, operands, bias):
        values, layout = operands
        if layout.nnz == 0 or x.shape[1] == 0:
            y = x.new_zeros(layout.num_rows, x.shape[1])
        else:
            y = launch(x, values, layout, self.balanced)
        return y if bias is None else y + bias


BASE = TensorCoreEngine("base", balanced=False)
BALANCED = TensorCoreEngine("balanced", balanced=True)
