"""torch.compile on a GPU with a TCSparseTensor as an input of the compiled function: no graph
break, eager-equal products and gradients (X and values) on every path the selector can choose,
and GCN and GraphSAGE training steps under CUDA graphs (``mode="reduce-overhead"``; forward and
loss compiled, or the whole step) whose losses equal the eager ones step for step. Each path is
forced by answering the selector's choice with it."""
import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.compiled import epoch_function
from torch_tcsparse import TCSparseTensor
from torch_tcsparse.engines import ENGINES
from torch_tcsparse.paths import SELECTOR_PATHS
from torch_tcsparse.selector.cache import SelectionCache

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.usefixtures("fresh_dynamo")]

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture
def forced(monkeypatch):
    """force(path): every choice the selector makes from now on is ``path``."""
    def force(path):
        monkeypatch.setattr(SelectionCache, "choose", lambda self, layout, n, dtype, device=None: (path, None))
    return force


def graph(nodes=300, edges=2400, hub=True, seed=0):
    """A symmetric adjacency with a hub row (long enough for the "rows" path to split it)."""
    generator = torch.Generator().manual_seed(seed)
    row = torch.randint(0, nodes, (edges,), generator=generator)
    col = torch.randint(0, nodes, (edges,), generator=generator)
    if hub:
        row = torch.cat([row, torch.zeros(nodes, dtype=torch.long)])
        col = torch.cat([col, torch.arange(nodes)])
    edge_index = torch.stack([torch.cat([row, col]), torch.cat([col, row])])
    weight = torch.rand(edge_index.shape[1], generator=generator) + 0.5
    return TCSparseTensor.from_edge_index(edge_index, weight, num_nodes=nodes).cuda()


