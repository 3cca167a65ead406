// Launch API of the ME-TCF kernels: raw pointers and a stream, no torch types, so the kernel
// files compile with nvcc alone and the torch binding (bindings.cpp) stays a thin wrapper.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
    const int32_t* chunk_row_starts;  // [chunks * window]: CSR position of each window row's first
                                      // entry in the chunk's blocks (int32: nnz fits block_offsets)
    int64_t num_windows;
    int64_t num_blocks;
    int64_t nnz;
    int window;       // 8 or 16
    int chunk;        // TC blocks per balanced chunk
};

// The kernels are templates over T, the element type of X, Y and the A values: float (TF32
// Tensor Cores), __half or __nv_bfloat16 (16-bit Tensor Cores); every product is accumulated in
// fp32. The values are the matrix's own, in canonical CSR order (columns ascending inside a row),
// read in place: any 2-byte aligned pointer for 16-bit T, 4-byte aligned for float.
// kernels_<type>.cu instantiate them.

// Y[num_rows, n] = A @ X[num_cols, n]; X and Y row-major with leading dimension n.
// base: one warp per (row window, slice of columns), each row written once.
template <typename T>
cudaError_t metcf_spmm_base(const MetcfArrays& a, const T* values, const T* x, T* y, int64_t n,
                            Precision precision, cudaStream_t stream);

// balanced: a persistent grid in which every warp takes the same number of chunks (of
// `chunk` TC blocks each, never straddling windows). Without a workspace, windows cut between
// warps are combined with atomics in fp32: into `partial` (float [num_rows, n]; for float Y it
// may be y itself), which the same call zeroes first and, when it is not y, rounds into y last.
// With a workspace (deterministic), every chunk of a multi-chunk window writes its fp32 tile to
// it and a second kernel sums them in chunk order; metcf_balanced_workspace_floats gives its size.
template <typename T>
cudaError_t metcf_spmm_balanced(const MetcfArrays& a, const T* values, const T* x, T* y, int64_t n,
                                Precision precision, float* partial, float* workspace, cudaStream_t stream);

// Launch shape of the SpMM kernel that runs at this n on a matrix of num_windows row windows (for
// the selector's scheduling model): warps resident per SM, and warps per window (or chunk) along n.
template <typename T>
cudaError_t metcf_spmm_launch_shape(int window, int64_t num_windows, int64_t n, bool balanced, Precision precision,
                                    int* resident, int64_t* slices);

// Upper bound on the balanced chunks: every window adds at most one partial chunk (no host read
// of chunk_offsets needed).
inline int64_t metcf_chunk_bound(const MetcfArrays& a) {
    return a.num_windows + a.num_blocks / (a.chunk > 1 ? a.chunk : 1) + 1;
}

// Floats of workspace the deterministic balanced kernel needs: one window tile per chunk.
inline int64_t metcf_balanced_workspace_floats(const MetcfArrays& a, int64_t n) {
    return metcf_chunk_bound(a) * a.window * n;
}

// out[p] = <grad_y[row(p)], x[col(p)]> (fp32 sum) for every nonzero p in block order (the
// gradient of the values of Y = A @ X).
template <typename T>
cudaError_t metcf_sddmm(const MetcfArrays& a, const T* grad_y, const T* x, float* out, int64_t n,
                        cudaStream_t stream);

}  // namespace tcsparse
