"""The ``"base"`` and ``"balanced"`` paths: the ME-TCF Tensor-Core kernels of
``csrc/metcf_spmm.cuh`` (base: a warp per row window and column slice; balanced: fixed chunks of
TC blocks per warp, cut windows summed with atomics). The values reach the kernels as float32
in block order; products are summed in fp32 (see ``kernels.py`` for the precision)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _ext
from ..formats.metcf import MetcfLayout
from ..kernels import layout_arguments, tf32_allowed
from .base import Engine


def _launch(x: torch.Tensor, values: torch.Tensor, arguments: tuple, balanced: bool) -> torch.Tensor:
    """Y = A @ x for A given by the layout's binding ``arguments`` and its float32 block-order
    ``values``; the binding checks every argument (RuntimeError naming it)."""
    return _ext.load().spmm(x, values, *arguments, balanced, torch.are_deterministic_algorithms_enabled(),
                            not tf32_allowed())


class TensorCoreOperands(NamedTuple):
    values: torch.Tensor  # float32, block order
    layout: MetcfLayout
    arguments: tuple  # the layout as the binding takes it, built once


def _operands(block_values: torch.Tensor, layout: MetcfLayout) -> TensorCoreOperands:
    return TensorCoreOperands(block_values.float(), layout, tuple(layout_arguments(layout)))


class TensorCoreEngine(Engine):
    operand_key = "tensor_core"

    def __init__(self, name: str, balanced: bool):
        self.name, self.balanced = name, balanced

    def prepare(self, structure, values):
        return _operands(structure.to_block_order(values), structure.layout)

    def from_layout(self, layout, block_values, row_pieces):
        return _operands(block_values, layout)

    def run(self, x, operands, bias):
        o = operands
        if o.values.numel() == 0 or x.shape[1] == 0:
            y = x.new_zeros(o.layout.num_rows, x.shape[1])
        else:
            y = _launch(x, o.values, o.arguments, self.balanced)
        return y if bias is None else y + bias


BASE = TensorCoreEngine("base", balanced=False)
BALANCED = TensorCoreEngine("balanced", balanced=True)
