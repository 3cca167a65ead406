"""The selector's C++ cost model (``csrc/selector_model.cpp`` and its C ABI,
``csrc/selector_capi.cpp``) as a shared library, built on first use by ``native_build``."""
from __future__ import annotations

from pathlib import Path

from .. import native_build

SOURCES = ("selector_model.cpp", "selector_capi.cpp")
HEADERS = ("selector_model.h",)
LIBRARY = "libtcsparse_selector.so"
MODEL = native_build.Library(LIBRARY, SOURCES, HEADERS, "the kernel selector's cost model")


def library_path() -> Path:
    """Where the library for the current sources, compiler and flags lives (built or not)."""
    return native_build.library_path(MODEL)


def build() -> Path:
    """The library's path, compiled first if it is not cached yet."""
    return native_build.build(MODEL)


if __name__ == "__main__":
    print(build())
