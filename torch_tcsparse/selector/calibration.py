"""A GPU family's calibrated constants (``calibration/<family>.json``), and their prices in the
C++ model."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import csr_rows
from . import native
from .paths import CALIBRATED_CHOICES, KERNEL_CHOICES

CALIBRATION_DIR = Path(__file__).resolve().parent.parent / "calibration"

# Constants that are per column of X (the rest are per warp or per launch): the kernels'
# per-job constants do not scale since wider N means more slices, already simulated.
SCALE_WITH_N = ("nnz_us", "row_us", "max_row_us", "zero_us", "miss_nnz_us")
DEFAULT_L2_BYTES = 50 << 20
KERNEL_RULES = ("ar", "cost")


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
    # (path, n, dtype) -> constants, and (n, dtype, SMs, L2 bytes) -> native.Prices, filled on demand
    _resolved: dict = field(default_factory=dict, init=False, compare=False, repr=False)
    _prices: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self):
        if self.kernel_rule not in KERNEL_RULES:
            raise ValueError(f"kernel_rule must be one of {KERNEL_RULES}, got {self.kernel_rule!r}")

    @classmethod
    def load(cls, family: str) -> "Calibration":
        path = calibration_path(family)
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

    def prices(self, n: int, dtype: torch.dtype, sm_count: int, l2_bytes: int) -> native.Prices:
        """The constants of N = ``n`` and ``dtype`` in the C++ model, for a device of ``sm_count``
        SMs and ``l2_bytes`` of L2; made once per process."""
        key = (n, dtype, sm_count, l2_bytes)
        prices = self._prices.get(key)
        if prices is None:
            rule = {"by_cost": self.kernel_rule == "cost", "ar_threshold": self.ar_threshold,
                    "csr_margin_base": self.csr_margin["base"], "csr_margin_balanced": self.csr_margin["balanced"],
                    "rows_margin": self.rows_margin}
            constants = {path: self.constants(path, n, dtype) for path in CALIBRATED_CHOICES}
            prices = self._prices[key] = native.Prices(constants, rule, sm_count, l2_bytes, csr_rows.PIECE_NNZ)
        return prices


def calibration_path(family: str) -> Path:
    """The file of ``family``'s constants, else the default one."""
    path = CALIBRATION_DIR / f"{family}.json"
    return path if path.exists() else CALIBRATION_DIR / "default.json"


def csr_margins(margin) -> dict:
    """Per kernel margins from a calibration's ``csr_margin``: one number for both kernels or one
    per kernel."""
    if isinstance(margin, dict):
        return {path: float(margin[path]) for path in KERNEL_CHOICES}
    return dict.fromkeys(KERNEL_CHOICES, float(margin))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
