"""node_dropout's mask on a GPU in one pass: each entry's hash of its node's word plus its
channel, computed in registers by a Triton kernel that writes only the bool mask. The same
draws in torch operations (``layers._mask`` off the GPU) pass over every entry a dozen times
in int64, which made the mask most of a GCN epoch's dense work on a GPU.

The hash is ``hashing.mix_`` on 32-bit words: unsigned 32-bit arithmetic wraps where the int64
form masks, so both give the same words."""
from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without CUDA ships without Triton
    triton = None

from .hashing import _MULTIPLIERS

_BLOCK_ROWS, _BLOCK_CHANNELS = 32, 128


def available(device: torch.device) -> bool:
    """Whether masks on ``device`` come from the kernel."""
    return triton is not None and torch.device(device).type == "cuda"


def keep_mask(node_words: Tensor, channels: int, threshold: int, out: Tensor) -> Tensor:
    """Writes into ``out`` (bool, [rows, channels], contiguous) whether each entry is kept:
    ``mix_((node_words[row] + channel) mod 2**32) >= threshold``. ``node_words``: int64 in
    [0, 2**32), one per row."""
    rows = node_words.numel()
    if out.shape != (rows, channels) or out.dtype != torch.bool or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bool tensor of shape {(rows, channels)}, "
                         f"got {out.dtype} {tuple(out.shape)}")
    if rows and channels:
        grid = (triton.cdiv(rows, _BLOCK_ROWS), triton.cdiv(channels, _BLOCK_CHANNELS))
        _keep_mask[grid](node_words, out, rows, channels, threshold, *_MULTIPLIERS,
                         BLOCK_ROWS=_BLOCK_ROWS, BLOCK_CHANNELS=_BLOCK_CHANNELS)
    return out


if triton is not None:
    @triton.jit
    def _keep_mask(words_ptr, out_ptr, rows, channels, threshold, first_multiplier, second_multiplier,
                   BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):
        row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        channel = tl.program_id(1) * BLOCK_CHANNELS + tl.arange(0, BLOCK_CHANNELS)
        word = tl.load(words_ptr + row, mask=row < rows, other=0).to(tl.uint32)
        key = word[:, None] + channel[None, :].to(tl.uint32)
        key = key ^ (key >> 16)
        key = key * first_multiplier.to(tl.uint32)
        key = key ^ (key >> 16)
        key = key * second_multiplier.to(tl.uint32)
        key = key ^ (key >> 16)
        inside = (row[:, None] < rows) & (channel[None, :] < channels)
        offsets = row[:, None].to(tl.int64) * channels + channel[None, :]
        tl.store(out_ptr + offsets, key >= threshold.to(tl.uint32), mask=inside)
