"""The README's Python snippets run as written (on the CPU here, on the GPU where there is one),
and the modules its commands name exist."""
import importlib.util
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index):
    if "torch_tcsparse.nn" in SNIPPETS[index]:
        pytest.importorskip("torch_geometric", reason="torch_tcsparse.nn needs PyG (the [pyg] extra)")
    exec(compile(SNIPPETS[index], f"README.md snippet {index}", "exec"), {"__name__": "readme"})


def test_commands_name_existing_modules():
    modules = set(re.findall(r"python -m ([\w.]+)", README)) - {"pytest"}
    assert {"examples.gcn.train", "benchmarks.gcn"} <= modules
    missing = [name for name in sorted(modules) if importlib.util.find_spec(name) is None]
    assert not missing, f"README names modules that do not exist: {missing}"


def test_no_paths_outside_the_repository():
    assert "../" not in README
