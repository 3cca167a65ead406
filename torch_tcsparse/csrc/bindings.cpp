// Torch binding of the ME-TCF kernels, of the CSR -> ME-TCF conversion, of a sampled block's
// columns and of the mean's row scale: validation
// (TCS_CHECK), allocation, stream, dispatch. The kernels themselves live in the .cu files, which
// never include torch headers.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "binding_checks.h"
#include "kernel_bindings.h"
#include "metcf_convert.h"
#include "metcf_spmm.h"
#include "row_scale.h"
#include "sampled_columns.h"

namespace {

using tcsparse_binding::check_index;
using tcsparse_binding::check_launch;
using tcsparse_binding::with_element_type;

// Past this the deterministic balanced kernel's per-chunk workspace is not worth its memory;
// the base kernel (deterministic by construction: one thread block per window) runs instead.
constexpr int64_t kMaxWorkspaceBytes = int64_t{1} << 30;

// An aligned copy of `t` when its data does not start on an `alignment`-byte boundary.
at::Tensor aligned(const at::Tensor& t, uintptr_t alignment) {
    return (reinterpret_cast<uintptr_t>(t.data_ptr()) % alignment) ? t.clone() : t;
}

struct Layout {
    tcsparse::MetcfArrays arrays;
    at::Tensor block_bitmap;  // 16-byte aligned: the kernels read one 128-bit bitmap per block
};

Layout make_layout(const at::Tensor& window_offsets, const at::Tensor& block_offsets, const at::Tensor& local_ids,
                   const at::Tensor& block_cols, const at::Tensor& block_bitmap, const at::Tensor& row_map,
                   const at::Tensor& chunk_offsets, const at::Tensor& chunk_row_starts, int64_t window,
                   int64_t num_rows, int64_t chunk, const at::Device& device) {
    TCS_CHECK(window == 8 || window == 16, "window must be 8 or 16, got ", window);
    TCS_CHECK(chunk >= 1, "chunk must be positive, got ", chunk);
    TCS_CHECK(num_rows >= 0, "num_rows must be non-negative, got ", num_rows);
    const int64_t num_windows = (num_rows + window - 1) / window;
    TCS_CHECK(block_offsets.dim() == 1 && block_offsets.numel() >= 1, "block_offsets must be 1-D and non-empty");
    const int64_t num_blocks = block_offsets.numel() - 1;
    const int64_t nnz = local_ids.numel();
    check_index(window_offsets, "window_offsets", at::kInt, num_windows + 1, device);
    check_index(block_offsets, "block_offsets", at::kInt, num_blocks + 1, device);
    check_index(local_ids, "local_ids", at::kByte, nnz, device);
    check_index(block_cols, "block_cols", at::kInt, num_blocks * 8, device);
    check_index(block_bitmap, "block_bitmap", at::kInt, num_blocks * 4, device);
    check_index(row_map, "row_map", at::kInt, num_windows * window, device);
    check_index(chunk_offsets, "chunk_offsets", at::kInt, num_windows + 1, device);
    // One entry per window row of every chunk; the chunk count is on the device, but every chunk
    // holds at most `chunk` blocks, so there are at least num_blocks / chunk of them.
    const int64_t min_chunks = (num_blocks + chunk - 1) / chunk;
    const int64_t starts = chunk_row_starts.numel();
    TCS_CHECK(starts % window == 0 && starts / window >= min_chunks, "chunk_row_starts must hold window (", window,
              ") entries for each of at least ", min_chunks, " chunks, got ", starts);
    check_index(chunk_row_starts, "chunk_row_starts", at::kInt, starts, device);
    Layout layout;
    layout.block_bitmap = aligned(block_bitmap, 16);
    layout.arrays = tcsparse::MetcfArrays{window_offsets.data_ptr<int32_t>(),
                                          block_offsets.data_ptr<int32_t>(),
                                          local_ids.data_ptr<uint8_t>(),
                                          block_cols.data_ptr<int32_t>(),
                                          reinterpret_cast<const uint32_t*>(layout.block_bitmap.data_ptr<int32_t>()),
                                          row_map.data_ptr<int32_t>(),
                                          chunk_offsets.data_ptr<int32_t>(),
                                          chunk_row_starts.data_ptr<int32_t>(),
                                          num_windows,
                                          num_blocks,
                                          nnz,
                                          static_cast<int>(window),
                                          static_cast<int>(chunk)};
    return layout;
}

void check_dense(const at::Tensor& t, const char* name, int64_t rows, const at::Device& device) {
    TCS_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got device ", t.device());
    TCS_CHECK(t.device() == device, name, " is on ", t.device(), " but the values are on ", device);
    const auto dtype = t.scalar_type();
    TCS_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, name,
                " must be float32, float16 or bfloat16, got ", dtype);
    TCS_CHECK(t.dim() == 2, name, " must be 2-D, got shape ", t.sizes());
    TCS_CHECK(t.size(0) == rows, name, " must have ", rows, " rows, got ", t.size(0));
}

