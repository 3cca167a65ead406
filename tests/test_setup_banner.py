"""setup.py on a machine with nvcc but no way to build the kernels (an isolated build, which has no
torch): the build output says so in a banner, not in one line among hundreds; with
TCSPARSE_BUILD_CUDA=0, a pure-Python build by choice, it says nothing of the kind."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def setup_without_torch(tmp_path: Path, build_cuda: str) -> subprocess.CompletedProcess:
    """``setup.py --version`` where ``import torch`` fails (as in pip's isolated build environment)
    and an nvcc is on PATH."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch in this environment')\n")
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(0o755)
    environ = dict(os.environ, PYTHONPATH=str(tmp_path), PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                   TCSPARSE_BUILD_CUDA=build_cuda)
    return subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True,
                          env=environ, timeout=300)


@pytest.mark.slow
def test_an_isolated_build_on_a_cuda_machine_says_it_has_no_kernels(tmp_path):
    result = setup_without_torch(tmp_path, "")
    assert result.returncode == 0, result.stderr
    assert "WARNING: this machine has nvcc, but this build holds NO compiled CUDA kernels" in result.stderr
    assert "torch is not importable here (build with --no-build-isolation)" in result.stderr
    assert "pip wheel --no-deps --no-build-isolation -w dist ." in result.stderr
    pure = tmp_path / "pure"
    pure.mkdir()
    chosen = setup_without_torch(pure, "0")
    assert chosen.returncode == 0 and "WARNING" not in chosen.stderr, chosen.stderr
