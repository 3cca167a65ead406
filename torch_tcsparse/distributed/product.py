"""``Y = A @ X`` over a row-partitioned A: each rank gets its halo rows of X, multiplies its
rows, and in the backward pass multiplies by its blocks' transposes and sends the halo rows of
the gradient back to their owners, which add them to their own.

With ``part.overlap`` each exchange runs while the product that does not need it does: forward,
the interior block multiplies the own rows while the halo rows arrive; backward, the boundary
block's transpose computes the halo gradients first, and the interior's runs while they travel.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..tensor import TCSparseTensor
from .part import GraphPart


class DistributedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, part: GraphPart) -> Tensor:
        ctx.part = part
        pending = part.gather_halo(x, part.halo_dtype)
        y, halo = _beside(pending, lambda: part.interior.matmul(x), part.overlap)
        return y.add_(part.boundary.matmul(halo))

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        part = ctx.part
        grad_out = grad_out.contiguous()
        pending = part.scatter_halo(part.boundary_t.matmul(grad_out), part.halo_dtype)
        grad_x, returned = _beside(pending, lambda: part.interior_t.matmul(grad_out), part.overlap)
        return grad_x.index_add_(0, part.send_index, returned), None


def _beside(pending, local, overlap: bool):
    """``local()`` and what the exchange ``pending`` received: ``local`` runs while the exchange
    travels where ``overlap``, else once it has arrived."""
    if overlap:
        result = local()
        return result, pending.wait()
    received = pending.wait()
    return local(), received


def spmm(part: GraphPart | TCSparseTensor, x: Tensor) -> Tensor:
    """This rank's rows of ``A @ X``, from its rows of X (a collective: every rank of the part's
    group calls it, in the same order). Differentiable for ``x``. A ``TCSparseTensor`` is the
    part of a single process, which holds the whole matrix: the layers then run without
    torch.distributed."""
    if isinstance(part, TCSparseTensor):
        return part.matmul(x)
    if not isinstance(part, GraphPart):
        raise TypeError(f"part must be a GraphPart or a TCSparseTensor, got {type(part).__name__}")
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.size(0) != part.num_own:
        raise ValueError(f"x must have shape [{part.num_own}, N] (this rank's rows), got {tuple(x.shape)}")
    if x.dtype != part.dtype:
        raise TypeError(f"x has dtype {x.dtype} but the part's matrix holds {part.dtype} (part.to(dtype) casts it)")
    if x.device != part.device:
        raise ValueError(f"x is on {x.device} but the part is on {part.device}")
    return DistributedProduct.apply(x.contiguous(), part)
