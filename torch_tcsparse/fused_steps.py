"""Fused optimizer steps (``fused=True``: Adam, AdamW, SGD, ...) write their parameters in one
kernel that moves no version counter, where a plain or foreach step moves it by writing in place.
A matrix holding a parameter's ``.detach()`` (values that need no gradient, which share the
parameter's version counter) keeps operands derived from its values while that counter stays,
so after a fused step it would keep multiplying by the old values. A post-step hook on every
optimizer moves the counter of each parameter a fused group holds, as the plain step would: the
version counter then tells every writer that goes through an optimizer. Writes through ``.data``
or into the storage still move none (README, "Values written behind the matrix's back")."""
from __future__ import annotations

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.autograd.graph import increment_version

_handle = None


def mark_fused_steps(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """Optimizer post-step hook: the parameters of the optimizer's fused groups count as written."""
    if torch.compiler.is_compiling():  # traced steps write through ops the compiler versions
        return
    written = [p for group in optimizer.param_groups if group.get("fused") for p in group["params"]]
    if written:
        increment_version(written)


def install() -> None:
    """Register ``mark_fused_steps`` for every optimizer, once per process."""
    global _handle
    if _handle is None:
        _handle = register_optimizer_step_post_hook(mark_fused_steps)
