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
#include "edge_softmax.h"

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

// The row pieces of a CSR (attention.h), checked.
tcsparse::RowPieces row_pieces(const at::Tensor& begin, const at::Tensor& row, const at::Tensor& slot,
                               const at::Tensor& split_rows, const at::Tensor& split_begin, const at::Device& device) {
    const int64_t pieces = row.numel(), num_split = split_rows.numel();
    check_index(begin, "piece_begin", at::kInt, pieces + 1, device);
    check_index(row, "piece_row", at::kInt, pieces, device);
    check_index(slot, "piece_slot", at::kInt, pieces, device);
    check_index(split_rows, "split_rows", at::kInt, num_split, device);
    check_index(split_begin, "split_begin", at::kInt, num_split + 1, device);
    return {begin.data_ptr<int32_t>(), row.data_ptr<int32_t>(), slot.data_ptr<int32_t>(), pieces,
            split_rows.data_ptr<int32_t>(), split_begin.data_ptr<int32_t>(), num_split};
}

// A [rows, heads] operand of `dtype` on `device`, made contiguous.
at::Tensor per_head(const at::Tensor& t, const char* name, const at::Device& device, at::ScalarType dtype,
                    int64_t heads) {
    TCS_CHECK(t.device() == device, name, " is on ", t.device(), " but the operands are on ", device);
    TCS_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
    TCS_CHECK(t.dim() == 2 && t.size(1) == heads, name, " must be [rows, ", heads, " heads], got shape ", t.sizes());
    return t.contiguous();
}

template <typename T>
const T* pointer(const at::Tensor& t) {
    return t.defined() ? reinterpret_cast<const T*>(t.const_data_ptr()) : nullptr;
}

template <typename T>
T* mutable_pointer(const at::Tensor& t) {
    return t.defined() ? reinterpret_cast<T*>(t.mutable_data_ptr()) : nullptr;
}

}  // namespace

namespace tcsparse_binding {

at::Tensor attention_spmm(const at::Tensor& weights, const at::Tensor& x, const at::Tensor& col,
                          const std::optional<at::Tensor>& edge_ids, const at::Tensor& piece_begin,
                          const at::Tensor& piece_row, const at::Tensor& piece_slot, const at::Tensor& split_rows,
                          const at::Tensor& split_begin, int64_t num_slots, int64_t num_rows) {
    TCS_CHECK(col.is_cuda(), "col must be a CUDA tensor, got device ", col.device());
    const at::Device device = col.device();
    const int64_t nnz = col.numel();
    TCS_CHECK(num_rows >= 0 && num_slots >= 0, "num_rows and num_slots must be non-negative, got ", num_rows, " and ",
              num_slots);
    check_index(col, "col", at::kInt, nnz, device);
    if (edge_ids.has_value()) check_index(*edge_ids, "edge_ids", at::kInt, nnz, device);
    const tcsparse::RowPieces row_pieces =
        ::row_pieces(piece_begin, piece_row, piece_slot, split_rows, split_begin, device);
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

at::Tensor attention_row_sums(const at::Tensor& values, const std::optional<at::Tensor>& edge_ids,
                              const at::Tensor& piece_begin, const at::Tensor& piece_row, const at::Tensor& piece_slot,
                              const at::Tensor& split_rows, const at::Tensor& split_begin, int64_t num_slots,
                              int64_t num_rows) {
    TCS_CHECK(values.is_cuda(), "values must be a CUDA tensor, got device ", values.device());
    const at::Device device = values.device();
    const at::ScalarType dtype = kernel_dtype(values, "values");
    TCS_CHECK(values.dim() == 2, "values must be [nonzeros, heads], got shape ", values.sizes());
    TCS_CHECK(num_rows >= 0 && num_slots >= 0, "num_rows and num_slots must be non-negative, got ", num_rows, " and ",
              num_slots);
    const int64_t nnz = values.size(0), heads = values.size(1);
    if (edge_ids.has_value()) check_index(*edge_ids, "edge_ids", at::kInt, nnz, device);
    const tcsparse::RowPieces pieces =
        row_pieces(piece_begin, piece_row, piece_slot, split_rows, split_begin, device);
    const at::Tensor vs = values.contiguous();
    const c10::cuda::CUDAGuard guard(device);
    at::Tensor out = at::empty({num_rows, heads}, vs.options());
    at::Tensor partial = at::empty({num_slots, heads}, vs.options().dtype(at::kFloat));
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::multihead_row_sums<T>(pieces, edge_ids.has_value() ? edge_ids->data_ptr<int32_t>() : nullptr,
                                                     pointer<T>(vs), heads, mutable_pointer<T>(out),
                                                     partial.mutable_data_ptr<float>(),
                                                     c10::cuda::getCurrentCUDAStream()),
                     "multihead_row_sums");
    });
    return out;
}

