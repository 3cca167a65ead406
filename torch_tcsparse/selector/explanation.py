"""Why a path was chosen: the C++ model's numbers for one (matrix, N bucket, dtype, device)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .paths import CHOICES


@dataclass(frozen=True)
class Explanation:
    """Why a path was chosen for one (matrix, N bucket, dtype, device); ``str()`` reads it out."""

    choice: str
    reason: str
    n: int
    dtype: torch.dtype
    device: str
    calibration: str
    features: dict
    slots: dict
    makespans_us: dict
    ar: float
    ar_threshold: float
    costs_us: dict
    bytes_moved: dict
    candidates: tuple = field(default=CHOICES)
    measured_us: dict = field(default_factory=dict)  # median us per path, once the choice was measured

    @property
    def ar_kernel(self) -> str:
        """DTC-SpMM's choice between the Tensor-Core kernels: balanced when AR > threshold."""
        return "balanced" if self.ar > self.ar_threshold else "base"

    def __str__(self) -> str:
        def row(mapping, fmt):
            return ", ".join(f"{key}={fmt(value)}" for key, value in mapping.items())

        return "\n".join(
            [
                f"choice: {self.choice} ({self.reason})",
                f"N={self.n} dtype={self.dtype} device={self.device} calibration={self.calibration}",
                f"features: {row(self.features, _number)}",
                f"slots (SMs x resident blocks): {row(self.slots, str)}",
                f"simulated makespan (us): {row(self.makespans_us, lambda v: f'{v:.1f}')}",
                f"approximation ratio AR = {self.ar:.3f} (threshold {self.ar_threshold:.3f}) -> {self.ar_kernel}",
                f"predicted time (us): {row(self.costs_us, lambda v: f'{v:.1f}')}",
                f"bytes moved (MB): {row(self.bytes_moved, lambda v: f'{v / 1e6:.2f}')}",
                f"candidates: {', '.join(self.candidates)}",
            ]
            + ([f"measured (us, median of the first product's samples): {row(self.measured_us, lambda v: f'{v:.1f}')}"]
               if self.measured_us else [])
        )


def _number(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
