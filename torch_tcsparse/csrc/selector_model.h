// The kernel selector's first choice in C++: the cost model of torch_tcsparse/selector (model.py,
// shape.py, schedule.py) for one (matrix, N bucket, dtype) on the device at hand, without the
// explanation. Python's model stays the reference (explanations, CPU, the offline calibration):
// tests/gpu/test_selector_native.py checks that both give the same costs and choice. Plain C++:
// no torch, no CUDA; the binding (selector_binding.cpp) hands over the launch shapes.
#pragma once

#include <cstdint>

namespace tcsparse::selector {

// The paths, in the order of torch_tcsparse.selector.CHOICES.
enum Path : int { kBase = 0, kBalanced, kCsr, kRows, kGrouped, kNumPaths };

// What the simulation knows of a matrix: sizes, and per-window prefix sums (windows + 1 entries
// each, the conversion's host copies, owned by the caller).
struct Matrix {
    int64_t window = 16;  // rows per window
    int64_t windows = 0;
    int64_t rows = 0;
    int64_t cols = 0;
    int64_t nnz = 0;
    int64_t max_row_nnz = 0;
    const int64_t* chunk_start = nullptr;      // balanced chunks before each window
    const int64_t* block_start = nullptr;      // TC blocks before each window
    const int64_t* nonempty_before = nullptr;  // windows of at least one block before each window
    double rows_share_ratio = 1.0;
    int64_t grouped_blocks = -1;  // blocks of the grouped layout; -1: the path cannot pay
    int64_t grouped_rest_nnz = 0;
    bool grouped_one_chunk = false;
};

// The scalars that decide a launch of one wave (shape.ShapeSummary), computed once per matrix.
struct Summary {
    int64_t tc_blocks = 0;
    int64_t max_blocks = 0;
    int64_t max_single_chunk_blocks = 0;
    int64_t empty_windows = 0;
    int64_t chunks = 0;
    int64_t split_windows = 0;
    int64_t chunks_of_split_windows = 0;
};

Summary summarize(const Matrix& m, int64_t chunk);

// A calibration's constants for one N bucket and dtype (device.Calibration.constants), a missing
// optional term as 0.
struct KernelPrices {
    double launch_us = 0, unit_us = 0, miss_unit_us = 0, tail_us = 0, floor_us = 0;
    double block_units = 0;                               // base
    double segment_units = 0, split_units = 0, zero_us = 0;  // balanced
};

struct LinearPrices {  // csr and rows
    double launch_us = 0, nnz_us = 0, row_us = 0, max_row_us = 0, miss_nnz_us = 0, split_launch_us = 0, floor_us = 0;
};

struct GroupedPrices {  // model.GROUPED_* for the dtype's element size
    double step_ns = 0, fixed_us = 0, direct_fixed_us = 0, reference_sms = 1;
};

struct Rule {  // model._decide
    bool by_cost = false;  // kernel_rule "cost"; else DTC-SpMM's AR threshold
    double ar_threshold = 0, csr_margin_base = 0, csr_margin_balanced = 0, rows_margin = 0;
    double rows_order_gain = 0;  // model.ROWS_ORDER_GAIN
};

struct Prices {
    KernelPrices base, balanced;
    LinearPrices csr, rows;
    GroupedPrices grouped;
    Rule rule;
    int64_t sm_count = 1;
    int64_t l2_bytes = 0;
    int64_t chunk = 32;                 // formats.metcf.BALANCE_CHUNK
    int64_t exact_jobs_per_slot = 4;    // schedule.EXACT_JOBS_PER_SLOT
    int64_t rest_piece_nnz = 256;       // csr_rows.PIECE_NNZ: the pieces of the grouped path's rest
    int64_t grouped_column_step = 32;   // columns per warp of the grouped kernel
};

struct Launch {
    int64_t resident = 1;  // warps of the kernel resident per SM
    int64_t slices = 1;    // warps per window (base) or chunk (balanced) along N
};

struct Query {
    int64_t n = 0;           // the N bucket
    int64_t value_bytes = 4; // of X's dtype
    Launch base, balanced;
    int64_t piece_nnz = 0;   // the rows path's pieces (csr_rows.split_piece_nnz)
    unsigned candidates = 0; // bit p: path p may run
    // Price every path: else the kernels' schedules are simulated only where the choice depends
    // on them (their launch and evenly spread work already rule them out on most graphs that
    // take "rows").
    bool all_costs = false;
};

struct Choice {
    int path = kCsr;
    double costs_us[kNumPaths] = {};  // predicted time per call, at least the path's host floor; NaN unpriced
    bool priced[kNumPaths] = {};      // grouped only where the matrix has the layout
};

Choice choose(const Matrix& m, const Summary& summary, const Prices& prices, const Query& query);

}  // namespace tcsparse::selector