// The values are read in place in X's dtype; any offset of a contiguous tensor of that dtype is
// aligned enough (the 16-bit kernels copy the aligned 4-byte word that holds an element).
void check_values(const at::Tensor& values, int64_t nnz, at::ScalarType dtype) {
    TCS_CHECK(values.is_cuda(), "values must be a CUDA tensor, got device ", values.device());
    TCS_CHECK(values.scalar_type() == dtype, "values must have x's dtype ", dtype, ", got ", values.scalar_type());
    TCS_CHECK(values.dim() == 1 && values.numel() == nnz, "values must be 1-D with ", nnz, " entries, got shape ",
                values.sizes());
    TCS_CHECK(values.is_contiguous(), "values must be contiguous");
}

}  // namespace

namespace tcsparse_binding {

at::Tensor sddmm(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& window_offsets,
                 const at::Tensor& block_offsets, const at::Tensor& local_ids, const at::Tensor& block_cols,
                 const at::Tensor& block_bitmap, const at::Tensor& row_map, const at::Tensor& chunk_offsets,
                 const at::Tensor& chunk_row_starts, int64_t window, int64_t num_rows, int64_t num_cols,
                 int64_t chunk) {
    const at::Device device = x.device();
    check_dense(x, "x", num_cols, device);
    check_dense(grad_y, "grad_y", num_rows, device);
    TCS_CHECK(grad_y.size(1) == x.size(1), "grad_y has ", grad_y.size(1), " columns but x has ", x.size(1));
    TCS_CHECK(grad_y.scalar_type() == x.scalar_type(), "grad_y is ", grad_y.scalar_type(), " but x is ",
                x.scalar_type());
    const c10::cuda::CUDAGuard guard(device);
    Layout layout = make_layout(window_offsets, block_offsets, local_ids, block_cols, block_bitmap, row_map,
                                chunk_offsets, chunk_row_starts, window, num_rows, chunk, device);
    const at::Tensor xc = x.contiguous();
    const at::Tensor gc = grad_y.contiguous();
    at::Tensor out = at::empty({local_ids.numel()}, xc.options().dtype(at::kFloat));
    with_element_type(xc.scalar_type(), [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::metcf_sddmm<T>(layout.arrays, reinterpret_cast<const T*>(gc.const_data_ptr()),
                                              reinterpret_cast<const T*>(xc.const_data_ptr()), out.data_ptr<float>(),
                                              xc.size(1), c10::cuda::getCurrentCUDAStream()),
                     "metcf_sddmm");
    });
    return out;
}

