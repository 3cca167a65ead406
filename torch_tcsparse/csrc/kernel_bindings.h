// The torch-facing bindings of the kernels (bindings.cpp, csr_rows_binding.cpp,
// grouped_binding.cpp, reduce_rows_binding.cpp): validation (TCS_CHECK), allocation, device and
// stream. They are bound to Python once, as plain pybind11 functions (python_module.cpp): a
// product calls them directly, without the dispatcher's boxing of a dozen arguments per call;
// torch.compile traces the custom ops of torch_tcsparse/ops.py, which call the same functions.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace tcsparse_binding {

at::Tensor spmm(const at::Tensor& x, const at::Tensor& values, const at::Tensor& window_offsets,
                const at::Tensor& block_offsets, const at::Tensor& local_ids, const at::Tensor& block_cols,
                const at::Tensor& block_bitmap, const at::Tensor& row_map, const at::Tensor& chunk_offsets,
                const at::Tensor& chunk_row_starts, int64_t window, int64_t num_rows, int64_t num_cols, int64_t chunk,
                bool balanced, bool deterministic, bool exact);

at::Tensor sddmm(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& window_offsets,
                 const at::Tensor& block_offsets, const at::Tensor& local_ids, const at::Tensor& block_cols,
                 const at::Tensor& block_bitmap, const at::Tensor& row_map, const at::Tensor& chunk_offsets,
                 const at::Tensor& chunk_row_starts, int64_t window, int64_t num_rows, int64_t num_cols,
                 int64_t chunk);

// (resident warps per SM, column slices) of the ME-TCF SpMM's launch on the current CUDA device.
std::vector<int64_t> launch_shape(int64_t window, int64_t num_windows, int64_t n, bool balanced, bool exact,
                                  at::ScalarType dtype);

// A sampled block's columns (sampled_columns.cu): each row's sources ascending, in rowptr's type.
// Rows of more than kSortedRowLimit sources are refused (the caller sorts those with torch).
at::Tensor sort_row_sources(const at::Tensor& rowptr, const at::Tensor& source, int64_t longest);

// The mean's row scale (row_scale.cu): 1 / (nonzeros of its row) for each of the nnz =
// rowptr[-1] nonzeros, in CSR order, float32 or float64 (dtype); rowptr int32 or int64.
at::Tensor row_scale(const at::Tensor& rowptr, int64_t nnz, at::ScalarType dtype);

// The CSR -> ME-TCF conversion (metcf_convert.cu), in three steps.
std::tuple<at::Tensor, at::Tensor> metcf_row_map(const at::Tensor& row_perm, int64_t num_rows, int64_t window);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> metcf_count(const at::Tensor& rowptr, const at::Tensor& col,
                                                                       const at::Tensor& row_map,
                                                                       const at::Tensor& slot_of_row, int64_t window,
                                                                       int64_t chunk);

std::vector<at::Tensor> metcf_fill(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& row_map,
                                   const at::Tensor& slot_of_row, const at::Tensor& first_before, at::Tensor owners,
                                   const at::Tensor& narrow_base, const at::Tensor& window_offsets, int64_t num_blocks,
                                   int64_t window);

at::Tensor csr_rows_spmm(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                         const at::Tensor& values, const at::Tensor& piece_slots, const at::Tensor& piece_starts,
                         const at::Tensor& split_rows, int64_t num_cols, int64_t piece_nnz,
                         const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& row_map,
                         const std::optional<at::Tensor>& addend);

// dX = A^T grad_y from csr_rows_spmm's operands, by fp32 atomics (csr_rows_scatter.h).
at::Tensor csr_rows_scatter(const at::Tensor& grad_y, const at::Tensor& rowptr, const at::Tensor& col,
                            const at::Tensor& values, const at::Tensor& piece_slots, const at::Tensor& piece_starts,
                            const at::Tensor& split_rows, int64_t num_cols, int64_t piece_nnz,
                            const std::optional<at::Tensor>& row_map);

at::Tensor grouped_spmm(const at::Tensor& x, const at::Tensor& fragments, const at::Tensor& chunk_starts,
                        const at::Tensor& chunk_group, const at::Tensor& block_cols, const at::Tensor& sub_slots,
                        const at::Tensor& row_map, int64_t num_rows, bool exact, const std::optional<at::Tensor>& bias,
                        bool keep_fp32);

// The max/min SpMM (reduce_rows_binding.cpp): (Y, the winning nonzero of every output).
std::tuple<at::Tensor, at::Tensor> reduce_rows(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                                               const at::Tensor& values, bool is_max, int64_t longest);
// Its backward: (dX, d(values)) as fp32 sums, each output's gradient sent to its winner.
std::tuple<at::Tensor, at::Tensor> reduce_rows_backward(const at::Tensor& grad_y, const at::Tensor& winners,
                                                        const at::Tensor& col, const at::Tensor& values,
                                                        const at::Tensor& x, bool needs_x, bool needs_values);

}  // namespace tcsparse_binding
