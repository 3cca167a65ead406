"""Build of the selector's C++ cost model (``csrc/selector_model.cpp`` and its C ABI,
``csrc/selector_capi.cpp``) into a shared library, on first use.

Plain C++ without torch or CUDA headers, so the build takes seconds with the system's compiler
(``$CXX``, else ``c++``) and needs no GPU. The library is cached under ``$TCSPARSE_BUILD_DIR`` if
set, else torch's extension cache (``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``),
in a folder named by a hash of the sources, the compiler and its flags: a change rebuilds it. Two
processes building at once are safe: each compiles to a file of its own and renames it into
place."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"
SOURCES = ("selector_model.cpp", "selector_capi.cpp")
HEADERS = ("selector_model.h",)
FLAGS = ("-std=c++17", "-O2", "-shared", "-fPIC")
LIBRARY = "libtcsparse_selector.so"


def compiler() -> str:
    """The C++ compiler the library is built with: ``$CXX``, else ``c++``."""
    return os.environ.get("CXX", "c++")


def build_root() -> Path:
    root = os.environ.get("TCSPARSE_BUILD_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root) if root else Path.home() / ".cache" / "torch_extensions"


def library_path() -> Path:
    """Where the library for the current sources, compiler and flags lives (built or not)."""
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    digest.update("\0".join((compiler(),) + FLAGS).encode())
    return build_root() / f"tcsparse_selector_{digest.hexdigest()[:16]}" / LIBRARY


def build() -> Path:
    """The library's path, compiled first if it is not cached yet."""
    path = library_path()
    if path.exists():
        return path
    cxx = compiler()
    if shutil.which(cxx) is None:
        raise RuntimeError(f"the kernel selector's cost model is C++ and needs a C++ compiler: {cxx!r} was not "
                           "found (install g++ or set CXX)")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(handle)
    try:
        command = [cxx, *FLAGS, *(str(CSRC / name) for name in SOURCES), "-o", partial]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the selector's cost model failed ({' '.join(command)}):\n{result.stderr}")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


if __name__ == "__main__":
    print(build())
