"""The kernel selector: scheduling simulation (exact on hand-built cases, approximation bounded
against heapq list scheduling), AR, ranking against csr, caching and the explanation. CPU only."""
import dataclasses

import numpy as np
import pytest
import torch

from torch_tcsparse import TCSparseTensor, csr_rows, selector
from torch_tcsparse.datasets import synthetic
from torch_tcsparse.formats.inputs import from_coo
from torch_tcsparse.formats.metcf import BALANCE_CHUNK, build_metcf
from torch_tcsparse.selector import model as cost_model
from torch_tcsparse.selector import (
    Calibration,
    DeviceModel,
    MatrixShape,
    SelectionCache,
    balanced_makespan_units,
    base_makespan_units,
    list_schedule_exact,
    list_schedule_makespan,
    rank,
)


# Terms of the shipped calibration that the simulation tests leave out (set them per test).
NO_FLOOR_NO_MISS = {"floor_us": 0.0, "miss_unit_us": 0.0, "miss_nnz_us": 0.0}


# The Tensor-Core kernels and cuSPARSE: the choice before "rows" is considered.
TC_AND_CSR = ("base", "balanced", "csr")


def model(sm_count=2, resident=2, threshold=1.2, **overrides) -> DeviceModel:
    """A device of ``sm_count x resident`` slots with the default constants (every bucket's
    constants overridable per path), without host floors and L2-miss terms unless given."""
    data = Calibration.load("default")
    buckets = {n: {path: {**c, **NO_FLOOR_NO_MISS} for path, c in paths.items()} for n, paths in data.buckets.items()}
    for path, constants in overrides.items():
        for paths in buckets.values():
            paths[path].update(constants)
    calibration = Calibration("test", threshold, buckets, sm_count, {"base": resident, "balanced": resident})
    return DeviceModel("test device", "test", sm_count, calibration, None)


def shape(window_blocks, nnz=None, max_row=1) -> MatrixShape:
    blocks = np.asarray(window_blocks, dtype=np.int64)
    return MatrixShape(16, blocks, rows=16 * blocks.size, nnz=int(blocks.sum()) * 8 if nnz is None else nnz, max_row_nnz=max_row)


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
    assert list_schedule_exact(costs, slots) == makespan
    assert list_schedule_makespan(costs, slots) == makespan


def test_batched_schedule_is_exact_up_to_the_exact_limit():
    rng = np.random.default_rng(3)
    for slots in (1, 7, 64):
        costs = rng.integers(1, 50, selector.EXACT_JOBS_PER_SLOT * slots).astype(float)
        assert list_schedule_makespan(costs, slots) == list_schedule_exact(costs, slots)


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
    """Beyond EXACT_JOBS_PER_SLOT the fluid estimate is approximate: within 5% of heapq list
    scheduling on these random cases (observed worst about 4%, power-law costs at 30 jobs per
    slot; below 1% for bounded uniform costs)."""
    rng = np.random.default_rng([len(kind), slots, jobs_per_slot])
    jobs = slots * jobs_per_slot
    assert jobs > selector.EXACT_JOBS_PER_SLOT * slots
    for _ in range(3):
        if kind == "uniform":
            costs = rng.integers(1, 10, jobs).astype(float)
        elif kind == "power_law":
            costs = np.minimum(rng.pareto(1.5, jobs) * 3 + 1, 5000).round()
        elif kind == "hubs":
            costs = rng.integers(1, 5, jobs).astype(float)
            costs[rng.integers(0, jobs, 3)] = jobs_per_slot * rng.uniform(1, 20)
        else:
            costs = rng.lognormal(1, 1.2, jobs).round() + 1
        costs += 2.5  # a thread block's fixed cost
        exact = list_schedule_exact(costs, slots)
        assert abs(list_schedule_makespan(costs, slots) - exact) <= 0.05 * exact


@pytest.mark.parametrize("jobs_per_slot", [5, 8, 20])
def test_fluid_schedule_of_equal_jobs_is_at_most_half_a_job_high(jobs_per_slot):
    # Equal jobs run in lockstep waves; the estimate assumes half a job still running per slot.
    slots, cost = 64, 4.0
    exact = list_schedule_exact(np.full(slots * jobs_per_slot, cost), slots)
    assert exact == jobs_per_slot * cost
    estimate = list_schedule_makespan(np.full(slots * jobs_per_slot, cost), slots)
    assert exact <= estimate <= exact + cost / 2


