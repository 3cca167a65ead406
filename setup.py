"""Packaging of torch_tcsparse: pyproject.toml holds the metadata; this file adds the CUDA kernels.

With a CUDA build of torch and nvcc in the build environment, the kernels are compiled into the
package as ``torch_tcsparse._kernels`` for ``$TORCH_CUDA_ARCH_LIST`` (default
``_build_config.DEFAULT_ARCH_LIST``). pip builds in an isolated environment without torch unless
told otherwise, so a build with the kernels runs without it::

    pip install --no-build-isolation .
    python -m build --wheel --no-isolation

Without torch, with a CPU build of torch or without nvcc, the package is pure Python and builds
its kernels on first use; where nvcc is found all the same (an isolated build), the build says so
in a banner. Editable installs build them on first use too (they follow the sources
as they change). ``TCSPARSE_BUILD_CUDA=1`` makes the build required (also for editable installs),
``TCSPARSE_BUILD_CUDA=0`` skips it.
"""
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def build_config():
    """``torch_tcsparse/_build_config.py``, loaded by its path: importing the package would import
    torch and the package's needs, which the build environment need not have."""
    spec = importlib.util.spec_from_file_location("torch_tcsparse_build_config", ROOT / "torch_tcsparse" / "_build_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def why_no_cuda_build():
    """None when this environment can compile the kernels, else why not."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return "torch is not importable here (build with --no-build-isolation)"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    if cpp_extension.CUDA_HOME is None or shutil.which(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")) is None:
        return "nvcc was not found (set CUDA_HOME or put nvcc on PATH)"
    if not os.path.isfile(os.path.join(cpp_extension.CUDA_HOME, "include", "cuda_runtime.h")):
        return f"CUDA_HOME={cpp_extension.CUDA_HOME} holds no include/cuda_runtime.h (set CUDA_HOME to the CUDA toolkit)"
    return None


def cuda_build(config, mode):
    """The kernels' extension and the build command that compiles it and writes its record."""
    import torch
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    arches = config.arch_list()
    csrc = config.CSRC.relative_to(ROOT)
    extension = CUDAExtension(
        name=f"torch_tcsparse.{config.PREBUILT}",
        sources=[str(csrc / name) for name in config.SOURCES],
        include_dirs=[str(ROOT / csrc)],
        extra_compile_args={"cxx": list(config.CXX_FLAGS),
                            "nvcc": [*config.NVCC_FLAGS, *config.gencode_flags(arches)]},
    )
    record = {"torch": torch.__version__, "cuda": torch.version.cuda, "arch_list": arches,
              "sources": config.sources_digest()}

    class BuildKernels(BuildExtension):
        def skipped(self):
            """Editable installs build on first use, unless the build is required."""
            return mode == "auto" and (self.inplace or getattr(self, "editable_mode", False))

        def run(self):
            if self.skipped():
                print("torch_tcsparse: editable install: the CUDA kernels are built on first use", file=sys.stderr)
                return
            print(f"torch_tcsparse: compiling the CUDA kernels for {arches}", file=sys.stderr)
            super().run()
            if self.inplace:
                self.write_record(self.get_ext_fullpath(extension.name))

        def build_extension(self, ext):
            super().build_extension(ext)
            self.write_record(self.get_ext_fullpath(ext.name))

        def get_outputs(self):
            if self.skipped():
                return []
            modules = super().get_outputs()
            return [*modules, *(str(Path(path).with_name(config.RECORD)) for path in modules)]

        def get_output_mapping(self):
            return {} if self.skipped() else super().get_output_mapping()

        def write_record(self, module_path):
            Path(module_path).with_name(config.RECORD).write_text(json.dumps(record, indent=1) + "\n")

    return [extension], {"build_ext": BuildKernels}


def main():
    config = build_config()
    mode = config.build_mode()
    extensions, commands = [], {}
    if mode != "off":
        why_not = why_no_cuda_build()
        if why_not is None:
            extensions, commands = cuda_build(config, mode)
        elif mode == "on":
            sys.exit(f"torch_tcsparse: {config.BUILD_ENV}=1, but the CUDA kernels cannot be built: {why_not}")
        else:
            print(f"torch_tcsparse: installing without prebuilt CUDA kernels: {why_not}", file=sys.stderr)
            if cuda_toolkit_here():
                print(NO_KERNELS_ON_A_CUDA_MACHINE.format(why_not=why_not, env=config.BUILD_ENV), file=sys.stderr)
    setup(ext_modules=extensions, cmdclass=commands)


# Said where nvcc is found yet the kernels are not built: most often pip's or build's isolated
# environment, which has no torch, so that the wheel quietly goes without the kernels.
NO_KERNELS_ON_A_CUDA_MACHINE = """\
torch_tcsparse: ************************************************************************
torch_tcsparse: WARNING: this machine has nvcc, but this build holds NO compiled CUDA kernels:
torch_tcsparse: {why_not}. To compile them in, build against an installed CUDA build
torch_tcsparse: of torch, without isolation:
torch_tcsparse:     pip wheel --no-deps --no-build-isolation -w dist .
torch_tcsparse:     python -m build --wheel --no-isolation
torch_tcsparse: Without them the kernels are compiled on first use on the GPU machine (nvcc and
torch_tcsparse: ninja needed there). {env}=0 builds pure Python without this warning,
torch_tcsparse: {env}=1 makes a build without the kernels fail.
torch_tcsparse: ************************************************************************"""


def cuda_toolkit_here():
    """Whether the CUDA toolkit's nvcc is on this machine (on PATH, under $CUDA_HOME or
    /usr/local/cuda), found without torch."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return shutil.which("nvcc") is not None or any(home and os.path.isfile(os.path.join(home, "bin", "nvcc"))
                                                   for home in homes)


main()
