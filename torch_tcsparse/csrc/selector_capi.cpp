// A C ABI over the selector's cost model (selector_model.h), loaded by torch_tcsparse/selector/
// native.py through ctypes: no torch, no pybind11 and no CUDA, so that it builds in seconds with
// the system's C++ compiler and runs on machines without a GPU. A matrix's prefix sums are kept
// by reference (the caller keeps the arrays alive); a calibration's prices are handed over by name
// once per (N bucket, dtype, device), and what a choice at one N bucket asks of a device
// (TcsQuery) is built once and shared by every matrix, so that a choice is one call of four
// arguments: ctypes converts each argument of a call, and that conversion, not the model, is most
// of what a first choice costs on a small graph.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "selector_model.h"

namespace sel = tcsparse::selector;

namespace {

struct MatrixHandle {
    sel::Matrix matrix;
    sel::Summary summary;
    int64_t chunk = 32;
    // The rows path's pieces (csr_rows.split_piece_nnz) for X of 4 or more bytes, and of 2.
    int64_t piece_nnz[2] = {};
};

}  // namespace

// What a choice at one N bucket asks of one device for X of one dtype: selector/native.py
// mirrors this layout (native.Query).
struct TcsQuery {
    const void* prices;
    int64_t n;            // the N bucket
    int64_t value_bytes;  // of X's dtype
    int64_t launch[4];    // resident warps per SM and column slices of base, then of balanced
};

namespace {

sel::Query query_of(const MatrixHandle& h, const TcsQuery& t, unsigned candidates, bool all_costs) {
    sel::Query q;
    q.n = t.n;
    q.value_bytes = t.value_bytes;
    q.base = {t.launch[0], t.launch[1]};
    q.balanced = {t.launch[2], t.launch[3]};
    q.piece_nnz = h.piece_nnz[t.value_bytes < 4 ? 1 : 0];
    q.candidates = candidates;
    q.all_costs = all_costs;
    return q;
}

// The field of `p` named `name` ("<path>.<constant>", "rule.<field>" or "device.<field>"), or null.
double* price_field(sel::Prices& p, const std::string& name) {
    const auto dot = name.find('.');
    if (dot == std::string::npos) return nullptr;
    const std::string group = name.substr(0, dot), key = name.substr(dot + 1);
    if (group == "base" || group == "balanced") {
        sel::KernelPrices& k = group == "base" ? p.base : p.balanced;
        if (key == "launch_us") return &k.launch_us;
        if (key == "unit_us") return &k.unit_us;
        if (key == "miss_unit_us") return &k.miss_unit_us;
        if (key == "tail_us") return &k.tail_us;
        if (key == "floor_us") return &k.floor_us;
        if (key == "block_units" && group == "base") return &k.block_units;
        if (key == "segment_units" && group == "balanced") return &k.segment_units;
        if (key == "split_units" && group == "balanced") return &k.split_units;
        if (key == "zero_us" && group == "balanced") return &k.zero_us;
        return nullptr;
    }
    if (group == "csr" || group == "rows") {
        sel::LinearPrices& l = group == "csr" ? p.csr : p.rows;
        if (key == "launch_us") return &l.launch_us;
        if (key == "nnz_us") return &l.nnz_us;
        if (key == "row_us") return &l.row_us;
        if (key == "max_row_us") return &l.max_row_us;
        if (key == "miss_nnz_us") return &l.miss_nnz_us;
        if (key == "floor_us") return &l.floor_us;
        if (key == "split_launch_us" && group == "rows") return &l.split_launch_us;
        return nullptr;
    }
    if (group == "rule") {
        if (key == "ar_threshold") return &p.rule.ar_threshold;
        if (key == "csr_margin_base") return &p.rule.csr_margin_base;
        if (key == "csr_margin_balanced") return &p.rule.csr_margin_balanced;
        if (key == "rows_margin") return &p.rule.rows_margin;
    }
    return nullptr;
}

thread_local std::string last_error;

}  // namespace