def test_fast_schedule_is_fast_on_a_million_jobs():
    import time

    costs = np.minimum(np.random.default_rng(0).pareto(1.2, 1_000_000) * 3 + 1, 20000).round() + 3
    start = time.perf_counter()
    list_schedule_makespan(costs, 1056)
    assert time.perf_counter() - start < 0.5  # typically 2-5 ms; loose for loaded CI machines


# Kernel simulation: uniform windows, hub windows, AR.


def test_uniform_windows_exact_makespans_and_ar_one():
    m = model(sm_count=2, resident=2)  # 4 slots
    block_units = 3.0
    s = shape([4] * 12)  # 12 windows of 4 blocks: 3 waves on 4 slots
    makespan, work = base_makespan_units(s, slices=1, slots=4, block_units=block_units)
    assert makespan == 3 * (block_units + 4)
    assert work == 12 * (block_units + 4)
    # Balanced with the same cost per segment: 4 blocks of 3 whole windows each: identical.
    launch = balanced_makespan_units(s, 1, 4, block_units, split_units=0.0)
    assert (launch.makespan, launch.work, launch.zeroed_windows) == (3 * (block_units + 4), work, 0)
    explanation = rank(s, 32, m)
    assert explanation.ar == pytest.approx(1.0)
    assert explanation.ar_kernel == "base"


def test_slices_multiply_the_jobs():
    s = shape([4] * 4)
    # 2 slices of 4 windows on 4 slots: 2 waves.
    assert base_makespan_units(s, slices=2, slots=4, block_units=1.0)[0] == 2 * 5


def test_hub_window_exact_makespans_and_large_ar():
    # One hub of 32 * 64 blocks and 63 windows of 1 block on 8 slots.
    blocks = [32 * 64] + [1] * 63
    s = shape(blocks)
    base, _ = base_makespan_units(s, slices=1, slots=8, block_units=1.0)
    assert base == 1.0 + 32 * 64  # the hub's thread block alone
    # Balanced: 127 items, 16 per thread block; blocks 0-3 each take 16 hub chunks (512 TC blocks,
    # one segment, cut by a range boundary so added atomically), blocks 4-7 the small windows.
    launch = balanced_makespan_units(s, 1, 8, segment_units=1.0, split_units=2.0)
    assert launch.makespan == 1.0 + 512 + 2.0
    assert launch.zeroed_windows == 3  # the hub, cut by three range boundaries (counted per cut)
    assert (launch.makespan, launch.work) == reference_balanced(blocks, 1, 8, 1.0, 2.0)
    explanation = rank(s, 32, model(sm_count=4, resident=2))
    assert explanation.ar > 3.0
    assert explanation.ar_kernel == "balanced"
    assert explanation.choice in ("balanced", "csr", "rows")


@pytest.mark.parametrize("slices, slots", [(1, 3), (2, 8), (4, 8), (3, 5), (2, 1000)])
def test_balanced_matches_item_by_item_reference(slices, slots):
    blocks = [70, 0, 5, 33, 1, 100, 2, 0, 64, 31, 32]
    launch = balanced_makespan_units(shape(blocks), slices, slots, 1.5, 2.0)
    assert (launch.makespan, launch.work) == pytest.approx(reference_balanced(blocks, slices, slots, 1.5, 2.0))


def test_balanced_one_chunk_per_warp_zeroes_empty_and_continued_windows():
    # 16 chunks x 2 slices <= 1000 slots: one chunk per warp. Windows of 70, 33, 100 and 64 blocks
    # split into 3 + 2 + 4 + 2 chunks: per slice 11 - 4 = 7 warps end inside a window; 2 empty.
    blocks = [70, 0, 5, 33, 1, 100, 2, 0, 64, 31, 32]
    launch = balanced_makespan_units(shape(blocks), 2, 1000, 1.5, 2.0)
    assert launch.zeroed_windows == 2 + 2 * 7
    assert launch.makespan == 1.5 + 32 + 2.0

