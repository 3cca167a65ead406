// Torch binding of the "rows" SpMM (csr_rows_spmm.h): validation, allocation, stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "binding_checks.h"
#include "csr_rows_spmm.h"

namespace {

using tcsparse_binding::check_index;
using tcsparse_binding::check_launch;

void check_float(const at::Tensor& t, const char* name, const at::Device& device) {
    TCS_CHECK(t.device() == device, name, " is on ", t.device(), " but the operands are on ", device);
    TCS_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
}

// Y = A @ x (+ bias) for the CSR (rowptr, col, values) split into pieces of piece_nnz nonzeros;
// x may have any row stride (its columns contiguous), Y is contiguous.
at::Tensor csr_rows_spmm(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                         const at::Tensor& values, const at::Tensor& piece_rows, const at::Tensor& piece_starts,
                         const at::Tensor& split_rows, int64_t num_cols, int64_t piece_nnz,
                         const std::optional<at::Tensor>& bias) {
    TCS_CHECK(rowptr.is_cuda(), "rowptr must be a CUDA tensor, got device ", rowptr.device());
    TCS_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, "rowptr must be 1-D with num_rows + 1 entries, got shape ",
              rowptr.sizes());
    const at::Device device = rowptr.device();
    const int64_t num_rows = rowptr.numel() - 1, nnz = col.numel();
    TCS_CHECK(piece_nnz >= 1 && piece_nnz <= INT32_MAX, "piece_nnz must lie in [1, ", int64_t{INT32_MAX}, "], got ",
              piece_nnz);
    check_index(rowptr, "rowptr", at::kInt, num_rows + 1, device);
    check_index(col, "col", at::kInt, nnz, device);
    check_index(piece_rows, "piece_rows", at::kInt, piece_rows.numel(), device);
    check_index(piece_starts, "piece_starts", at::kInt, piece_rows.numel(), device);
    check_index(split_rows, "split_rows", at::kInt, split_rows.numel(), device);
    check_float(values, "values", device);
    TCS_CHECK(values.dim() == 1 && values.numel() == nnz, "values must be 1-D with ", nnz, " entries, got shape ",
              values.sizes());
    check_float(x, "x", device);
    TCS_CHECK(x.dim() == 2 && x.size(0) == num_cols, "x must be 2-D with ", num_cols, " rows, got shape ", x.sizes());
    const int64_t n = x.size(1);
    const at::Tensor xs = x.stride(1) == 1 && x.stride(0) >= n ? x : x.contiguous();
    const at::Tensor vc = values.contiguous();
    at::Tensor bc;
    if (bias.has_value()) {
        check_float(*bias, "bias", device);
        TCS_CHECK(bias->dim() == 1 && bias->numel() == n, "bias must be 1-D with ", n, " entries, got shape ",
                  bias->sizes());
        bc = bias->contiguous();
    }
    const c10::cuda::CUDAGuard guard(device);
    at::Tensor y = at::empty({num_rows, n}, xs.options().memory_format(at::MemoryFormat::Contiguous));
    const tcsparse::CsrRows a{rowptr.data_ptr<int32_t>(),       col.data_ptr<int32_t>(),
                              vc.data_ptr<float>(),             piece_rows.data_ptr<int32_t>(),
                              piece_starts.data_ptr<int32_t>(), split_rows.data_ptr<int32_t>(),
                              num_rows,                         piece_rows.numel(),
                              split_rows.numel(),               static_cast<int>(piece_nnz)};
    check_launch(tcsparse::csr_rows_spmm(a, xs.data_ptr<float>(), std::max<int64_t>(xs.stride(0), 1), y.data_ptr<float>(),
                                         std::max<int64_t>(n, 1), n, bias.has_value() ? bc.data_ptr<float>() : nullptr,
                                         c10::cuda::getCurrentCUDAStream()),
                 "csr_rows_spmm");
    return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tcsparse_kernels, m) {
    m.def(
        "csr_rows_spmm(Tensor x, Tensor rowptr, Tensor col, Tensor values, Tensor piece_rows, Tensor piece_starts, "
        "Tensor split_rows, int num_cols, int piece_nnz, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(tcsparse_kernels, CUDA, m) {
    m.impl("csr_rows_spmm", &csr_rows_spmm);
}
