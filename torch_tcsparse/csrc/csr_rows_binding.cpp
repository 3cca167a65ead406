// Torch bindings of the "rows" SpMM (csr_rows_spmm.h) and of its scatter of A^T dY
// (csr_rows_scatter.h), which read the same operands: validation, allocation, stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "binding_checks.h"
#include "kernel_bindings.h"
#include "csr_rows_scatter.h"
#include "csr_rows_spmm.h"
#include "split_sums.h"

namespace {

using tcsparse_binding::check_index;
using tcsparse_binding::check_launch;
using tcsparse_binding::with_element_type;

void check_operand(const at::Tensor& t, const char* name, const at::Device& device, at::ScalarType dtype,
                   const char* dense) {
    TCS_CHECK(t.device() == device, name, " is on ", t.device(), " but the operands are on ", device);
    TCS_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, " like ", dense, ", got ", t.scalar_type());
}

// The split CSR both kernels read, its arrays checked: their sizes, types and device, not their
// values (csr_rows_spmm below says why).
tcsparse::CsrRows rows_pattern(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& piece_slots,
                               const at::Tensor& piece_starts, const at::Tensor& split_rows, int64_t piece_nnz,
                               const std::optional<at::Tensor>& row_map) {
    TCS_CHECK(rowptr.is_cuda(), "rowptr must be a CUDA tensor, got device ", rowptr.device());
    TCS_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, "rowptr must be 1-D with num_rows + 1 entries, got shape ",
              rowptr.sizes());
    const at::Device device = rowptr.device();
    const int64_t num_rows = rowptr.numel() - 1;
    TCS_CHECK(piece_nnz >= 1 && piece_nnz <= INT32_MAX, "piece_nnz must lie in [1, ", int64_t{INT32_MAX}, "], got ",
              piece_nnz);
    check_index(rowptr, "rowptr", at::kInt, num_rows + 1, device);
    check_index(col, "col", at::kInt, col.numel(), device);
    check_index(piece_slots, "piece_slots", at::kInt, piece_slots.numel(), device);
    check_index(piece_starts, "piece_starts", at::kInt, piece_slots.numel(), device);
    check_index(split_rows, "split_rows", at::kInt, split_rows.numel(), device);
    if (row_map.has_value()) check_index(*row_map, "row_map", at::kInt, num_rows, device);
    return tcsparse::CsrRows{rowptr.data_ptr<int32_t>(),
                             col.data_ptr<int32_t>(),
                             row_map.has_value() ? row_map->data_ptr<int32_t>() : nullptr,
                             piece_slots.data_ptr<int32_t>(),
                             piece_starts.data_ptr<int32_t>(),
                             split_rows.data_ptr<int32_t>(),
                             num_rows,
                             piece_slots.numel(),
                             split_rows.numel(),
                             col.numel(),
                             static_cast<int>(piece_nnz)};
}

// The dense operand `dense` (named `name`, `rows` rows) and the values: one dtype of float32,
// float16 or bfloat16 on `device`; `dense` 2-D, the values 1-D with `nnz` entries. Returns
// `dense` itself where its columns are contiguous, else a contiguous copy: the kernels take any
// row stride.
at::Tensor checked_dense(const at::Tensor& dense, const char* name, int64_t rows, const at::Tensor& values,
                         int64_t nnz, const at::Device& device) {
    TCS_CHECK(dense.device() == device, name, " is on ", dense.device(), " but the operands are on ", device);
    const at::ScalarType dtype = dense.scalar_type();
    TCS_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, name,
              " must be float32, float16 or bfloat16, got ", dtype);
    check_operand(values, "values", device, dtype, name);
    TCS_CHECK(values.dim() == 1 && values.numel() == nnz, "values must be 1-D with ", nnz, " entries, got shape ",
              values.sizes());
    TCS_CHECK(dense.dim() == 2 && dense.size(0) == rows, name, " must be 2-D with ", rows, " rows, got shape ",
              dense.sizes());
    const int64_t n = dense.size(1);
    return dense.stride(1) == 1 && dense.stride(0) >= n ? dense : dense.contiguous();
}

}  // namespace

