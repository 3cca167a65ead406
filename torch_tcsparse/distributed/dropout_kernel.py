"""node_dropout on a GPU in one pass: each entry's hash of its node's word plus its channel is
computed in registers by a Triton kernel, which writes the kept entries (``keep_mask``) or, for
ReLU then dropout, the output and the flags the backward pass keeps (``relu_dropout``). The same
draws in torch operations (``layers._mask``, off the GPU) pass over every entry a dozen times
in int64 and the ReLU-dropout's arithmetic four more times, most of a GCN epoch's dense work.

The hash is ``hashing.mix_`` on 32-bit words: unsigned 32-bit arithmetic wraps where the int64
form masks, so both give the same words. The arithmetic is torch's on the GPU: ReLU, the mask
as a factor (so NaN stays NaN), then the scale as a product by the reciprocal, in the dtype torch
computes it in (float32 for 16-bit inputs), rounded once to the input's dtype."""
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
    """Whether dropout on ``device`` runs in the kernels."""
    return triton is not None and torch.device(device).type == "cuda"


def keep_mask(node_words: Tensor, threshold: int, out: Tensor) -> Tensor:
    """Writes into ``out`` (bool, [rows, channels], contiguous) whether each entry is kept:
    ``mix_((node_words[row] + channel) mod 2**32) >= threshold``. ``node_words``: int64 in
    [0, 2**32), one per row."""
    _check_rows("out", out, node_words.numel(), torch.bool)
    if out.numel():
        _keep_mask[_grid(out)](node_words, out, out.size(0), out.size(1), threshold, *_MULTIPLIERS,
                               BLOCK_ROWS=_BLOCK_ROWS, BLOCK_CHANNELS=_BLOCK_CHANNELS)
    return out


def relu_dropout(x: Tensor, node_words: Tensor, threshold: int, scale: Tensor, out: Tensor, kept: Tensor) -> None:
    """Writes ``relu(x) * keep * scale`` into ``out`` (x's dtype) and ``out != 0`` into ``kept``
    (bool), with ``keep`` drawn as ``keep_mask`` draws it; ``scale``: one element, the dtype of
    the arithmetic. Every tensor of rows is contiguous."""
    rows = node_words.numel()
    _check_rows("x", x, rows, x.dtype)
    _check_rows("out", out, rows, x.dtype)
    _check_rows("kept", kept, rows, torch.bool)
    if x.shape != out.shape or x.shape != kept.shape:
        raise ValueError(f"x, out and kept must have one shape, got {tuple(x.shape)}, {tuple(out.shape)}, "
                         f"{tuple(kept.shape)}")
    if scale.numel() != 1:
        raise ValueError(f"scale must hold one element, got {scale.numel()}")
    if x.numel():
        _relu_dropout[_grid(x)](x, node_words, scale, out, kept, x.size(0), x.size(1), threshold, *_MULTIPLIERS,
                                BLOCK_ROWS=_BLOCK_ROWS, BLOCK_CHANNELS=_BLOCK_CHANNELS)


def _check_rows(name: str, tensor: Tensor, rows: int, dtype: torch.dtype) -> None:
    if tensor.dim() != 2 or tensor.size(0) != rows or tensor.dtype != dtype or not tensor.is_contiguous():
        raise ValueError(f"{name} must be a contiguous {dtype} tensor of {rows} rows, "
                         f"got {tensor.dtype} {tuple(tensor.shape)}")


def _grid(tensor: Tensor) -> tuple[int, int]:
    return triton.cdiv(tensor.size(0), _BLOCK_ROWS), triton.cdiv(tensor.size(1), _BLOCK_CHANNELS)


if triton is not None:
    @triton.jit
    def _kept(words_ptr, rows, channels, threshold, first_multiplier, second_multiplier,
              BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):
        """The block's offsets, which of them lie inside, and which entries dropout keeps."""
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
        return offsets, inside, key >= threshold.to(tl.uint32)

    # A threshold of 1 would otherwise become a compile-time constant, which has no .to().
    @triton.jit(do_not_specialize=["threshold"])
    def _keep_mask(words_ptr, out_ptr, rows, channels, threshold, first_multiplier, second_multiplier,
                   BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):
        offsets, inside, keep = _kept(words_ptr, rows, channels, threshold, first_multiplier, second_multiplier,
                                      BLOCK_ROWS, BLOCK_CHANNELS)
        tl.store(out_ptr + offsets, keep, mask=inside)

    @triton.jit(do_not_specialize=["threshold"])
    def _relu_dropout(x_ptr, words_ptr, scale_ptr, out_ptr, kept_ptr, rows, channels, threshold, first_multiplier,
                      second_multiplier, BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):
        offsets, inside, keep = _kept(words_ptr, rows, channels, threshold, first_multiplier, second_multiplier,
                                      BLOCK_ROWS, BLOCK_CHANNELS)
        scale = tl.load(scale_ptr)
        value = tl.load(x_ptr + offsets, mask=inside, other=0).to(scale.dtype)
        value = tl.where(value < 0, tl.zeros_like(value), value)
        out = (value * keep.to(scale.dtype) * scale).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offsets, out, mask=inside)
        tl.store(kept_ptr + offsets, out != 0, mask=inside)
