"""A compiled product is keyed for torch's caches without pickling the matrix: a second process
compiling the same function on the same matrix reuses the first one's compiled graph, and
compiling warns of nothing."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent("""
    import json, torch
    from torch._dynamo.utils import counters
    from torch_tcsparse import TCSparseTensor
    from torch_tcsparse.testing import random_dense

    a = TCSparseTensor.from_dense(random_dense(40, 30, 0.2, seed=0))
    x = torch.randn(30, 5)
    y = torch.compile(lambda a, x: torch.relu(a @ x), fullgraph=True)(a, x)
    torch.testing.assert_close(y, torch.relu(a.to_dense() @ x))
    print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"],
                      "misses": counters["inductor"]["fxgraph_cache_miss"]}))
""")


@pytest.mark.slow
def test_a_second_process_reuses_the_compiled_graph(tmp_path):
    environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                   "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environment,
                           timeout=600) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "pickle" not in run.stderr and "_stable_hash_for_caching" not in run.stderr, run.stderr[-3000:]
    first, second = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert first["misses"] >= 1 and second["hits"] >= 1 and second["misses"] == 0, (first, second)


PATTERN_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from torch._dynamo.utils import counters
    from torch_tcsparse import TCSparseTensor

    # Two patterns of the same size and nonzero count: a ring, and the ring with row 1's entries
    # moved to row 0 (a longer row, an empty one).
    n = 64
    row = torch.arange(n).repeat_interleave(2)
    col = (row + torch.tensor([0, 1]).repeat(n)) % n
    if sys.argv[1] == "moved":
        row = torch.where(row == 1, 0, row)
    a = TCSparseTensor.from_coo(row, col, torch.rand(2 * n), (n, n))
    x = torch.randn(n, 4)
    y = torch.compile(lambda a, x: a @ x, fullgraph=True)(a, x)
    torch.testing.assert_close(y, a.to_dense() @ x)
    print(json.dumps({"hits": counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]}))
""")


@pytest.mark.slow
def test_another_pattern_of_the_same_sizes_compiles_its_own_graph(tmp_path):
    environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                   "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    runs = [subprocess.run([sys.executable, "-c", PATTERN_SCRIPT, pattern], capture_output=True, text=True,
                           env=environment, timeout=600) for pattern in ("ring", "moved")]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(runs[1].stdout.strip().splitlines()[-1])["hits"] == 0


def test_the_cache_key_follows_the_matrix_not_its_address():
    from torch_tcsparse import TCSparseTensor
    from torch_tcsparse.testing import random_dense

    dense = random_dense(40, 30, 0.2, seed=0)
    first, again = TCSparseTensor.from_dense(dense), TCSparseTensor.from_dense(dense)
    other = TCSparseTensor.from_dense(random_dense(40, 30, 0.5, seed=1))
    assert first._stable_hash_for_caching() == again._stable_hash_for_caching()
    assert first._stable_hash_for_caching() != other._stable_hash_for_caching()
    assert first.half()._stable_hash_for_caching() != first._stable_hash_for_caching()
