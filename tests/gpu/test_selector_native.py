"""The selector's first choice in C++ (csrc/selector_model.cpp) against the Python model it
follows (selector/model.py): the same predicted times and the same choice, on random shapes from
one wave to many, every rule of a calibration, both unit-cost grids of the exact schedule; a
product's cached choice is the one ``A.explain`` gives; bad features are refused."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from torch_tcsparse import TCSparseTensor, _ext, csr_rows, selector
from torch_tcsparse import kernels as kernels_module
from torch_tcsparse.selector import CHOICES, MatrixShape, native
from torch_tcsparse.selector import model as cost_model
from torch_tcsparse.selector.native import NativeMatrix

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def random_shape(rng) -> MatrixShape:
    """TC blocks per window of one of five kinds (uniform, power law, hubs, equal, lognormal),
    with or without a grouped layout, from no window to many waves of warps."""
    windows = int(rng.choice([0, 1, 3, 17, 100, 700, 3000, 9000]))
    kind = int(rng.integers(0, 5))
    if kind == 0:
        blocks = rng.integers(0, 10, windows)
    elif kind == 1:
        blocks = np.minimum(rng.pareto(1.2, windows) * 3, 5000)
    elif kind == 2:
        blocks = rng.integers(0, 4, windows)
        if windows:
            blocks[rng.integers(0, windows, 3)] = rng.integers(30, 3000, 3)
    elif kind == 3:
        blocks = np.full(windows, int(rng.integers(1, 70)))
    else:
        blocks = rng.lognormal(1, 1.3, windows)
    blocks = np.asarray(blocks, dtype=np.int64)
    nnz = int(blocks.sum() * rng.uniform(1.5, 30)) + int(rng.integers(0, 100))
    grouped = None if rng.random() < 0.4 else int(rng.integers(1, int(blocks.sum()) + 2))
    return MatrixShape(
        16, blocks, rows=16 * windows, nnz=nnz, max_row_nnz=int(rng.integers(1, 3000)),
        cols=int(16 * windows * rng.choice([1, 3, 50]) + 1), rows_share_ratio=float(rng.choice([1.0, 0.7, 1.2])),
        grouped_blocks=grouped, grouped_rest_nnz=int(rng.integers(0, nnz + 1)) if grouped and rng.random() < 0.5 else 0,
        grouped_one_chunk=bool(rng.random() < 0.3))


def device_models():
    """The device's own model, then the same device under other calibration rules, margins and
    an exact schedule's unit cost off the half-unit grid (its heap)."""
    model = selector.device_model(torch.device("cuda"))
    calibration = model.calibration

    def variant(**changes):
        return dataclasses.replace(model, calibration=dataclasses.replace(calibration, **changes))

    odd_units = {n: {path: {**c, "block_units": 2.3} if path == "base" else c for path, c in table.items()}
                 for n, table in calibration.buckets.items()}
    return [model, variant(kernel_rule="cost"), variant(csr_margin={"base": 0.1, "balanced": 0.2}, rows_margin=0.05),
            variant(buckets=odd_units, dtype_buckets={})]


def native_choice(matrix: NativeMatrix, n: int, dtype: torch.dtype, model, candidates, all_costs: bool):
    """``NativeMatrix.choose`` for any device model and candidates."""
    bits = sum(1 << CHOICES.index(path) for path in candidates)
    piece_nnz = csr_rows.split_piece_nnz(matrix.nnz, matrix.max_row_nnz, dtype)
    exact = dtype == torch.float32 and not kernels_module.tf32_allowed()
    arguments = (matrix.handle, native.prices(model, n, dtype), n, dtype, exact, piece_nnz, bits, model.cuda_index)
    code, costs = _ext.eager().price_paths(*arguments, all_costs)
    return CHOICES[code], costs


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_native_choice_and_costs_match_the_python_model(kernels, seed, tf32, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)  # the fp32 kernels' launch shapes differ
    rng = np.random.default_rng(seed)
    models = device_models()
    cuda = torch.device("cuda")
    for _ in range(30):
        shape = random_shape(rng)
        matrix = NativeMatrix.of_shape(shape)
        for model in models:
            for n in selector.BUCKETS:
                for dtype in DTYPES:
                    candidates = cost_model.runnable_paths(dtype, cuda, shape)
                    everything = model is models[0] and rng.random() >= 0.3
                    if not everything:
                        candidates = tuple(p for p in candidates if p != "rows")
                    expected, expected_costs = cost_model.predicted_choice(shape, n, model, candidates, dtype)
                    if everything:  # a product's first choice: the device's own prices and candidates
                        assert matrix.path(n, dtype, cuda) == expected
                    choice, costs = native_choice(matrix, n, dtype, model, candidates, all_costs=True)
                    pruned_choice, pruned_costs = native_choice(matrix, n, dtype, model, candidates, all_costs=False)
                    assert choice == pruned_choice == expected, (shape.num_windows, n, dtype, expected_costs, costs)
                    priced = {p: c for p, c in zip(CHOICES, costs) if not math.isnan(c)}
                    assert priced == pytest.approx(expected_costs, rel=1e-12)
                    for full, pruned in zip(costs, pruned_costs):
                        assert math.isnan(pruned) or pruned == full