extern "C" {

// The message of the last call that failed (returned null or a negative code).
const char* tcs_last_error() { return last_error.c_str(); }

// The name of path `path` of the model's enum Path (the order its costs and choices use), null
// past the last: the Python side checks it against its own list when it loads the library.
const char* tcs_path_name(int path) {
    static const char* const kNames[sel::kNumPaths] = {"base", "balanced", "csr", "rows", "grouped"};
    static_assert(sel::kBase == 0 && sel::kBalanced == 1 && sel::kCsr == 2 && sel::kRows == 3 && sel::kGrouped == 4,
                  "kNames follows enum Path");
    return path >= 0 && path < sel::kNumPaths ? kNames[path] : nullptr;
}

// Prefix sums of `window_blocks` into three arrays of `windows + 1` entries.
void tcs_prefixes(const int64_t* window_blocks, int64_t windows, int64_t chunk, int64_t* chunk_start,
                  int64_t* block_start, int64_t* nonempty_before) {
    sel::prefixes(window_blocks, windows, chunk, chunk_start, block_start, nonempty_before);
}

// A matrix's features; the prefix arrays (windows + 1 entries each) must outlive it. `piece_nnz`:
// the rows path's pieces for X of 4 or more bytes, then of 2.
void* tcs_matrix_new(int64_t window, int64_t windows, int64_t rows, int64_t cols, int64_t nnz, int64_t max_row_nnz,
                     const int64_t* chunk_start, const int64_t* block_start, const int64_t* nonempty_before,
                     double rows_share_ratio, int64_t grouped_blocks, int64_t grouped_rest_nnz, int grouped_one_chunk,
                     int64_t chunk, const int64_t* piece_nnz) {
    if (chunk < 1 || windows < 0 || piece_nnz[0] < 1 || piece_nnz[1] < 1) {
        last_error = "chunk and pieces must be positive and windows non-negative";
        return nullptr;
    }
    auto* h = new (std::nothrow) MatrixHandle;
    if (h == nullptr) {
        last_error = "out of memory";
        return nullptr;
    }
    sel::Matrix& m = h->matrix;
    m.window = window;
    m.windows = windows;
    m.rows = rows;
    m.cols = cols;
    m.nnz = nnz;
    m.max_row_nnz = max_row_nnz;
    m.chunk_start = chunk_start;
    m.block_start = block_start;
    m.nonempty_before = nonempty_before;
    m.rows_share_ratio = rows_share_ratio;
    m.grouped_blocks = grouped_blocks;
    m.grouped_rest_nnz = grouped_rest_nnz;
    m.grouped_one_chunk = grouped_one_chunk != 0;
    h->chunk = chunk;
    h->piece_nnz[0] = piece_nnz[0];
    h->piece_nnz[1] = piece_nnz[1];
    h->summary = sel::summarize(m, chunk);
    return h;
}

void tcs_matrix_free(void* matrix) { delete static_cast<MatrixHandle*>(matrix); }

// tc_blocks, max_blocks, max_single_chunk_blocks, empty_windows, chunks, split_windows,
// chunks_of_split_windows.
void tcs_matrix_summary(const void* matrix, int64_t* out) {
    const sel::Summary& s = static_cast<const MatrixHandle*>(matrix)->summary;
    const int64_t values[7] = {s.tc_blocks,    s.max_blocks,    s.max_single_chunk_blocks, s.empty_windows,
                               s.chunks,       s.split_windows, s.chunks_of_split_windows};
    std::memcpy(out, values, sizeof values);
}

// Prices from `count` named values (price_field's names) and the device's and layouts' sizes;
// null, with tcs_last_error, on an unknown name.
void* tcs_prices_new(int count, const char* const* names, const double* values, int by_cost, int64_t sm_count,
                     int64_t l2_bytes, int64_t chunk, int64_t rest_piece_nnz) {
    if (sm_count < 1 || chunk < 1 || rest_piece_nnz < 1) {
        last_error = "sm_count, chunk and rest_piece_nnz must be positive";
        return nullptr;
    }
    auto* p = new (std::nothrow) sel::Prices;
    if (p == nullptr) {
        last_error = "out of memory";
        return nullptr;
    }
    for (int i = 0; i < count; ++i) {
        double* field = price_field(*p, names[i]);
        if (field == nullptr) {
            last_error = std::string("unknown calibration constant ") + names[i];
            delete p;
            return nullptr;
        }
        *field = values[i];
    }
    p->rule.by_cost = by_cost != 0;
    p->sm_count = sm_count;
    p->l2_bytes = l2_bytes;
    p->chunk = chunk;
    p->rest_piece_nnz = rest_piece_nnz;
    return p;
}

void tcs_prices_free(void* prices) { delete static_cast<sel::Prices*>(prices); }

// The choice (index of the path) among `candidates` (bit p: path p may run) for `query`;
// `costs` (5 doubles, or null: the kernels priced only where the choice depends on them): every
// path's predicted time, NaN where not priced.
int tcs_choose(const void* matrix, const TcsQuery* query, unsigned candidates, double* costs) {
    const auto* h = static_cast<const MatrixHandle*>(matrix);
    const sel::Choice c = sel::choose(h->matrix, h->summary, *static_cast<const sel::Prices*>(query->prices),
                                      query_of(*h, *query, candidates, costs != nullptr));
    if (costs != nullptr) {
        for (int path = 0; path < sel::kNumPaths; ++path) costs[path] = c.priced[path] ? c.costs_us[path] : std::nan("");
    }
    return c.path;
}

// What explain() gives, flat: selector/native.py mirrors this layout.
struct TcsExplanation {
    int64_t path;
    double costs_us[sel::kNumPaths];   // NaN: not priced
    double device_us[sel::kNumPaths];  // before the host floor
    double ar;
    double base_makespan, base_work, balanced_makespan, balanced_work;
    int64_t zeroed_windows;
    double miss;
    int64_t slots[2], slices[2];
    double makespans_us[3];
    double bytes_moved[4];
    char reason[512];
};

void tcs_explain(const void* matrix, const TcsQuery* query, unsigned candidates, TcsExplanation* out) {
    const auto* h = static_cast<const MatrixHandle*>(matrix);
    const sel::Explanation e = sel::explain(h->matrix, h->summary, *static_cast<const sel::Prices*>(query->prices),
                                            query_of(*h, *query, candidates, true));
    out->path = e.choice.path;
    for (int path = 0; path < sel::kNumPaths; ++path) {
        out->costs_us[path] = e.choice.priced[path] ? e.choice.costs_us[path] : std::nan("");
        out->device_us[path] = e.device_us[path];
    }
    out->ar = e.ar;
    out->base_makespan = e.base.makespan;
    out->base_work = e.base.work;
    out->balanced_makespan = e.balanced.makespan;
    out->balanced_work = e.balanced.work;
    out->zeroed_windows = e.balanced.zeroed_windows;
    out->miss = e.miss;
    std::memcpy(out->slots, e.slots, sizeof e.slots);
    std::memcpy(out->slices, e.slices, sizeof e.slices);
    std::memcpy(out->makespans_us, e.makespans_us, sizeof e.makespans_us);
    std::memcpy(out->bytes_moved, e.bytes_moved, sizeof e.bytes_moved);
    std::memcpy(out->reason, e.reason, sizeof e.reason);
}

// The base kernel's (makespan, work) in TC-block units.
void tcs_base_launch(const void* matrix, int64_t slices, int64_t slots, double block_units, double* out) {
    const auto* h = static_cast<const MatrixHandle*>(matrix);
    const sel::Units u = sel::base_launch(h->matrix, h->summary, slices, slots, block_units);
    out[0] = u.makespan;
    out[1] = u.work;
}

// The balanced kernel's (makespan, work, zeroed windows) in TC-block units.
void tcs_balanced_launch(const void* matrix, int64_t slices, int64_t slots, double segment_units, double split_units,
                         double* out) {
    const auto* h = static_cast<const MatrixHandle*>(matrix);
    const sel::BalancedUnits u =
        sel::balanced_launch(h->matrix, h->summary, slices, slots, segment_units, split_units, h->chunk);
    out[0] = u.makespan;
    out[1] = u.work;
    out[2] = static_cast<double>(u.zeroed_windows);
}

// The index among `count` (blocks, rest nonzeros) splits of the grouped layout with the least
// predicted grouped-path time at N = `n` for X of `value_bytes` (the first of equal times).
int tcs_grouped_split(const void* matrix, const void* prices, int64_t n, int64_t value_bytes, int count,
                      const int64_t* blocks, const int64_t* rest_nnz) {
    const auto* h = static_cast<const MatrixHandle*>(matrix);
    const auto& p = *static_cast<const sel::Prices*>(prices);
    int best = 0;
    double best_us = INFINITY;
    for (int i = 0; i < count; ++i) {
        const double us = sel::grouped_path_us(h->matrix, p, n, value_bytes, blocks[i], rest_nnz[i], false);
        if (us < best_us) {
            best = i;
            best_us = us;
        }
    }
    return best;
}

int64_t tcs_default_column_slices(int64_t n, int64_t value_bytes) { return sel::default_column_slices(n, value_bytes); }

int64_t tcs_rows_per_warp(int64_t n, int64_t value_bytes) { return sel::rows_per_warp(n, value_bytes); }

double tcs_rows_order_gain(int64_t value_bytes) { return sel::rows_order_gain(value_bytes); }

}  // extern "C"
