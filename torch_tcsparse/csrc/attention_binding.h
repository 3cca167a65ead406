// Torch bindings of multi-head attention's sparse products (attention_binding.cpp over
// attention.h), bound to Python beside the other kernels (python_module.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace tcsparse_binding {

// Y [num_rows, heads, channels]: Y[i, h] = sum over the nonzeros k of row i of
// weights[edge_ids[k] (else k), h] * x[col[k], h], the rows cut into the pieces given.
at::Tensor attention_spmm(const at::Tensor& weights, const at::Tensor& x, const at::Tensor& col,
                          const std::optional<at::Tensor>& edge_ids, const at::Tensor& piece_begin,
                          const at::Tensor& piece_row, const at::Tensor& piece_slot, const at::Tensor& split_rows,
                          const at::Tensor& split_begin, int64_t num_slots, int64_t num_rows);

// S [nnz, heads]: S[k, h] = <a[row[k], h], b[col[k], h]>.
at::Tensor attention_sddmm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& row, const at::Tensor& col);

}  // namespace tcsparse_binding