def test_kernel_time_splits_even_work_and_tail():
    constants = {"launch_us": 5.0, "unit_us": 2.0, "tail_us": 0.5}
    # 40 units of work on 4 slots: 10 even; a makespan of 30 leaves a tail of 20.
    assert selector.kernel_time_us(constants, makespan=30.0, work=40.0, slots=4) == 5.0 + 2.0 * 10 + 0.5 * 20
    assert selector.kernel_time_us(constants, makespan=10.0, work=40.0, slots=4) == 5.0 + 2.0 * 10


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
    l2 = 50 << 20
    assert selector.l2_miss_fraction(1000, 128, 4, l2) == 0.0  # 512 KB of X: all in L2
    assert selector.l2_miss_fraction(4 * l2 // 512, 128, 4, l2) == pytest.approx(0.75)
    assert selector.l2_miss_fraction(0, 128, 4, l2) == 0.0


def test_miss_terms_price_x_beyond_l2():
    m = model(csr={"miss_nnz_us": 1e-3}, base={"miss_unit_us": 1.0})
    blocks = [4] * 12
    fits = MatrixShape(16, np.asarray(blocks), rows=192, nnz=384, max_row_nnz=1, cols=1000)
    beyond = dataclasses.replace(fits, cols=1 << 22)  # 2 GB of X at N = 128
    near, far = rank(fits, 128, m), rank(beyond, 128, m)
    assert far.features["x_share_beyond_l2"] > 0.95 and near.features["x_share_beyond_l2"] == 0.0
    assert far.costs_us["csr"] - near.costs_us["csr"] == pytest.approx(1e-3 * 384 * far.features["x_share_beyond_l2"])
    assert far.costs_us["base"] > near.costs_us["base"]


@pytest.mark.parametrize("ratio", [0.4, 1.3])
def test_rows_order_scales_the_rows_time(ratio):
    """A reordered matrix's rows path: its time (all but the split rows' launch) scales by
    1 - ROWS_ORDER_GAIN x (1 - ratio), down when the order brings rows that share columns
    together, up when it parts them."""
    m = model(rows={"miss_nnz_us": 1e-3, "split_launch_us": 0.0})
    given = MatrixShape(16, np.asarray([4] * 12), rows=192, nnz=384, max_row_nnz=1, cols=1 << 22)
    ordered = dataclasses.replace(given, rows_share_ratio=ratio)
    before, after = rank(given, 128, m), rank(ordered, 128, m)
    assert after.features["rows_share_ratio"] == ratio
    expected = 1 - selector.ROWS_ORDER_GAIN * (1 - ratio)
    assert after.costs_us["rows"] == pytest.approx(before.costs_us["rows"] * expected)
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


def test_chunks_of_a_layout():
    s = shape([70, 0, 32, 33])
    sizes, first = s.chunks
    assert sizes.tolist() == [32, 32, 6, 32, 32, 1]
    assert first.tolist() == [True, False, False, True, True, False]
    assert s.empty_windows == 1 and s.nonempty_windows == 3


@pytest.mark.parametrize("blocks", [[70, 0, 32, 33], [0, 0, 5, 0, 64, 1, 0], [1] * 9, [100]])
def test_before_chunks_agrees_with_the_chunks(blocks):
    s = shape(blocks)
    sizes, first = s.chunks
    c = np.arange(s.num_chunks + 1)
    before_blocks, before_firsts, is_first = s.before_chunks(c)
    assert before_blocks.tolist() == np.concatenate([[0], np.cumsum(sizes)]).tolist()
    assert before_firsts.tolist() == np.concatenate([[0], np.cumsum(first)]).tolist()
    assert is_first.tolist() == first.tolist() + [False]


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
    monkeypatch.setattr(cost_model, "_kernels_usable", lambda dtype, device: True)
    cuda = torch.device("cuda")
    assert "rows" in cost_model.runnable_paths(dtype, cuda, shape([4] * 12))
    huge = shape([4] * 12, nnz=1 << 31)
    assert "rows" not in cost_model.runnable_paths(dtype, cuda, huge)


def test_rows_caps_the_longest_row_at_a_piece():
    hub = shape([4] * 12, max_row=10**6)
    costs = rank(hub, 32, model(rows={"max_row_us": 1.0, "floor_us": 0.0}), ("rows",)).costs_us
    # launch, nnz and rows terms aside, a piece of PIECE_NNZ nonzeros, not the hub's million
    assert costs["rows"] < 2 * csr_rows.PIECE_NNZ


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rows_pays_the_split_launch_only_when_a_row_is_split(dtype):
    m = model(rows={"split_launch_us": 7.0, "max_row_us": 0.0, "floor_us": 0.0})
    unsplit, split = shape([4] * 12, max_row=csr_rows.PIECE_NNZ // 8), shape([4] * 12, max_row=10**6)
    piece = cost_model.rows_piece_nnz(split, dtype)
    assert unsplit.max_row_nnz <= cost_model.rows_piece_nnz(unsplit, dtype)
    costs = [rank(s, 32, m, ("rows",), dtype).costs_us["rows"] for s in (unsplit, split)]
    assert costs[1] == pytest.approx(costs[0] + 7.0)
    assert rank(split, 32, m, dtype=dtype).features["rows_piece_nnz"] == piece


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
    assert selector.default_column_slices(n) == slices


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


def test_matrix_shape_of_layout():
    layout = small_layout()
    s = MatrixShape.of(layout)
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
    # The shape built from them equals the one read back from the tensors alone.
    from_host = MatrixShape.of(layout)
    rebuilt = type(layout).from_tensors(layout.tensors(), layout.window, layout.num_rows, layout.num_cols)
    assert rebuilt.host_counts is None
    read_back = MatrixShape.of(rebuilt)
    assert from_host.window_blocks.tolist() == read_back.window_blocks.tolist()
    assert from_host.max_row_nnz == read_back.max_row_nnz
    for given, computed in zip(from_host._chunk_prefixes, read_back._chunk_prefixes):
        assert given.tolist() == computed.tolist()
    assert from_host.summary == read_back.summary
    assert rank(from_host, 64, model()).costs_us == rank(read_back, 64, model()).costs_us


def test_select_agrees_with_rank():
    layout = small_layout()
    s = MatrixShape.of(layout)
    for n in (32, 128):
        for sm_count, resident in ((1, 1), (2, 4), (64, 16)):
            m = model(sm_count=sm_count, resident=resident)
            assert selector.select(s, n, m) == rank(s, n, m).choice


def test_cache_computes_once_per_bucket_dtype_device(monkeypatch):
    layout = small_layout()
    reads = []
    original = MatrixShape.of
    monkeypatch.setattr(MatrixShape, "of",
                        classmethod(lambda cls, lay, **features: reads.append(1) or original(lay, **features)))
    cache = SelectionCache()
    first = cache.explain(layout, 100, torch.float32)
    assert cache.explain(layout, 128, torch.float32) is first  # same bucket
    assert len(cache) == 1
    cache.explain(layout, 64, torch.float32)
    cache.explain(layout, 64, torch.float64)
    assert len(cache) == 3
    assert len(reads) == 1  # block counts read from the layout once
    assert cache.choose(layout, 128, torch.float32) == (first.choice, None)  # no trial off CUDA


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


# On a GPU: the occupancy the kernels report, and a chosen path that runs.


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_choice_on_cuda_uses_kernel_occupancy_and_runs():
    from torch_tcsparse import TCSparseTensor, kernels

    assert kernels.available()
    g = torch.Generator().manual_seed(1)
    n = 3000
    row, col = torch.randint(0, n, (30000,), generator=g), torch.randint(0, n, (30000,), generator=g)
    a = TCSparseTensor.from_coo(row, col, torch.rand(30000, generator=g), shape=(n, n)).cuda()
    layout = a._structure.layout
    cache = SelectionCache()
    for width in (32, 128):
        explanation = cache.explain(layout, width, torch.float32)
        props = torch.cuda.get_device_properties(a.device)
        for path in ("base", "balanced"):
            resident = kernels.occupancy(path, width)
            assert resident >= 1
            assert explanation.slots[path] == props.multi_processor_count * resident
            assert kernels.column_slices(path, width) >= 1
        # A cache without a structure has no grouped layout to offer.
        assert explanation.candidates == tuple(c for c in selector.CHOICES if c != "grouped")
        x = torch.randn(n, width, device="cuda")
        expected = a.matmul(x, path="csr")
        got = a.matmul(x, path=explanation.choice)
        torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2 * float(expected.abs().max()))


# The calibration pipeline of benchmarks/selector.py, offline on synthetic measurements.


def selector_benchmark():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "selector.py"
    spec = importlib.util.spec_from_file_location("selector_benchmark", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_benchmark_times_first_choices_on_fresh_caches():
    bench = selector_benchmark()
    subject = (small_layout(), 128, torch.float32, 1.0, None)
    features_us, choice_us, path = bench.first_choice_sample(*subject)
    assert features_us > 0 and choice_us > 0
    assert path == "csr"  # no kernels on the CPU
    medians = bench.first_choice_rounds({3: subject, 7: subject}, rounds=3)
    assert set(medians) == {3, 7} and all(len(pair) == 2 and min(pair) > 0 for pair in medians.values())


def test_benchmark_refits_and_scores_offline(tmp_path, capsys):
    import json

    bench = selector_benchmark()

    # Measurements made up from a known calibration (with a slower balanced kernel than the
    # defaults), on graphs from uniform to heavy-tailed.
    info = {
        "name": "made-up GPU", "family": "madeup", "sm_count": 16,
        "occupancy": {p: {str(n): 4 for n in selector.BUCKETS} for p in selector.KERNEL_CHOICES},
        "slices": {p: {str(n): selector.default_column_slices(n) for n in selector.BUCKETS} for p in selector.KERNEL_CHOICES},
    }
    truth = Calibration.load("default")
    for paths in truth.buckets.values():
        paths["balanced"]["split_units"] = 6.0
        paths["base"]["tail_us"] *= 0.5
    rng = np.random.default_rng(0)
    shapes, records = {}, []
    for i in range(8):
        blocks = np.minimum(rng.pareto(0.8 + 0.3 * i, 500 * (i + 1)).astype(np.int64) * 3 + 1, 3000)
        shapes[f"g{i}"] = MatrixShape(16, blocks, 16 * blocks.size, int(blocks.sum()) * (3 + i), int(blocks.max()) * 2)
        for dtype in (torch.float32, torch.float16):
            for n in selector.BUCKETS:
                record = {"graph": f"g{i}", "n": n, "dtype": selector.dtype_name(dtype), "choice_us": 100.0,
                          "launch": {p: [4, selector.default_column_slices(n, dtype)] for p in selector.KERNEL_CHOICES}}
                costs = rank(shapes[f"g{i}"], n, bench.model_for(info, truth, record), dtype=dtype).costs_us
                records.append({**record, "times_us": costs})
    bench.save(tmp_path / "run", records, shapes, info)

    bench.main(["--refit-from", str(tmp_path / "run"), "--calibrate", "--out", str(tmp_path / "out")])
    table = capsys.readouterr().out
    assert "held-out half" in table and "fitted on all" in table
    assert table.rstrip().endswith("worst vs csr <= 1.10")
    fitted = Calibration.from_dict(json.loads((tmp_path / "out" / "madeup.json").read_text()), "fitted")
    assert set(fitted.buckets) == set(selector.BUCKETS)
    assert set(fitted.dtype_buckets) == {"float16"} and set(fitted.dtype_buckets["float16"]) == set(selector.BUCKETS)
    assert set(fitted.csr_margin) == set(selector.KERNEL_CHOICES)
    scored = bench.score(records, shapes, info, fitted)
    assert scored["hit_rate"] >= 0.9
    assert scored["worst_vs_csr"] <= 1.10


def made_up_run(bench, tmp_path, name, scale=1.0):
    """A run of a made-up device whose times are the default calibration's predictions (times
    ``scale``), saved as benchmarks/selector.py saves one: (folder, records, shapes, info)."""
    info = {
        "name": "made-up GPU", "family": "madeup", "sm_count": 16,
        "occupancy": {p: {str(n): 4 for n in selector.BUCKETS} for p in selector.KERNEL_CHOICES},
        "slices": {p: {str(n): selector.default_column_slices(n) for n in selector.BUCKETS} for p in selector.KERNEL_CHOICES},
    }
    truth = Calibration.load("default")
    rng = np.random.default_rng(1)
    shapes, records = {}, []
    for i in range(6):
        blocks = np.minimum(rng.pareto(0.8 + 0.3 * i, 300 * (i + 1)).astype(np.int64) * 3 + 1, 3000)
        shapes[f"g{i}"] = MatrixShape(16, blocks, 16 * blocks.size, int(blocks.sum()) * (3 + i), 100 * i)
        for n in selector.BUCKETS:
            record = {"graph": f"g{i}", "n": n, "dtype": "float32", "choice_us": 100.0,
                      "launch": {p: [4, selector.default_column_slices(n)] for p in selector.KERNEL_CHOICES}}
            costs = rank(shapes[f"g{i}"], n, bench.model_for(info, truth, record)).costs_us
            records.append({**record, "times_us": {p: t * scale for p, t in costs.items()}})
    bench.save(tmp_path / name, records, shapes, info)
    return tmp_path / name, records, shapes, info


def test_benchmark_shapes_load_back_also_from_older_runs(tmp_path):
    bench = selector_benchmark()
    folder, _, shapes, _ = made_up_run(bench, tmp_path, "run")
    loaded = bench.load_saved(folder)[1]
    for name, shape in shapes.items():
        assert (loaded[name].max_row_nnz, loaded[name].num_cols) == (shape.max_row_nnz, shape.num_cols)
        assert loaded[name].window_blocks.tolist() == shape.window_blocks.tolist()
    # A run saved before the columns were: its meta rows end at the longest row.
    with np.load(folder / "shapes.npz") as arrays:
        older = {key: arrays[key][:4] if key.endswith("/meta") else arrays[key] for key in arrays.files}
    np.savez_compressed(folder / "shapes.npz", **older)
    assert all(s.cols is None and s.grouped_blocks is None for s in bench.load_saved(folder)[1].values())


def test_benchmark_leaves_stale_times_out_and_one_run_out(tmp_path, capsys):
    import json

    bench = selector_benchmark()
    first, records, _, _ = made_up_run(bench, tmp_path, "first")
    second, _, _, _ = made_up_run(bench, tmp_path, "second", scale=1.1)
    (first / "stale.json").write_text(json.dumps({"stale": [{"path": "rows", "n": 256, "why": "test"}]}))
    loaded = bench.load_saved(first)[0]
    assert all(("rows" in r["times_us"]) == (r["n"] != 256) for r in loaded)
    # Merged: each path's geometric mean over the runs that measured it.
    merged = bench.load_runs([first, second])[0]
    at_256 = next(r for r in merged if r["n"] == 256)
    original = next(r for r in records if r["n"] == 256 and r["graph"] == at_256["graph"])
    assert at_256["times_us"]["rows"] == pytest.approx(1.1 * original["times_us"]["rows"])
    assert at_256["times_us"]["csr"] == pytest.approx(1.1**0.5 * original["times_us"]["csr"])

    bench.main(["--refit-from", f"{first},{second}", "--leave-one-run-out", "--out", str(tmp_path / "out")])
    table = capsys.readouterr().out
    assert table.count("fitted on the others") == 2 and table.count("default.json") == 2
    assert (tmp_path / "out" / "leave_one_run_out.txt").read_text() == table


def test_lazy_imports_of_the_kernels_resolve():
    """The selector reaches the kernels module only when asked about a CUDA device; those
    imports must resolve from inside the package on a machine without one too."""
    from torch_tcsparse.selector import device

    assert isinstance(device._tf32_allowed(), bool)
    assert isinstance(cost_model._kernels_usable(torch.float32, torch.device("cuda")), bool)


def test_grouped_path_cost_choice_and_availability(monkeypatch):
    """The grouped kernel's time is its fixed part plus a cost per warp-step (blocks x warps per
    chunk), scaled to the SM count; it is chosen where predicted fastest, and offered only where
    the matrix has a grouped layout and results need not be deterministic."""
    row, col, _ = synthetic.uniform(300, 60, seed=3)
    layout, _ = build_metcf(from_coo(row, col, None, (300, 300), None))
    shape = dataclasses.replace(MatrixShape.of(layout), grouped_blocks=1000)
    model = selector.device_model(torch.device("cpu"))
    prediction = cost_model.predict(shape, 128, model)
    steps = 1000 * 4  # one warp per 32 columns
    expected = cost_model.GROUPED_FIXED_US[4] + cost_model.GROUPED_STEP_NS[4] * steps * 132 / model.sm_count / 1e3
    assert prediction.device_us["grouped"] == pytest.approx(expected)
    assert cost_model.grouped_warps_per_chunk(100, torch.float16) == 4
    assert "grouped" not in cost_model.predict(MatrixShape.of(layout), 128, model).device_us

    costs = {"base": 50.0, "balanced": 40.0, "csr": 60.0, "rows": 45.0, "grouped": 30.0}
    calibration = model.calibration
    assert cost_model._decide(selector.CHOICES, costs, 1.0, 10, calibration)[0] == "grouped"
    assert cost_model._decide(selector.CALIBRATED_CHOICES, costs, 1.0, 10, calibration)[0] != "grouped"

    monkeypatch.setattr(cost_model, "_kernels_usable", lambda dtype, device: True)
    cuda = torch.device("cuda")
    assert "grouped" in cost_model.runnable_paths(torch.float32, cuda, shape)
    assert "grouped" not in cost_model.runnable_paths(torch.float32, cuda, MatrixShape.of(layout))
    torch.use_deterministic_algorithms(True)
    try:
        assert "grouped" not in cost_model.runnable_paths(torch.float32, cuda, shape)
    finally:
        torch.use_deterministic_algorithms(False)


def test_grouped_rest_priced_and_split_chosen_by_price():
    """The grouped path costs its layout's blocks plus the rows kernel on the nonzeros it leaves
    out; the split is the threshold of least such cost: one that drops most blocks for a small
    rest wins, one that pushes most nonzeros into the rest loses to keeping them."""
    row, col, _ = synthetic.uniform(3000, 60, seed=3)
    layout, _ = build_metcf(from_coo(row, col, None, (3000, 3000), None))
    shape = MatrixShape.of(layout)
    model = selector.device_model(torch.device("cpu"))
    whole = dataclasses.replace(shape, grouped_blocks=20_000)
    split = dataclasses.replace(whole, grouped_rest_nnz=10_000)
    rows = model.calibration.constants("rows", 128, torch.float32)
    miss = cost_model.l2_miss_fraction(shape.num_cols, 128, 4, model.l2_bytes)
    rest_us = cost_model._rows_time_us(rows, dataclasses.replace(shape, nnz=10_000), miss)
    predicted = cost_model.predict(split, 128, model).device_us["grouped"]
    assert predicted == pytest.approx(cost_model.predict(whole, 128, model).device_us["grouped"] + rest_us)
    assert selector.grouped_split({1: (20_000, 0), 16: (2_000, 10_000)}, shape, model) == 16
    assert selector.grouped_split({1: (20_000, 0), 16: (19_000, shape.nnz)}, shape, model) == 1


def test_grouped_kernel_writing_16bit_y_itself_drops_the_zeroing_and_rounding():
    """Where every group is one chunk and nothing is left to the rows kernel, a 16-bit Y is
    written by the grouped kernel alone (no zeroed sums, no rounding launch): float32 and layouts
    with several chunks per group or a rest keep their fixed cost."""
    one_chunk = dataclasses.replace(shape([4] * 8), grouped_blocks=100, grouped_one_chunk=True)
    shared = dataclasses.replace(one_chunk, grouped_one_chunk=False)
    with_rest = dataclasses.replace(one_chunk, grouped_rest_nnz=10)

    def time_us(s, dtype=torch.float16):
        return cost_model.grouped_time_us(s, 128, dtype, 132)

    saved = cost_model.GROUPED_FIXED_US[2] - cost_model.GROUPED_DIRECT_FIXED_US
    assert time_us(shared) - time_us(one_chunk) == pytest.approx(saved)
    assert time_us(with_rest) == time_us(shared)
    assert time_us(one_chunk, torch.float32) == time_us(shared, torch.float32)
