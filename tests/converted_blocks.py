"""Every block a sampled batch converts during a test: ``SampledBatch._blocks``, the one route of
``blocks()`` and ``block()``, wrapped to record what it returns."""
from __future__ import annotations


def record_converted_blocks(monkeypatch) -> list:
    """The list that every block converted from now on (for this test) is appended to."""
    from torch_tcsparse.loader import SampledBatch

    made = []
    convert = SampledBatch._blocks

    def recorded(*args, **kwargs):
        built = convert(*args, **kwargs)
        made.extend(built)
        return built

    monkeypatch.setattr(SampledBatch, "_blocks", recorded)
    return made
