// Python binding of the selector's first choice (selector_model.h): a matrix's features and a
// calibration's prices are handed over once (per matrix, per N bucket and dtype in a process),
// then each first choice is one call. The launch shapes come from the compiled kernels, as
// kernels.occupancy / kernels.column_slices give them to the Python model.
#include <c10/cuda/CUDAGuard.h>
#include <pybind11/numpy.h>
#include <torch/extension.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "binding_checks.h"
#include "metcf_spmm.h"
#include "selector_binding.h"
#include "selector_model.h"

namespace py = pybind11;
namespace sel = tcsparse::selector;

namespace tcsparse_binding {

using Prefix = py::array_t<int64_t, py::array::c_style>;

// The paths a matrix may take for one X dtype and deterministic mode (bits of CHOICES) and the
// rows path's piece size: model.runnable_paths and csr_rows.split_piece_nnz, handed over from
// Python once each.
struct Candidates {
    unsigned bits = 0;
    int64_t piece_nnz = 0;
};

// The kernels' X dtypes: float32, float16, bfloat16.
constexpr int kDtypeSlots = 3;

// A matrix's features; holds the prefix arrays it points into.
struct SelectorMatrix {
    sel::Matrix matrix;
    sel::Summary summary;
    Prefix chunk_start, block_start, nonempty_before;
    std::optional<Candidates> candidates[kDtypeSlots][2];  // [dtype slot][deterministic]
};

namespace {

// Row windows asked for when a matrix has none (kernels.MANY_WINDOWS, as DeviceModel.launch).
constexpr int64_t kManyWindows = int64_t{1} << 40;

Prefix checked_prefix(const py::array& array, const char* name, int64_t windows) {
    TCS_CHECK(py::isinstance<Prefix>(array), name, " must be a contiguous int64 array");
    Prefix prefix = py::reinterpret_borrow<Prefix>(array);
    TCS_CHECK(prefix.ndim() == 1 && prefix.shape(0) == windows + 1, name, " must be 1-D with ", windows + 1,
              " entries, got ", static_cast<int64_t>(prefix.ndim() == 1 ? prefix.shape(0) : -1));
    return prefix;
}

SelectorMatrix make_matrix(int64_t window, int64_t windows, int64_t rows, int64_t cols, int64_t nnz,
                           int64_t max_row_nnz, const py::array& chunk_start, const py::array& block_start,
                           const py::array& nonempty_before, double rows_share_ratio, int64_t grouped_blocks,
                           int64_t grouped_rest_nnz, bool grouped_one_chunk, int64_t chunk) {
    TCS_CHECK(window == 8 || window == 16, "window must be 8 or 16, got ", window);
    TCS_CHECK(windows >= 0 && rows >= 0 && cols >= 0 && nnz >= 0 && max_row_nnz >= 0,
              "matrix sizes must be non-negative, got windows ", windows, ", rows ", rows, ", cols ", cols, ", nnz ",
              nnz, ", longest row ", max_row_nnz);
    TCS_CHECK(chunk >= 1, "chunk must be positive, got ", chunk);
    SelectorMatrix out;
    out.chunk_start = checked_prefix(chunk_start, "chunk_start", windows);
    out.block_start = checked_prefix(block_start, "block_start", windows);
    out.nonempty_before = checked_prefix(nonempty_before, "nonempty_before", windows);
    sel::Matrix& m = out.matrix;
    m.window = window;
    m.windows = windows;
    m.rows = rows;
    m.cols = cols;
    m.nnz = nnz;
    m.max_row_nnz = max_row_nnz;
    m.chunk_start = out.chunk_start.data();
    m.block_start = out.block_start.data();
    m.nonempty_before = out.nonempty_before.data();
    m.rows_share_ratio = rows_share_ratio;
    m.grouped_blocks = grouped_blocks;
    m.grouped_rest_nnz = grouped_rest_nnz;
    m.grouped_one_chunk = grouped_one_chunk;
    out.summary = sel::summarize(m, chunk);
    return out;
}

double get(const py::dict& d, const char* key, double fallback = 0.0) {
    return d.contains(key) ? d[key].cast<double>() : fallback;
}

// Each named field from `d`, 0 where the calibration leaves the term out.
void read_fields(const py::dict& d, std::initializer_list<std::pair<const char*, double*>> fields) {
    for (const auto& [key, field] : fields) *field = get(d, key);
}

sel::KernelPrices kernel_prices(const py::dict& d) {
    sel::KernelPrices p;
    read_fields(d, {{"launch_us", &p.launch_us}, {"unit_us", &p.unit_us}, {"miss_unit_us", &p.miss_unit_us},
                    {"tail_us", &p.tail_us}, {"floor_us", &p.floor_us}, {"block_units", &p.block_units},
                    {"segment_units", &p.segment_units}, {"split_units", &p.split_units}, {"zero_us", &p.zero_us}});
    return p;
}

sel::LinearPrices linear_prices(const py::dict& d) {
    sel::LinearPrices p;
    read_fields(d, {{"launch_us", &p.launch_us}, {"nnz_us", &p.nnz_us}, {"row_us", &p.row_us},
                    {"max_row_us", &p.max_row_us}, {"miss_nnz_us", &p.miss_nnz_us},
                    {"split_launch_us", &p.split_launch_us}, {"floor_us", &p.floor_us}});
    return p;
}

// `paths`: the calibration's constants per path; `grouped` and `rule`: model.py's constants;
// `sizes`: the device and the layouts' fixed sizes.
sel::Prices make_prices(const py::dict& paths, const py::dict& grouped, const py::dict& rule, const py::dict& sizes) {
    sel::Prices p;
    p.base = kernel_prices(paths["base"]);
    p.balanced = kernel_prices(paths["balanced"]);
    p.csr = linear_prices(paths["csr"]);
    p.rows = linear_prices(paths["rows"]);
    p.grouped.step_ns = get(grouped, "step_ns");
    p.grouped.fixed_us = get(grouped, "fixed_us");
    p.grouped.direct_fixed_us = get(grouped, "direct_fixed_us");
    p.grouped.reference_sms = get(grouped, "reference_sms", 1.0);
    p.rule.by_cost = rule["by_cost"].cast<bool>();
    p.rule.ar_threshold = get(rule, "ar_threshold");
    p.rule.csr_margin_base = get(rule, "csr_margin_base");
    p.rule.csr_margin_balanced = get(rule, "csr_margin_balanced");
    p.rule.rows_margin = get(rule, "rows_margin");
    p.rule.rows_order_gain = get(rule, "rows_order_gain");
    p.sm_count = sizes["sm_count"].cast<int64_t>();
    p.l2_bytes = sizes["l2_bytes"].cast<int64_t>();
    p.chunk = sizes["chunk"].cast<int64_t>();
    p.exact_jobs_per_slot = sizes["exact_jobs_per_slot"].cast<int64_t>();
    p.rest_piece_nnz = sizes["rest_piece_nnz"].cast<int64_t>();
    p.grouped_column_step = sizes["grouped_column_step"].cast<int64_t>();
    TCS_CHECK(p.sm_count >= 1 && p.chunk >= 1 && p.grouped_column_step >= 1 && p.exact_jobs_per_slot >= 1,
              "sm_count, chunk, grouped_column_step and exact_jobs_per_slot must be positive");
    return p;
}

sel::Launch launch_of(at::ScalarType dtype, int64_t windows, int64_t n, bool balanced, bool exact) {
    int resident = 0;
    int64_t slices = 0;
    const auto precision = exact ? tcsparse::Precision::kTF32x3 : tcsparse::Precision::kTF32;
    tcsparse_binding::with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        // 16-row windows, as kernels.occupancy answers the Python model.
        tcsparse_binding::check_launch(
            tcsparse::metcf_spmm_launch_shape<T>(16, windows ? windows : kManyWindows, n, balanced, precision,
                                                 &resident, &slices),
            "metcf_spmm_launch_shape");
    });
    return {resident, slices};
}