std::vector<int64_t> launch_shape(int64_t window, int64_t num_windows, int64_t n, bool balanced, bool exact,
                                  at::ScalarType dtype) {
    TCS_CHECK(window == 8 || window == 16, "window must be 8 or 16, got ", window);
    TCS_CHECK(n >= 1, "n must be positive, got ", n);
    TCS_CHECK(num_windows >= 0, "num_windows must be non-negative, got ", num_windows);
    int resident = 0;
    int64_t slices = 0;
    const auto precision = exact ? tcsparse::Precision::kTF32x3 : tcsparse::Precision::kTF32;
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::metcf_spmm_launch_shape<T>(static_cast<int>(window), num_windows, n, balanced, precision,
                                                          &resident, &slices),
                     "metcf_spmm_launch_shape");
    });
    return {resident, slices};
}

}  // namespace tcsparse_binding

namespace {

// The conversion's CSR and row order, checked: rowptr and col of one index type (int32 or int64),
// row_map int32 [windows * window], slot_of_row int32 [rows] or empty for the identity order.
template <typename I>
tcsparse::CsrWindows<I> csr_windows(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& row_map,
                                    const at::Tensor& slot_of_row, int64_t window) {
    TCS_CHECK(window == 8 || window == 16, "window must be 8 or 16, got ", window);
    TCS_CHECK(rowptr.is_cuda(), "rowptr must be a CUDA tensor, got device ", rowptr.device());
    TCS_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, "rowptr must be 1-D with num_rows + 1 entries, got shape ",
              rowptr.sizes());
    const at::Device device = rowptr.device();
    const int64_t num_rows = rowptr.numel() - 1;
    const int64_t num_windows = (num_rows + window - 1) / window;
    TCS_CHECK(num_rows <= INT32_MAX, "at most ", int64_t{INT32_MAX}, " rows are supported, got ", num_rows);
    check_index(rowptr, "rowptr", rowptr.scalar_type(), num_rows + 1, device);
    check_index(col, "col", rowptr.scalar_type(), col.numel(), device);
    check_index(row_map, "row_map", at::kInt, num_windows * window, device);
    if (slot_of_row.numel()) check_index(slot_of_row, "slot_of_row", at::kInt, num_rows, device);
    return {rowptr.data_ptr<I>(), col.data_ptr<I>(), row_map.data_ptr<int32_t>(),
            slot_of_row.numel() ? slot_of_row.data_ptr<int32_t>() : nullptr, nullptr, num_rows, col.numel(), num_windows,
            static_cast<int>(window)};
}

template <typename F>
auto with_index_type(at::ScalarType dtype, F&& f) {
    switch (dtype) {
        case at::kInt:
            return f(int32_t{});
        case at::kLong:
            return f(int64_t{});
        default:
            TCS_CHECK(false, "rowptr and col must be int32 or int64, got ", dtype);
    }
}

}  // namespace

namespace tcsparse_binding {

at::Tensor sort_row_sources(const at::Tensor& rowptr, const at::Tensor& source, int64_t longest) {
    TCS_CHECK(rowptr.is_cuda(), "rowptr must be a CUDA tensor, got device ", rowptr.device());
    TCS_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, "rowptr must be 1-D with num_rows + 1 entries, got shape ",
              rowptr.sizes());
    TCS_CHECK(longest >= 0 && longest <= tcsparse::kSortedRowLimit, "longest must lie in [0, ",
              tcsparse::kSortedRowLimit, "], got ", longest);
    check_index(source, "source", at::kLong, source.numel(), rowptr.device());
    const c10::cuda::CUDAGuard guard(rowptr.device());
    const int64_t num_rows = rowptr.numel() - 1;
    at::Tensor col = at::empty({source.numel()}, rowptr.options());
    with_index_type(rowptr.scalar_type(), [&](auto index) {
        using I = decltype(index);
        check_index(rowptr, "rowptr", rowptr.scalar_type(), num_rows + 1, rowptr.device());
        check_launch(tcsparse::sort_row_sources<I>(rowptr.data_ptr<I>(), num_rows, source.data_ptr<int64_t>(),
                                                   col.data_ptr<I>(), c10::cuda::getCurrentCUDAStream()),
                     "sort_row_sources");
    });
    return col;
}

