"""The kernel selector's cost model (C++, through ``selector.native``): scheduling simulation
(exact on hand-built cases, the estimate bounded against heapq list scheduling), AR, ranking
against csr, the explanation, caching and the calibration. CPU only."""
import dataclasses
import heapq

import numpy as np
import pytest
import torch

from torch_tcsparse import TCSparseTensor, csr_rows, kernels, selector, trials
from graph_data import synthetic
from torch_tcsparse.formats.inputs import from_coo
from torch_tcsparse.formats.metcf import BALANCE_CHUNK, build_metcf
from torch_tcsparse.selector import Calibration, DeviceModel, MatrixFeatures, SelectionCache, choice, rank
from torch_tcsparse.selector import build as selector_build
from torch_tcsparse.selector import cache as selection_cache
from torch_tcsparse.selector import device as selector_device


# Terms of the shipped calibration that the simulation tests leave out (set them per test).
NO_FLOOR_NO_MISS = {"floor_us": 0.0, "miss_unit_us": 0.0, "miss_nnz_us": 0.0}

# The Tensor-Core kernels and cuSPARSE: the choice before "rows" is considered.
TC_AND_CSR = ("base", "balanced", "csr")

# The model's constants these tests check behaviour against (csrc/selector_model.h).
EXACT_JOBS_PER_SLOT = 4
ROWS_ORDER_GAIN = 0.68  # float32's (csrc/selector_model.h, rows_order_gain)
# csrc/selector_model.cpp, grouped_prices: float32's price per MB of the fp32 sums.
GROUPED_SUMS_US_PER_MB = 1.25


def model(sm_count=2, resident=2, threshold=1.2, **overrides) -> DeviceModel:
    """A device of ``sm_count x resident`` slots with the default constants (every bucket's
    constants overridable per path), without host floors and L2-miss terms unless given."""
    data = Calibration.load("default")
    buckets = {n: {path: {**c, **{k: v for k, v in NO_FLOOR_NO_MISS.items() if k in c or k == "floor_us"}}
                   for path, c in paths.items()} for n, paths in data.buckets.items()}
    for path, constants in overrides.items():
        for paths in buckets.values():
            paths[path].update(constants)
    calibration = Calibration("test", threshold, buckets, sm_count, {"base": resident, "balanced": resident})
    return DeviceModel("test device", "test", sm_count, calibration, None)


def shape(window_blocks, nnz=None, max_row=1, **features) -> MatrixFeatures:
    blocks = np.asarray(window_blocks, dtype=np.int64)
    return MatrixFeatures.of_window_blocks(16, blocks, rows=16 * blocks.size,
                                           nnz=int(blocks.sum()) * 8 if nnz is None else nnz, max_row_nnz=max_row,
                                           **features)


def list_schedule(costs, slots: int) -> float:
    """Makespan of list scheduling with a heap: each job, in order, to the slot that frees first
    (the reference the model's schedule is tested against)."""
    free = [0.0] * slots
    for cost in np.asarray(costs, dtype=np.float64).tolist():
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def base_makespan(costs, slots: int, block_units: float = 0.0) -> float:
    """The model's base makespan of one job per window costing ``block_units`` + its blocks."""
    blocks = np.asarray(costs, dtype=np.int64)
    return shape(blocks).base_launch(1, slots, block_units)[0]


# List scheduling, exact.


@pytest.mark.parametrize(
    "costs, slots, makespan",
    [
        ([3, 3, 3, 3], 2, 6.0),
        ([5, 1, 1, 1, 1, 1], 2, 5.0),  # five short jobs fill the second slot while the long one runs
        ([1, 1, 10, 1], 2, 11.0),  # the long job starts when a slot frees at 1
        ([2, 7], 4, 7.0),  # fewer jobs than slots: the longest
        ([], 3, 0.0),
    ],
)
def test_list_scheduling_hand_built(costs, slots, makespan):
    assert list_schedule(costs, slots) == makespan
    assert base_makespan(costs, slots) == makespan


@pytest.mark.parametrize("block_units", [0.0, 2.5, 2.3])  # the half-unit grid, and off it (a heap)
def test_schedule_is_exact_up_to_the_exact_limit(block_units):
    rng = np.random.default_rng(3)
    for slots in (1, 7, 64):
        blocks = rng.integers(1, 50, EXACT_JOBS_PER_SLOT * slots)
        assert base_makespan(blocks, slots, block_units) == pytest.approx(list_schedule(blocks + block_units, slots))


def test_slices_are_adjacent_jobs_of_a_window():
    rng = np.random.default_rng(4)
    blocks = rng.integers(0, 30, 40)
    for slices, slots in ((2, 20), (3, 40), (4, 50)):  # at most EXACT_JOBS_PER_SLOT jobs per slot
        makespan, work = shape(blocks).base_launch(slices, slots, 1.5)
        assert makespan == pytest.approx(list_schedule(np.repeat(blocks + 1.5, slices), slots))
        assert work == pytest.approx(slices * (blocks + 1.5).sum())


