"""The paths the selector ranks, and the N buckets a choice is cached for."""
from __future__ import annotations

from ..paths import KERNEL_PATHS as KERNEL_CHOICES
from ..paths import SELECTOR_PATHS as CHOICES

# The paths whose constants a calibration file holds ("grouped" has in-code constants: model.py).
CALIBRATED_CHOICES = ("base", "balanced", "csr", "rows")
BUCKETS = (32, 64, 128, 256)


def n_bucket(n: int) -> int:
    """The N a choice is computed and cached for: the next power of two, at least 32."""
    if n < 1:
        raise ValueError(f"N must be positive, got {n}")
    return BUCKETS[0] if n <= BUCKETS[0] else 1 << (n - 1).bit_length()