// The choice at N bucket `n` (selector_model.h's Query and Choice).
sel::Choice run_choice(const SelectorMatrix& m, const sel::Prices& prices, int64_t n, at::ScalarType dtype, bool exact,
                       int64_t piece_nnz, unsigned candidates, int64_t device_index, bool all_costs) {
    TCS_CHECK(n >= 1, "n must be positive, got ", n);
    TCS_CHECK(piece_nnz >= 1, "piece_nnz must be positive, got ", piece_nnz);
    sel::Query q;
    q.n = n;
    q.value_bytes = static_cast<int64_t>(c10::elementSize(dtype));
    {
        const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
        q.base = launch_of(dtype, m.matrix.windows, n, false, exact);
        q.balanced = launch_of(dtype, m.matrix.windows, n, true, exact);
    }
    q.piece_nnz = piece_nnz;
    q.candidates = candidates;
    q.all_costs = all_costs;
    return sel::choose(m.matrix, m.summary, prices, q);
}

int dtype_slot(at::ScalarType dtype) {
    switch (dtype) {
        case at::kFloat: return 0;
        case at::kHalf: return 1;
        case at::kBFloat16: return 2;
        default: return -1;
    }
}

// A calibration's prices per (N bucket, dtype slot, CUDA index), handed over from Python once per
// process (selector/native.py) and kept for every later first choice.
std::map<std::tuple<int64_t, int, int64_t>, sel::Prices>& price_registry() {
    static std::map<std::tuple<int64_t, int, int64_t>, sel::Prices> registry;
    return registry;
}

