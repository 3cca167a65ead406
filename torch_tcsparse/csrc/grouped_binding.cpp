// Torch binding of the grouped Tensor-Core SpMM (grouped_spmm.h): validation, allocation, stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "binding_checks.h"
#include "kernel_bindings.h"
#include "grouped_spmm.h"

namespace {

using tcsparse_binding::check_index;
using tcsparse_binding::check_launch;
using tcsparse_binding::with_element_type;

tcsparse::Precision precision_of(bool exact) {
    return exact ? tcsparse::Precision::kTF32x3 : tcsparse::Precision::kTF32;
}

}  // namespace

namespace tcsparse_binding {

// Y = A @ x (+ bias on every row) for the grouped layout (torch_tcsparse/formats/grouped.py) and
// its fragments (x's dtype, fragment_values); Y has x's dtype, or float32 with keep_fp32 (the sums
// a second kernel adds to before one rounding). The layout's contents are not checked here (that
// would cost a host sync per call): callers pass a TCSparseTensor's, built from a validated CSR.
at::Tensor grouped_spmm(const at::Tensor& x, const at::Tensor& fragments, const at::Tensor& chunk_starts,
                        const at::Tensor& chunk_group, const at::Tensor& block_cols, const at::Tensor& sub_slots,
                        const at::Tensor& row_map, int64_t num_rows, bool exact, const std::optional<at::Tensor>& bias,
                        bool keep_fp32) {
    TCS_CHECK(fragments.is_cuda(), "fragments must be a CUDA tensor, got device ", fragments.device());
    const at::Device device = fragments.device();
    TCS_CHECK(fragments.dim() == 1 && fragments.is_contiguous() && fragments.numel() % tcsparse::kFragmentEntries == 0,
              "fragments must be 1-D and contiguous with a multiple of ", int64_t{tcsparse::kFragmentEntries},
              " entries, got shape ", fragments.sizes());
    TCS_CHECK(num_rows >= 0, "num_rows must be non-negative, got ", num_rows);
    TCS_CHECK(chunk_starts.dim() == 1 && chunk_starts.numel() >= 1, "chunk_starts must be 1-D and non-empty");
    TCS_CHECK(block_cols.dim() == 1 && block_cols.numel() % 8 == 0, "block_cols must be 1-D with a multiple of 8 "
              "entries, got shape ", block_cols.sizes());
    const int64_t num_chunks = chunk_starts.numel() - 1, num_blocks = block_cols.numel() / 8;
    const int64_t num_groups = (num_rows + tcsparse::kGroupRows - 1) / tcsparse::kGroupRows;
    check_index(chunk_starts, "chunk_starts", at::kInt, num_chunks + 1, device);
    check_index(chunk_group, "chunk_group", at::kInt, num_chunks, device);
    check_index(block_cols, "block_cols", at::kInt, num_blocks * 8, device);
    check_index(sub_slots, "sub_slots", at::kInt, num_blocks * tcsparse::kGroupWindows, device);
    check_index(row_map, "row_map", at::kInt, num_groups * tcsparse::kGroupRows, device);
    TCS_CHECK(x.device() == device, "x is on ", x.device(), " but the fragments are on ", device);
    TCS_CHECK(x.dim() == 2, "x must be 2-D, got shape ", x.sizes());
    const at::ScalarType dtype = x.scalar_type();
    TCS_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "x must be float32, float16 or bfloat16, got ", dtype);
    TCS_CHECK(fragments.scalar_type() == dtype, "fragments must have x's dtype ", dtype, ", got ",
              fragments.scalar_type());
    TCS_CHECK(!exact || dtype == at::kFloat, "the exact (3xTF32) product takes float32 x, got ", dtype);
    const at::Tensor xc = x.contiguous();
    const int64_t n = xc.size(1);
    if (bias.has_value()) {
        TCS_CHECK(bias->device() == device && bias->scalar_type() == dtype, "bias must be ", dtype, " on ", device,
                  ", got ", bias->scalar_type(), " on ", bias->device());
        TCS_CHECK(bias->dim() == 1 && bias->numel() == n, "bias must be 1-D with ", n, " entries, got shape ",
                  bias->sizes());
    }
    const c10::cuda::CUDAGuard guard(device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const bool rounded = dtype != at::kFloat && !keep_fp32;
    // The kernel copies fragment slots in 16-byte pieces.
    const at::Tensor fragments16 =
        reinterpret_cast<uintptr_t>(fragments.data_ptr()) % 16 ? fragments.clone() : fragments;
    const tcsparse::GroupedArrays a{chunk_starts.data_ptr<int32_t>(), chunk_group.data_ptr<int32_t>(),
                                    block_cols.data_ptr<int32_t>(), sub_slots.data_ptr<int32_t>(),
                                    row_map.data_ptr<int32_t>(), num_chunks};
    // Where every group is one chunk (the layout gives each group at least one), a 16-bit Y is
    // written by the kernel alone, bias included (grouped_spmm.h). Elsewhere the kernel adds every
    // chunk's sums atomically into fp32 rows, so they start from zero (or from the bias): Y itself
    // when it is fp32, else a scratch rounded into Y at the end. A memset and the rounding kernel
    // launched here, not at::zeros and Tensor::to: on small graphs (ogbl-ddi) the host time of
    // those two torch ops was more than the kernel's own.
    const bool direct = rounded && num_chunks == num_groups;
    at::Tensor sums, direct_bias;
    if (direct) {
        if (bias.has_value()) direct_bias = bias->contiguous();
    } else if (bias.has_value()) {
        sums = bias->to(at::kFloat).expand({num_rows, n}).contiguous();
    } else {
        sums = at::empty({num_rows, n}, xc.options().dtype(at::kFloat));
        check_launch(cudaMemsetAsync(sums.data_ptr(), 0, sums.numel() * sizeof(float), stream), "grouped_spmm");
    }
    at::Tensor y = rounded ? at::empty({num_rows, n}, xc.options()) : sums;
    // No group (an empty matrix) or no column: nothing to launch, Y is empty.
    if (num_chunks == 0 || n == 0) return y;
    with_element_type(dtype, [&](auto element) {
        using T = decltype(element);
        check_launch(tcsparse::grouped_spmm<T>(
                         a, reinterpret_cast<const T*>(fragments16.const_data_ptr()),
                         reinterpret_cast<const T*>(xc.const_data_ptr()), direct ? nullptr : sums.data_ptr<float>(),
                         rounded ? static_cast<T*>(y.data_ptr()) : nullptr,
                         direct_bias.defined() ? static_cast<const T*>(direct_bias.const_data_ptr()) : nullptr,
                         num_rows, n, precision_of(exact), stream),
                     "grouped_spmm");
    });
    return y;
}

}  // namespace tcsparse_binding
