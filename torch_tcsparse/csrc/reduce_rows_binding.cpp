// Torch bindings of the max/min SpMM and its backward (reduce_rows.h): validation, allocation, stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

#include "binding_checks.h"
#include "kernel_bindings.h"
#include "reduce_rows.h"

namespace tcsparse_binding {

// x (2-D, float32/float16/bfloat16, on device) and values (1-D, nnz entries, x's dtype and device).
static void check_x_and_values(const at::Tensor& x, const at::Tensor& values, int64_t nnz, const at::Device& device) {
    TCS_CHECK(x.device() == device, "x is on ", x.device(), " but the operands are on ", device);
    TCS_CHECK(x.dim() == 2, "x must be 2-D, got shape ", x.sizes());
    const at::ScalarType dtype = x.scalar_type();
    TCS_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "x must be float32, float16 or bfloat16, got ", dtype);
    TCS_CHECK(values.device() == device, "values is on ", values.device(), " but the operands are on ", device);
    TCS_CHECK(values.scalar_type() == dtype, "values must be ", dtype, " like x, got ", values.scalar_type());
    TCS_CHECK(values.dim() == 1 && values.numel() == nnz, "values must be 1-D with ", nnz, " entries, got shape ",
              values.sizes());
}

// (Y, winners) for the CSR (rowptr, col, values) and x [num_cols, n] with any row stride (its
// columns contiguous); values and x share one dtype (float32, float16 or bfloat16), Y has it too,
// winners are int32 nonzero indices (-1 for an empty row). is_max: max, else min. longest: the
// nonzeros of the longest row (any bound at least that), or -1 where unknown; a matrix whose rows
// all fit in a piece skips the pieces' launches and scratch.
std::tuple<at::Tensor, at::Tensor> reduce_rows(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                                               const at::Tensor& values, bool is_max, int64_t longest) {
    TCS_CHECK(rowptr.is_cuda(), "rowptr must be a CUDA tensor, got device ", rowptr.device());
    TCS_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, "rowptr must be 1-D with num_rows + 1 entries, got shape ",
              rowptr.sizes());
    const at::Device device = rowptr.device();
    const int64_t num_rows = rowptr.numel() - 1, nnz = col.numel();
    check_index(rowptr, "rowptr", at::kInt, num_rows + 1, device);
    check_index(col, "col", at::kInt, nnz, device);
    check_x_and_values(x, values, nnz, device);
    const at::ScalarType dtype = x.scalar_type();
    TCS_CHECK(longest >= -1, "longest must be a row's nonzeros or -1 (unknown), got ", longest);
    const int64_t n = x.size(1);
    const at::Tensor xs = x.stride(1) == 1 && x.stride(0) >= n ? x : x.contiguous();
    const at::Tensor vc = values.contiguous();
    const c10::cuda::CUDAGuard guard(device);
    at::Tensor y = at::empty({num_rows, n}, xs.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor winners = at::empty({num_rows, n}, xs.options().dtype(at::kInt).memory_format(at::MemoryFormat::Contiguous));
    const bool split = num_rows > 0 && (longest < 0 || longest > 2 * tcsparse::kPieceNnz);
    const int64_t partials = split ? tcsparse::reduce_rows_partials(nnz) : 0;
    at::Tensor partial_best = at::empty({partials, n}, xs.options().dtype(at::kFloat));
    at::Tensor partial_win = at::empty({partials, n}, xs.options().dtype(at::kInt));
    at::Tensor first_of = at::empty({partials}, xs.options().dtype(at::kInt));
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::reduce_rows<T>(rowptr.data_ptr<int32_t>(), col.data_ptr<int32_t>(), num_rows, partials,
                                              reinterpret_cast<const T*>(vc.const_data_ptr()),
                                              reinterpret_cast<const T*>(xs.const_data_ptr()),
                                              std::max<int64_t>(xs.stride(0), 1), n, is_max,
                                              partial_best.mutable_data_ptr<float>(),
                                              partial_win.mutable_data_ptr<int32_t>(),
                                              first_of.mutable_data_ptr<int32_t>(),
                                              reinterpret_cast<T*>(y.mutable_data_ptr()),
                                              winners.mutable_data_ptr<int32_t>(), c10::cuda::getCurrentCUDAStream()),
                     "reduce_rows");
    });
    return {y, winners};
}