void set_candidates(SelectorMatrix& m, at::ScalarType dtype, bool deterministic, unsigned bits, int64_t piece_nnz) {
    const int slot = dtype_slot(dtype);
    TCS_CHECK(slot >= 0, "candidates are kept for float32, float16 and bfloat16, got ", dtype);
    TCS_CHECK(piece_nnz >= 1, "piece_nnz must be positive, got ", piece_nnz);
    m.candidates[slot][deterministic ? 1 : 0] = Candidates{bits, piece_nnz};
}

void register_prices(int64_t n, at::ScalarType dtype, int64_t device_index, const sel::Prices& prices) {
    const int slot = dtype_slot(dtype);
    TCS_CHECK(slot >= 0, "prices are kept for float32, float16 and bfloat16, got ", dtype);
    price_registry()[{n, slot, device_index}] = prices;
}

// Whether float32 products may round to TF32: kernels.tf32_allowed, from the same flags.
bool tf32_allowed() {
    const auto& context = at::globalContext();
    return context.allowTF32CuBLAS() || context.float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;
}

// A product's first choice at N bucket `n`: the path's index in CHOICES, or -1 where Python has
// not yet handed over the matrix's candidates for this dtype and mode, or the prices of this
// bucket, dtype and device. Torch's modes (deterministic algorithms, TF32) are read here rather
// than passed: the Python around this call is what a first choice costs on small graphs.
int first_path(const SelectorMatrix& m, int64_t n, at::ScalarType dtype, const c10::Device& device) {
    const int slot = dtype_slot(dtype);
    if (slot < 0 || !device.is_cuda()) return -1;
    const auto& candidates = m.candidates[slot][at::globalContext().deterministicAlgorithms() ? 1 : 0];
    if (!candidates) return -1;
    if (candidates->bits == 1u << sel::kCsr) return sel::kCsr;
    const int64_t index = device.has_index() ? device.index() : c10::cuda::current_device();
    const auto& registry = price_registry();
    const auto prices = registry.find({n, slot, index});
    if (prices == registry.end()) return -1;
    const bool exact = dtype == at::kFloat && !tf32_allowed();
    return run_choice(m, prices->second, n, dtype, exact, candidates->piece_nnz, candidates->bits, index, false).path;
}

// (path index in CHOICES, predicted us per path with NaN where unpriced).
py::tuple price_paths(const SelectorMatrix& m, const sel::Prices& prices, int64_t n, at::ScalarType dtype, bool exact,
                      int64_t piece_nnz, unsigned candidates, int64_t device_index, bool all_costs) {
    const sel::Choice c = run_choice(m, prices, n, dtype, exact, piece_nnz, candidates, device_index, all_costs);
    return py::make_tuple(c.path, py::make_tuple(c.costs_us[0], c.costs_us[1], c.costs_us[2], c.costs_us[3],
                                                 c.costs_us[4]));
}

}  // namespace

void add_selector(py::module_& m) {
    py::class_<SelectorMatrix>(m, "SelectorMatrix")
        .def(py::init(&make_matrix), py::arg("window"), py::arg("windows"), py::arg("rows"), py::arg("cols"),
             py::arg("nnz"), py::arg("max_row_nnz"), py::arg("chunk_start"), py::arg("block_start"),
             py::arg("nonempty_before"), py::arg("rows_share_ratio"), py::arg("grouped_blocks"),
             py::arg("grouped_rest_nnz"), py::arg("grouped_one_chunk"), py::arg("chunk"));
    py::class_<sel::Prices>(m, "SelectorPrices")
        .def(py::init(&make_prices), py::arg("paths"), py::arg("grouped"), py::arg("rule"), py::arg("sizes"));
    m.def("set_candidates", &set_candidates, py::arg("matrix"), py::arg("dtype"), py::arg("deterministic"),
          py::arg("bits"), py::arg("piece_nnz"));
    m.def("register_prices", &register_prices, py::arg("n"), py::arg("dtype"), py::arg("device_index"),
          py::arg("prices"));
    m.def("first_path", &first_path, py::arg("matrix"), py::arg("n"), py::arg("dtype"), py::arg("device"));
    m.def("price_paths", &price_paths, py::arg("matrix"), py::arg("prices"), py::arg("n"), py::arg("dtype"),
          py::arg("exact"), py::arg("piece_nnz"), py::arg("candidates"), py::arg("device_index"),
          py::arg("all_costs"));
}

}  // namespace tcsparse_binding
