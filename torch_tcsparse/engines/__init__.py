"""The engines behind ``A @ X``: one module per path, and the registry from path name to engine.

An engine (``base.Engine``) builds its index arrays from a matrix's structure, derives its
operands from the values, and launches; the backward of every engine is the same formula
(``autograd.py``): dX runs the engine on the transpose (or, in an eager product's first backward
pass through a matrix, the rows engine's scatter from its forward operands), the values' gradient
is one SDDMM.
``reduce="mean"`` runs these engines on row-scaled values; ``reduce="max"``/``"min"`` is no sum and
has its own forward and backward (``extreme.py``).
"""
from __future__ import annotations

from ..paths import ENGINE_PATHS
from .base import Engine
from .csr import CSR_ENGINE
from .grouped import GROUPED
from .reference import REFERENCE
from .rows import ROWS
from .tensor_core import BALANCED, BASE


def _registry(engines) -> dict[str, Engine]:
    """Engine by path name, in the order of ``paths.ENGINE_PATHS``: each path has exactly one."""
    by_name = {engine.name: engine for engine in engines}
    if sorted(by_name) != sorted(ENGINE_PATHS) or len(by_name) != len(engines):
        raise RuntimeError(f"the engines {sorted(by_name)} do not match the paths {sorted(ENGINE_PATHS)}")
    return {name: by_name[name] for name in ENGINE_PATHS}


ENGINES: dict[str, Engine] = _registry((BASE, BALANCED, ROWS, GROUPED, CSR_ENGINE, REFERENCE))

__all__ = ["ENGINES", "Engine"]