def reference_balanced(window_blocks, slices, slots, segment_units, split_units):
    """metcf_balanced_kernel's split written out item by item: the cost of every thread block."""
    chunk = BALANCE_CHUNK
    chunk_window = [w for w, b in enumerate(window_blocks) for _ in range(-(-b // chunk))]
    chunk_size = [min(chunk, window_blocks[w] - chunk * chunk_window[:c].count(w)) for c, w in enumerate(chunk_window)]
    items = [(s, c) for s in range(slices) for c in range(len(chunk_window))]
    upper = (len(window_blocks) + sum(window_blocks) // chunk + 1) * slices
    per = -(-len(items) // min(upper, slots))
    window_of = [(s, chunk_window[c]) for s, c in items]
    costs = []
    for start in range(0, len(items), per):
        mine = range(start, min(start + per, len(items)))
        cost = sum(chunk_size[items[i][1]] for i in mine)
        for window in dict.fromkeys(window_of[i] for i in mine):
            whole = all(window_of[i] != window for i in range(len(items)) if i not in mine)
            cost += segment_units + (0 if whole else split_units)
        costs.append(cost)
    return max(costs), sum(costs)


@pytest.mark.parametrize("kind", ["uniform", "power_law", "hubs", "lognormal"])
@pytest.mark.parametrize("slots, jobs_per_slot", [(64, 20), (264, 30), (128, 80)])
def test_fast_schedule_close_to_exact(kind, slots, jobs_per_slot):
    """Beyond EXACT_JOBS_PER_SLOT the schedule is a fluid estimate: within 5% of heapq list
    scheduling on these random cases."""
    rng = np.random.default_rng([len(kind), slots, jobs_per_slot])
    jobs = slots * jobs_per_slot
    assert jobs > EXACT_JOBS_PER_SLOT * slots
    for _ in range(3):
        if kind == "uniform":
            blocks = rng.integers(1, 10, jobs)
        elif kind == "power_law":
            blocks = np.minimum(rng.pareto(1.5, jobs) * 3 + 1, 5000).round()
        elif kind == "hubs":
            blocks = rng.integers(1, 5, jobs)
            blocks[rng.integers(0, jobs, 3)] = round(jobs_per_slot * rng.uniform(1, 20))
        else:
            blocks = rng.lognormal(1, 1.2, jobs).round() + 1
        blocks = blocks.astype(np.int64)
        exact = list_schedule(blocks + 2.5, slots)  # a thread block's fixed cost of 2.5 units
        assert abs(base_makespan(blocks, slots, 2.5) - exact) <= 0.05 * exact


@pytest.mark.parametrize("jobs_per_slot", [5, 8, 20])
def test_fluid_schedule_of_equal_jobs_is_at_most_half_a_job_high(jobs_per_slot):
    # Equal jobs run in lockstep waves; the estimate assumes half a job still running per slot.
    slots, cost = 64, 4
    exact = list_schedule(np.full(slots * jobs_per_slot, cost), slots)
    assert exact == jobs_per_slot * cost
    estimate = base_makespan(np.full(slots * jobs_per_slot, cost), slots)
    assert exact <= estimate <= exact + cost / 2


def test_fast_schedule_is_fast_on_a_million_jobs():
    import time

    blocks = (np.minimum(np.random.default_rng(0).pareto(1.2, 1_000_000) * 3 + 1, 20000).round()).astype(np.int64)
    features = shape(blocks)
    start = time.perf_counter()
    features.base_launch(1, 1056, 3.0)
    assert time.perf_counter() - start < 0.5  # milliseconds; loose for loaded CI machines


# Kernel simulation: uniform windows, hub windows, AR.


def test_uniform_windows_exact_makespans_and_ar_one():
    m = model(sm_count=2, resident=2)  # 4 slots
    block_units = 3.0
    s = shape([4] * 12)  # 12 windows of 4 blocks: 3 waves on 4 slots
    makespan, work = s.base_launch(1, 4, block_units)
    assert makespan == 3 * (block_units + 4)
    assert work == 12 * (block_units + 4)
    # Balanced with the same cost per segment: 4 blocks of 3 whole windows each: identical.
    assert s.balanced_launch(1, 4, block_units, 0.0) == (3 * (block_units + 4), work, 0)
    explanation = rank(s, 32, m)
    assert explanation.ar == pytest.approx(1.0)
    assert explanation.ar_kernel == "base"


def test_slices_multiply_the_jobs():
    s = shape([4] * 4)
    # 2 slices of 4 windows on 4 slots: 2 waves.
    assert s.base_launch(2, 4, 1.0)[0] == 2 * 5


def test_hub_window_exact_makespans_and_large_ar():
    # One hub of 32 * 64 blocks and 63 windows of 1 block on 8 slots.
    blocks = [32 * 64] + [1] * 63
    s = shape(blocks)
    assert s.base_launch(1, 8, 1.0)[0] == 1.0 + 32 * 64  # the hub's thread block alone
    # Balanced: 127 items, 16 per thread block; blocks 0-3 each take 16 hub chunks (512 TC blocks,
    # one segment, cut by a range boundary so added atomically), blocks 4-7 the small windows.
    makespan, work, zeroed = s.balanced_launch(1, 8, 1.0, 2.0)
    assert makespan == 1.0 + 512 + 2.0
    assert zeroed == 3  # the hub, cut by three range boundaries (counted per cut)
    assert (makespan, work) == reference_balanced(blocks, 1, 8, 1.0, 2.0)
    explanation = rank(s, 32, model(sm_count=4, resident=2))
    assert explanation.ar > 3.0
    assert explanation.ar_kernel == "balanced"
    assert explanation.choice in ("balanced", "csr", "rows")


@pytest.mark.parametrize("slices, slots", [(1, 3), (2, 8), (4, 8), (3, 5), (2, 1000)])
def test_balanced_matches_item_by_item_reference(slices, slots):
    blocks = [70, 0, 5, 33, 1, 100, 2, 0, 64, 31, 32]
    makespan, work, _ = shape(blocks).balanced_launch(slices, slots, 1.5, 2.0)
    assert (makespan, work) == pytest.approx(reference_balanced(blocks, slices, slots, 1.5, 2.0))


def test_balanced_one_chunk_per_warp_zeroes_empty_and_continued_windows():
    # 16 chunks x 2 slices <= 1000 slots: one chunk per warp. Windows of 70, 33, 100 and 64 blocks
    # split into 3 + 2 + 4 + 2 chunks: per slice 11 - 4 = 7 warps end inside a window; 2 empty.
    blocks = [70, 0, 5, 33, 1, 100, 2, 0, 64, 31, 32]
    makespan, _, zeroed = shape(blocks).balanced_launch(2, 1000, 1.5, 2.0)
    assert zeroed == 2 + 2 * 7
    assert makespan == 1.5 + 32 + 2.0


def test_kernel_time_splits_even_work_and_tail():
    # A hub makes a tail: launch, the work spread evenly, then the tail at its own price.
    s = shape([40] + [1] * 15)
    m = model(sm_count=2, resident=2, base={"launch_us": 5.0, "unit_us": 2.0, "tail_us": 0.5, "block_units": 1.0})
    makespan, work = s.base_launch(1, 4, 1.0)
    even = work / 4
    assert makespan > even
    assert rank(s, 32, m).costs_us["base"] == pytest.approx(5.0 + 2.0 * even + 0.5 * (makespan - even))


def test_predicted_kernel_times_of_uniform_windows():
    m = model(sm_count=2, resident=2)
    s = shape([4] * 12)
    explanation = rank(s, 32, m)
    base = m.calibration.constants("base", 32)
    # 3 waves of (block_units + 4) units, perfectly even: no tail.
    assert explanation.costs_us["base"] == pytest.approx(base["launch_us"] + base["unit_us"] * 3 * (base["block_units"] + 4))


def test_floor_is_the_least_a_call_costs():
    s = shape([4] * 12)
    unfloored = rank(s, 32, model()).costs_us
    floored = rank(s, 32, model(base={"floor_us": 1e4}, csr={"floor_us": 1.0})).costs_us
    assert floored["base"] == 1e4
    assert floored["csr"] == unfloored["csr"] and floored["balanced"] == unfloored["balanced"]


def test_l2_miss_fraction():
    m = model()
    l2 = m.l2_bytes

    def miss(cols):
        return rank(shape([4] * 12, cols=cols), 128, m).features["x_share_beyond_l2"]

    assert miss(1000) == 0.0  # 512 KB of X: all in L2
    assert miss(4 * l2 // 512) == pytest.approx(0.75)
    assert miss(0) == 0.0


def test_miss_terms_price_x_beyond_l2():
    m = model(csr={"miss_nnz_us": 1e-3}, base={"miss_unit_us": 1.0})
    fits = shape([4] * 12, nnz=384, cols=1000)
    beyond = fits.replace(cols=1 << 22)  # 2 GB of X at N = 128
    near, far = rank(fits, 128, m), rank(beyond, 128, m)
    assert far.features["x_share_beyond_l2"] > 0.95 and near.features["x_share_beyond_l2"] == 0.0
    assert far.costs_us["csr"] - near.costs_us["csr"] == pytest.approx(1e-3 * 384 * far.features["x_share_beyond_l2"])
    assert far.costs_us["base"] > near.costs_us["base"]


@pytest.mark.parametrize("ratio", [0.4, 1.3])
def test_rows_order_scales_the_rows_time(ratio):
    """A reordered matrix's rows path: its time (all but the split rows' launch) scales by
    1 - ROWS_ORDER_GAIN x (share of X beyond L2) x (1 - ratio), down when the order brings rows
    that share columns together, up when it parts them; an X held in L2 leaves it unchanged."""
    m = model(rows={"miss_nnz_us": 1e-3, "split_launch_us": 0.0})
    given = shape([4] * 12, nnz=384, cols=1 << 22)
    ordered = given.replace(rows_share_ratio=ratio)
    before, after = rank(given, 128, m), rank(ordered, 128, m)
    assert after.features["rows_share_ratio"] == ratio
    beyond = after.features["x_share_beyond_l2"]
    assert beyond > 0.95
    expected = 1 - ROWS_ORDER_GAIN * beyond * (1 - ratio)
    assert after.costs_us["rows"] == pytest.approx(before.costs_us["rows"] * expected)
    near = given.replace(cols=64)
    assert rank(near.replace(rows_share_ratio=ratio), 128, m).costs_us["rows"] == pytest.approx(rank(near, 128, m).costs_us["rows"])
    assert after.costs_us["csr"] == before.costs_us["csr"]  # cuSPARSE runs the rows as given


def test_structure_knows_its_rows_order(monkeypatch):
    from torch_tcsparse.reorder import locality

    monkeypatch.setattr(locality, "GROUP_ROWS", 2)
    # Rows 0 and 2 share columns {0, 1}, rows 1 and 3 share {5, 6}.
    row, col = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), torch.tensor([0, 1, 5, 6, 0, 1, 5, 6])
    given = TCSparseTensor.from_coo(row, col, torch.ones(8), shape=(4, 7))
    paired = TCSparseTensor.from_coo(row, col, torch.ones(8), shape=(4, 7), reorder=torch.tensor([0, 2, 1, 3]))
    assert given._structure.selection.rows_share_ratio == 1.0
    assert paired._structure.selection.rows_share_ratio == 0.5
    assert paired.explain(128).features["rows_share_ratio"] == 0.5


def test_summary_of_a_layout():
    s = shape([70, 0, 32, 33])
    assert s.summary == {"tc_blocks": 135, "max_blocks": 70, "max_single_chunk_blocks": 32, "empty_windows": 1,
                         "chunks": 6, "split_windows": 2, "chunks_of_split_windows": 5}
    assert s.window_blocks.tolist() == [70, 0, 32, 33]
    assert [p.tolist() for p in s.prefixes] == [[0, 3, 3, 4, 6], [0, 70, 70, 102, 135], [0, 1, 1, 2, 3]]


def test_bad_features_are_refused():
    prefix = np.zeros(4, dtype=np.int64)
    with pytest.raises(ValueError, match="prefixes must be three arrays of num_windows \\+ 1 = 5 entries"):
        MatrixFeatures(16, 4, 64, 64, 10, 3, (prefix, np.zeros(5), np.zeros(5)))
    with pytest.raises(ValueError, match="window must be 8 or 16, got 12"):
        MatrixFeatures(12, 4, 64, 64, 10, 3, tuple(np.zeros(5, dtype=np.int64) for _ in range(3)))
    with pytest.raises(ValueError, match="nnz must be a non-negative integer, got -1"):
        MatrixFeatures(16, 4, 64, 64, -1, 3, tuple(np.zeros(5, dtype=np.int64) for _ in range(3)))
    with pytest.raises(ValueError, match="window_blocks must be a 1-D array"):
        MatrixFeatures.of_window_blocks(16, [[1, 2]], 16, 3, 1)
    with pytest.raises(TypeError, match="unknown features"):
        shape([1]).replace(colour=3)


def test_unknown_calibration_constants_are_refused():
    broken = model(base={"launch_ms": 1.0})
    with pytest.raises(ValueError, match="unknown calibration constant base.launch_ms"):
        rank(shape([4] * 12), 32, broken)
    with pytest.raises(ValueError, match="kernel_rule must be one of"):
        Calibration("test", 1.2, {}, 1, {}, kernel_rule="fastest")


def test_the_library_is_cached_under_the_build_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TCSPARSE_BUILD_DIR", str(tmp_path))
    path = selector_build.library_path()
    assert path.parent.parent == tmp_path and path.name == selector_build.LIBRARY
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert selector_build.library_path() != path  # the compiler is part of the key
    with pytest.raises(RuntimeError, match="needs a C\\+\\+ compiler: 'no-such-compiler' was not found"):
        selector_build.build()


# Ranking against csr.


def test_csr_margin_of_older_files_applies_to_both_kernels():
    assert selector.csr_margins(0.15) == {"base": 0.15, "balanced": 0.15}
    assert selector.csr_margins({"base": 0.0, "balanced": 0.1}) == {"base": 0.0, "balanced": 0.1}


def test_csr_wins_when_predicted_cheaper():
    s = shape([4] * 12)
    cheap_csr = model(csr={"launch_us": 0.0, "nnz_us": 0.0, "row_us": 0.0, "max_row_us": 0.0})
    explanation = rank(s, 32, cheap_csr)
    assert explanation.choice == "csr"
    assert "csr is predicted faster" in explanation.reason


def test_csr_margin_keeps_csr_when_a_kernel_is_barely_faster():
    s = shape([4] * 12)
    m = model()
    costs = rank(s, 32, m, TC_AND_CSR).costs_us
    # csr predicted 5% slower than base: base without a margin, csr with a 10% margin.
    csr_us = 1.05 * costs["base"] - costs["csr"] + m.calibration.constants("csr", 32)["launch_us"]
    without = model(csr={"launch_us": csr_us}, base={}, balanced={})
    assert rank(s, 32, without, TC_AND_CSR).choice == "base"
    margins = {"base": 0.1, "balanced": 0.0}
    with_margin = DeviceModel("m", "m", 2, dataclasses.replace(without.calibration, csr_margin=margins), None)
    assert rank(s, 32, with_margin, TC_AND_CSR).choice == "csr"
    margins = {"base": 0.0, "balanced": 0.1}  # the margin of the kernel chosen applies
    other_margin = DeviceModel("m", "m", 2, dataclasses.replace(without.calibration, csr_margin=margins), None)
    assert rank(s, 32, other_margin, TC_AND_CSR).choice == "base"
    costly_csr = model(csr={"launch_us": 1e6})
    assert rank(s, 32, costly_csr, TC_AND_CSR).choice == "base"


def test_threshold_decides_between_kernels():
    s = shape([32 * 64] + [1] * 63)
    costly_csr = {"csr": {"launch_us": 1e9}}
    ar = rank(s, 32, model(**costly_csr)).ar
    assert rank(s, 32, model(threshold=ar - 0.01, **costly_csr), TC_AND_CSR).choice == "balanced"
    assert rank(s, 32, model(threshold=ar + 0.01, **costly_csr), TC_AND_CSR).choice == "base"


def test_rows_replaces_the_choice_only_when_predicted_faster():
    s = shape([4] * 12)
    costly_rows = model(rows={"launch_us": 1e9})
    kept = rank(s, 32, costly_rows)
    assert kept.choice == rank(s, 32, costly_rows, TC_AND_CSR).choice
    cheap_rows = model(rows={"launch_us": 0.0, "nnz_us": 0.0, "row_us": 0.0, "floor_us": 0.0})
    explanation = rank(s, 32, cheap_rows)
    assert explanation.choice == "rows"
    assert "rows predicted faster" in explanation.reason
    assert explanation.bytes_moved["rows"] == explanation.bytes_moved["csr"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rows_is_a_candidate_with_int32_indices(monkeypatch, dtype):
    monkeypatch.setattr(choice.kernels, "usable_for", lambda dtype, device: True)
    cuda = torch.device("cuda")
    assert "rows" in selector.runnable_paths(dtype, cuda, shape([4] * 12))
    huge = shape([4] * 12, nnz=1 << 31)
    assert "rows" not in selector.runnable_paths(dtype, cuda, huge)


def test_rows_caps_the_longest_row_at_a_piece():
    hub = shape([4] * 12, max_row=10**6)
    costs = rank(hub, 32, model(rows={"max_row_us": 1.0, "floor_us": 0.0}), ("rows",)).costs_us
    # launch, nnz and rows terms aside, a piece of PIECE_NNZ nonzeros, not the hub's million
    assert costs["rows"] < 2 * csr_rows.PIECE_NNZ


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rows_pays_the_split_launch_only_when_a_row_is_split(dtype):
    m = model(rows={"split_launch_us": 7.0, "max_row_us": 0.0, "floor_us": 0.0})
    unsplit, split = shape([4] * 12, max_row=csr_rows.PIECE_NNZ // 8), shape([4] * 12, max_row=10**6)
    piece = csr_rows.split_piece_nnz(split.nnz, split.max_row_nnz, dtype)
    assert unsplit.max_row_nnz <= csr_rows.split_piece_nnz(unsplit.nnz, unsplit.max_row_nnz, dtype)
    costs = [rank(s, 32, m, ("rows",), dtype).costs_us["rows"] for s in (unsplit, split)]
    assert costs[1] == pytest.approx(costs[0] + 7.0)
    assert rank(split, 32, m, dtype=dtype).features["rows_piece_nnz"] == piece


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("nnz", [10**5, csr_rows.MEDIUM_NNZ, csr_rows.LARGE_NNZ])
def test_the_model_prices_the_rows_piece_of_the_dtype(dtype, nnz):
    """The longest piece the rows path is priced at is ``csr_rows.split_piece_nnz``'s for X of
    ``dtype`` (handed to C++ with the matrix's features, one per element size)."""
    only_longest = {"launch_us": 0.0, "nnz_us": 0.0, "row_us": 0.0, "max_row_us": 1.0, "miss_nnz_us": 0.0,
                    "split_launch_us": 0.0, "floor_us": 0.0}
    for longest in (40, 100, 10**6):
        s = shape([4] * 12, nnz=nnz, max_row=longest)
        piece = csr_rows.split_piece_nnz(nnz, longest, selector_device.kernel_dtype(dtype))
        explanation = rank(s, 32, model(rows=only_longest), ("rows",), dtype)
        assert explanation.costs_us["rows"] == pytest.approx(min(longest, piece))
        assert explanation.features["rows_piece_nnz"] == piece


def test_small_graphs_take_small_pieces():
    # float16 splits only where a row is longer than PIECE_NNZ anyway (its split costs launches)
    assert csr_rows.split_piece_nnz(10**5, 10**3, torch.float32) == 32
    assert csr_rows.split_piece_nnz(10**5, 10**3, torch.float16) == 64
    assert csr_rows.split_piece_nnz(10**5, csr_rows.PIECE_NNZ, torch.float16) == csr_rows.PIECE_NNZ
    assert csr_rows.split_piece_nnz(csr_rows.MEDIUM_NNZ, 10**3, torch.bfloat16) == 128
    assert csr_rows.split_piece_nnz(csr_rows.LARGE_NNZ, 10**3, torch.float32) == csr_rows.PIECE_NNZ


def test_kernels_left_out_of_candidates():
    explanation = rank(shape([4] * 12), 32, model(csr={"launch_us": 1e9}), candidates=("csr",))
    assert explanation.choice == "csr"


def test_empty_matrix_goes_to_a_csr_path():
    explanation = rank(shape([0, 0]), 64, model(), TC_AND_CSR)
    assert explanation.choice == "csr"
    assert explanation.reason == "the matrix has no TC blocks"
    assert rank(shape([0, 0]), 64, model()).choice in ("csr", "rows")


# Shapes, buckets, calibration.


@pytest.mark.parametrize(
    "n, slices", [(1, 1), (32, 1), (33, 2), (64, 1), (96, 3), (100, 2), (128, 2), (256, 4), (512, 8)]
)
def test_default_column_slices(n, slices):
    assert selector.default_column_slices(n, 4) == slices


@pytest.mark.parametrize("n, slices", [(32, 1), (64, 1), (128, 1), (129, 3), (200, 2), (256, 2)])
def test_default_column_slices_of_16bit_x(n, slices):
    assert selector.default_column_slices(n, 2) == slices


@pytest.mark.parametrize("n, bucket", [(1, 32), (32, 32), (33, 64), (128, 128), (129, 256), (300, 512)])
def test_n_bucket(n, bucket):
    assert selector.n_bucket(n) == bucket


def test_n_bucket_rejects_nonpositive():
    with pytest.raises(ValueError, match="N must be positive"):
        selector.n_bucket(0)


def test_constants_scale_per_column_beyond_the_last_bucket():
    calibration = Calibration.load("default")
    at_256, at_512 = calibration.constants("csr", 256), calibration.constants("csr", 512)
    assert at_512["nnz_us"] == pytest.approx(2 * at_256["nnz_us"])
    assert at_512["launch_us"] == at_256["launch_us"]
    assert calibration.constants("base", 512) == calibration.constants("base", 256)


def test_default_calibration_is_documented_and_complete():
    calibration = Calibration.load("no-such-family")
    assert calibration.source == "default.json"
    assert calibration.kernel_rule in ("ar", "cost") and calibration.ar_threshold >= 1.0
    for table in [calibration.buckets, *calibration.dtype_buckets.values()]:
        for bucket in selector.BUCKETS:
            assert set(table[bucket]) == set(selector.CALIBRATED_CHOICES)
    assert set(calibration.dtype_buckets) == {"float16", "bfloat16"}


@pytest.mark.parametrize(
    "name, capability, family",
    [
        ("NVIDIA H100 80GB HBM3", (9, 0), "h100"),
        ("NVIDIA H200", (9, 0), "h200"),
        ("NVIDIA GeForce RTX 4090", (8, 9), "rtx4090"),
        ("NVIDIA A100-SXM4-80GB", (8, 0), "a100"),
        ("Some Future GPU", (10, 0), "sm100"),
    ],
)
def test_gpu_family(name, capability, family):
    assert selector.gpu_family(name, capability) == family


# Layouts, caching and the explanation.


def small_layout():
    g = torch.Generator().manual_seed(0)
    n, e = 500, 4000
    row, col = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    row = torch.cat([row, torch.zeros(600, dtype=torch.long)])  # a hub row
    col = torch.cat([col, torch.randint(0, n, (600,), generator=g)])
    layout, _ = build_metcf(from_coo(row, col, None, (n, n), None), 16)
    return layout


def test_matrix_features_of_layout():
    layout = small_layout()
    s = MatrixFeatures.of_layout(layout)
    assert s.tc_blocks == layout.num_blocks
    assert s.window_blocks.size == layout.num_windows
    assert s.max_row_nnz == int((layout.csr_rowptr[1:] - layout.csr_rowptr[:-1]).max())
    assert s.nnz == layout.nnz


def test_conversion_host_copies_match_the_device_layout():
    layout = small_layout()
    counts = layout.host_counts
    assert counts.window_offsets.tolist() == layout.window_offsets.tolist()
    assert counts.chunk_offsets.tolist() == layout.chunk_offsets.tolist()
    assert counts.max_row_nnz == int((layout.csr_rowptr[1:] - layout.csr_rowptr[:-1]).max())
    # The features built from them equal those read back from the tensors alone.
    from_host = MatrixFeatures.of_layout(layout)
    rebuilt = type(layout).from_tensors(layout.tensors(), layout.window, layout.num_rows, layout.num_cols)
    assert rebuilt.host_counts is None
    read_back = MatrixFeatures.of_layout(rebuilt)
    assert from_host.max_row_nnz == read_back.max_row_nnz
    for given, computed in zip(from_host.prefixes, read_back.prefixes):
        assert given.tolist() == computed.tolist()
    assert from_host.summary == read_back.summary
    assert rank(from_host, 64, model()).costs_us == rank(read_back, 64, model()).costs_us


def random_features(rng) -> MatrixFeatures:
    """TC blocks per window of one of five kinds (uniform, power law, hubs, equal, lognormal),
    with or without a grouped layout, from no window to many waves of warps."""
    windows = int(rng.choice([0, 1, 3, 17, 100, 700, 3000]))
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
    return MatrixFeatures.of_window_blocks(
        16, blocks, rows=16 * windows, nnz=nnz, max_row_nnz=int(rng.integers(1, 3000)),
        cols=int(16 * windows * rng.choice([1, 3, 50]) + 1), rows_share_ratio=float(rng.choice([1.0, 0.7, 1.2])),
        grouped_blocks=grouped, grouped_rest_nnz=int(rng.integers(0, nnz + 1)) if grouped and rng.random() < 0.5 else 0,
        grouped_one_chunk=bool(rng.random() < 0.3))


@pytest.mark.parametrize("seed", range(3))
def test_a_products_choice_agrees_with_the_explanation(seed):
    """A product's choice prices the kernels only where the choice depends on them (bounds, and
    the balanced grid walked only where AR may pick it): it is the explanation's choice, and its
    costs, where priced, the explanation's, under every rule of a calibration and on devices from
    one slot to many."""
    rng = np.random.default_rng(seed)
    defaults = Calibration.load("default")
    odd_units = {n: {path: {**c, "block_units": 2.3} if path == "base" else c for path, c in table.items()}
                 for n, table in defaults.buckets.items()}
    for _ in range(25):
        features = random_features(rng)
        sm_count, resident = int(rng.choice([1, 2, 16, 132])), int(rng.choice([1, 4, 20]))
        calibration = Calibration(
            "test", float(rng.choice([1.2, 2.2])), odd_units if rng.random() < 0.3 else defaults.buckets, sm_count,
            {"base": resident, "balanced": resident}, csr_margin={"base": 0.1 * rng.integers(0, 2), "balanced": 0.2},
            dtype_buckets=defaults.dtype_buckets, kernel_rule=str(rng.choice(["ar", "cost"])),
            rows_margin=float(rng.choice([0.0, 0.05])))
        m = DeviceModel("test", "test", sm_count, calibration, None, defaults.l2_bytes)
        candidates = selector.CHOICES if rng.random() < 0.7 else ("base", "balanced", "csr", "grouped")
        for n in selector.BUCKETS:
            for dtype in (torch.float32, torch.float16):
                explanation = rank(features, n, m, candidates, dtype)
                path, none = selector.predicted_choice(features, n, m, candidates, dtype)
                assert none is None and path == explanation.choice
                path, costs = selector.predicted_choice(features, n, m, candidates, dtype, all_costs=True)
                assert path == explanation.choice and costs == explanation.costs_us


def test_cache_computes_once_per_bucket_dtype_device(monkeypatch):
    layout = small_layout()
    reads = []
    original = MatrixFeatures.of_layout
    monkeypatch.setattr(MatrixFeatures, "of_layout",
                        classmethod(lambda cls, lay, **features: reads.append(1) or original(lay, **features)))
    cache = SelectionCache()
    first = cache.explain(layout, 100, torch.float32)
    assert cache.explain(layout, 128, torch.float32) is first  # same bucket
    assert len(cache) == 1
    cache.explain(layout, 64, torch.float32)
    cache.explain(layout, 64, torch.float64)
    assert len(cache) == 3
    assert len(reads) == 1  # features built from the layout once
    assert cache.choose(layout, 128, torch.float32) == (first.choice, None)  # no trial off CUDA


CUDA = torch.device("cuda", 0)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture
def kernels_everywhere(monkeypatch):
    """Products' choices as on a GPU with the kernels built (the launch shapes are the documented
    defaults without one); torch's modes and the queries shared between matrices restored after."""
    monkeypatch.setattr(selection_cache.kernels, "usable_for", lambda dtype, device: True)
    modes = torch.backends.cuda.matmul.allow_tf32, torch.are_deterministic_algorithms_enabled()
    selector_device.device_query.cache_clear()
    yield
    selector_device.device_query.cache_clear()
    torch.backends.cuda.matmul.allow_tf32 = modes[0]
    torch.use_deterministic_algorithms(modes[1])


def cache_of(features: MatrixFeatures) -> SelectionCache:
    """A SelectionCache whose matrix's features are ``features`` (no layout needed)."""
    cache = SelectionCache(features.rows_share_ratio)
    cache._features = features
    return cache


@pytest.mark.parametrize("seed", range(3))
def test_a_first_choice_is_its_explanations_choice(kernels_everywhere, monkeypatch, seed):
    """A product's first choice (one call with the matrix's and the device's prebuilt sides) is
    the choice ``explain`` reads from the C++ model, on random matrices at every N, dtype and
    deterministic mode; where trials may run, it measures the explanation's close candidates."""
    rng = np.random.default_rng(seed)
    for _ in range(12):
        features = random_features(rng)
        torch.use_deterministic_algorithms(bool(rng.random() < 0.3))
        measured = bool(rng.random() < 0.3)
        monkeypatch.setattr(trials, "allowed", lambda device: measured)
        cache = cache_of(features)
        for dtype in KERNEL_DTYPES:
            for n in (1, 32, 50, 64, 128, 200, 256, 300, 1000):
                path, trial = cache.choose(None, n, dtype, CUDA)
                explanation = explain_at(features, n, dtype)
                assert path == explanation.choice
                close = trials.shortlist(explanation.choice, explanation.costs_us, explanation.candidates)
                assert (trial.paths if trial else (path,)) == (close if measured else (path,))


def explain_at(features: MatrixFeatures, n: int, dtype: torch.dtype):
    """The explanation of the N bucket of ``n`` among the paths that may run now."""
    return rank(features, selector.n_bucket(n), selector.device_model(CUDA),
                selector.runnable_paths(dtype, CUDA, features), dtype)


def test_a_first_choice_asks_in_the_current_modes(kernels_everywhere, monkeypatch):
    """What a first choice hands the model follows TF32 (the exact float32 kernels have launch
    shapes of their own), deterministic algorithms (no grouped path), trials (every path priced
    where they may run), the device and the dtype; the device's side of it is made once per
    process and shared by matrices of one window count."""
    monkeypatch.setattr(DeviceModel, "launch", lambda self, path, n, dtype=torch.float32, windows=None: (
        2 if dtype == torch.float32 and kernels.tf32_allowed() else 1, 1))
    # Every device answers with the documented defaults: the test asks for a second GPU, which a
    # machine with one would refuse to describe.
    defaults = selector_device._device_model(torch.device("cpu"))
    monkeypatch.setattr(selector_device, "_device_model", lambda device: defaults)
    asked = []

    def choose(features, query, candidates):
        asked.append((query, candidates))
        return "csr"

    monkeypatch.setattr(selection_cache.native, "choose", choose)
    monkeypatch.setattr(selection_cache.native, "choose_with_costs",
                        lambda features, query, candidates: (choose(features, query, candidates), {"csr": 1.0}))
    features = shape([4] * 12, grouped_blocks=30)
    every, without_grouped = (selector.paths.candidate_bits(paths) for paths in
                              (selector.CHOICES, [p for p in selector.CHOICES if p != "grouped"]))
    cache = cache_of(features)
    torch.backends.cuda.matmul.allow_tf32 = False
    cache.choose(None, 32, torch.float32, CUDA)
    torch.backends.cuda.matmul.allow_tf32 = True
    cache.choose(None, 64, torch.float32, CUDA)
    cache.choose(None, 64, torch.float16, CUDA)
    cache.choose(None, 64, torch.float32, torch.device("cuda", 1))
    torch.use_deterministic_algorithms(True)
    cache.choose(None, 128, torch.float32, CUDA)
    torch.use_deterministic_algorithms(False)
    monkeypatch.setattr(trials, "allowed", lambda device: True)
    cache.choose(None, 256, torch.float32, CUDA)
    assert [(q.n, q.value_bytes, q.launch[0], bits) for q, bits in asked] == [
        (32, 4, 1, every), (64, 4, 2, every), (64, 2, 1, every), (64, 4, 2, every), (128, 4, 2, without_grouped),
        (256, 4, 2, every)]
    assert asked[3][0] is not asked[1][0]  # its own device
    for query, _ in asked:
        windows = features.num_windows
        device = torch.device("cuda", 1) if query is asked[3][0] else CUDA
        dtype = torch.float32 if query.value_bytes == 4 else torch.float16
        assert query is selector_device.device_query(device, query.n, dtype, query.launch[0] == 2, windows)
    assert cache_of(features.replace()).choose(None, 64, torch.float32, CUDA) == ("csr", None)
    assert asked[-1][0] is asked[1][0]  # another matrix of the same window count


def test_choose_on_cpu_is_csr_and_explained():
    layout = small_layout()
    path, explanation = selector.choose(layout, 64, torch.float32, "cpu")
    assert path == "csr"
    assert explanation.candidates == ("csr",)
    assert explanation.n == 64
    text = str(explanation)
    for part in ("choice: csr", "features:", "tc_blocks=", "simulated makespan (us):", "approximation ratio AR",
                 "predicted time (us):", "base=", "balanced=", "csr=", "bytes moved"):
        assert part in text
    assert explanation.features["tc_blocks"] == layout.num_blocks
    assert set(explanation.costs_us) == {"base", "balanced", "csr", "rows"}
    assert all(cost > 0 for cost in explanation.costs_us.values())


def test_explain_uses_the_bucket():
    explanation = selector.explain(small_layout(), 200)
    assert explanation.n == 256
    assert explanation.features["column_slices"] == 4


def test_explain_refuses_what_is_not_a_layout():
    with pytest.raises(TypeError, match="layout must be a MetcfLayout, got str"):
        selector.explain("a matrix", 64)


def test_kernels_usable_answers_without_a_gpu():
    assert isinstance(choice.kernels.usable_for(torch.float32, torch.device("cuda")), bool)
    assert choice.kernels.usable_for(torch.float64, torch.device("cuda")) is False


# The grouped path.


def grouped_us(features, n=128, dtype=torch.float32, sm_count=132) -> float:
    """The grouped path's device time (no host floor) on ``sm_count`` SMs."""
    return rank(features, n, model(sm_count=sm_count), dtype=dtype).costs_us["grouped"]


def test_grouped_path_cost_choice_and_availability(monkeypatch):
    """The grouped kernel's time is a fixed part, a cost per block and per warp-step (blocks x
    warps per chunk of 32 columns), both scaled to the SM count, and a cost per byte of the fp32
    sums it adds into (rows x N, the SM count aside); it is chosen where predicted fastest, and
    offered only where the matrix has a grouped layout and results need not be deterministic."""
    row, col, _ = synthetic.uniform(300, 60, seed=3)
    layout, _ = build_metcf(from_coo(row, col, None, (300, 300), None))
    plain = MatrixFeatures.of_layout(layout)
    with_blocks = {blocks: plain.replace(grouped_blocks=blocks) for blocks in (1000, 2000, 3000)}
    per_thousand = grouped_us(with_blocks[2000]) - grouped_us(with_blocks[1000])
    assert per_thousand > 0 and grouped_us(with_blocks[3000]) - grouped_us(with_blocks[2000]) == pytest.approx(per_thousand)
    sums_us = GROUPED_SUMS_US_PER_MB * 300 * 4 / 1e6  # per column of Y
    # N = 256 doubles the warp-steps of N = 128 (2 x 4 warps per block) and the sums.
    steps_us = grouped_us(with_blocks[1000], n=256) - grouped_us(with_blocks[1000]) - 128 * sums_us
    assert 0 < steps_us < per_thousand
    assert grouped_us(with_blocks[2000], n=256) - grouped_us(with_blocks[1000], n=256) == pytest.approx(per_thousand + steps_us)
    # N = 100 takes 4 warps per block, as N = 128 does: only the sums shrink.
    assert grouped_us(with_blocks[1000], n=100) == pytest.approx(grouped_us(with_blocks[1000]) - 28 * sums_us)
    on_half = grouped_us(with_blocks[2000], sm_count=66) - grouped_us(with_blocks[1000], sm_count=66)
    assert on_half == pytest.approx(2 * per_thousand)
    assert "grouped" not in rank(plain, 128, model()).costs_us

    costly = {path: {"launch_us": 1e6} for path in selector.CALIBRATED_CHOICES}
    explanation = rank(with_blocks[1000], 128, model(**costly))
    assert explanation.choice == "grouped" and "grouped predicted faster still" in explanation.reason
    assert rank(with_blocks[1000], 128, model(**costly), selector.CALIBRATED_CHOICES).choice != "grouped"

    monkeypatch.setattr(choice.kernels, "usable_for", lambda dtype, device: True)
    cuda = torch.device("cuda")
    assert "grouped" in selector.runnable_paths(torch.float32, cuda, with_blocks[1000])
    assert "grouped" not in selector.runnable_paths(torch.float32, cuda, plain)
    torch.use_deterministic_algorithms(True)
    try:
        assert "grouped" not in selector.runnable_paths(torch.float32, cuda, with_blocks[1000])
    finally:
        torch.use_deterministic_algorithms(False)


def test_grouped_rest_priced_and_split_chosen_by_price():
    """The grouped path costs its layout's blocks plus the rows kernel on the nonzeros it leaves
    out; the split is the threshold of least such cost: one that drops most blocks for a small
    rest wins, one that pushes most nonzeros into the rest loses to keeping them."""
    features = shape([4] * 200, nnz=50_000, cols=3000)
    whole = features.replace(grouped_blocks=20_000)
    split = whole.replace(grouped_rest_nnz=10_000)
    m = model(sm_count=132)
    # The rest runs in pieces of PIECE_NNZ, longer than any row here: the rows time of its nonzeros.
    rest_us = rank(features.replace(nnz=10_000), 128, m).costs_us["rows"]
    assert rank(split, 128, m).costs_us["grouped"] == pytest.approx(rank(whole, 128, m).costs_us["grouped"] + rest_us)
    cpu = selector.device_model(torch.device("cpu"))
    assert selector.grouped_split({1: (20_000, 0), 16: (2_000, 10_000)}, features, cpu) == 16
    assert selector.grouped_split({1: (20_000, 0), 16: (19_000, features.nnz)}, features, cpu) == 1
    with pytest.raises(ValueError, match="sizes must name at least one split"):
        selector.grouped_split({}, features, cpu)


def test_grouped_kernel_writing_16bit_y_itself_drops_the_zeroing_and_rounding():
    """Where every group is one chunk and nothing is left to the rows kernel, a 16-bit Y is
    written by the grouped kernel alone (no zeroed sums, no rounding launch): float32 and layouts
    with several chunks per group keep their fixed cost."""
    one_chunk = shape([4] * 8, grouped_blocks=100, grouped_one_chunk=True)
    shared = one_chunk.replace(grouped_one_chunk=False)
    assert grouped_us(one_chunk, dtype=torch.float16) < grouped_us(shared, dtype=torch.float16)
    assert grouped_us(one_chunk) == grouped_us(shared)


# Calibration (selector.calibrate), offline on made-up measurements.


def made_up_run(tmp_path, name, scale=1.0, dtypes=(torch.float32,), graphs=6, truth=None, l2_bytes=None):
    """A run of a made-up device whose times are ``truth``'s predictions (default: the shipped
    calibration's) times ``scale``, saved as benchmarks/selector.py saves one: (folder, records,
    shapes, info). ``l2_bytes``: the device's L2 (default: the model's, which holds every X)."""
    from torch_tcsparse.selector import calibrate

    info = {
        "name": "made-up GPU", "family": "madeup", "sm_count": 16,
        "occupancy": {p: {str(n): 4 for n in selector.BUCKETS} for p in selector.KERNEL_CHOICES},
    }
    if l2_bytes is not None:
        info["l2_bytes"] = l2_bytes
    truth = truth or Calibration.load("default")
    rng = np.random.default_rng(1)
    shapes, records = {}, []
    for i in range(graphs):
        blocks = np.minimum(rng.pareto(0.8 + 0.3 * i, 400 * (i + 1)).astype(np.int64) * 3 + 1, 3000)
        # Every other graph reordered: its rows share ratio travels with the run.
        shapes[f"g{i}"] = MatrixFeatures.of_window_blocks(16, blocks, 16 * blocks.size, int(blocks.sum()) * (3 + i),
                                                          int(blocks.max()) * 2, rows_share_ratio=1.0 - 0.2 * (i % 2))
        for dtype in dtypes:
            for n in selector.BUCKETS:
                record = {"graph": f"g{i}", "n": n, "dtype": selector.dtype_name(dtype),
                          "launch": {p: [4, selector.default_column_slices(n, dtype.itemsize)]
                                     for p in selector.KERNEL_CHOICES}}
                costs = rank(shapes[f"g{i}"], n, calibrate.model_for(info, truth, record), dtype=dtype).costs_us
                records.append({**record, "times_us": {p: t * scale for p, t in costs.items()}})
    calibrate.save(tmp_path / name, records, shapes, info)
    return tmp_path / name, records, shapes, info


def test_calibration_refits_a_known_calibration(tmp_path, capsys):
    import json

    from torch_tcsparse.selector import calibrate

    truth = Calibration.load("default")
    for paths in truth.buckets.values():  # a slower balanced kernel than the defaults
        paths["balanced"]["split_units"] = 6.0
        paths["base"]["tail_us"] *= 0.5
    folder, records, shapes, info = made_up_run(tmp_path, "run", dtypes=(torch.float32, torch.float16), graphs=8,
                                                truth=truth)
    calibrate.main([str(folder), "-o", str(tmp_path / "out" / "madeup.json")])
    table = capsys.readouterr().out
    assert "held-out half" in table and "fitted on all" in table and "wrote" in table
    fitted = Calibration.from_dict(json.loads((tmp_path / "out" / "madeup.json").read_text()), "fitted")
    assert set(fitted.buckets) == set(selector.BUCKETS)
    assert set(fitted.dtype_buckets) == {"float16"} and set(fitted.dtype_buckets["float16"]) == set(selector.BUCKETS)
    assert set(fitted.csr_margin) == set(selector.KERNEL_CHOICES)
    scored = calibrate.score(records, shapes, info, fitted)
    assert scored["hit_rate"] >= 0.9
    assert scored["worst_vs_csr"] <= 1.10


def test_calibration_runs_load_back_merged_and_without_stale_times(tmp_path, capsys):
    import json

    from torch_tcsparse.selector import calibrate

    first, records, shapes, _ = made_up_run(tmp_path, "first")
    second, _, _, _ = made_up_run(tmp_path, "second", scale=1.1)
    loaded = calibrate.load_saved(first)[1]
    for name, features in shapes.items():
        assert (loaded[name].max_row_nnz, loaded[name].num_cols) == (features.max_row_nnz, features.num_cols)
        assert loaded[name].window_blocks.tolist() == features.window_blocks.tolist()
        assert loaded[name].rows_share_ratio == features.rows_share_ratio
    (first / "stale.json").write_text(json.dumps({"stale": [{"path": "rows", "n": 256, "why": "test"}]}))
    assert all(("rows" in r["times_us"]) == (r["n"] != 256) for r in calibrate.load_saved(first)[0])
    # Merged: each path's geometric mean over the runs that measured it.
    merged = calibrate.load_runs([first, second])[0]
    at_256 = next(r for r in merged if r["n"] == 256)
    original = next(r for r in records if r["n"] == 256 and r["graph"] == at_256["graph"])
    assert at_256["times_us"]["rows"] == pytest.approx(1.1 * original["times_us"]["rows"])
    assert at_256["times_us"]["csr"] == pytest.approx(1.1**0.5 * original["times_us"]["csr"])
    # Runs of different graphs (the suite, the corpus's fit families) merge into their union.
    other, other_records, _, _ = made_up_run(tmp_path, "other", graphs=8)
    union, union_shapes, _ = calibrate.load_runs([first, other])
    assert len(union) == len(other_records) and set(union_shapes) == {f"g{i}" for i in range(8)}
    assert {r["graph"] for r in union} == {f"g{i}" for i in range(8)}

    calibrate.main([str(first), str(second), "--leave-one-run-out"])
    table = capsys.readouterr().out
    assert table.count("fitted on the others") == 2 and table.count("default.json") == 2


def test_calibration_recovers_the_rows_prices_of_reordered_matrices(tmp_path):
    """The model scales the rows kernel's time by its order's sharing where X spills from L2: a fit
    on the model's own times of reordered matrices gives back the prices it was made with."""
    from torch_tcsparse.selector import calibrate

    truth = Calibration.load("default")
    _, records, shapes, info = made_up_run(tmp_path, "run", dtypes=(torch.float16,), graphs=8, truth=truth,
                                           l2_bytes=1 << 16)
    at_128 = [r for r in records if r["n"] == 128]
    assert {shapes[r["graph"]].rows_share_ratio for r in at_128} == {1.0, 0.8}
    assert all(calibrate.choose(info, truth, shapes, r).features["x_share_beyond_l2"] > 0.5 for r in at_128)
    fitted = calibrate.fit_bucket(at_128, shapes, 128, info, truth)["rows"]
    expected = truth.constants("rows", 128, torch.float16)
    for name in ("nnz_us", "row_us", "miss_nnz_us"):
        assert fitted[name] == pytest.approx(expected[name], rel=0.02), name


def test_16bit_buckets_are_fitted_on_both_16bit_dtypes():
    from torch_tcsparse.selector import calibrate

    records = [{"graph": "g", "n": 32, "dtype": name} for name in ("float32", "float16", "bfloat16", "float16")]
    grouped = calibrate.records_by_dtype(records)
    assert [r["dtype"] for r in grouped["float32"]] == ["float32"]
    assert grouped["float16"] == grouped["bfloat16"] == records[1:]
    assert calibrate.records_for(records[:2], "bfloat16") == [records[1]]


def test_calibration_refits_only_the_buckets_asked(tmp_path, capsys):
    import json

    from torch_tcsparse.selector import calibrate
    from torch_tcsparse.selector.calibration import calibration_path

    truth = Calibration.load("default")
    truth.dtype_buckets["float16"][128]["rows"]["nnz_us"] *= 2  # a slower rows kernel at N = 128
    folder, records, shapes, info = made_up_run(tmp_path, "run", dtypes=(torch.float16,), graphs=8, truth=truth)
    calibrate.main([str(folder), "--buckets", "float16:128,bfloat16:128", "-o", str(tmp_path / "out.json")])
    assert "fitted on all" in capsys.readouterr().out
    shipped = json.loads(calibration_path("default").read_text())
    fitted = json.loads((tmp_path / "out.json").read_text())
    for key in ("ar_threshold", "csr_margin", "rows_margin", "kernel_rule", "buckets"):
        assert fitted[key] == shipped[key], key
    for name in ("float16", "bfloat16"):
        for n, bucket in shipped["dtype_buckets"][name].items():
            if n != "128":
                assert fitted["dtype_buckets"][name][n] == bucket
        # bfloat16's prices at 128 come from the float16 records (the 16-bit kernels are one code).
        rows = fitted["dtype_buckets"][name]["128"]["rows"]
        assert rows["nnz_us"] == pytest.approx(truth.dtype_buckets["float16"][128]["rows"]["nnz_us"], rel=0.05)
    with pytest.raises(SystemExit, match="no record"):
        calibrate.main([str(folder), "--buckets", "float32:128", "-o", str(tmp_path / "other.json")])
    with pytest.raises(SystemExit, match="DTYPE:N"):
        calibrate.main([str(folder), "--buckets", "float16:100", "-o", str(tmp_path / "other.json")])


def test_calibration_cli_refuses_what_is_not_a_run(tmp_path, capsys):
    from torch_tcsparse.selector import calibrate

    with pytest.raises(SystemExit):
        calibrate.main([str(tmp_path), "-o", str(tmp_path / "out.json")])
    assert "not a run folder" in capsys.readouterr().err


def test_first_choice_benchmark_runs_without_a_gpu(tmp_path, capsys):
    """``python -m benchmarks.selector --first-choice`` times the first choice at each N bucket on
    a machine without a GPU too (the choice asked as for a CUDA device with the kernels built),
    and leaves the process's answer to whether the kernels run as it found it."""
    from benchmarks import selector as selector_benchmark

    usable = choice.kernels.usable_for(torch.float32, CUDA)
    selector_benchmark.main(["--first-choice", "--graphs", "sbm_2708_d4", "--n", "32,128", "--dtypes",
                             "float32,float16", "--out", str(tmp_path)])
    lines = (tmp_path / "first_choice.csv").read_text().splitlines()
    assert lines[0] == "graph,nnz,dtype,n,choice_us,features_us,path"
    rows = [dict(zip(lines[0].split(","), line.split(","))) for line in lines[1:]]
    assert [(r["dtype"], r["n"]) for r in rows] == [(d, n) for d in ("float32", "float16") for n in ("32", "128")]
    for row in rows:
        assert row["graph"] == "sbm_2708_d4" and float(row["choice_us"]) > 0 and float(row["features_us"]) > 0
        assert row["path"] in selector.CHOICES
    assert "float32: median" in capsys.readouterr().out
    assert choice.kernels.usable_for(torch.float32, CUDA) == usable
