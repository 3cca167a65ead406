"""RoDe (Pang et al., "RoDe: a row decomposition-based approach for sparse matrix multiplication
on GPUs", PPoPP'24; github.com/CRAFT-THU/RoDe) as a peer of the SpMM benchmarks.

RoDe's code carries no license, so none of it is in this repository: ``get_rode.sh`` clones it
at a pinned commit into the git-ignored ``third_party/RoDe`` (or ``$RODE_DIR``), and our binding
(``rode_binding.cu``), which includes the clone's ``RoDe_SpMM/RoDeSpmm.cu``, is compiled from it.
``<cstdint>`` is force-included: the clone's headers use fixed-width integers without including
it, which newer compilers reject. ``--use_fast_math -O3`` are the flags of RoDe's own build.

Two ways to a module. ``python -m benchmarks.peers.rode --build`` compiles it once into the
git-ignored ``third_party/rode_build`` (or ``$RODE_BUILD``), stripped, with a record of the torch,
Python and binding source it was built for and its GPU architectures (``$TORCH_CUDA_ARCH_LIST``,
default 9.0): a machine without the clone, a compiler or a network runs that folder as it is,
when the record matches it. Without a matching module, ``extension()`` compiles the binding from
the clone with ``torch.utils.cpp_extension.load`` (torch's extension cache).

RoDe cuts every row into segments of 512 nonzeros (aligned down to 4-element vectors), runs the
segments of at least one 32-nonzero block in one kernel and the rest of each row in a residue
kernel on a second stream; both add into Y with atomics, so every call zeroes Y first (timed with
it). Its float32 kernels come for N = 32 and for 64 columns per block (its "n128" variant), which
serves any multiple of 64. Float32 only, exact (no TF32): it has no other. Its kernels address X
and Y by 32-bit offsets (bytes into X, elements into Y): a product whose X passes 2 GiB, or whose
Y passes 2^31 elements, is out of its range (``out_of_range``); the binding refuses it, since RoDe
then reads outside X and returns wrong sums or faults.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CLONE = Path(os.environ.get("RODE_DIR", HERE / "third_party" / "RoDe"))
BUILD = Path(os.environ.get("RODE_BUILD", HERE / "third_party" / "rode_build"))
BINDING = HERE / "rode_binding.cu"
NAME = "tcsparse_rode_peer"
FLAGS = ("-O3", "--use_fast_math", "-include", "cstdint", "--expt-relaxed-constexpr")
# The segmentation RoDe's evaluation asks of its preprocessing (RowDivide2Segment(512, 4, 32)).
SEGMENT = 512
VECTOR = 4
BLOCK = 32
INT32_MAX = 2**31 - 1


def pinned_commit() -> str:
    """The commit ``get_rode.sh`` checks out (the one the binding was written against)."""
    found = re.search(r"^COMMIT=([0-9a-f]{40})$", (HERE / "get_rode.sh").read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError("get_rode.sh names no COMMIT")
    return found.group(1)


def binding_digest() -> str:
    return hashlib.sha256(BINDING.read_bytes()).hexdigest()[:16]


def runtime_record() -> dict:
    """What a prebuilt module must have been built for: the running torch and Python, and the
    binding's source as it is now."""
    return {"torch": torch.__version__, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "binding": binding_digest()}


def prebuilt_problem(folder: Path = BUILD) -> str | None:
    """Why the module in ``folder`` cannot serve this process, or None."""
    library, record_path = folder / f"{NAME}.so", folder / f"{NAME}.json"
    if not library.is_file() or not record_path.is_file():
        return f"no prebuilt module in {folder} (python -m benchmarks.peers.rode --build makes one)"
    record = json.loads(record_path.read_text())
    for key, wanted in runtime_record().items():
        if record.get(key) != wanted:
            return f"the module in {folder} was built for {key} {record.get(key)}, this process has {wanted}"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if f"{major}.{minor}" not in record.get("arch", []):
            return f"the module in {folder} holds code for sm {record.get('arch')}, this GPU is {major}.{minor}"
    return None


def unavailable() -> str | None:
    """Why RoDe cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    prebuilt = prebuilt_problem()
    if prebuilt is None:
        return None
    if not (CLONE / "RoDe_SpMM" / "RoDeSpmm.cu").is_file():
        return f"{prebuilt}; no clone of RoDe in {CLONE} to build one (benchmarks/peers/get_rode.sh makes one)"
    if shutil.which("nvcc") is None and "CUDA_HOME" not in os.environ:
        return f"{prebuilt}; no CUDA compiler (nvcc) on the PATH to build one"
    return None


def load_prebuilt(folder: Path = BUILD):
    """The module in ``folder``, imported as it is (torch, imported above, has loaded the
    libraries it links: c10, torch, the CUDA runtime)."""
    import importlib.machinery
    import importlib.util

    path = folder / f"{NAME}.so"
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def gencode_flags(arch_list: str) -> list[str]:
    """nvcc's -gencode flags for a TORCH_CUDA_ARCH_LIST string ("9.0", "8.0;9.0+PTX")."""
    flags = []
    for entry in re.split(r"[;\s]+", arch_list.strip()):
        if not entry:
            continue
        number = entry.removesuffix("+PTX").replace(".", "")
        if not number.isdigit():
            raise ValueError(f"not an architecture: {entry!r} of {arch_list!r}")
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if entry.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    if not flags:
        raise ValueError(f"no architecture in {arch_list!r}")
    return flags