@pytest.mark.parametrize("precision", ["highest", "high"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_a_first_choice_reads_torchs_modes(kernels, precision, deterministic, monkeypatch):
    """``NativeMatrix.path`` reads the TF32 and deterministic modes in C++: it answers what
    ``choose`` answers from the modes read in Python."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    previous = torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()
    torch.set_float32_matmul_precision(precision)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        rng = np.random.default_rng(7)
        cuda = torch.device("cuda")
        for _ in range(20):
            matrix = NativeMatrix.of_shape(random_shape(rng))
            for n in selector.BUCKETS:
                for dtype in DTYPES:
                    assert matrix.path(n, dtype, cuda) == matrix.choose(n, dtype, cuda)[0]
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.use_deterministic_algorithms(previous[1])


def test_a_product_runs_the_choice_explain_gives(kernels):
    g = torch.Generator().manual_seed(2)
    n = 5000
    row, col = torch.randint(0, n, (60000,), generator=g), torch.randint(0, n, (60000,), generator=g)
    a = TCSparseTensor.from_coo(row, col, torch.rand(60000, generator=g), shape=(n, n)).cuda()
    for dtype in DTYPES:
        for width in (32, 128):
            x = torch.randn(n, width, device="cuda", dtype=dtype)
            cache = a._structure.selection
            assert cache.choose(a._structure.layout, width, dtype, x.device) == (a.to(dtype).explain(width).choice, None)


@pytest.mark.parametrize("built_on", ["cuda", "cpu"])
def test_the_features_come_with_the_conversion_on_a_gpu(kernels, built_on):
    """A matrix converted on (or moved to) the GPU has its C++ features before its first
    product, which then pays only the choice; one on the CPU leaves them to its products, and so
    does a transpose (a backward pass runs it on the forward's path)."""
    g = torch.Generator().manual_seed(3)
    n = 3000
    row, col = torch.randint(0, n, (30000,), generator=g), torch.randint(0, n, (30000,), generator=g)
    a = TCSparseTensor.from_coo(row.to(built_on), col.to(built_on), torch.rand(30000, generator=g).to(built_on),
                                shape=(n, n))
    if built_on == "cpu":
        assert a._structure.selection._native is None
        a = a.cuda()
    cache = a._structure.selection
    assert cache._native is not None and len(cache) == 0
    x = torch.randn(n, 64, device="cuda")
    torch.testing.assert_close(a @ x, a.to_dense() @ x, rtol=1e-2, atol=1e-2)
    assert cache.settled(64, torch.float32, x.device) == a.explain(64).choice
    assert a._structure.transposed().selection._native is None


def test_bad_features_are_refused(kernels):
    prefix = np.zeros(4, dtype=np.int64)
    with pytest.raises(RuntimeError, match="chunk_start must be 1-D with 5 entries"):
        NativeMatrix(16, 4, 64, 64, 10, 3, (prefix, np.zeros(5, dtype=np.int64), np.zeros(5, dtype=np.int64)))
    with pytest.raises(RuntimeError, match="block_start must be a contiguous int64 array"):
        NativeMatrix(16, 4, 64, 64, 10, 3, (np.zeros(5, dtype=np.int64), np.zeros(5, dtype=np.int32),
                                            np.zeros(5, dtype=np.int64)))
    with pytest.raises(RuntimeError, match="window must be 8 or 16"):
        NativeMatrix(12, 4, 64, 64, 10, 3, tuple(np.zeros(5, dtype=np.int64) for _ in range(3)))
