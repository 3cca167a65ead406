// Launch API of the ME-TCF kernels: raw pointers and a stream, no torch types, so the kernel
// files compile with nvcc alone and the torch binding (bindings.cpp) stays a thin wrapper.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace tcsparse {

// How fp32 products are formed on the Tensor Cores.
//   kTF32:   one TF32 mma per tile; operands rounded to 10 mantissa bits, so each product has a
//            relative error up to 2^-11 and a dot product of length k has error ~ 2^-11 * sum|a*b|
//            (the same as torch's own TF32 matmul).
//   kTF32x3: a = a_hi + a_lo and x = x_hi + x_lo with hi/lo in TF32; three mma
//            (hi*hi + hi*lo + lo*hi) recover fp32 accuracy: the dropped lo*lo term and the
//            rounding of lo leave a relative error per product of about 2^-21, below fp32's
//            accumulation error for long rows.
enum class Precision : int { kTF32 = 0, kTF32x3 = 1 };

// Device arrays of an ME-TCF layout (see torch_tcsparse/formats/metcf.py).
struct MetcfArrays {
    const int32_t* window_offsets;  // [num_windows + 1]
    const int32_t* block_offsets;   // [num_blocks + 1]
    const uint8_t* local_ids;       // [nnz]: row_in_window * 8 + col_in_block (the SDDMM reads these)
    const int32_t* block_cols;      // [num_blocks * 8]
    const uint32_t* block_bitmap;   // [num_blocks * 4], 16-byte aligned: bit r * 8 + c of a block
    const int32_t* row_map;         // [num_windows * window]
    const int32_t* chunk_offsets;   // [num_windows + 1]
    int64_t num_windows;
    int64_t num_blocks;
    int64_t nnz;
    int window;       // 8 or 16
    int chunk;        // TC blocks per balanced chunk
};

// Y[num_rows, n] = A @ X[num_cols, n]; X and Y row-major with leading dimension n.
// base: one warp per (row window, slice of 32 or 64 columns), each row written once.
cudaError_t metcf_spmm_base_f32(const MetcfArrays& a, const float* values, const float* x, float* y, int64_t n,
                                Precision precision, cudaStream_t stream);

// balanced: a persistent grid in which every warp takes the same number of chunks (of
// `chunk` TC blocks each, never straddling windows). Without a workspace, windows cut between
// warps are combined with atomics into rows the same call zeroes first; with one
// (deterministic), every chunk of a multi-chunk window writes its tile to the workspace and a
// second kernel sums them in chunk order. metcf_balanced_workspace_floats gives the size needed.
cudaError_t metcf_spmm_balanced_f32(const MetcfArrays& a, const float* values, const float* x, float* y, int64_t n,
                                    Precision precision, float* workspace, cudaStream_t stream);

// Launch shape of the SpMM kernel that runs at this n (for the selector's scheduling model):
// warps resident per SM, and warps per row window (or chunk) along n.
cudaError_t metcf_spmm_launch_shape(int window, int64_t n, bool balanced, Precision precision, int* resident,
                                    int64_t* slices);

// Floats of workspace the deterministic balanced kernel needs: an upper bound on the number of
// chunks (every window adds at most one partial chunk) times window * n.
int64_t metcf_balanced_workspace_floats(const MetcfArrays& a, int64_t n);

// out[p] = <grad_y[row(p)], x[col(p)]> for every nonzero p in block order (the gradient of the
// values of Y = A @ X).
cudaError_t metcf_sddmm_f32(const MetcfArrays& a, const float* grad_y, const float* x, float* out, int64_t n,
                            cudaStream_t stream);

}  // namespace tcsparse
