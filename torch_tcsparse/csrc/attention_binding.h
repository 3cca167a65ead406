// Torch bindings of multi-head attention's sparse products (attention_binding.cpp over
// attention.h), bound to Python beside the other kernels (python_module.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace tcsparse_binding {

// Y [num_rows, heads, channels]: Y[i, h] = sum over the nonzeros k of row i of
// weights[edge_ids[k] (else k), h] * x[col[k], h], the rows cut into the pieces given.
at::Tensor attention_spmm(const at::Tensor& weights, const at::Tensor& x, const at::Tensor& col,
                          const std::optional<at::Tensor>& edge_ids, const at::Tensor& piece_begin,
                          const at::Tensor& piece_row, const at::Tensor& piece_slot, const at::Tensor& split_rows,
                          const at::Tensor& split_begin, int64_t num_slots, int64_t num_rows);

// S [nnz, heads]: S[k, h] = <a[row[k], h], b[col[k], h]>.
at::Tensor attention_sddmm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& row, const at::Tensor& col);

// O [num_rows, heads]: O[i, h] = sum over the nonzeros k of row i of values[edge_ids[k] (else k), h].
at::Tensor attention_row_sums(const at::Tensor& values, const std::optional<at::Tensor>& edge_ids,
                              const at::Tensor& piece_begin, const at::Tensor& piece_row, const at::Tensor& piece_slot,
                              const at::Tensor& split_rows, const at::Tensor& split_begin, int64_t num_slots,
                              int64_t num_rows);

// alpha [nnz, heads], the softmax over each row of the edges' scores (edge_softmax.h): `dot`
// false: GAT's from first = src [num_cols, heads] and second = dst [num_rows, heads] (optional),
// parameter its negative slope; `dot` true: scaled dot products of first = query and second = key
// [*, heads, channels], parameter the scale.
at::Tensor attention_softmax(bool dot, const at::Tensor& first, const std::optional<at::Tensor>& second,
                             const at::Tensor& col, const at::Tensor& piece_begin, const at::Tensor& piece_row,
                             const at::Tensor& piece_slot, const at::Tensor& split_rows, const at::Tensor& split_begin,
                             int64_t num_slots, double parameter);

// [grad_score] or, with grad_dst (GAT with dst only), [grad_score, its row sums [num_rows, heads]]:
// the gradient of the scores before their last step from alpha and its gradient.
std::vector<at::Tensor> attention_softmax_backward(bool dot, const at::Tensor& alpha, const at::Tensor& grad_alpha,
                                                   const at::Tensor& first, const std::optional<at::Tensor>& second,
                                                   const at::Tensor& col, const at::Tensor& piece_begin,
                                                   const at::Tensor& piece_row, const at::Tensor& piece_slot,
                                                   const at::Tensor& split_rows, const at::Tensor& split_begin,
                                                   int64_t num_slots, double parameter, int64_t num_rows,
                                                   bool grad_dst);

}  // namespace tcsparse_binding
