// A binding of RoDe's float32 SpMM kernels (RoDe_SpMM/RoDeSpmm.cu of its repository, compiled
// from the local clone: benchmarks/peers/rode.py puts its folders on the include path). Its own
// launcher starts both kernels unconditionally; a matrix whose rows are all shorter than one
// 32-nonzero block has no segment, and a grid of zero blocks is a launch error, so each kernel
// is launched here only when it has work, with the configuration of RoDe's entry points.
#include <cstdint>
#include <limits>
#include <string>

// c10's stream and event headers rather than ATen's CUDA context, which pulls in the cuBLAS and
// cuSPARSE headers: the binding builds with the CUDA runtime's headers alone.
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "RoDeSpmm.cu"

namespace {

// RoDeSpmm_n32 and RoDeSpmm_n128 (float): 4 rows of 8 threads per block, 32 nonzeros per step,
// 4-wide residue unroll, and 32 or 64 output columns per block.
constexpr int kRows = 4;
constexpr int kStep = 32;
constexpr int kWidth = 8;
constexpr int kUnroll = 4;
constexpr int kStages = 8;

template <int kColumns>
void launch(int segments, int residues, int k, int n, const float* values, const int* columns,
            const int* row_offsets, const int* segment_rows, const int* residue_rows,
            const int* segment_starts, const float* x, float* y, cudaStream_t first, cudaStream_t second) {
    const dim3 block(kWidth, kRows, 1);
    if (segments > 0) {
        const dim3 grid((segments + kRows - 1) / kRows, (n + kColumns - 1) / kColumns, 1);
        RoDeComputeKernel1<float, float4, float4, kRows, kStep, kColumns, kWidth, kUnroll, kStages>
            <<<grid, block, 0, first>>>(segments, k, n, values, columns, row_offsets, segment_rows,
                                        segment_starts, x, y);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (residues > 0) {
        const dim3 grid((residues + kRows - 1) / kRows, (n + kColumns - 1) / kColumns, 1);
        RoDeComputeKernel2<float, float4, float4, kRows, kStep, kColumns, kWidth, kUnroll, kStages>
            <<<grid, block, 0, second>>>(residues, k, n, values, columns, row_offsets, residue_rows, x, y);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
}

void check(const torch::Tensor& t, const char* name, torch::ScalarType dtype) {
    TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.scalar_type() == dtype, name,
                " must be a contiguous CUDA tensor of ", dtype, ", got ", t.scalar_type());
}

// RoDe's kernels address a row of X by its byte offset and a row of Y by its element offset, both
// in 32-bit ints (the offset argument of its OffsetCast is an int): past them the offsets wrap,
// and the kernels read before X (wrong sums, or an illegal address) and write before Y. The range
// a product must stay in: why not, or an empty string.
std::string out_of_range(int64_t x_rows, int64_t y_rows, int64_t n) {
    constexpr int64_t kLimit = std::numeric_limits<int32_t>::max();
    if ((x_rows - 1) * n * static_cast<int64_t>(sizeof(float)) > kLimit) {
        return "X of " + std::to_string(x_rows) + " x " + std::to_string(n) +
               " floats is past RoDe's 32-bit byte offsets into X (2 GiB)";
    }
    if (y_rows * n > kLimit) {
        return "Y of " + std::to_string(y_rows) + " x " + std::to_string(n) +
               " floats is past RoDe's 32-bit element offsets into Y";
    }
    return "";
}

// y += A x over the rows' segments (first stream) and residues (second stream); y must hold zeros
// (or the sum to add to): RoDe accumulates with atomics. A product past RoDe's offsets is refused
// unless past_range asks for it (to show what RoDe itself returns there).
void spmm(const torch::Tensor& values, const torch::Tensor& columns, const torch::Tensor& row_offsets,
          const torch::Tensor& segment_rows, const torch::Tensor& residue_rows,
          const torch::Tensor& segment_starts, const torch::Tensor& x, torch::Tensor& y, bool past_range) {
    check(values, "values", torch::kFloat32);
    check(x, "x", torch::kFloat32);
    check(y, "y", torch::kFloat32);
    for (const auto* t : {&columns, &row_offsets, &segment_rows, &residue_rows, &segment_starts}) {
        check(*t, "index arrays", torch::kInt32);
    }
    TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && y.size(0) == row_offsets.numel() - 1 && y.size(1) == x.size(1),
                "y must be a matrix of the CSR's rows and x's columns");
    const int n = static_cast<int>(x.size(1));
    TORCH_CHECK(n == 32 || n % 64 == 0, "RoDe's kernels take N = 32 or a multiple of 64, got ", n);
    TORCH_CHECK(segment_starts.numel() == segment_rows.numel() + 1, "segment_starts must hold one more entry than segment_rows");
    const std::string range = out_of_range(x.size(0), y.size(0), n);
    TORCH_CHECK(past_range || range.empty(), range);
    const c10::cuda::CUDAGuard guard(x.device());
    const c10::cuda::CUDAStream first = c10::cuda::getCurrentCUDAStream();
    const c10::cuda::CUDAStream second = c10::cuda::getStreamFromPool();
    // The second stream starts after what the caller queued (the zeroing of y) and the caller's
    // stream resumes after both kernels.
    c10::cuda::CUDAEvent ready, done;
    ready.record(first);
    ready.block(second);
    const auto run = n == 32 ? launch<32> : launch<64>;
    run(static_cast<int>(segment_rows.numel()), static_cast<int>(residue_rows.numel()), static_cast<int>(x.size(0)), n,
        values.data_ptr<float>(), columns.data_ptr<int>(), row_offsets.data_ptr<int>(), segment_rows.data_ptr<int>(),
        residue_rows.data_ptr<int>(), segment_starts.data_ptr<int>(), x.data_ptr<float>(), y.data_ptr<float>(),
        first.stream(), second.stream());
    done.record(second);
    done.block(first);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("spmm", &spmm, "RoDe's float32 SpMM, accumulating into y");
    m.def("out_of_range", &out_of_range, "why a product of these sizes is past RoDe's offsets, or an empty string");
}
