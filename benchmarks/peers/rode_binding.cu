// A binding of RoDe's float32 SpMM kernels (RoDe_SpMM/RoDeSpmm.cu of its repository, compiled
// from the local clone: benchmarks/peers/rode.py puts its folders on the include path). Its own
// launcher starts both kernels unconditionally; a matrix whose rows are all shorter than one
// 32-nonzero block has no segment, and a grid of zero blocks is a launch error, so each kernel
// is launched here only when it has work, with the configuration of RoDe's entry points.
#include <cstdint>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
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

// y += A x over the rows' segments (first stream) and residues (second stream); y must hold zeros
// (or the sum to add to): RoDe accumulates with atomics.
void spmm(const torch::Tensor& values, const torch::Tensor& columns, const torch::Tensor& row_offsets,
          const torch::Tensor& segment_rows, const torch::Tensor& residue_rows,
          const torch::Tensor& segment_starts, const torch::Tensor& x, torch::Tensor& y) {
    check(values, "values", torch::kFloat32);
    check(x, "x", torch::kFloat32);
    check(y, "y", torch::kFloat32);
    for (const auto* t : {&columns, &row_offsets, &segment_rows, &residue_rows, &segment_starts}) {
        check(*t, "index arrays", torch::kInt32);
    }
    const int n = static_cast<int>(x.size(1));
    TORCH_CHECK(n == 32 || n % 64 == 0, "RoDe's kernels take N = 32 or a multiple of 64, got ", n);
    TORCH_CHECK(segment_starts.numel() == segment_rows.numel() + 1, "segment_starts must hold one more entry than segment_rows");
    const c10::cuda::CUDAGuard guard(x.device());
    const at::cuda::CUDAStream first = at::cuda::getCurrentCUDAStream();
    const at::cuda::CUDAStream second = at::cuda::getStreamFromPool();
    // The second stream starts after what the caller queued (the zeroing of y) and the caller's
    // stream resumes after both kernels.
    at::cuda::CUDAEvent ready, done;
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
}
