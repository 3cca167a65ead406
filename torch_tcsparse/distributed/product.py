"""``Y = A @ X`` over a row-partitioned A, with the reductions of ``TCSparseTensor.matmul``: each
rank gets its halo rows of X, multiplies its rows, and in the backward pass sends the halo rows
of the gradient back to their owners, which add them to their own.

The sum multiplies by the blocks' transposes in the backward pass. With ``part.overlap`` each
exchange runs while the product that does not need it does: forward, the interior block
multiplies the own rows while the halo rows arrive; backward, the boundary block's transpose
computes the halo gradients first, and the interior's runs while they travel. The mean is the
sum over the row's nonzeros counted in both blocks. Max and min reduce each block with the
library's product and keep the larger (smaller) of the two where a row has entries in both;
their gradients follow autograd through the blocks' products and the halo exchange.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..paths import REDUCTION_ALIASES, REDUCTIONS
from ..tensor import TCSparseTensor
from .part import GraphPart


class DistributedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, part: GraphPart, fixed_halo: Tensor | None) -> Tensor:
        ctx.part = part
        if fixed_halo is not None:
            return part.interior.matmul(x).add_(part.boundary.matmul(fixed_halo))
        pending = part.gather_halo(x, part.halo_dtype)
        y, halo = _beside(pending, lambda: part.interior.matmul(x), part.overlap)
        return y.add_(part.boundary.matmul(halo))

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        part = ctx.part
        grad_out = grad_out.contiguous()
        pending = part.scatter_halo(part.boundary_t.matmul(grad_out), part.halo_dtype)
        grad_x, returned = _beside(pending, lambda: part.interior_t.matmul(grad_out), part.overlap)
        return grad_x.index_add_(0, part.send_index, returned), None, None


class HaloRows(torch.autograd.Function):
    """This rank's halo rows of X; backward, their gradients go back to the owners and are added
    to the gradient of the owners' rows."""

    @staticmethod
    def forward(ctx, x: Tensor, part: GraphPart) -> Tensor:
        ctx.part = part
        return part.gather_halo(x, part.halo_dtype).wait()

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        part = ctx.part
        returned = part.scatter_halo(grad_halo.contiguous(), part.halo_dtype).wait()
        grad_x = returned.new_zeros((part.num_own, grad_halo.size(1)))
        return grad_x.index_add_(0, part.send_index, returned), None


def _beside(pending, local, overlap: bool):
    """``local()`` and what the exchange ``pending`` received: ``local`` runs while the exchange
    travels where ``overlap``, else once it has arrived."""
    if overlap:
        result = local()
        return result, pending.wait()
    received = pending.wait()
    return local(), received


def spmm(part: GraphPart | TCSparseTensor, x: Tensor, reduce: str = "sum") -> Tensor:
    """This rank's rows of ``A @ X`` (a collective: every rank of the part's group calls it, in
    the same order), the products ``A[i, j] * X[j]`` of a row combined by ``reduce`` ("sum",
    "mean", "max" or "min", as ``TCSparseTensor.matmul`` takes it; an empty row gives 0), from
    its rows of X. Differentiable for ``x``. A ``TCSparseTensor`` is the part of a single
    process, which holds the whole matrix: the layers then run without torch.distributed.
    Features given to ``part.fix_features`` take the halo rows received then."""
    if not isinstance(reduce, str) or REDUCTION_ALIASES.get(reduce, reduce) not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS} (or {tuple(REDUCTION_ALIASES)}), got {reduce!r}")
    reduce = REDUCTION_ALIASES.get(reduce, reduce)
    if isinstance(part, TCSparseTensor):
        return part.matmul(x, reduce=reduce)
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
    fixed_halo = part.fixed_halo(x)
    x = x.contiguous()
    if reduce in ("sum", "mean"):
        total = DistributedProduct.apply(x, part, fixed_halo)
        return total if reduce == "sum" else total / part.row_counts().clamp(min=1).unsqueeze(1).to(total.dtype)
    halo = HaloRows.apply(x, part) if fixed_halo is None else fixed_halo
    interior = part.interior.matmul(x, reduce=reduce)
    boundary = part.boundary.matmul(halo, reduce=reduce)
    both = torch.maximum(interior, boundary) if reduce == "max" else torch.minimum(interior, boundary)
    interior_rows, boundary_rows = part.block_row_counts()
    # A block without entries in a row gives 0 there, which must not take part in the extreme.
    return torch.where((boundary_rows == 0).unsqueeze(1), interior,
                       torch.where((interior_rows == 0).unsqueeze(1), boundary, both))