namespace tcsparse_binding {

// Y = A @ x (+ bias) for the CSR (rowptr, col, values) split into pieces of piece_nnz nonzeros;
// x may have any row stride (its columns contiguous), Y is contiguous. x, values, bias and Y
// share one dtype: float32, float16 or bfloat16. row_map, when given, is the row of Y each CSR row
// goes to: a permutation of the rows (not checked here, which would cost a host sync per call;
// callers pass a TCSparseTensor's, checked when it was built). Likewise the pieces' values are
// csr_rows.row_pieces's, not checked here: only their sizes, types and device; padding entries
// (-1, csr_rows_spmm.h) are skipped by the kernel. addend, when given, is an fp32
// [num_rows, n] matrix in Y's row order added to Y before its one rounding (csr_rows_spmm.h).
at::Tensor csr_rows_spmm(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                         const at::Tensor& values, const at::Tensor& piece_slots, const at::Tensor& piece_starts,
                         const at::Tensor& split_rows, int64_t num_cols, int64_t piece_nnz,
                         const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& row_map,
                         const std::optional<at::Tensor>& addend) {
    const tcsparse::CsrRows a = rows_pattern(rowptr, col, piece_slots, piece_starts, split_rows, piece_nnz, row_map);
    const at::Device device = rowptr.device();
    const int64_t num_rows = a.num_rows;
    const at::Tensor xs = checked_dense(x, "x", num_cols, values, col.numel(), device);
    const at::ScalarType dtype = x.scalar_type();
    const int64_t n = x.size(1);
    const at::Tensor vc = values.contiguous();
    at::Tensor bc;
    if (bias.has_value()) {
        check_operand(*bias, "bias", device, dtype, "x");
        TCS_CHECK(bias->dim() == 1 && bias->numel() == n, "bias must be 1-D with ", n, " entries, got shape ",
                  bias->sizes());
        bc = bias->contiguous();
    }
    at::Tensor ac;
    if (addend.has_value()) {
        TCS_CHECK(addend->device() == device && addend->scalar_type() == at::kFloat, "addend must be float32 on ",
                  device, ", got ", addend->scalar_type(), " on ", addend->device());
        TCS_CHECK(addend->dim() == 2 && addend->size(0) == num_rows && addend->size(1) == n, "addend must have shape [",
                  num_rows, ", ", n, "], got ", addend->sizes());
        ac = addend->contiguous();
    }
    const c10::cuda::CUDAGuard guard(device);
    at::Tensor y = at::empty({num_rows, n}, xs.options().memory_format(at::MemoryFormat::Contiguous));
    const SplitBuffers split = split_buffers(device, split_rows.numel(), n);
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        const auto* bp = bias.has_value() ? reinterpret_cast<const T*>(bc.const_data_ptr()) : nullptr;
        check_launch(tcsparse::csr_rows_spmm<T>(a, reinterpret_cast<const T*>(vc.const_data_ptr()),
                                                reinterpret_cast<const T*>(xs.const_data_ptr()),
                                                std::max<int64_t>(xs.stride(0), 1),
                                                reinterpret_cast<T*>(y.mutable_data_ptr()), std::max<int64_t>(n, 1), n,
                                                bp, ac.defined() ? ac.const_data_ptr<float>() : nullptr,
                                                split.pointers(),
                                                c10::cuda::getCurrentCUDAStream()),
                     "csr_rows_spmm");
    });
    return y;
}

// dX = A^T grad_y for the operands of csr_rows_spmm (the same checks; grad_y has a row per row of
// Y, read through row_map), summed by fp32 atomics into a zeroed [num_cols, n] matrix and
// returned in grad_y's dtype (float32: that matrix itself).
at::Tensor csr_rows_scatter(const at::Tensor& grad_y, const at::Tensor& rowptr, const at::Tensor& col,
                            const at::Tensor& values, const at::Tensor& piece_slots, const at::Tensor& piece_starts,
                            const at::Tensor& split_rows, int64_t num_cols, int64_t piece_nnz,
                            const std::optional<at::Tensor>& row_map) {
    const tcsparse::CsrRows a = rows_pattern(rowptr, col, piece_slots, piece_starts, split_rows, piece_nnz, row_map);
    const at::Device device = rowptr.device();
    TCS_CHECK(num_cols >= 0, "num_cols must be non-negative, got ", num_cols);
    const at::Tensor gs = checked_dense(grad_y, "grad_y", a.num_rows, values, col.numel(), device);
    const at::ScalarType dtype = grad_y.scalar_type();
    const int64_t n = grad_y.size(1);
    const at::Tensor vc = values.contiguous();
    const c10::cuda::CUDAGuard guard(device);
    at::Tensor grad_x = at::zeros({num_cols, n}, gs.options().dtype(at::kFloat));
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::csr_rows_scatter<T>(a, reinterpret_cast<const T*>(vc.const_data_ptr()),
                                                   reinterpret_cast<const T*>(gs.const_data_ptr()),
                                                   std::max<int64_t>(gs.stride(0), 1), grad_x.mutable_data_ptr<float>(),
                                                   n, c10::cuda::getCurrentCUDAStream()),
                     "csr_rows_scatter");
    });
    return dtype == at::kFloat ? grad_x : grad_x.to(dtype);
}

}  // namespace tcsparse_binding
