// The bindings of the kernels a product calls every time (bindings.cpp, csr_rows_binding.cpp,
// grouped_binding.cpp). Each is registered twice: as a torch operator (torch.ops.tcsparse_kernels,
// which torch.compile and the custom ops of torch_tcsparse/ops.py go through) and as a plain
// pybind11 function (python_module.cpp) for eager products, which skips the dispatcher's
// boxing of a dozen arguments per call.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace tcsparse_binding {

at::Tensor spmm(const at::Tensor& x, const at::Tensor& values, const at::Tensor& window_offsets,
                const at::Tensor& block_offsets, const at::Tensor& local_ids, const at::Tensor& block_cols,
                const at::Tensor& block_bitmap, const at::Tensor& row_map, const at::Tensor& chunk_offsets,
                int64_t window, int64_t num_rows, int64_t num_cols, int64_t chunk, bool balanced, bool deterministic,
                bool exact);

at::Tensor csr_rows_spmm(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                         const at::Tensor& values, const at::Tensor& piece_slots, const at::Tensor& piece_starts,
                         const at::Tensor& split_rows, int64_t num_cols, int64_t piece_nnz,
                         const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& row_map,
                         const std::optional<at::Tensor>& addend);

at::Tensor grouped_spmm(const at::Tensor& x, const at::Tensor& fragments, const at::Tensor& chunk_starts,
                        const at::Tensor& chunk_group, const at::Tensor& block_cols, const at::Tensor& sub_slots,
                        const at::Tensor& row_map, int64_t num_rows, bool exact, const std::optional<at::Tensor>& bias,
                        bool keep_fp32);

}  // namespace tcsparse_binding
