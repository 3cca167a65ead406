"""Batch normalization and dropout whose result does not depend on how the nodes are split
across ranks, so that P processes train the same model as one."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from . import dropout_kernel
from .checks import check_index, check_int
from .hashing import MASK as _MASK
from .hashing import hash_ids
from .hashing import mix_ as _mix

# Rows per chunk of the mask, so that its int64 words stay a few hundred MB at 256 channels.
_CHUNK_ELEMENTS = 1 << 24
# Rows per launch of the dropout kernels, which hash only the nodes' words (two int64 per row
# while hashed: 64 MB). Chunks of the torch form's size (65k rows at 256 channels) would make
# the host's launches, not the device, the time of the layer.
KERNEL_CHUNK_ROWS = 1 << 22


def node_dropout(x: Tensor, nodes: Tensor, p: float, seed: int, training: bool = True, relu: bool = False) -> Tensor:
    """Dropout whose mask is a hash of (seed, node id, channel): a node's entries are dropped
    alike whichever rank holds it. ``nodes``: the global id of each row of ``x``; ``seed``
    (below 2**32) must differ between calls that should draw different masks (a step's and a layer's).
    ``relu``: dropout of ``relu(x)``, the same numbers as ``F.relu`` then this dropout, keeping one
    byte per entry for the backward pass instead of the ReLU's output (4 bytes) and the mask (1)."""
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor, got {tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    check_index("nodes", nodes)
    if nodes.numel() != x.size(0):
        raise ValueError(f"nodes must hold one id per row of x ({x.size(0)}), got {nodes.numel()}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ValueError(f"p must be a float in [0, 1), got {p!r}")
    check_int("seed", seed, 0, _MASK)
    if not isinstance(relu, bool):
        raise TypeError(f"relu must be a bool, got {type(relu).__name__}")
    if not training or p == 0:
        return torch.relu(x) if relu else x
    if relu:
        return _ReluDropout.apply(x, nodes, p, seed)
    return x * _mask(x, nodes, p, seed) / (1.0 - p)


def _mask(x: Tensor, nodes: Tensor, p: float, seed: int) -> Tensor:
    """The entries of ``x`` that dropout keeps (bool, x's shape). Each node id is hashed once
    with the seed (both halves of an id of any size), and an entry's draw is one more hash of
    its node's word plus its channel: one hash per entry whatever the ids' size (ids beyond 2**24
    at 256 channels would otherwise need a second hash of every entry, doubling the mask's time)."""
    threshold = _threshold(p)
    mask = torch.empty(x.shape, dtype=torch.bool, device=x.device)
    in_kernel = dropout_kernel.available(x.device)
    channel = None if in_kernel else torch.arange(x.size(1), device=x.device)
    for rows, node_words in _chunks(x, nodes, seed, in_kernel):
        if in_kernel:
            dropout_kernel.keep_mask(node_words, threshold, mask[rows])
        else:
            words = _mix(node_words.unsqueeze(1).add(channel).bitwise_and_(_MASK))
            mask[rows] = words >= threshold
    return mask


def _threshold(p: float) -> int:
    """The 32-bit word at or above which an entry is kept: a word is uniform, so a share p falls below."""
    return int(p * (1 << 32))


def chunk_rows(channels: int, in_kernel: bool) -> int:
    """Rows of ``x`` hashed at a time: the torch form hashes every entry, the kernels every row."""
    return KERNEL_CHUNK_ROWS if in_kernel else max(1, _CHUNK_ELEMENTS // max(channels, 1))


def _chunks(x: Tensor, nodes: Tensor, seed: int, in_kernel: bool):
    """Each chunk of ``x``'s rows (a slice) with its nodes' words (``chunk_rows``)."""
    step = chunk_rows(x.size(1), in_kernel)
    for start in range(0, x.size(0), step):
        rows = slice(start, start + step)
        yield rows, hash_ids(nodes[rows].to(device=x.device, dtype=torch.int64), seed)


def _relu_dropout_in_kernel(x: Tensor, nodes: Tensor, p: float, seed: int) -> tuple[Tensor, Tensor]:
    """``relu(x) * mask / (1 - p)`` and its nonzero flags from ``dropout_kernel``, with the numbers
    of the torch operations on the GPU (which divide by a scalar as a product by its reciprocal,
    in float32 for 16-bit inputs)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    kept = torch.empty(x.shape, dtype=torch.bool, device=x.device)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    # Computed on the host, then filled on the device: copying a host tensor there would wait for
    # the device's queue to drain, every layer of every epoch.
    scale = torch.full((), torch.tensor(1.0 - p, dtype=compute).reciprocal().item(), dtype=compute, device=x.device)
    threshold = _threshold(p)
    for rows, node_words in _chunks(x, nodes, seed, True):
        dropout_kernel.relu_dropout(x[rows], node_words, threshold, scale, out[rows], kept[rows])
    return out, kept


class _ReluDropout(torch.autograd.Function):
    """``relu(x) * mask / (1 - p)``, the operations of ``F.relu`` and ``node_dropout`` in their
    order (on a GPU in one kernel). The gradient is ``grad / (1 - p)`` where the output is
    nonzero, else zero: only that bool is saved, where the three operations apart keep the
    ReLU's output, the mask and (in the next layer) the output. The rounding is theirs; only the
    sign of some zero gradients may differ."""

    @staticmethod
    def forward(ctx, x: Tensor, nodes: Tensor, p: float, seed: int) -> Tensor:
        if dropout_kernel.available(x.device):
            out, kept = _relu_dropout_in_kernel(x, nodes, p, seed)
        else:
            out = torch.relu(x)
            mask = _mask(x, nodes, p, seed)
            out.mul_(mask).div_(1.0 - p)
            del mask
            kept = out != 0
        ctx.p = p
        ctx.save_for_backward(kept)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (kept,) = ctx.saved_tensors
        # The mask first, then the scale, as the forward: a scale that overflows a 16-bit dtype
        # (p near 1) gives dropped entries 0, never inf * 0.
        return grad.mul(kept).div_(1.0 - ctx.p), None, None, None


class _AllReduceSum(torch.autograd.Function):
    """Sum over the ranks; the gradient of every rank's input is the sum of the ranks' output
    gradients, since each rank's loss reads the same sum."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class GlobalBatchNorm1d(torch.nn.BatchNorm1d):
    """``BatchNorm1d`` whose training statistics are taken over the rows of every rank of
    ``group`` (default: the world): P ranks holding a split of the nodes normalize as one
    process holding them all. Without an initialized process group it is ``BatchNorm1d``.
    ``torch.nn.SyncBatchNorm`` does the same on GPUs only."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, group=None):
        if isinstance(momentum, bool) or not isinstance(momentum, float) or not 0 <= momentum <= 1:
            raise ValueError(f"momentum must be a float in [0, 1], got {momentum!r}")
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        if x.dim() != 2 or x.size(1) != self.num_features:
            raise ValueError(f"x must have shape [rows, {self.num_features}], got {tuple(x.shape)}")
        group = dist.group.WORLD if self.group is None else self.group
        count = torch.tensor([x.size(0)], dtype=torch.float64, device=x.device)
        dist.all_reduce(count, group=group)
        total = int(count.item())
        if total < 2:
            raise ValueError(f"batch normalization needs at least 2 rows over all ranks in training, got {total}")
        mean = _AllReduceSum.apply(x.sum(0), group) / total
        centered = x - mean
        variance = _AllReduceSum.apply((centered * centered).sum(0), group) / total
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(variance.detach() * total / (total - 1), self.momentum)
        out = centered * torch.rsqrt(variance + self.eps)
        return out * self.weight + self.bias
