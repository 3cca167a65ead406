"""Properties of A @ X on random graphs (empty rows, duplicate edges, self loops, rectangular
shapes, permutations), checked against a float64 reference with tolerances relative to torch's
own error at the same precision: every path valid on the device and "auto"; moves between dtypes
and devices; compiled code; values changed in place between products. GPU cases run where CUDA
is available (under compute-sanitizer there: ``compute-sanitizer python -m pytest ...``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_tcsparse import TCSparseTensor
from torch_tcsparse.paths import CUDA_ONLY_PATHS, KERNEL_DTYPES
from torch_tcsparse.testing import assert_matches_reference, coo_to_dense, devices, value_dtypes


@pytest.fixture(autouse=True)
def one_thread():
    """Graphs of a few dozen nodes: one intra-op thread, as for the tiny-graph folders (a team of
    threads stalls on every small op when the CI cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class Graph:
    row: torch.Tensor
    col: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, int]

    def dense(self) -> torch.Tensor:
        """The float64 matrix, duplicates summed."""
        return coo_to_dense(self.row, self.col, self.values, self.shape)


@st.composite
def graphs(draw, min_edges: int = 0) -> Graph:
    """Random edges over a random subset of rows (the others stay empty), a third of them
    repeated, self loops on square ones; values in quarters, exact in every dtype."""
    low = 1 if min_edges else 0
    num_rows = draw(st.integers(low, 48))
    num_cols = draw(st.one_of(st.just(num_rows), st.integers(low, 48)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    edges = draw(st.integers(min_edges, 160)) if num_rows and num_cols else 0
    active = np.flatnonzero(rng.random(num_rows) < draw(st.floats(0.1, 1.0))) if num_rows else np.zeros(0, int)
    if active.size == 0 and edges:
        active = np.arange(num_rows)
    row = rng.choice(active, edges) if edges else np.zeros(0, int)
    col = rng.integers(0, max(num_cols, 1), edges)
    if edges and draw(st.booleans()):
        again = rng.integers(0, edges, max(1, edges // 3))
        row, col = np.concatenate([row, row[again]]), np.concatenate([col, col[again]])
    if num_rows == num_cols and num_rows and draw(st.booleans()):
        loops = rng.choice(num_rows, max(1, num_rows // 4))
        row, col = np.concatenate([row, loops]), np.concatenate([col, loops])
    values = rng.integers(1, 5, row.size) * rng.choice([-1, 1], row.size) / 4.0
    return Graph(torch.from_numpy(row.astype(np.int64)), torch.from_numpy(col.astype(np.int64)),
                 torch.from_numpy(values), (num_rows, num_cols))


@st.composite
def options(draw, graph: Graph) -> dict:
    chosen = dict(window=draw(st.sampled_from([8, 16])))
    if graph.shape[0] and draw(st.booleans()):
        perm = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(graph.shape[0])
        chosen |= dict(reorder=torch.from_numpy(perm), symmetric=False)
    return chosen


def build(graph: Graph, dtype: torch.dtype, device: torch.device, **chosen) -> TCSparseTensor:
    return TCSparseTensor.from_coo(
        graph.row.to(device), graph.col.to(device), graph.values.to(device, dtype), shape=graph.shape, **chosen
    )


def operand(graph: Graph, dtype: torch.dtype, device: torch.device, seed: int, columns: int = 5) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal((graph.shape[1], columns))).to(device, dtype)


def valid_paths(device: torch.device, dtype: torch.dtype) -> list[str]:
    if device.type == "cuda":
        kernels = list(CUDA_ONLY_PATHS) if dtype in KERNEL_DTYPES else []
        return kernels + ["csr", "reference", "auto"]
    return ["csr", "reference", "auto"]


CASES = [(device, dtype) for device in devices for dtype in value_dtypes]
CASE_IDS = [f"{device.type}-{str(dtype).removeprefix('torch.')}" for device, dtype in CASES]


@pytest.mark.parametrize("device, dtype", CASES, ids=CASE_IDS)
@given(data=st.data())
def test_every_path_matches_the_float64_reference(device, dtype, data):
    graph = data.draw(graphs())
    a = build(graph, dtype, device, **data.draw(options(graph)))
    x = operand(graph, dtype, device, data.draw(st.integers(0, 2**32 - 1)))
    dense = graph.dense().to(dtype).double()
    for path in valid_paths(device, dtype):
        assert_matches_reference(a.matmul(x, path=path), dense, x)
    assert_matches_reference(a @ x[:, 0], dense, x[:, 0])


@pytest.mark.parametrize("device", devices, ids=[device.type for device in devices])
@given(data=st.data())
def test_moves_between_dtypes_and_devices_keep_the_product(device, data):
    graph = data.draw(graphs())
    source, target = data.draw(st.sampled_from(value_dtypes)), data.draw(st.sampled_from(value_dtypes))
    a = build(graph, source, torch.device("cpu"), **data.draw(options(graph)))
    dense = graph.dense().to(source).to(target).double()
    for moved in (a.to(device, target), a.to(target).to(device), a.to(device).to(dtype=target)):
        assert moved.device.type == device.type and moved.dtype == target
        x = operand(graph, target, device, data.draw(st.integers(0, 2**32 - 1)))
        assert_matches_reference(moved.matmul(x, path="auto"), dense, x)
    doubled = a.to(device).double()
    x = operand(graph, torch.float64, device, 0)
    assert_matches_reference(doubled.matmul(x, path="reference"), graph.dense().to(source).double(), x)


@pytest.mark.parametrize("device", devices, ids=[device.type for device in devices])
@settings(max_examples=5)  # each example compiles (a fresh graph shape): a few are what is cheap
@given(graph=graphs(min_edges=1))
def test_compiled_product_matches_the_reference(device, graph):
    torch._dynamo.reset()
    a = build(graph, torch.float32, device)
    x = operand(graph, torch.float32, device, 0)
    compiled = torch.compile(lambda matrix, operand_: matrix @ operand_ + 1, fullgraph=False, backend="aot_eager")
    assert_matches_reference(compiled(a, x) - 1, graph.dense().float().double(), x)


def mutation_cases():
    for device in devices:
        for dtype in value_dtypes:
            for path in valid_paths(device, dtype):
                yield pytest.param(device, dtype, path, id=f"{device.type}-{str(dtype).removeprefix('torch.')}-{path}")


@pytest.mark.parametrize("device, dtype, path", list(mutation_cases()))
@given(graph=graphs(min_edges=1), seed=st.integers(0, 2**32 - 1))
def test_in_place_changes_of_the_values_reach_the_product(device, dtype, path, graph, seed):
    base = build(graph, dtype, device)
    csr = base.csr
    structure = (csr.row_indices().cpu(), csr.col.cpu(), graph.shape)
    w = torch.nn.Parameter(csr.values.clone())
    a = base.with_values(w)
    x = operand(graph, dtype, device, seed)

    def check():
        with torch.no_grad():
            dense = coo_to_dense(*structure[:2], w.detach().cpu(), graph.shape)
            assert_matches_reference(a.matmul(x, path=path), dense, x)

    check()
    with torch.no_grad():
        w.mul_(2)
    check()
    optimizer = torch.optim.SGD([w], lr=0.25)
    for _ in range(2):
        optimizer.zero_grad()
        a.matmul(x, path=path).float().pow(2).sum().backward()
        optimizer.step()
        check()
