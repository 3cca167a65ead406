// The kernel selector's cost model (the package docstring of torch_tcsparse/selector describes
// it): the predicted time of every path for one (matrix, N bucket, dtype) on a device, the choice
// between them, and its explanation. Plain C++, no torch and no CUDA, so that it runs without a
// GPU too; the C ABI (selector_capi.cpp) is what Python loads, and Python hands over the launch
// shapes (queried from the compiled kernels on a GPU, the documented defaults without one).
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

// The scalars that decide a launch of one wave, computed once per matrix.
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

// A calibration's constants for one N bucket and dtype (selector.Calibration.constants), a
// missing optional term as 0.
struct KernelPrices {
    double launch_us = 0, unit_us = 0, miss_unit_us = 0, tail_us = 0, floor_us = 0;
    double block_units = 0;                               // base
    double segment_units = 0, split_units = 0, zero_us = 0;  // balanced
};

struct LinearPrices {  // csr and rows
    double launch_us = 0, nnz_us = 0, row_us = 0, max_row_us = 0, miss_nnz_us = 0, split_launch_us = 0, floor_us = 0;
};

// The grouped kernel's time: a fixed part (the launches), a cost per block (its fragment slots and
// metadata) and per warp-step (one block of a chunk for one warp: the gathers of X and the MMAs),
// both whole GPU, and a cost per byte of Y: a launch that adds into fp32 sums zeroes them and adds
// every chunk's sums atomically, a traffic that on graphs of millions of rows outweighs the
// blocks'; where the kernel writes a 16-bit Y itself (every group one chunk, nothing left to the
// rows kernel) it stores each row once. Fitted on an H200 (132 SMs) by relative least squares on
// the grouped kernel's times at N = 32 and 128 on the corpus's "fit" families (4M and 16M
// nonzeros, in their given, tca and community orders) and the suite graphs the grouped path
// serves (docs/DECISIONS.md); the byte prices are the device's bandwidth, not scaled by SMs.
struct GroupedPrices {
    double fixed_us = 0, block_ns = 0, step_ns = 0, sums_us_per_mb = 0, direct_us_per_mb = 0, reference_sms = 1;
};

// Per element size of X: 4 bytes (float32 and wider), 2 bytes.
GroupedPrices grouped_prices(int64_t value_bytes);

// Columns of X per warp of the grouped kernel (csrc/grouped_spmm.cu), in every dtype.
constexpr int64_t kGroupedColumnsPerWarp = 32;

// The share of the rows path's time that an order removes per unit of distinct-column share
// removed, where all of X lies beyond L2 (it scales with the share that does: an order moves
// the rows of X that miss L2); less in 16 bits, whose rows kernel waits on its gathers' latency
// more than on their bytes. Fitted with the grouped prices, on the same orders (the package
// docstring).
constexpr double rows_order_gain(int64_t value_bytes) { return value_bytes >= 4 ? 0.68 : 0.49; }

// List scheduling is simulated exactly up to this many jobs per slot, estimated beyond.
constexpr int64_t kExactJobsPerSlot = 4;

struct Rule {
    bool by_cost = false;  // kernel_rule "cost"; else DTC-SpMM's AR threshold
    double ar_threshold = 0, csr_margin_base = 0, csr_margin_balanced = 0, rows_margin = 0;
};

struct Prices {
    KernelPrices base, balanced;
    LinearPrices csr, rows;
    Rule rule;
    int64_t sm_count = 1;
    int64_t l2_bytes = 0;
    int64_t chunk = 32;             // formats.metcf.BALANCE_CHUNK
    int64_t rest_piece_nnz = 256;   // csr_rows.PIECE_NNZ: the pieces of the grouped path's rest
};

struct Launch {
    int64_t resident = 1;  // warps of the kernel resident per SM
    int64_t slices = 1;    // warps per window (base) or chunk (balanced) along N
};

struct Query {
    int64_t n = 0;           // the N bucket
    int64_t value_bytes = 4; // of X's dtype (launch shapes and grouped prices of float32 above 4)
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

// Warps per window along N without a CUDA device to ask: the dispatch rule of csrc/metcf_spmm.cuh.
// A step is the columns of one 16-byte copy per lane group (32 for 4-byte X, 64 for 16-bit);
// slices are two steps wide when N >= 2 steps and the last slice is more than half full, else one.
int64_t default_column_slices(int64_t n, int64_t value_bytes);

// Rows the rows kernel packs into a warp at N columns (csrc/csr_rows_spmm.cu): slots of the fewest
// lanes, a power of two up to 32, whose kRowsLaneBytes each cover a row of X; a warp per row from
// 32 lanes' worth of columns on.
constexpr int64_t kRowsLaneBytes = 16;
int64_t rows_per_warp(int64_t n, int64_t value_bytes);

// Per-window prefix sums of TC blocks per window (length windows each; outputs windows + 1):
// balanced chunks, TC blocks and non-empty windows before each window.
void prefixes(const int64_t* window_blocks, int64_t windows, int64_t chunk, int64_t* chunk_start,
              int64_t* block_start, int64_t* nonempty_before);

// The base kernel's launch in TC-block units, list-scheduled on `slots`.
struct Units {
    double makespan = 0, work = 0;
};
Units base_launch(const Matrix& m, const Summary& s, int64_t slices, int64_t slots, double block_units);

// The balanced kernel's persistent grid, exactly as metcf_balanced_kernel splits it, at
// `segment_units` per segment and `split_units` per cut segment.
struct BalancedUnits {
    double makespan = 0, work = 0;
    int64_t zeroed_windows = 0;  // cleared first: empty windows plus range boundaries inside a window
};
BalancedUnits balanced_launch(const Matrix& m, const Summary& s, int64_t slices, int64_t slots, double segment_units,
                              double split_units, int64_t chunk);

// The grouped path's device time with `blocks` in its layout and `rest_nnz` left to the rows
// kernel (no host floor).
double grouped_path_us(const Matrix& m, const Prices& p, int64_t n, int64_t value_bytes, int64_t blocks,
                       int64_t rest_nnz, bool one_chunk);

// Everything the choice is made of, every path priced: what an explanation reads out.
struct Explanation {
    Choice choice;
    double device_us[kNumPaths] = {};  // before the host floor; NaN unpriced
    double ar = 1.0;                   // DTC-SpMM's approximation ratio
    Units base;                        // TC-block units
    BalancedUnits balanced;
    double miss = 0;                   // share of X beyond L2
    int64_t slots[2] = {};             // base, balanced: SMs x resident warps
    int64_t slices[2] = {};
    double makespans_us[3] = {};       // base, balanced, base at perfect balance
    double bytes_moved[4] = {};        // base, balanced, csr, rows
    char reason[512] = {};
};

Explanation explain(const Matrix& m, const Summary& summary, const Prices& prices, const Query& query);

}  // namespace tcsparse::selector
