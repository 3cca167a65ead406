"""Build of plain C++ sources of ``csrc`` (no torch or CUDA headers) into a shared library loaded
with ctypes, on first use: the kernel selector's cost model, the CPU conversion's passes.

The build takes seconds with the system's compiler (``$CXX``, else ``c++``) and needs no GPU. A
library is cached under ``$TCSPARSE_BUILD_DIR`` if set, else torch's extension cache
(``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``), in a folder named by a hash of its
sources, the compiler and its flags: a change rebuilds it. Two processes building at once are
safe: each compiles to a file of its own and renames it into place."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
FLAGS = ("-std=c++17", "-O2", "-shared", "-fPIC", "-pthread")


@dataclass(frozen=True)
class Library:
    """One shared library: its file name, the sources compiled into it and the headers they read
    (all in ``csrc``), and what it is, for error messages."""

    name: str
    sources: tuple[str, ...]
    headers: tuple[str, ...]
    purpose: str


def compiler() -> str:
    """The C++ compiler the libraries are built with: ``$CXX``, else ``c++``."""
    return os.environ.get("CXX", "c++")


def build_root() -> Path:
    root = os.environ.get("TCSPARSE_BUILD_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root) if root else Path.home() / ".cache" / "torch_extensions"


def library_path(library: Library) -> Path:
    """Where ``library`` for the current sources, compiler and flags lives (built or not)."""
    digest = hashlib.sha256()
    for name in library.sources + library.headers:
        digest.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    digest.update("\0".join((compiler(),) + FLAGS).encode())
    stem = library.name.removeprefix("lib").removesuffix(".so")
    return build_root() / f"{stem}_{digest.hexdigest()[:16]}" / library.name


def build(library: Library) -> Path:
    """The path of ``library``, compiled first if it is not cached yet. RuntimeError where no
    compiler is found or the build fails."""
    path = library_path(library)
    if path.exists():
        return path
    cxx = compiler()
    if shutil.which(cxx) is None:
        raise RuntimeError(f"{library.purpose} is C++ and needs a C++ compiler: {cxx!r} was not found "
                           "(install g++ or set CXX)")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(handle)
    try:
        command = [cxx, *FLAGS, *(str(CSRC / name) for name in library.sources), "-o", partial]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building {library.purpose} failed ({' '.join(command)}):\n{result.stderr}")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path
