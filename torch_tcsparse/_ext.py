"""The CUDA kernels of ``csrc/`` as a Python module.

The module built into the package at install (``setup.py``: ``torch_tcsparse._kernels``) serves
when it was built for the running torch, from the sources the package holds, with code for the
GPU in use. Otherwise the kernels are built on first use (``torch.utils.cpp_extension.load``,
needs nvcc and ninja) for ``$TORCH_CUDA_ARCH_LIST``, else ``_build_config.DEFAULT_ARCH_LIST``.
torch hashes the sources and flags, so that build is cached (under ``$TCSPARSE_BUILD_DIR`` if
set, else torch's extension cache, ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``)
and redone only when they change; a file lock makes two processes building at once safe.

Ahead of time without installing (e.g. in a Docker image, or before a timed run); this prints
which module serves (``__main__.py``)::

    python -m torch_tcsparse
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import threading
from pathlib import Path

from ._build_config import (CSRC, CXX_FLAGS, NAME, NVCC_FLAGS, PREBUILT, RECORD, SOURCES, arch_list, covers,
                            gencode_flags, sources_digest)

_RECORD_PATH = Path(__file__).resolve().parent / RECORD
_lock = threading.Lock()
_module = None
_available: bool | None = None


def _prebuilt():
    """The module built into the package and None, or None and why it cannot serve (None when
    the package was installed without it)."""
    import torch

    if not _RECORD_PATH.is_file():
        return None, None
    try:
        record = json.loads(_RECORD_PATH.read_text())
        built_for, built_arches, built_from = record["torch"], record["arch_list"], record["sources"]
    except (ValueError, KeyError, TypeError) as error:
        return None, f"the prebuilt kernels' record {_RECORD_PATH} is unreadable ({error})"
    if built_for != torch.__version__:
        return None, f"the prebuilt kernels were built for torch {built_for}, this is torch {torch.__version__}"
    try:
        changed = built_from != sources_digest()
    except OSError as error:
        return None, f"the kernel sources the prebuilt kernels were built from are missing ({error})"
    if changed:
        return None, "the kernel sources changed after the prebuilt kernels were built"
    if torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
        if not covers(built_arches, capability):
            return None, (f"the prebuilt kernels hold code for {built_arches}, none of it for this GPU "
                          f"(compute capability {capability[0]}.{capability[1]})")
    try:
        return importlib.import_module(f"{__package__}.{PREBUILT}"), None
    except ImportError as error:
        return None, f"the prebuilt kernels do not load ({error})"


def _check_toolchain(why_not_prebuilt: str | None) -> None:
    import torch
    from torch.utils import cpp_extension

    context = f"; {why_not_prebuilt}" if why_not_prebuilt else ""
    if cpp_extension.CUDA_HOME is None or shutil.which(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")) is None:
        raise RuntimeError(
            "torch_tcsparse needs nvcc to build its CUDA kernels, and none was found "
            f"(set CUDA_HOME or put nvcc on PATH); the CPU path works without it{context}"
        )
    if torch.version.cuda is None:
        raise RuntimeError(f"torch {torch.__version__} is a CPU build: it builds no CUDA kernels, and the CPU path "
                           f"needs none{context}")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError(f"torch_tcsparse needs ninja to build its CUDA kernels: pip install ninja{context}")


def _build(why_not_prebuilt: str | None, verbose: bool):
    _check_toolchain(why_not_prebuilt)
    from torch.utils import cpp_extension

    if verbose and why_not_prebuilt:
        print(f"torch_tcsparse: building the kernels: {why_not_prebuilt}")
    build_dir = os.environ.get("TCSPARSE_BUILD_DIR")
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    return cpp_extension.load(
        name=NAME,
        sources=[str(CSRC / s) for s in SOURCES],
        extra_cflags=list(CXX_FLAGS),
        extra_cuda_cflags=[*NVCC_FLAGS, *gencode_flags(arch_list())],
        extra_include_paths=[str(CSRC)],
        build_directory=build_dir,
        is_python_module=True,
        verbose=verbose,
    )


def load(verbose: bool = False):
    """The compiled extension (``csrc/python_module.cpp``: the kernels' bindings as plain
    functions): the prebuilt one if it fits, else built; found on the first call of the process."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            module, why_not = _prebuilt()
            _module = module if module is not None else _build(why_not, verbose)
    return _module


def is_prebuilt(module) -> bool:
    """Whether ``module`` (from ``load``) is the one built into the package."""
    return module.__name__ == f"{__package__}.{PREBUILT}"


def available() -> bool:
    """True when a CUDA device is present and the extension builds; never raises."""
    global _available
    if _available is None:
        try:
            import torch

            _available = torch.cuda.is_available() and load() is not None
        except Exception:  # any build or driver failure means: use the other paths
            _available = False
    return _available
