"""The build configuration shared by the build on first use and setup.py, and how the extension
chooses between the prebuilt module and the build on first use (CPU only: no module is built)."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from torch_tcsparse import _build_config as config
from torch_tcsparse import _ext
from torch_tcsparse.formats import native
from torch_tcsparse.selector import build as selector_build

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("value, expected", [
    (None, "8.0;9.0+PTX"),
    ("", "8.0;9.0+PTX"),
    ("9.0+PTX", "9.0+PTX"),
    ("9.0 8.0", "8.0;9.0"),
    ("8.0;8.6 ;9.0+PTX", "8.0;8.6;9.0+PTX"),
    ("Hopper", "9.0+PTX"),
    ("Ampere;Hopper", "8.0;8.6+PTX;9.0+PTX"),
    ("7.0;7.5;8.0;9.0+PTX", "8.0;9.0+PTX"),
    ("Turing Ada", "8.9+PTX"),
    ("9.0;9.0+PTX", "9.0+PTX"),
    ("9.0a;10.0", "9.0a;10.0"),
])
def test_arch_list(value, expected):
    environ = {} if value is None else {"TORCH_CUDA_ARCH_LIST": value}
    assert config.arch_list(environ) == expected


@pytest.mark.parametrize("value, message", [
    ("sm_90", "TORCH_CUDA_ARCH_LIST: cannot read 'sm_90'"),
    ("9", "TORCH_CUDA_ARCH_LIST: cannot read '9'"),
    ("native", "TORCH_CUDA_ARCH_LIST: cannot read 'native'"),
    ("9.0+ptx", "TORCH_CUDA_ARCH_LIST: cannot read '9.0+ptx'"),
    ("7.0;7.5+PTX", "compute capability 8.0 or newer, and '7.0;7.5+PTX' names none"),
])
def test_arch_list_rejects(value, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+").replace(".", r"\.")):
        config.arch_list({"TORCH_CUDA_ARCH_LIST": value})


def test_default_arch_list_ends_in_ptx():
    assert config.gencode_flags(config.DEFAULT_ARCH_LIST) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_gencode_flags_of_arch_specific_entries():
    assert config.gencode_flags("9.0a+PTX") == ["-gencode=arch=compute_90a,code=sm_90a",
                                                "-gencode=arch=compute_90a,code=compute_90a"]


@pytest.mark.parametrize("arches, capability, expected", [
    ("8.0;9.0+PTX", (8, 0), True),
    ("8.0;9.0+PTX", (8, 6), True),   # sm_80 machine code runs on 8.x
    ("8.0;9.0+PTX", (9, 0), True),
    ("8.0;9.0+PTX", (10, 0), True),  # through sm_90's PTX
    ("8.0;9.0+PTX", (12, 0), True),
    ("8.0;9.0", (10, 0), False),     # no PTX: nothing for a newer major version
    ("8.6", (8, 0), False),          # machine code does not run on an older minor version
    ("9.0+PTX", (8, 9), False),      # PTX does not run on an older GPU
    ("9.0a", (9, 0), True),
    ("9.0a+PTX", (10, 0), False),    # arch-specific code, PTX included, runs on its own GPU only
])
def test_covers(arches, capability, expected):
    assert config.covers(arches, capability) is expected


def test_covers_rejects_a_capability_that_is_not_a_pair():
    with pytest.raises(TypeError, match=r"capability must be a \(major, minor\) tuple of ints, got '9.0'"):
        config.covers("9.0", "9.0")


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("", "auto"), ("1", "on"), ("0", "off"), (" 1 ", "on")])
def test_build_mode(value, mode):
    assert config.build_mode({} if value is None else {"TCSPARSE_BUILD_CUDA": value}) == mode


def test_build_mode_rejects():
    with pytest.raises(ValueError, match="TCSPARSE_BUILD_CUDA must be 0, 1 or unset, got 'yes'"):
        config.build_mode({"TCSPARSE_BUILD_CUDA": "yes"})


def test_every_kernel_source_is_built():
    """Each C++/CUDA file in csrc is built by exactly one build: the kernels, the selector's model
    or the CPU conversion's passes."""
    on_disk = {path.name for path in config.CSRC.iterdir() if path.suffix in (".cu", ".cpp")}
    builds = [set(config.SOURCES), set(selector_build.SOURCES), set(native.CPU_PASSES.sources)]
    assert set().union(*builds) == on_disk
    assert sum(len(sources) for sources in builds) == len(on_disk)


def test_sources_digest_follows_sources_and_headers(tmp_path):
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for path in config.CSRC.iterdir():
        (csrc / path.name).write_bytes(path.read_bytes())
    assert config.sources_digest(csrc) == config.sources_digest()
    header = next(path for path in csrc.iterdir() if path.suffix == ".cuh")
    header.write_bytes(header.read_bytes() + b"\n")
    assert config.sources_digest(csrc) != config.sources_digest()


