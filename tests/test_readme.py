"""The README's Python snippets run as written (on the CPU here, on the GPU where there is one),
the modules its commands name exist, and its commands end on a CPU machine in results or in a few
lines saying what to run instead."""
import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index, monkeypatch):
    if "torch_tcsparse.nn" in SNIPPETS[index]:
        pytest.importorskip("torch_geometric", reason="torch_tcsparse.nn needs PyG (the [pyg] extra)")
    # A module of its own, importable as a script's is: torch.compile imports the module of the
    # function it compiles.
    module = types.ModuleType("readme")
    monkeypatch.setitem(sys.modules, "readme", module)
    exec(compile(SNIPPETS[index], f"README.md snippet {index}", "exec"), module.__dict__)


def test_commands_name_existing_modules():
    modules = set(re.findall(r"python -m ([\w.]+)", README)) - {"pytest"}
    assert {"examples.gcn.train", "benchmarks.gcn"} <= modules
    missing = [name for name in sorted(modules) if importlib.util.find_spec(name) is None]
    assert not missing, f"README names modules that do not exist: {missing}"


def test_no_paths_outside_the_repository():
    assert "../" not in README


# Where each module the README runs is run in a cheap form, on the CPU: every README command ends,
# on a machine without a GPU, in results or in at most three lines that say what is missing and
# what to run instead. A module the README gains needs a line here.
COMMAND_TESTS = {
    "benchmarks.compiled": "test_readme.py (no GPU: CPU_REFUSALS); tests/examples/test_compiled_benchmark.py",
    "benchmarks.distributed": "tests/distributed/",
    "benchmarks.gcn": "test_readme.py (no GPU: CPU_REFUSALS); tests/examples/test_gcn_benchmark.py (--quick)",
    "benchmarks.batch": "tests/test_batch_benchmark.py",
    "benchmarks.layers": "tests/nn/test_layers_benchmark_parts.py",
    "benchmarks.selector": "tests/test_selector.py (--first-choice without a GPU)",
    "benchmarks.spmm": "tests/test_batch_benchmark.py and the GPU check",
    "examples.gcn.blocks": "tests/examples/test_blocks.py",
    "examples.gcn.train": "tests/examples/test_train.py",
    "examples.sage.train": "tests/examples/test_sage.py",
    "torch_tcsparse": "tests/test_build.py (test_the_kernels_command_ends_in_one_line_without_them)",
    "torch_tcsparse.selector.calibrate": "test_readme.py (CPU_REFUSALS, test_calibrate_reads_the_default_run)",
}


def test_every_command_module_has_a_cheap_run():
    modules = set(re.findall(r"python -m ([\w.]+)", README)) - {"pytest"}
    assert modules <= set(COMMAND_TESTS), f"README commands without a cheap run: {sorted(modules - set(COMMAND_TESTS))}"


# README commands that need what a CPU machine lacks (a GPU, a measured run): as the README gives
# them, each must stop in at most three lines naming the command to run instead.
CPU_REFUSALS = {
    "python -m benchmarks.gcn": "python -m benchmarks.gcn --quick",
    "python -m benchmarks.compiled": "python -m benchmarks.compiled --device cpu --backend aot_eager",
    "python -m torch_tcsparse.selector.calibrate": "python -m benchmarks.selector",
}


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what the commands say on a machine without a GPU")
@pytest.mark.parametrize("command", list(CPU_REFUSALS))
def test_a_command_that_needs_a_gpu_says_what_to_run_instead(command, tmp_path):
    environ = dict(os.environ, OUT=str(tmp_path / "out"), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, *command.split()[1:]], cwd=tmp_path, env=environ, capture_output=True,
                            text=True, timeout=600)
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode != 0 and 1 <= len(lines) <= 3, "\n".join(lines)
    assert CPU_REFUSALS[command] in "\n".join(lines)


def test_calibrate_reads_the_default_run(tmp_path, monkeypatch):
    """The README's calibrate command on the run benchmarks.selector writes, -o left out."""
    from test_selector import made_up_run

    from torch_tcsparse.selector import calibrate

    run, *_ = made_up_run(tmp_path, "selector_out")
    monkeypatch.setattr(calibrate, "DEFAULT_RUN", run)
    monkeypatch.chdir(tmp_path)
    calibrate.main([])
    assert (run / "calibration.json").is_file()
