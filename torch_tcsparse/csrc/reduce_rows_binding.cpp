// Torch binding of the max/min SpMM (reduce_rows.h): validation, allocation, stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

#include "binding_checks.h"
#include "kernel_bindings.h"
#include "reduce_rows.h"

namespace tcsparse_binding {

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
    TCS_CHECK(x.device() == device, "x is on ", x.device(), " but the operands are on ", device);
    const at::ScalarType dtype = x.scalar_type();
    TCS_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "x must be float32, float16 or bfloat16, got ", dtype);
    TCS_CHECK(values.device() == device, "values is on ", values.device(), " but the operands are on ", device);
    TCS_CHECK(values.scalar_type() == dtype, "values must be ", dtype, " like x, got ", values.scalar_type());
    TCS_CHECK(values.dim() == 1 && values.numel() == nnz, "values must be 1-D with ", nnz, " entries, got shape ",
              values.sizes());
    TCS_CHECK(x.dim() == 2, "x must be 2-D, got shape ", x.sizes());
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

}  // namespace tcsparse_binding