def test_build_config_imports_neither_torch_nor_the_package():
    """setup.py loads it by path in a build environment that may lack both."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('c', {str(ROOT / 'torch_tcsparse' / '_build_config.py')!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "assert module.SOURCES and module.arch_list() == '8.0;9.0+PTX'\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('torch', 'torch_tcsparse')))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environ)
    assert out.stdout.strip() == "[]"


def test_ext_reads_the_shared_sources():
    assert _ext.SOURCES is config.SOURCES


@pytest.fixture
def record(tmp_path, monkeypatch):
    """A prebuilt module's record, as it would fit this torch and these sources; the test edits it."""
    path = tmp_path / config.RECORD
    monkeypatch.setattr(_ext, "_RECORD_PATH", path)
    fields = {"torch": torch.__version__, "cuda": torch.version.cuda, "arch_list": "8.0;9.0+PTX",
              "sources": config.sources_digest()}

    def write(**changes):
        path.write_text(json.dumps({**fields, **changes}))

    return write


def test_fitting_prebuilt_module_serves(record, monkeypatch):
    module = types.ModuleType("torch_tcsparse._stand_in")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(_ext, "PREBUILT", "_stand_in")
    monkeypatch.setattr(_ext, "_module", None)
    record()
    assert _ext._prebuilt() == (module, None)
    assert _ext.load() is module and _ext.is_prebuilt(module)


def test_no_record_means_no_prebuilt_module(tmp_path, monkeypatch):
    monkeypatch.setattr(_ext, "_RECORD_PATH", tmp_path / config.RECORD)
    assert _ext._prebuilt() == (None, None)


@pytest.mark.parametrize("changes, reason", [
    ({"torch": "2.0.0+cu118"}, f"built for torch 2.0.0+cu118, this is torch {torch.__version__}"),
    ({"sources": "0" * 64}, "the kernel sources changed after the prebuilt kernels were built"),
    ({}, "the prebuilt kernels do not load (No module named 'torch_tcsparse._absent')"),
])
def test_prebuilt_module_that_does_not_fit(record, monkeypatch, changes, reason):
    monkeypatch.setattr(_ext, "PREBUILT", "_absent")  # an installed package may hold the real one
    record(**changes)
    module, why_not = _ext._prebuilt()
    assert module is None and reason in why_not


def test_unreadable_record(record, tmp_path):
    (tmp_path / config.RECORD).write_text("{")
    module, why_not = _ext._prebuilt()
    assert module is None and "record" in why_not and "unreadable" in why_not


def test_prebuilt_module_without_code_for_the_gpu(record, monkeypatch):
    record(arch_list="8.0;9.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (10, 0))
    module, why_not = _ext._prebuilt()
    assert module is None
    assert why_not == "the prebuilt kernels hold code for 8.0;9.0, none of it for this GPU (compute capability 10.0)"


def test_build_error_says_why_the_prebuilt_module_does_not_serve(record, monkeypatch):
    from torch.utils import cpp_extension

    record(torch="2.0.0+cu118")
    monkeypatch.setattr(_ext, "_module", None)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    with pytest.raises(RuntimeError, match=r"needs nvcc to build its CUDA kernels.*; the prebuilt kernels were built for torch 2\.0\.0"):
        _ext.load()


def test_build_error_without_prebuilt_module_is_unchanged(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(_ext, "_RECORD_PATH", tmp_path / config.RECORD)
    monkeypatch.setattr(_ext, "_module", None)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    with pytest.raises(RuntimeError, match=r"\(set CUDA_HOME or put nvcc on PATH\); the CPU path works without it$"):
        _ext.load()


def run_setup(build_cuda):
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    environ["TCSPARSE_BUILD_CUDA"] = build_cuda
    return subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True,
                          env=environ)


@pytest.mark.slow
@pytest.mark.skipif(torch.version.cuda is not None, reason="checks setup.py's answer to a CPU build of torch")
def test_setup_with_cpu_torch():
    auto = run_setup("")
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.strip().splitlines()[-1] == "0.1.0"
    assert f"installing without prebuilt CUDA kernels: torch {torch.__version__} is not a CUDA build" in auto.stderr
    required = run_setup("1")
    assert required.returncode != 0
    assert f"TCSPARSE_BUILD_CUDA=1, but the CUDA kernels cannot be built: torch {torch.__version__} is not a CUDA build" \
        in required.stderr
    assert run_setup("0").returncode == 0


def test_setup_rejects_an_unknown_mode():
    out = run_setup("yes")
    assert out.returncode != 0 and "TCSPARSE_BUILD_CUDA must be 0, 1 or unset, got 'yes'" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="what the command says on a machine without a GPU")
def test_the_kernels_command_ends_in_one_line_without_them():
    run = subprocess.run([sys.executable, "-m", "torch_tcsparse"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1 and lines[0].startswith("torch_tcsparse: no CUDA kernels: "), lines
