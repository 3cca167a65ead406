"""The operations that would wait for a GPU, recorded while code runs on the CPU.

On a CUDA tensor, reading a value on the host (``.item()``, ``int()``, ``bool()``, ``.tolist()``)
and every operation whose output size depends on the data (``nonzero``, boolean masks,
``unique``, ``repeat_interleave`` without ``output_size``, ``bincount``, ``torch.equal``) make the
host wait for the device. The CPU runs the same torch calls, so recording them there counts the
waits a GPU run would have, without a GPU."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.bincount.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
}


def _waits(func, args, kwargs) -> bool:
    if func in _READS:
        return True
    if func is torch.ops.aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None
    if func in (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default):
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
    return False


class DeviceReads(TorchDispatchMode):
    """``with DeviceReads() as reads: ...``; ``reads.ops`` then names each waiting operation in
    the order it ran (``tolist`` included, which dispatches nothing on the CPU)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _waits(func, args, kwargs):
            self.ops.append(str(func))
        return func(*args, **kwargs)

    def __enter__(self):
        original, ops = torch.Tensor.tolist, self.ops

        def tolist(tensor):
            ops.append("tolist")
            return original(tensor)

        torch.Tensor.tolist = tolist  # shadows the C method, which stays on torch._C.TensorBase
        return super().__enter__()

    def __exit__(self, *exc):
        del torch.Tensor.tolist
        return super().__exit__(*exc)
