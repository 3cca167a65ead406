// Torch binding of multi-head attention's sparse products (attention.h): validation, allocation,
// stream. Index values are not range-checked here (that costs a host sync per call): callers
// pass the arrays of a TCSparseTensor's canonical CSR and what is derived from them once.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "attention.h"
#include "attention_binding.h"
#include "binding_checks.h"

namespace {

using tcsparse_binding::check_index;
using tcsparse_binding::check_launch;
using tcsparse_binding::with_element_type;

// A [rows, heads, channels] operand of the kernels' dtype on `device`, made contiguous.
at::Tensor features(const at::Tensor& t, const char* name, const at::Device& device, at::ScalarType dtype,
                    int64_t heads) {
    TCS_CHECK(t.device() == device, name, " is on ", t.device(), " but the operands are on ", device);
    TCS_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
    TCS_CHECK(t.dim() == 3 && t.size(1) == heads, name, " must be [rows, ", heads, " heads, channels], got shape ",
              t.sizes());
    return t.contiguous();
}

at::ScalarType kernel_dtype(const at::Tensor& t, const char* name) {
    const at::ScalarType dtype = t.scalar_type();
    TCS_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, name,
              " must be float32, float16 or bfloat16, got ", dtype);
    return dtype;
}

}  // namespace

namespace tcsparse_binding {

at::Tensor attention_spmm(const at::Tensor& weights, const at::Tensor& x, const at::Tensor& col,
                          const std::optional<at::Tensor>& edge_ids, const at::Tensor& piece_begin,
                          const at::Tensor& piece_row, const at::Tensor& piece_slot, const at::Tensor& split_rows,
                          const at::Tensor& split_begin, int64_t num_slots, int64_t num_rows) {
    TCS_CHECK(col.is_cuda(), "col must be a CUDA tensor, got device ", col.device());
    const at::Device device = col.device();
    const int64_t nnz = col.numel(), pieces = piece_row.numel(), num_split = split_rows.numel();
    TCS_CHECK(num_rows >= 0 && num_slots >= 0, "num_rows and num_slots must be non-negative, got ", num_rows, " and ",
              num_slots);
    check_index(col, "col", at::kInt, nnz, device);
    if (edge_ids.has_value()) check_index(*edge_ids, "edge_ids", at::kInt, nnz, device);
    check_index(piece_begin, "piece_begin", at::kInt, pieces + 1, device);
    check_index(piece_row, "piece_row", at::kInt, pieces, device);
    check_index(piece_slot, "piece_slot", at::kInt, pieces, device);
    check_index(split_rows, "split_rows", at::kInt, num_split, device);
    check_index(split_begin, "split_begin", at::kInt, num_split + 1, device);
    const at::ScalarType dtype = kernel_dtype(x, "x");
    TCS_CHECK(weights.device() == device && weights.scalar_type() == dtype, "weights must be ", dtype, " on ", device,
              ", got ", weights.scalar_type(), " on ", weights.device());
    TCS_CHECK(weights.dim() == 2 && weights.size(0) == nnz, "weights must be [", nnz, " nonzeros, heads], got shape ",
              weights.sizes());
    const int64_t heads = weights.size(1);
    const at::Tensor xs = features(x, "x", device, dtype, heads);
    const at::Tensor ws = weights.contiguous();
    const int64_t channels = xs.size(2);
    const c10::cuda::CUDAGuard guard(device);
    at::Tensor y = at::empty({num_rows, heads, channels}, xs.options());
    at::Tensor partial = at::empty({num_slots, heads * channels}, xs.options().dtype(at::kFloat));
    const tcsparse::RowPieces row_pieces{piece_begin.data_ptr<int32_t>(), piece_row.data_ptr<int32_t>(),
                                         piece_slot.data_ptr<int32_t>(),  pieces,
                                         split_rows.data_ptr<int32_t>(),  split_begin.data_ptr<int32_t>(),
                                         num_split};
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::multihead_spmm<T>(row_pieces, col.data_ptr<int32_t>(),
                                                 edge_ids.has_value() ? edge_ids->data_ptr<int32_t>() : nullptr,
                                                 reinterpret_cast<const T*>(ws.const_data_ptr()),
                                                 reinterpret_cast<const T*>(xs.const_data_ptr()), heads, channels,
                                                 reinterpret_cast<T*>(y.mutable_data_ptr()),
                                                 partial.mutable_data_ptr<float>(), c10::cuda::getCurrentCUDAStream()),
                     "multihead_spmm");
    });
    return y;
}

at::Tensor attention_sddmm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& row, const at::Tensor& col) {
    TCS_CHECK(row.is_cuda(), "row must be a CUDA tensor, got device ", row.device());
    const at::Device device = row.device();
    const int64_t nnz = row.numel();
    check_index(row, "row", at::kInt, nnz, device);
    check_index(col, "col", at::kInt, nnz, device);
    const at::ScalarType dtype = kernel_dtype(a, "a");
    TCS_CHECK(a.dim() == 3, "a must be [rows, heads, channels], got shape ", a.sizes());
    const int64_t heads = a.size(1);
    const at::Tensor as = features(a, "a", device, dtype, heads);
    const at::Tensor bs = features(b, "b", device, dtype, heads);
    TCS_CHECK(bs.size(2) == as.size(2), "a and b must have the same channels, got ", as.size(2), " and ", bs.size(2));
    const int64_t channels = as.size(2);
    const c10::cuda::CUDAGuard guard(device);
    at::Tensor out = at::empty({nnz, heads}, as.options());
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::multihead_sddmm<T>(row.data_ptr<int32_t>(), col.data_ptr<int32_t>(), nnz,
                                                  reinterpret_cast<const T*>(as.const_data_ptr()),
                                                  reinterpret_cast<const T*>(bs.const_data_ptr()), heads, channels,
                                                  reinterpret_cast<T*>(out.mutable_data_ptr()),
                                                  c10::cuda::getCurrentCUDAStream()),
                     "multihead_sddmm");
    });
    return out;
}

}  // namespace tcsparse_binding