at::Tensor row_scale(const at::Tensor& rowptr, int64_t nnz, at::ScalarType dtype) {
    TCS_CHECK(rowptr.is_cuda(), "rowptr must be a CUDA tensor, got device ", rowptr.device());
    TCS_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, "rowptr must be 1-D with num_rows + 1 entries, got shape ",
              rowptr.sizes());
    TCS_CHECK(nnz >= 0, "nnz must be non-negative, got ", nnz);
    TCS_CHECK(dtype == at::kFloat || dtype == at::kDouble, "dtype must be float32 or float64, got ", dtype);
    const c10::cuda::CUDAGuard guard(rowptr.device());
    const int64_t num_rows = rowptr.numel() - 1;
    TCS_CHECK(num_rows >= 1 || nnz == 0, "a matrix without rows has no nonzeros, got nnz ", nnz);
    at::Tensor scale = at::empty({nnz}, rowptr.options().dtype(dtype));
    with_index_type(rowptr.scalar_type(), [&](auto index) {
        using I = decltype(index);
        check_index(rowptr, "rowptr", rowptr.scalar_type(), num_rows + 1, rowptr.device());
        auto launch = [&](auto* out) {
            return tcsparse::row_scale<I>(rowptr.data_ptr<I>(), num_rows, nnz, out, c10::cuda::getCurrentCUDAStream());
        };
        check_launch(dtype == at::kFloat ? launch(scale.data_ptr<float>()) : launch(scale.data_ptr<double>()),
                     "row_scale");
    });
    return scale;
}

// (row_map int32 [windows * window], slot_of_row int32 [rows], empty without a permutation) of
// the row order `row_perm` (int64 [rows], or empty for the given order).
std::tuple<at::Tensor, at::Tensor> metcf_row_map(const at::Tensor& row_perm, int64_t num_rows, int64_t window) {
    TCS_CHECK(window == 8 || window == 16, "window must be 8 or 16, got ", window);
    TCS_CHECK(num_rows >= 0 && num_rows <= INT32_MAX, "num_rows must lie in [0, ", int64_t{INT32_MAX}, "], got ",
              num_rows);
    TCS_CHECK(row_perm.is_cuda(), "row_perm must be a CUDA tensor, got device ", row_perm.device());
    const bool permuted = row_perm.numel() > 0;
    if (permuted) check_index(row_perm, "row_perm", at::kLong, num_rows, row_perm.device());
    const c10::cuda::CUDAGuard guard(row_perm.device());
    const auto ints = row_perm.options().dtype(at::kInt);
    const int64_t slots = (num_rows + window - 1) / window * window;
    at::Tensor row_map = at::empty({slots}, ints);
    at::Tensor slot_of_row = at::empty({permuted ? num_rows : 0}, ints);
    check_launch(tcsparse::metcf_row_map(permuted ? row_perm.data_ptr<int64_t>() : nullptr, num_rows, slots,
                                         row_map.data_ptr<int32_t>(),
                                         permuted ? slot_of_row.data_ptr<int32_t>() : nullptr,
                                         c10::cuda::getCurrentCUDAStream()),
                 "metcf_row_map");
    return {row_map, slot_of_row};
}

