"""The device side of the model: a GPU family's calibrated constants (``calibration/<family>.json``)
and the launch shapes of the compiled kernels on the device at hand."""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .paths import KERNEL_CHOICES
from .shape import default_column_slices

CALIBRATION_DIR = Path(__file__).resolve().parent.parent / "calibration"

# Constants that are per column of X (the rest are per warp or per launch): the kernels'
# per-job constants do not scale since wider N means more slices, already simulated.
SCALE_WITH_N = ("nnz_us", "row_us", "max_row_us", "zero_us", "miss_nnz_us")
DEFAULT_L2_BYTES = 50 << 20


@dataclass(frozen=True)
class Calibration:
    """Constants of one GPU family (``calibration/<family>.json``)."""

    source: str
    ar_threshold: float
    buckets: dict  # N bucket -> path -> constants, for float32 (TF32) and any dtype not listed below
    sm_count: int  # used only without a CUDA device
    occupancy: dict  # path -> resident warps per SM, used only without a CUDA device
    # kernel path -> a kernel is chosen only when predicted this fraction faster than csr
    csr_margin: dict = field(default_factory=lambda: dict.fromkeys(KERNEL_CHOICES, 0.0))
    l2_bytes: int = DEFAULT_L2_BYTES  # used only without a CUDA device
    dtype_buckets: dict = field(default_factory=dict)  # "float16" / "bfloat16" -> buckets of their own
    kernel_rule: str = "ar"  # between the kernels: "ar" (DTC-SpMM's threshold) or "cost" (predicted time)
    rows_margin: float = 0.0  # "rows" replaces the choice only when predicted this fraction faster
    # (path, n, dtype) -> constants, filled by ``constants`` (a first choice looks up all four)
    _resolved: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    def load(cls, family: str) -> "Calibration":
        path = CALIBRATION_DIR / f"{family}.json"
        if not path.exists():
            path = CALIBRATION_DIR / "default.json"
        return cls.from_dict(json.loads(path.read_text()), path.name)

    @classmethod
    def from_dict(cls, data: dict, source: str) -> "Calibration":
        def buckets(table: dict) -> dict:
            return {int(n): constants for n, constants in table.items()}

        return cls(
            source,
            float(data["ar_threshold"]),
            buckets(data["buckets"]),
            int(data["sm_count"]),
            dict(data["occupancy"]),
            csr_margins(data.get("csr_margin", 0.0)),
            int(data.get("l2_bytes", DEFAULT_L2_BYTES)),
            {name: buckets(table) for name, table in data.get("dtype_buckets", {}).items()},
            str(data.get("kernel_rule", "ar")),
            float(data.get("rows_margin", 0.0)),
        )

    def constants(self, path: str, n: int, dtype: torch.dtype = torch.float32) -> dict:
        """The constants of ``path`` for N = ``n`` and X of ``dtype`` (its own buckets if it has
        some, else float32's): those of the nearest bucket at or below, the per-column ones
        scaled by n / bucket. Shared between calls: read, do not modify."""
        key = (path, n, dtype)
        constants = self._resolved.get(key)
        if constants is None:
            table = self.dtype_buckets.get(dtype_name(dtype), self.buckets)
            known = sorted(table)
            bucket = max([b for b in known if b <= n], default=known[0])
            constants = dict(table[bucket][path])
            for name in SCALE_WITH_N:
                if name in constants:
                    constants[name] *= n / bucket
            self._resolved[key] = constants
        return constants


def csr_margins(margin) -> dict:
    """Per kernel margins from a calibration's ``csr_margin``: one number for both kernels (the
    files before 2026-11-22's fifth session) or one per kernel."""
    if isinstance(margin, dict):
        return {path: float(margin[path]) for path in KERNEL_CHOICES}
    return dict.fromkeys(KERNEL_CHOICES, float(margin))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def gpu_family(name: str, capability: tuple[int, int]) -> str:
    """Calibration key of a GPU: its model ("h100", "a100", "rtx4090", ...) or ``sm<cc>``."""
    match = re.search(r"\b(h\d{3}|gh\d{3}|b\d{3}|a\d{2,3}|l40s?|l4|v100|t4|rtx\s?\d{4})\b", name.lower())
    if match:
        return match.group(1).replace(" ", "")
    return f"sm{capability[0]}{capability[1]}"


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
        N = ``n`` for X of ``dtype`` on a matrix of ``windows`` row windows (None: a large one)."""
        if self.cuda_index is None:
            return int(self.calibration.occupancy[path]), default_column_slices(n, dtype)
        return _launch_shape(self.cuda_index, path, n, dtype, windows, _tf32_allowed())

    def resident(self, path: str, n: int, dtype: torch.dtype = torch.float32, windows: int | None = None) -> int:
        return self.launch(path, n, dtype, windows)[0]

    def slices(self, path: str, n: int, dtype: torch.dtype = torch.float32, windows: int | None = None) -> int:
        return self.launch(path, n, dtype, windows)[1]


def _tf32_allowed() -> bool:
    from .. import kernels

    return kernels.tf32_allowed()


@functools.lru_cache(maxsize=4096)
def _launch_shape(cuda_index: int, path: str, n: int, dtype: torch.dtype, windows: int | None, tf32: bool):
    """(resident warps per SM, column slices) of the compiled kernel, asked once per shape: the
    query is an op call under a device guard, too slow to repeat for every candidate of every
    choice. ``tf32`` is part of the key because the exact fp32 variant has its own shape."""
    from .. import kernels

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


def device_model(device=None) -> DeviceModel:
    """The model of ``device`` (a CUDA device, or the defaults of ``calibration/default.json``)."""
    return _device_model(torch.device("cpu" if device is None else device))