ROUTES = {
    "@": lambda a, x: a @ x,
    "torch.sparse.mm": torch.sparse.mm,
    "A.matmul mean": lambda a, x: a.matmul(x, reduce="mean"),
    "A.matmul max": lambda a, x: a.matmul(x, reduce="max"),
    "torch.sparse.mm amin": lambda a, x: torch.sparse.mm(a, x, "amin"),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_explain_finds_no_graph_break(kernels, route):
    a = graph()
    x = torch.randn(a.shape[1], 16, device="cuda")
    explanation = torch._dynamo.explain(ROUTES[route])(a, x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def outputs_and_gradients(fn, a, x):
    weights = a.csr.values.detach().clone().requires_grad_()
    x = x.clone().requires_grad_()
    y = fn(a.with_values(weights), x)
    (y * torch.linspace(-1, 1, y.shape[1], device=y.device)).sum().backward()
    return y.detach(), x.grad, weights.grad


@pytest.mark.parametrize("path", SELECTOR_PATHS)
@pytest.mark.parametrize("route", list(ROUTES))
def test_compiled_product_matches_eager_on_every_path(kernels, forced, path, route):
    forced(path)
    a = graph()
    x = torch.randn(a.shape[1], 16, device="cuda")
    eager = outputs_and_gradients(ROUTES[route], a, x)
    compiled = outputs_and_gradients(torch.compile(ROUTES[route], fullgraph=True), a, x)
    for got, expected in zip(compiled, eager):
        torch.testing.assert_close(got, expected, **TOLERANCE)


def gcn_losses(adj, compiled: bool, steps: int = 5, model: str = "gcn", mode: str = "compiled"):
    """The losses of ``steps`` training steps of the benchmark's 2-layer ``model`` (16 -> 32 -> 4),
    compiled in ``mode`` (``benchmarks.compiled.MODES``) or eager."""
    torch.manual_seed(0)
    x = torch.randn(adj.shape[0], 16, device="cuda")
    labels = torch.randint(0, 4, (adj.shape[0],), device="cuda")
    epoch = epoch_function(adj, x, labels, hidden=32, classes=4,
                           options={"mode": "reduce-overhead"} if compiled else None, model=model, mode=mode)
    return torch.stack([epoch().detach().clone() for _ in range(steps)])


@pytest.mark.parametrize("path", SELECTOR_PATHS)
def test_reduce_overhead_gcn_step_matches_eager_on_every_path(kernels, forced, path):
    forced(path)
    adj = graph()
    torch.testing.assert_close(gcn_losses(adj, compiled=True), gcn_losses(adj, compiled=False), **TOLERANCE)


def test_reduce_overhead_gcn_step_on_the_selectors_choice(kernels):
    adj = graph(hub=False)
    torch.testing.assert_close(gcn_losses(adj, compiled=True), gcn_losses(adj, compiled=False), **TOLERANCE)


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_reduce_overhead_whole_step_matches_eager(kernels, model):
    """The benchmark's "whole" mode: zero_grad, forward, backward (compiled autograd) and Adam in
    one compiled function under CUDA graphs, step for step the eager losses."""
    adj = graph(hub=False)
    torch.testing.assert_close(gcn_losses(adj, compiled=True, model=model, mode="whole"),
                               gcn_losses(adj, compiled=False, model=model), **TOLERANCE)


@pytest.mark.parametrize("path", SELECTOR_PATHS)
def test_reduce_overhead_whole_step_matches_eager_on_every_path(kernels, forced, path):
    forced(path)
    adj = graph()
    torch.testing.assert_close(gcn_losses(adj, compiled=True, mode="whole"), gcn_losses(adj, compiled=False),
                               **TOLERANCE)


def test_learnable_edge_weights_get_the_eager_gradient_under_cuda_graphs(kernels):
    adj = graph()
    x = torch.randn(adj.shape[1], 16, device="cuda")

    def gradient(compiled):
        weights = adj.csr.values.detach().clone().requires_grad_()
        fn = lambda a, x: (a @ x).square().sum()  # noqa: E731
        if compiled:
            fn = torch.compile(fn, fullgraph=True, mode="reduce-overhead")
            torch.compiler.cudagraph_mark_step_begin()
        fn(adj.with_values(weights), x).backward()
        return weights.grad

    # The hub row is split and its pieces add by atomics in any order: the two products differ by
    # float32 rounding at the scale of the hub's gradients, not of each entry's.
    eager = gradient(False)
    torch.testing.assert_close(gradient(True), eager, rtol=TOLERANCE["rtol"],
                               atol=TOLERANCE["atol"] * float(eager.abs().max()))


def test_deterministic_mode_recompiles_with_unsplit_rows(kernels, forced):
    forced("rows")
    adj = graph()
    x = torch.randn(adj.shape[1], 16, device="cuda")
    compiled = torch.compile(lambda a, x: a @ x, fullgraph=True)
    split = compiled(adj, x)
    torch.use_deterministic_algorithms(True)
    try:
        unsplit = compiled(adj, x)
        torch.testing.assert_close(unsplit, adj @ x, **TOLERANCE)
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(split, unsplit, **TOLERANCE)


def test_compiled_graph_caches_tell_matrices_of_one_pattern_apart(kernels, tmp_path, monkeypatch):
    """With torch's compiled-graph caches on (its default), a matrix whose layout was built
    before its transpose and a fresh one of the same pattern flatten into different arrays: each
    gets a graph of its own flattening, and both train as eager does."""
    import torch._functorch.config
    import torch._inductor.config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    used = graph(hub=False)
    x = torch.randn(used.shape[1], 16, device="cuda", requires_grad=True)
    for path in ("rows", "base"):
        used.matmul(x, path=path).sum().backward()
    fresh = graph(hub=False)
    with torch._inductor.config.patch(fx_graph_cache=True), torch._functorch.config.patch(enable_autograd_cache=True):
        for adj in (fresh, used):
            torch._dynamo.reset()
            torch.testing.assert_close(gcn_losses(adj, compiled=True), gcn_losses(adj, compiled=False), **TOLERANCE)


CACHED_STEP = """
import json, torch
from torch._dynamo.utils import counters
from benchmarks.compiled import epoch_function
from torch_tcsparse import TCSparseTensor

generator = torch.Generator().manual_seed(0)
edge_index = torch.randint(0, 300, (2, 2400), generator=generator)
adj = TCSparseTensor.from_edge_index(edge_index, torch.rand(2400, generator=generator) + 0.5, num_nodes=300).cuda()
x = torch.randn(300, 16, device="cuda")
labels = torch.randint(0, 4, (300,), device="cuda")
epoch = epoch_function(adj, x, labels, hidden=32, classes=4, options={"mode": "reduce-overhead"})
for _ in range(3):
    epoch()
torch.cuda.synchronize()
print(json.dumps({"saved": counters["aot_autograd"]["autograd_cache_saved"],
                  "hits": counters["aot_autograd"]["autograd_cache_hit"]}))
"""


@pytest.mark.slow
def test_a_compiled_training_step_is_saved_to_and_loaded_from_the_caches(kernels, tmp_path):
    """The AOTAutograd cache entry names the matrix by its stable hash (``flattening``): none of its
    index arrays is pickled (copied to the host), the entry saves without a warning under CUDA
    graphs, and a second process loads it."""
    environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
                   "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    runs = [subprocess.run([sys.executable, "-c", CACHED_STEP], capture_output=True, text=True, env=environment,
                           timeout=900) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "unable to serialize" not in run.stderr, run.stderr[-3000:]
    first, second = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert first["saved"] >= 1 and second["hits"] >= 1, (first, second)


@pytest.mark.parametrize("path", SELECTOR_PATHS)
def test_a_matrix_carries_the_indices_of_the_selectors_path_alone(kernels, forced, path):
    """With the selector answering ``path``, a compiled product takes in that engine's indices
    (``grouped`` runs ``base``) and the CSR's, and none of the other engines'."""
    forced(path)
    a = graph()
    _, context = a.__tensor_flatten__()
    assert context.plan.paths == tuple(sorted({"base" if path == "grouped" else path, "csr"},
                                              key=list(ENGINES).index))
    x = torch.randn(a.shape[1], 16, device="cuda")
    torch.testing.assert_close(torch.compile(lambda a, x: a @ x, fullgraph=True)(a, x), a @ x, **TOLERANCE)
