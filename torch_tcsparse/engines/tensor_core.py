"""The ``"base"`` and ``"balanced"`` paths: the ME-TCF Tensor-Core kernels of
``csrc/metcf_spmm.cuh`` (base: a warp per row window and column slice; balanced: fixed chunks of
TC blocks per warp, cut windows summed with atomics). Their indices are the matrix's ME-TCF
layout; the kernels read the values where they are, in CSR order and X's dtype (no copy: the
operands alias the matrix's values, so they never go stale whatever writes the values); products
are summed in fp32 (``kernels.py`` gives the precision)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import kernels
from ..formats.metcf import MetcfLayout
from .base import Engine


class TensorCoreOperands(NamedTuple):
    values: torch.Tensor  # CSR order, contiguous: the matrix's own values where they are so
    layout: MetcfLayout
    arguments: tuple  # the layout as the binding takes it


def block_order(values: torch.Tensor, layout: MetcfLayout) -> torch.Tensor:
    """CSR-order ``values`` in the layout's block order (``csr_gather`` names each one's place):
    differentiable, and no inverse permutation kept (it would be an index per nonzero)."""
    return placed(values, layout.csr_gather)


def placed(values: torch.Tensor, gather: torch.Tensor) -> torch.Tensor:
    """``values`` with entry i moved to place ``gather[i]`` (a permutation), differentiable."""
    if values.device.type == "cpu":
        # index_put copies the int32 index to int64 (8 bytes per nonzero) on the CPU; adding
        # into -0.0 reads it as it is and is exact (-0.0 + v is v, signed zeros included).
        # On a GPU index_add is an atomic add, where index_put is a plain store.
        return values.new_full(values.shape, -0.0).index_add(0, gather, values)
    return values.new_empty(values.shape).index_put((gather,), values)


def kernel_arrays(layout: MetcfLayout) -> list[torch.Tensor]:
    """The layout's arrays a product or SDDMM on it reads (``MetcfLayout.KERNEL_FIELDS``): what a
    compiled function takes in of a layout it multiplies."""
    return [getattr(layout, name) for name in MetcfLayout.KERNEL_FIELDS]


class TensorCoreEngine(Engine):
    operand_key = "tensor_core"

    def __init__(self, name: str, balanced: bool):
        self.name, self.balanced = name, balanced

    def kept_indices(self, structure, key, dtype):
        return structure.layout  # read as it is now: the transpose's link is set on it later

    def operands(self, layout, values):
        return TensorCoreOperands(values.contiguous(), layout, kernels.layout_arguments(layout))

    def reads_in_place(self, operands, values):
        # The operands hold the values themselves unless they had to be made contiguous.
        return operands.values.data_ptr() == values.data_ptr() and operands.values.stride() == values.stride()

    def run(self, x, operands, bias):
        o = operands
        if o.values.numel() == 0 or x.shape[1] == 0:
            y = x.new_zeros(o.layout.num_rows, x.shape[1])
        else:
            # Values of another dtype than X (a product under autocast) are cast for this product.
            values = o.values if o.values.dtype == x.dtype else o.values.to(x.dtype)
            y = kernels.metcf_spmm(x, values, o.arguments, self.balanced)
        return y if bias is None else y + bias

    def flat(self, layout):
        return kernel_arrays(layout), [layout.window, layout.num_rows, layout.num_cols]

    def unflat(self, tensors, ints):
        return MetcfLayout.from_fields(dict(zip(MetcfLayout.KERNEL_FIELDS, tensors)), *ints)


BASE = TensorCoreEngine("base", balanced=False)
BALANCED = TensorCoreEngine("balanced", balanced=True)