// The first pass of the conversion, all that reordering needs to count blocks:
// first_before [nnz + 1], owners [nnz] and narrow_base [windows] (rowptr's index type), and the
// int64 counts [3 (windows + 1) + 1]: window_offsets, chunk_offsets (of `chunk` blocks) and the
// non-empty windows before each window, then the longest row (one copy to the host reads them).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> metcf_count(const at::Tensor& rowptr, const at::Tensor& col,
                                                                       const at::Tensor& row_map,
                                                                       const at::Tensor& slot_of_row, int64_t window,
                                                                       int64_t chunk) {
    TCS_CHECK(chunk >= 1, "chunk must be positive, got ", chunk);
    const c10::cuda::CUDAGuard guard(rowptr.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    return with_index_type(rowptr.scalar_type(), [&](auto index) {
        using I = decltype(index);
        auto a = csr_windows<I>(rowptr, col, row_map, slot_of_row, window);
        at::Tensor narrow_base = at::empty({a.num_windows}, rowptr.options());
        check_launch(tcsparse::metcf_narrow_windows<I>(a, narrow_base.data_ptr<I>(), stream), "metcf_narrow_windows");
        a.narrow_base = narrow_base.data_ptr<I>();
        at::Tensor first_before = at::zeros({a.nnz + 1}, rowptr.options());
        at::Tensor owners = at::empty({a.nnz}, rowptr.options());
        check_launch(tcsparse::metcf_mark_first<I>(a, first_before.data_ptr<I>(), owners.data_ptr<I>(), stream),
                     "metcf_mark_first");
        first_before.cumsum_(0);
        at::Tensor counts = at::zeros({3 * (a.num_windows + 1) + 1}, rowptr.options().dtype(at::kLong));
        check_launch(tcsparse::metcf_window_counts<I>(a, first_before.data_ptr<I>(), static_cast<int>(chunk),
                                                      counts.data_ptr<int64_t>(), stream),
                     "metcf_window_counts");
        counts.narrow(0, 0, 3 * (a.num_windows + 1)).view({3, a.num_windows + 1}).cumsum_(1);
        return std::make_tuple(first_before, owners, narrow_base, counts);
    });
}

// The layout's block arrays from metcf_count's first_before, owners (used up as scratch) and
// narrow_base, and the window offsets (int32 [windows + 1], num_blocks at the end): block_cols, block_bitmap,
// block_offsets, local_ids and csr_gather (of rowptr's index type), as formats/metcf.py
// documents them.
std::vector<at::Tensor> metcf_fill(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& row_map,
                                   const at::Tensor& slot_of_row, const at::Tensor& first_before, at::Tensor owners,
                                   const at::Tensor& narrow_base, const at::Tensor& window_offsets, int64_t num_blocks,
                                   int64_t window) {
    const c10::cuda::CUDAGuard guard(rowptr.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    return with_index_type(rowptr.scalar_type(), [&](auto index) {
        using I = decltype(index);
        auto a = csr_windows<I>(rowptr, col, row_map, slot_of_row, window);
        check_index(narrow_base, "narrow_base", rowptr.scalar_type(), a.num_windows, rowptr.device());
        a.narrow_base = narrow_base.data_ptr<I>();
        TCS_CHECK(num_blocks >= 0 && num_blocks <= INT32_MAX, "num_blocks must lie in [0, ", int64_t{INT32_MAX},
                  "], got ", num_blocks);
        check_index(first_before, "first_before", rowptr.scalar_type(), a.nnz + 1, rowptr.device());
        check_index(owners, "owners", rowptr.scalar_type(), a.nnz, rowptr.device());
        check_index(window_offsets, "window_offsets", at::kInt, a.num_windows + 1, rowptr.device());
        const auto ints = rowptr.options().dtype(at::kInt);
        const auto bytes = rowptr.options().dtype(at::kByte);
        at::Tensor block_cols = at::full({num_blocks * 8}, -1, ints);
        at::Tensor block_bitmap = at::zeros({num_blocks * 4}, ints);
        at::Tensor block_offsets = at::zeros({num_blocks + 1}, ints);
        at::Tensor nnz_local = at::empty({a.nnz}, bytes);
        auto* bitmap = reinterpret_cast<uint32_t*>(block_bitmap.data_ptr<int32_t>());
        check_launch(tcsparse::metcf_place<I>(a, first_before.data_ptr<I>(), window_offsets.data_ptr<int32_t>(),
                                              block_cols.data_ptr<int32_t>(), bitmap, block_offsets.data_ptr<int32_t>(),
                                              owners.data_ptr<I>(), nnz_local.data_ptr<uint8_t>(), stream),
                     "metcf_place");
        block_offsets.cumsum_(0);
        at::Tensor local_ids = at::empty({a.nnz}, bytes);
        at::Tensor csr_gather = at::empty({a.nnz}, rowptr.options());
        check_launch(tcsparse::metcf_order<I>(a.nnz, owners.data_ptr<I>(), nnz_local.data_ptr<uint8_t>(), bitmap,
                                              block_offsets.data_ptr<int32_t>(), local_ids.data_ptr<uint8_t>(),
                                              csr_gather.data_ptr<I>(), stream),
                     "metcf_order");
        return std::vector<at::Tensor>{block_cols, block_bitmap, block_offsets, local_ids, csr_gather};
    });
}

at::Tensor spmm(const at::Tensor& x, const at::Tensor& values, const at::Tensor& window_offsets,
                const at::Tensor& block_offsets, const at::Tensor& local_ids, const at::Tensor& block_cols,
                const at::Tensor& block_bitmap, const at::Tensor& row_map, const at::Tensor& chunk_offsets,
                const at::Tensor& chunk_row_starts, int64_t window, int64_t num_rows, int64_t num_cols, int64_t chunk,
                bool balanced, bool deterministic, bool exact) {
    const at::Device device = values.device();
    check_dense(x, "x", num_cols, device);
    check_values(values, local_ids.numel(), x.scalar_type());
    const c10::cuda::CUDAGuard guard(device);
    Layout layout = make_layout(window_offsets, block_offsets, local_ids, block_cols, block_bitmap, row_map,
                                chunk_offsets, chunk_row_starts, window, num_rows, chunk, device);
    const at::Tensor xc = x.contiguous();
    const int64_t n = xc.size(1);
    TCS_CHECK(n <= 65535 * 32, "x has ", n, " columns; at most ", 65535 * 32, " are supported");
    at::Tensor y = at::empty({num_rows, n}, xc.options());
    if (num_rows == 0 || n == 0) return y;
    const auto precision = exact ? tcsparse::Precision::kTF32x3 : tcsparse::Precision::kTF32;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const auto& a = layout.arrays;
    with_element_type(xc.scalar_type(), [&](auto element) {
        using T = decltype(element);
        const T* xp = reinterpret_cast<const T*>(xc.const_data_ptr());
        const T* vp = reinterpret_cast<const T*>(values.const_data_ptr());
        T* yp = reinterpret_cast<T*>(y.mutable_data_ptr());
        if (balanced && deterministic) {
            const int64_t floats = tcsparse::metcf_balanced_workspace_floats(a, n);
            if (floats * 4 <= kMaxWorkspaceBytes) {
                at::Tensor workspace = at::empty({floats}, xc.options().dtype(at::kFloat));
                check_launch(tcsparse::metcf_spmm_balanced<T>(a, vp, xp, yp, n, precision, nullptr,
                                                              workspace.data_ptr<float>(), stream),
                             "metcf_spmm_balanced (deterministic)");
                return;
            }
            balanced = false;
        }
        if (balanced) {
            // Cut windows are summed in fp32: in y itself when it is fp32, else in a scratch.
            at::Tensor partial = std::is_same_v<T, float> ? y : at::empty({num_rows, n}, xc.options().dtype(at::kFloat));
            check_launch(tcsparse::metcf_spmm_balanced<T>(a, vp, xp, yp, n, precision, partial.data_ptr<float>(),
                                                          nullptr, stream),
                         "metcf_spmm_balanced");
        } else {
            check_launch(tcsparse::metcf_spmm_base<T>(a, vp, xp, yp, n, precision, stream), "metcf_spmm_base");
        }
    });
    return y;
}

}  // namespace tcsparse_binding
