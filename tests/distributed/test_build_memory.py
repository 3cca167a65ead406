"""The build-memory benchmark on a small graph (it measures CUDA memory: GPU only)."""
import pytest
import torch

from benchmarks import build_memory


def test_build_memory_phases(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("build_memory measures CUDA memory: no GPU here")
    build_memory.main(["--scale", "12", "--out", str(tmp_path)])
    text = (tmp_path / "build_memory.csv").read_text()
    for phase in ("canonical CSR", "structure", "TCSparseTensor.from_csr", "transpose", "GraphPart.from_rows"):
        assert phase in text


def test_build_memory_arguments():
    with pytest.raises(SystemExit, match=r"--scale must be in \[1, 30\], got 0"):
        build_memory.parse_args(["--scale", "0"])