namespace {

// The operands both softmax directions share: the per-node arrays (GAT's src [num_cols, heads]
// and dst [num_rows, heads] or none; dot attention's query and key [*, heads, channels]) checked
// against each other, and the pieces.
struct SoftmaxOperands {
    at::Device device = at::kCPU;
    at::ScalarType dtype = at::kFloat;
    int64_t heads = 0, channels = 0;
    at::Tensor first, second;  // src and dst (undefined where absent), or query and key
    tcsparse::RowPieces pieces{};
};

SoftmaxOperands softmax_operands(bool dot, const at::Tensor& first, const std::optional<at::Tensor>& second,
                                 const at::Tensor& col, const at::Tensor& piece_begin, const at::Tensor& piece_row,
                                 const at::Tensor& piece_slot, const at::Tensor& split_rows,
                                 const at::Tensor& split_begin, int64_t num_slots) {
    TCS_CHECK(col.is_cuda(), "col must be a CUDA tensor, got device ", col.device());
    TCS_CHECK(num_slots >= 0, "num_slots must be non-negative, got ", num_slots);
    SoftmaxOperands o;
    o.device = col.device();
    check_index(col, "col", at::kInt, col.numel(), o.device);
    o.pieces = row_pieces(piece_begin, piece_row, piece_slot, split_rows, split_begin, o.device);
    o.dtype = kernel_dtype(first, dot ? "query" : "src");
    TCS_CHECK(first.dim() == (dot ? 3 : 2), dot ? "query must be [rows, heads, channels]" : "src must be [rows, heads]",
              ", got shape ", first.sizes());
    o.heads = first.size(1);
    if (dot) {
        TCS_CHECK(second.has_value(), "key must be given");
        o.first = features(first, "query", o.device, o.dtype, o.heads);
        o.second = features(*second, "key", o.device, o.dtype, o.heads);
        o.channels = o.first.size(2);
        TCS_CHECK(o.second.size(2) == o.channels, "query and key must have the same channels, got ", o.channels,
                  " and ", o.second.size(2));
    } else {
        o.first = per_head(first, "src", o.device, o.dtype, o.heads);
        if (second.has_value()) o.second = per_head(*second, "dst", o.device, o.dtype, o.heads);
    }
    return o;
}

template <typename T>
tcsparse::GatScores<T> gat_scores(const SoftmaxOperands& o, double negative_slope) {
    return {pointer<T>(o.first), pointer<T>(o.second), static_cast<float>(negative_slope)};
}

template <typename T>
tcsparse::DotScores<T> dot_scores(const SoftmaxOperands& o, double scale) {
    return {pointer<T>(o.first), pointer<T>(o.second), o.channels, static_cast<float>(scale)};
}

// alpha [nnz, heads] of the softmax of the scores `o` forms with `parameter` (GAT's negative
// slope, or dot attention's scale).
at::Tensor softmax_forward(bool dot, const SoftmaxOperands& o, const at::Tensor& col, int64_t num_slots,
                           double parameter) {
    const c10::cuda::CUDAGuard guard(o.device);
    at::Tensor alpha = at::empty({col.numel(), o.heads}, o.first.options());
    at::Tensor slots = at::empty({num_slots, o.heads, 2}, o.first.options().dtype(at::kFloat));
    with_element_type(o.dtype, [&](auto element) {
        using T = decltype(element);
        const auto stream = c10::cuda::getCurrentCUDAStream();
        T* out = mutable_pointer<T>(alpha);
        float* scratch = slots.mutable_data_ptr<float>();
        const int32_t* cols = col.data_ptr<int32_t>();
        check_launch(dot ? tcsparse::edge_softmax<T>(o.pieces, cols, dot_scores<T>(o, parameter), o.heads, out, scratch,
                                                     stream)
                         : tcsparse::edge_softmax<T>(o.pieces, cols, gat_scores<T>(o, parameter), o.heads, out, scratch,
                                                     stream),
                     "edge_softmax");
    });
    return alpha;
}

}  // namespace

