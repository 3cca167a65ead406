"""Build of the CUDA kernels in ``csrc/`` on first use (``torch.utils.cpp_extension.load``).

torch hashes the sources and flags, so the build is cached (under ``$TCSPARSE_BUILD_DIR`` if set,
else torch's extension cache, ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``) and
redone only when they change; a file lock makes two processes building at once safe.

Ahead of time (e.g. in a Docker image, or before a timed run)::

    python -m torch_tcsparse._ext
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (
    "bindings.cpp",
    "python_module.cpp",
    "csr_rows_binding.cpp",
    "split_sums.cpp",
    "grouped_binding.cpp",
    "reduce_rows_binding.cpp",
    "kernels_f32.cu",
    "kernels_f16.cu",
    "kernels_bf16.cu",
    "metcf_convert.cu",
    "csr_rows_spmm.cu",
    "grouped_spmm.cu",
    "reduce_rows.cu",
)
NAME = "tcsparse_kernels"

# sm_80 (A100) and sm_90 (H100/H200) machine code; mma.sync TF32 and BF16 need sm_80 at least.
CUDA_FLAGS = [
    "-O3",
    "-lineinfo",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
]

_lock = threading.Lock()
_module = None
_available: bool | None = None


def _check_toolchain() -> None:
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None or shutil.which(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")) is None:
        raise RuntimeError(
            "torch_tcsparse needs nvcc to build its CUDA kernels, and none was found "
            "(set CUDA_HOME or put nvcc on PATH); the CPU path works without it"
        )
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("torch_tcsparse needs ninja to build its CUDA kernels: pip install ninja")


def load(verbose: bool = False):
    """The compiled extension (``csrc/python_module.cpp``: the kernels' bindings as plain
    functions), built and loaded on the first call of the process."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            _check_toolchain()
            from torch.utils import cpp_extension

            build_dir = os.environ.get("TCSPARSE_BUILD_DIR")
            if build_dir:
                os.makedirs(build_dir, exist_ok=True)
            _module = cpp_extension.load(
                name=NAME,
                sources=[str(CSRC / s) for s in SOURCES],
                extra_cflags=["-O3"],
                extra_cuda_cflags=CUDA_FLAGS,
                extra_include_paths=[str(CSRC)],
                build_directory=build_dir,
                is_python_module=True,
                verbose=verbose,
            )
    return _module


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


if __name__ == "__main__":
    load(verbose=True)
    print(f"built and loaded {NAME}")
