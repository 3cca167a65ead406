"""The device the model prices: SM count, L2, the compiled kernels' launch shapes, and its
family's calibration; and what a choice asks of it at an N bucket (``device_query``), kept per
process."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

from .. import kernels
from ..paths import KERNEL_DTYPES, KERNEL_PATHS
from . import native
from .calibration import DEFAULT_L2_BYTES, Calibration


def gpu_family(name: str, capability: tuple[int, int]) -> str:
    """Calibration key of a GPU: its model ("h100", "a100", "rtx4090", ...) or ``sm<cc>``."""
    match = re.search(r"\b(h\d{3}|gh\d{3}|b\d{3}|a\d{2,3}|l40s?|l4|v100|t4|rtx\s?\d{4})\b", name.lower())
    if match:
        return match.group(1).replace(" ", "")
    return f"sm{capability[0]}{capability[1]}"


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype whose kernels' launch shapes a product of X of ``dtype`` is priced with."""
    return dtype if dtype in KERNEL_DTYPES else torch.float32


@dataclass(frozen=True)
class DeviceModel:
    """SM count and occupancy of the kernels on one device, with its family's calibration."""

    name: str
    family: str
    sm_count: int
    calibration: Calibration
    cuda_index: int | None  # None: no CUDA device, occupancy from the calibration's defaults
    l2_bytes: int = DEFAULT_L2_BYTES

    def launch(self, path: str, n: int, dtype: torch.dtype = torch.float32, windows: int | None = None):
        """(warps of ``path``'s kernel resident per SM, warps per row window or chunk along N) at
        N = ``n`` for X of ``dtype`` on a matrix of ``windows`` row windows (None: a large one):
        the compiled kernels' on a GPU, the documented defaults without one."""
        dtype = kernel_dtype(dtype)
        if self.cuda_index is None:
            return int(self.calibration.occupancy[path]), native.default_column_slices(n, dtype.itemsize)
        return _launch_shape(self.cuda_index, path, n, dtype, windows, kernels.tf32_allowed())

    def prices(self, n: int, dtype: torch.dtype) -> native.Prices:
        return self.calibration.prices(n, dtype, self.sm_count, self.l2_bytes)

    def query(self, n: int, dtype: torch.dtype, windows: int | None = None) -> native.Query:
        """What a choice at N = ``n`` for X of ``dtype`` on a matrix of ``windows`` row windows asks
        of this device: its prices and the kernels' launch shapes."""
        base, balanced = (self.launch(path, n, dtype, windows) for path in KERNEL_PATHS)
        return native.Query(self.prices(n, dtype), n, dtype.itemsize, base, balanced)


@functools.lru_cache(maxsize=4096)
def _launch_shape(cuda_index: int, path: str, n: int, dtype: torch.dtype, windows: int | None, tf32: bool):
    """(resident warps per SM, column slices) of the compiled kernel, asked once per shape: the
    query is an op call under a device guard, too slow to repeat for every choice. ``tf32`` is
    part of the key because the exact fp32 variant has its own shape."""
    windows = windows or kernels.MANY_WINDOWS
    with torch.cuda.device(cuda_index):
        return (int(kernels.occupancy(path, n, dtype, windows)), int(kernels.column_slices(path, n, dtype, windows)))


@functools.lru_cache(maxsize=None)
def _device_model(device: torch.device) -> DeviceModel:
    if device.type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device() if device.index is None else device.index
        props = torch.cuda.get_device_properties(index)
        family = gpu_family(props.name, (props.major, props.minor))
        l2_bytes = int(getattr(props, "L2_cache_size", 0)) or DEFAULT_L2_BYTES
        return DeviceModel(props.name, family, props.multi_processor_count, Calibration.load(family), index, l2_bytes)
    calibration = Calibration.load("default")
    return DeviceModel(
        "no CUDA device (documented defaults)", "default", calibration.sm_count, calibration, None, calibration.l2_bytes
    )


@functools.lru_cache(maxsize=4096)
def device_query(device: torch.device, n: int, dtype: torch.dtype, tf32: bool, windows: int) -> native.Query:
    """``device_model(device).query(n, dtype, windows)``, made once per process and shared by every
    matrix of ``windows`` row windows: a first choice at an N bucket looks it up rather than asking
    the kernels for their launch shapes and building its arguments. ``tf32``
    (``kernels.tf32_allowed``, for float32 X) is part of the key because the exact float32 kernels
    have launch shapes of their own."""
    return _device_model(device).query(n, dtype, windows)


def device_model(device=None) -> DeviceModel:
    """The model of ``device`` (a CUDA device, or the defaults of ``calibration/default.json``)."""
    return _device_model(torch.device("cpu" if device is None else device))