at::Tensor attention_softmax(bool dot, const at::Tensor& first, const std::optional<at::Tensor>& second,
                             const at::Tensor& col, const at::Tensor& piece_begin, const at::Tensor& piece_row,
                             const at::Tensor& piece_slot, const at::Tensor& split_rows, const at::Tensor& split_begin,
                             int64_t num_slots, double parameter) {
    const SoftmaxOperands o = softmax_operands(dot, first, second, col, piece_begin, piece_row, piece_slot, split_rows,
                                               split_begin, num_slots);
    return softmax_forward(dot, o, col, num_slots, parameter);
}

std::vector<at::Tensor> attention_softmax_backward(bool dot, const at::Tensor& alpha, const at::Tensor& grad_alpha,
                                                   const at::Tensor& first, const std::optional<at::Tensor>& second,
                                                   const at::Tensor& col, const at::Tensor& piece_begin,
                                                   const at::Tensor& piece_row, const at::Tensor& piece_slot,
                                                   const at::Tensor& split_rows, const at::Tensor& split_begin,
                                                   int64_t num_slots, double parameter, int64_t num_rows,
                                                   bool grad_dst) {
    const SoftmaxOperands o = softmax_operands(dot, first, second, col, piece_begin, piece_row, piece_slot, split_rows,
                                               split_begin, num_slots);
    const int64_t nnz = col.numel();
    for (const auto& [t, name] : {std::pair{&alpha, "alpha"}, std::pair{&grad_alpha, "grad_alpha"}}) {
        TCS_CHECK(t->device() == o.device && t->scalar_type() == o.dtype, name, " must be ", o.dtype, " on ", o.device,
                  ", got ", t->scalar_type(), " on ", t->device());
        TCS_CHECK(t->dim() == 2 && t->size(0) == nnz && t->size(1) == o.heads, name, " must be [", nnz, ", ", o.heads,
                  "], got shape ", t->sizes());
    }
    TCS_CHECK(!grad_dst || (!dot && o.second.defined()), "grad_dst needs GAT's dst scores");
    TCS_CHECK(num_rows >= 0, "num_rows must be non-negative, got ", num_rows);
    const at::Tensor a = alpha.contiguous(), g = grad_alpha.contiguous();
    const c10::cuda::CUDAGuard guard(o.device);
    at::Tensor grad_score = at::empty({nnz, o.heads}, a.options());
    at::Tensor dst = grad_dst ? at::empty({num_rows, o.heads}, a.options()) : at::Tensor();
    at::Tensor slots = at::empty({num_slots, o.heads, 2}, a.options().dtype(at::kFloat));
    with_element_type(o.dtype, [&](auto element) {
        using T = decltype(element);
        const auto stream = c10::cuda::getCurrentCUDAStream();
        const int32_t* cols = col.data_ptr<int32_t>();
        float* scratch = slots.mutable_data_ptr<float>();
        check_launch(dot ? tcsparse::edge_softmax_backward<T>(o.pieces, cols, dot_scores<T>(o, parameter), o.heads,
                                                              pointer<T>(a), pointer<T>(g),
                                                              mutable_pointer<T>(grad_score), nullptr, scratch, stream)
                         : tcsparse::edge_softmax_backward<T>(o.pieces, cols, gat_scores<T>(o, parameter), o.heads,
                                                              pointer<T>(a), pointer<T>(g),
                                                              mutable_pointer<T>(grad_score), mutable_pointer<T>(dst),
                                                              scratch, stream),
                     "edge_softmax_backward");
    });
    if (grad_dst) return {grad_score, dst};
    return {grad_score};
}

}  // namespace tcsparse_binding
