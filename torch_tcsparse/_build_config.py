"""What the CUDA kernels are built from and for which GPUs: the one list of sources and flags that
both builds read, ``_ext`` (on first use) and ``setup.py`` (into the package at install). setup.py
loads this file by its path, before the package or torch can be imported, so it imports neither.

The GPUs come from ``$TORCH_CUDA_ARCH_LIST`` as torch spells it (``"8.0;9.0+PTX"``, spaces or
semicolons, ``+PTX`` for portable code that the driver compiles for newer GPUs, torch's family
names such as ``Hopper``), else ``DEFAULT_ARCH_LIST``."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (
    "bindings.cpp",
    "python_module.cpp",
    "csr_rows_binding.cpp",
    "split_sums.cpp",
    "grouped_binding.cpp",
    "reduce_rows_binding.cpp",
    "attention_binding.cpp",
    "kernels_f32.cu",
    "kernels_f16.cu",
    "kernels_bf16.cu",
    "metcf_convert.cu",
    "sampled_columns.cu",
    "row_scale.cu",
    "csr_rows_spmm.cu",
    "csr_rows_scatter.cu",
    "grouped_spmm.cu",
    "reduce_rows.cu",
    "reduce_rows_backward.cu",
    "attention.cu",
    "edge_softmax.cu",
)
# The module built on first use (in torch's extension cache) and the one built into the package.
NAME = "tcsparse_kernels"
PREBUILT = "_kernels"
# Written beside the prebuilt module: what it was built with, so that a different torch, changed
# sources or a GPU it holds no code for fall back to the build on first use.
RECORD = "_kernels_build.json"

# -g0: setuptools compiles with Python's own flags, -g among them, whose host debug information
# would weigh about as much as the kernels in a wheel.
CXX_FLAGS = ("-O3", "-g0")
NVCC_FLAGS = ("-O3", "-lineinfo")

# sm_80 (A100) and sm_90 (H100/H200) machine code, and sm_90's PTX, which the driver compiles for
# any newer GPU. mma.sync with TF32 and BF16 needs sm_80 at least: older entries are left out.
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"
OLDEST = (8, 0)
ARCH_ENV = "TORCH_CUDA_ARCH_LIST"
BUILD_ENV = "TCSPARSE_BUILD_CUDA"

# torch.utils.cpp_extension's names, so that a list written for other extensions reads the same.
NAMED_ARCHES = {
    "Kepler+Tesla": "3.7",
    "Kepler": "3.5+PTX",
    "Maxwell+Tegra": "5.3",
    "Maxwell": "5.0;5.2+PTX",
    "Pascal": "6.0;6.1+PTX",
    "Volta+Tegra": "7.2",
    "Volta": "7.0+PTX",
    "Turing": "7.5+PTX",
    "Ampere+Tegra": "8.7",
    "Ampere": "8.0;8.6+PTX",
    "Ada": "8.9+PTX",
    "Hopper": "9.0+PTX",
    "Blackwell+Tegra": "11.0",
    "Blackwell": "10.0;10.3;12.0;12.1+PTX",
}
_ENTRY = re.compile(r"(\d+)\.(\d+)([af]?)(\+PTX)?")


def arch_list(environ=None) -> str:
    """The architecture list to build for, normalized (``"8.0;9.0+PTX"``): ``$TORCH_CUDA_ARCH_LIST``
    if set, else ``DEFAULT_ARCH_LIST``. ValueError names the variable for an entry it cannot read
    or a list with nothing at 8.0 or newer."""
    environ = os.environ if environ is None else environ
    value = environ.get(ARCH_ENV, "").strip()
    if not value:
        return DEFAULT_ARCH_LIST
    return _normalize(value, ARCH_ENV)


def _normalize(value: str, source: str) -> str:
    words = [word for word in re.split(r"[;\s]+", value) if word]
    entries = {}
    for word in words:
        for entry in NAMED_ARCHES.get(word, word).split(";"):
            match = _ENTRY.fullmatch(entry)
            if match is None:
                raise ValueError(
                    f"{source}: cannot read {entry!r} in {value!r}; write entries such as 8.0, 9.0a or "
                    f"9.0+PTX, or one of {', '.join(NAMED_ARCHES)}"
                )
            major, minor, suffix, ptx = int(match[1]), int(match[2]), match[3], bool(match[4])
            if (major, minor) < OLDEST:
                continue
            key = (major, minor, suffix)
            entries[key] = entries.get(key, False) or ptx
    if not entries:
        raise ValueError(
            f"{source}: the kernels need compute capability {OLDEST[0]}.{OLDEST[1]} or newer, "
            f"and {value!r} names none"
        )
    return ";".join(f"{major}.{minor}{suffix}{'+PTX' if ptx else ''}" for (major, minor, suffix), ptx in sorted(entries.items()))


def _entries(normalized: str):
    for entry in normalized.split(";"):
        match = _ENTRY.fullmatch(entry)
        yield int(match[1]), int(match[2]), match[3], bool(match[4])


def gencode_flags(normalized: str) -> list[str]:
    """nvcc's ``-gencode`` flags for a list from ``arch_list``: machine code for each entry and
    PTX for those marked ``+PTX``. Passing them keeps torch from adding its own."""
    flags = []
    for major, minor, suffix, ptx in _entries(normalized):
        number = f"{major}{minor}{suffix}"
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return flags


def covers(normalized: str, capability: tuple[int, int]) -> bool:
    """Whether code built for a list from ``arch_list`` runs on a GPU of this compute capability:
    machine code runs on its own major version at the same or a higher minor one (``a`` code on
    its exact GPU only), PTX on any GPU at least as new (``a`` PTX again on its exact GPU only)."""
    if not (isinstance(capability, tuple) and len(capability) == 2 and all(isinstance(c, int) for c in capability)):
        raise TypeError(f"capability must be a (major, minor) tuple of ints, got {capability!r}")
    for major, minor, suffix, ptx in _entries(normalized):
        if suffix == "a":
            if (major, minor) == capability:
                return True
        elif major == capability[0] and minor <= capability[1]:
            return True
        elif ptx and suffix == "" and (major, minor) <= capability:
            return True
    return False


def build_mode(environ=None) -> str:
    """``$TCSPARSE_BUILD_CUDA``: "auto" when unset or empty (build into the package when torch is a
    CUDA build and nvcc is found), "on" for 1 (build or fail), "off" for 0 (pure Python)."""
    environ = os.environ if environ is None else environ
    value = environ.get(BUILD_ENV, "").strip()
    modes = {"": "auto", "1": "on", "0": "off"}
    if value not in modes:
        raise ValueError(f"{BUILD_ENV} must be 0, 1 or unset, got {value!r}")
    return modes[value]


def sources_digest(csrc: Path = CSRC) -> str:
    """A hash of the sources and every header in ``csrc``: a prebuilt module whose digest differs
    was built from other sources."""
    digest = hashlib.sha256()
    headers = sorted(path.name for path in csrc.iterdir() if path.suffix in (".h", ".cuh"))
    for name in (*SOURCES, *headers):
        digest.update(name.encode() + b"\0" + (csrc / name).read_bytes() + b"\0")
    return digest.hexdigest()
