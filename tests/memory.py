"""Peak resident memory of a block, for the tests that bound what a crafted input may allocate.

Linux lets a process reset its own high-water mark (``/proc/self/clear_refs``), so the peak of one
block is measured in-process, without the cost of a fresh interpreter."""
from __future__ import annotations

import re

import pytest


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1))


class PeakGrowth:
    """``with PeakGrowth() as peak: ...`` sets ``peak.bytes`` to how far the peak resident memory
    rose above what was resident when the block began; skips the test where the peak cannot be
    reset."""

    bytes: int

    def __enter__(self) -> "PeakGrowth":
        try:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
            self._before = _status_kib("VmRSS")
        except OSError as error:
            pytest.skip(f"needs a resettable peak resident size (/proc/self/clear_refs): {error}")
        return self

    def __exit__(self, *exc_info) -> bool:
        self.bytes = (_status_kib("VmHWM") - self._before) * 1024
        return False