// (dX, d(values)) of the max/min product whose winners reduce_rows gave, as fp32 sums (the caller
// rounds them to its dtype): each output's gradient goes to its winner. An output that is not
// wanted comes back empty. grad_y [num_rows, n], x [num_cols, n] (any row stride, its columns
// contiguous) and values share one dtype (float32, float16 or bfloat16); winners int32 [num_rows,
// n], col int32 (the CSR's column of every nonzero).
std::tuple<at::Tensor, at::Tensor> reduce_rows_backward(const at::Tensor& grad_y, const at::Tensor& winners,
                                                        const at::Tensor& col, const at::Tensor& values,
                                                        const at::Tensor& x, bool needs_x, bool needs_values) {
    TCS_CHECK(col.is_cuda(), "col must be a CUDA tensor, got device ", col.device());
    const at::Device device = col.device();
    const int64_t nnz = col.numel();
    check_index(col, "col", at::kInt, nnz, device);
    check_x_and_values(x, values, nnz, device);
    const at::ScalarType dtype = x.scalar_type();
    const int64_t n = x.size(1);
    TCS_CHECK(grad_y.device() == device, "grad_y is on ", grad_y.device(), " but the operands are on ", device);
    TCS_CHECK(grad_y.scalar_type() == dtype, "grad_y must be ", dtype, " like x, got ", grad_y.scalar_type());
    TCS_CHECK(grad_y.dim() == 2 && grad_y.size(1) == n, "grad_y must be [num_rows, ", n, "], got shape ",
              grad_y.sizes());
    const int64_t num_rows = grad_y.size(0);
    TCS_CHECK(winners.device() == device, "winners is on ", winners.device(), " but the operands are on ", device);
    TCS_CHECK(winners.scalar_type() == at::kInt, "winners must be Int, got ", winners.scalar_type());
    TCS_CHECK(winners.sizes() == grad_y.sizes(), "winners must have grad_y's shape ", grad_y.sizes(), ", got ",
              winners.sizes());
    const at::Tensor gy = grad_y.contiguous(), wc = winners.contiguous(), vc = values.contiguous();
    const at::Tensor xs = x.stride(1) == 1 && x.stride(0) >= n ? x : x.contiguous();
    const c10::cuda::CUDAGuard guard(device);
    const at::TensorOptions sums = xs.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
    at::Tensor grad_x = at::zeros({needs_x ? xs.size(0) : 0, n}, sums);
    at::Tensor grad_values = at::zeros({needs_values ? nnz : 0}, sums);
    const bool vector_rows = reinterpret_cast<uintptr_t>(gy.const_data_ptr()) % 16 == 0 &&
                             reinterpret_cast<uintptr_t>(wc.const_data_ptr()) % 16 == 0;
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::reduce_rows_backward<T>(
                         reinterpret_cast<const T*>(gy.const_data_ptr()), wc.const_data_ptr<int32_t>(),
                         col.const_data_ptr<int32_t>(), reinterpret_cast<const T*>(vc.const_data_ptr()),
                         reinterpret_cast<const T*>(xs.const_data_ptr()), std::max<int64_t>(xs.stride(0), 1), num_rows,
                         n, vector_rows, needs_x ? grad_x.mutable_data_ptr<float>() : nullptr,
                         needs_values ? grad_values.mutable_data_ptr<float>() : nullptr,
                         c10::cuda::getCurrentCUDAStream()),
                     "reduce_rows_backward");
    });
    return {grad_x, grad_values};
}

}  // namespace tcsparse_binding