# libstdc++'s headers, on a glibc of 2.32 or later, read glibc's __libc_single_threaded to skip
# atomics in a process without threads: a module compiled there needs glibc 2.32 to load, where
# torch's wheels need 2.28. The module carried to other machines holds its own copy, hidden, at 0
# ("threads may run"), so its reference counts are always atomic, as they must be beside torch's
# threads anyway.
PORTABLE_GLIBC = 'extern "C" __attribute__((visibility("hidden"))) char __libc_single_threaded = 0;\n'


def _compile(build_directory: str | None = None, arch_list: str | None = None, verbose: bool = False,
             extra_sources: tuple = ()):
    from torch.utils.cpp_extension import load

    cflags = list(FLAGS) + (gencode_flags(arch_list) if arch_list else [])
    options = {"build_directory": build_directory} if build_directory else {}
    return load(name=NAME, sources=[str(BINDING), *map(str, extra_sources)],
                extra_include_paths=[str(CLONE / "RoDe_SpMM"), str(CLONE / "utils")], extra_cuda_cflags=cflags,
                verbose=verbose, **options)


def build(folder: Path = BUILD, arch_list: str | None = None, verbose: bool = False) -> Path:
    """Compile the binding from the clone into ``folder``: the module, stripped of its symbol
    tables (it is carried to machines that only run it), and the record ``prebuilt_problem``
    checks. Needs the clone at the pinned commit and nvcc, not a GPU."""
    commit = subprocess.run(["git", "-C", str(CLONE), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if commit != pinned_commit():
        raise SystemExit(f"the clone in {CLONE} is at {commit or 'no commit'}, the binding was written against "
                         f"{pinned_commit()}: run benchmarks/peers/get_rode.sh")
    arch_list = arch_list or os.environ.get("TORCH_CUDA_ARCH_LIST") or "9.0"
    folder.mkdir(parents=True, exist_ok=True)
    objects = folder / "objects"
    if objects.exists():
        shutil.rmtree(objects)
    objects.mkdir()
    portable = objects / "portable_glibc.cpp"
    portable.write_text(PORTABLE_GLIBC)
    _compile(str(objects), arch_list, verbose, (portable,))
    library = folder / f"{NAME}.so"
    shutil.copyfile(objects / f"{NAME}.so", library)
    shutil.rmtree(objects)
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", str(library)], check=True)
    record = {**runtime_record(), "cuda": torch.version.cuda,
              "arch": [entry.removesuffix("+PTX") for entry in re.split(r"[;\s]+", arch_list.strip()) if entry],
              "arch_list": arch_list, "rode_commit": commit}
    (folder / f"{NAME}.json").write_text(json.dumps(record, indent=1) + "\n")
    return library


@functools.lru_cache(maxsize=None)
def extension():
    """The binding's module: the prebuilt one where its record matches, else compiled from the
    clone."""
    if prebuilt_problem() is None:
        return load_prebuilt()
    return _compile()


def out_of_range(num_rows: int, num_cols: int, n: int) -> str | None:
    """Why RoDe cannot multiply a ``num_rows`` x ``num_cols`` matrix by N = ``n`` columns, or
    None: N other than 32 or a multiple of 64 (its kernels' widths), or X or Y past its 32-bit
    offsets (the binding's ``out_of_range``, mirrored to say so without a build)."""
    if not (n == 32 or (n > 0 and n % 64 == 0)):
        return f"N = {n}: RoDe's kernels take N = 32 or a multiple of 64"
    if (num_cols - 1) * n * 4 > INT32_MAX:
        return (f"X of {num_cols} x {n} floats ({num_cols * n * 4 / 2**30:.2f} GiB) is past RoDe's 32-bit byte "
                f"offsets into X (2 GiB)")
    if num_rows * n > INT32_MAX:
        return f"Y of {num_rows} x {n} floats is past RoDe's 32-bit element offsets into Y"
    return None


def segments(rowptr: torch.Tensor):
    """RoDe's row decomposition of a CSR: (segment rows, segment starts with the end appended,
    residue rows), int32 on ``rowptr``'s device. A row's length counts the nonzeros before its
    start back to a 4-element boundary; its full 512-nonzero segments start at the row (the first)
    and on the boundaries after it; the rest is a segment when it holds a 32-nonzero block, and a
    residue row when it does not divide into blocks."""
    if not isinstance(rowptr, torch.Tensor) or rowptr.dim() != 1 or rowptr.numel() == 0:
        raise ValueError(f"rowptr must be a non-empty 1-D tensor, got {rowptr!r}")
    rowptr = rowptr.long()
    offset = rowptr[:-1]
    misalign = offset % VECTOR
    padded = rowptr[1:] - offset + misalign
    full = torch.where(padded > SEGMENT, (padded + SEGMENT - 1) // SEGMENT - 1, torch.zeros_like(padded))
    rest = padded - full * SEGMENT
    count = full + (rest >= BLOCK).long()
    rows = torch.arange(offset.numel(), device=rowptr.device).repeat_interleave(count)
    first = torch.cumsum(count, 0) - count
    index = torch.arange(rows.numel(), device=rowptr.device) - first.repeat_interleave(count)
    starts = offset[rows] + index * SEGMENT - torch.where(index > 0, misalign[rows], torch.zeros_like(index))
    starts = torch.cat([starts, rowptr[-1:]])
    residue = torch.nonzero((rest > 0) & (rest % BLOCK != 0)).flatten()
    return rows.int(), starts.int(), residue.int()


class RoDe:
    """``RoDe(rowptr, col, values, num_cols)(x)``: A @ X through RoDe's kernels, float32, on a CUDA
    device. ``past_range`` runs products past RoDe's 32-bit offsets too (to show what it returns
    there: wrong sums or a fault, which ends the process's CUDA context)."""

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, num_cols: int | None = None,
                 past_range: bool = False):
        if not (rowptr.is_cuda and col.is_cuda and values.is_cuda):
            raise ValueError("RoDe runs on a CUDA device: rowptr, col and values must be CUDA tensors")
        if col.numel() != values.numel() or int(rowptr[-1]) != col.numel():
            raise ValueError(f"a CSR of {int(rowptr[-1])} nonzeros needs as many columns and values, "
                             f"got {col.numel()} and {values.numel()}")
        self.module = extension()
        # Vector loads of a row's last nonzeros may reach past the arrays' end: a few zeros after.
        tail = 2 * VECTOR
        self.values = torch.cat([values.float(), values.new_zeros(tail, dtype=torch.float32)]).contiguous()
        self.col = torch.cat([col.int(), col.new_zeros(tail, dtype=torch.int32)]).contiguous()
        self.rowptr = rowptr.int().contiguous()
        self.segment_rows, self.segment_starts, self.residue_rows = segments(rowptr)
        self.num_rows = rowptr.numel() - 1
        self.num_cols = num_cols if num_cols is not None else (int(col.max()) + 1 if col.numel() else 0)
        self.past_range = past_range
        self._out = {}

    def refusal(self, n: int) -> str | None:
        """Why RoDe does not multiply this matrix by N = ``n`` columns, or None. ``past_range``
        lifts the range of its offsets, not the widths its kernels come in."""
        reason = out_of_range(self.num_rows, self.num_cols, n)
        if reason and self.past_range and out_of_range(0, 0, n) is None:
            return None
        return reason

    def supports(self, n: int) -> bool:
        return self.refusal(n) is None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not x.is_cuda or x.dim() != 2 or out_of_range(0, 0, x.shape[1]):
            raise ValueError(f"x must be a CUDA float32 matrix of 32 or a multiple of 64 columns, got "
                             f"{x.dtype} {tuple(x.shape)} on {x.device}")
        n = x.shape[1]
        y = self._out.get(n)
        if y is None:
            y = self._out[n] = torch.empty(self.num_rows, n, device=x.device)
        y.zero_()
        self.module.spmm(self.values, self.col, self.rowptr, self.segment_rows, self.residue_rows,
                         self.segment_starts, x.contiguous(), y, self.past_range)
        return y


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build RoDe's binding into a folder, or say whether it serves here.")
    parser.add_argument("--build", action="store_true", help="compile the binding from the clone (needs nvcc, not a GPU)")
    parser.add_argument("--folder", default=str(BUILD), help="where the module and its record go (default: %(default)s)")
    parser.add_argument("--arch", default=None, help="TORCH_CUDA_ARCH_LIST for the build (default: its value, else 9.0)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if args.build:
        library = build(folder, args.arch, args.verbose)
        print(f"{library} ({library.stat().st_size / 2**20:.1f} MiB)")
    problem = prebuilt_problem(folder)
    if problem:
        raise SystemExit(problem)
    module = load_prebuilt(folder)
    record = json.loads((folder / f"{NAME}.json").read_text())
    print(f"module {module.__name__} loads: built for torch {record['torch']}, CUDA {record['cuda']}, Python "
          f"{record['python']}, sm {', '.join(record['arch'])}, RoDe {record['rode_commit'][:10]}")


if __name__ == "__main__":
    main()
