// Launch API of the max/min SpMM (reduce="max"/"min") and its backward: raw pointers and a
// stream, no torch types (reduce_rows_binding.cpp wraps them).
//
// Y[i, c] = max (min) over the nonzeros k of row i of values[k] * X[col[k], c], and winners[i, c]
// = that k (the first one on a tie; a NaN product beats every number, the first NaN wins). An
// empty row gives Y = 0 and winner -1. The winners are what the backward sends the gradient to.
//
// Why not the Tensor-Core layout: an extreme is no sum, the MMA cannot form it. Rows longer than
// 2 * kPieceNnz nonzeros are reduced in pieces by groups of their own, whose extremes and winners
// a second launch merges in order, so that a hub row does not hold the launch's last warps; the
// merge keeps the rule's first winner, so the result and the winners are the unsplit walk's.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tcsparse {

// Nonzeros per chunk of the pieces of long rows (B; docs/DECISIONS.md gives the reason): a row
// of more than 2 B nonzeros is split, every piece holds at most 2 B - 1.
constexpr int64_t kPieceNnz = 128;

// Chunks of kPieceNnz nonzeros of a matrix of nnz nonzeros, none where no row can be long.
inline int64_t reduce_rows_partials(int64_t nnz) {
    return nnz > 2 * kPieceNnz ? (nnz + kPieceNnz - 1) / kPieceNnz : 0;
}

// T = float, __half or __nv_bfloat16 (values, X and Y all T). rowptr [num_rows + 1] and col
// [nnz]: a CSR with int32 indices (any order of columns within a row: ties go to the lower k).
// X rows have stride ldx (columns contiguous); Y and winners are contiguous [num_rows, n].
// num_chunks: reduce_rows_partials(nnz) to cut long rows into pieces, 0 to walk every row whole
// (for a matrix known to have no long row); partial_best and partial_win are scratch of
// num_chunks x n, first_of of num_chunks.
// Products are formed in fp32 (exact for 16-bit operands), compared in fp32 (the pieces' partials
// too) and the extreme rounded once to T.
template <typename T>
cudaError_t reduce_rows(const int32_t* rowptr, const int32_t* col, int64_t num_rows, int64_t num_chunks,
                        const T* values, const T* x, int64_t ldx, int64_t n, bool is_max, float* partial_best,
                        int32_t* partial_win, int32_t* first_of, T* y, int32_t* winners, cudaStream_t stream);

// The backward (reduce_rows_backward.cu): for every output (i, c) with winner k = winners[i, c] >= 0,
// grad_x[col[k], c] += values[k] * grad_y[i, c] and grad_values[k] += X[col[k], c] * grad_y[i, c],
// in fp32 by atomics (the order of the adds is not fixed). grad_y and winners are contiguous
// [num_rows, n]; X rows have stride ldx; grad_x [num_cols, n] and grad_values [nnz] are fp32,
// zeroed by the caller, 16-byte aligned, either may be null (not wanted). vector_rows: grad_y and
// winners start 16-byte aligned, so rows of a multiple of 4 elements are read 4 at a time.
template <typename T>
cudaError_t reduce_rows_backward(const T* grad_y, const int32_t* winners, const int32_t* col, const T* values,
                                 const T* x, int64_t ldx, int64_t num_rows, int64_t n, bool vector_rows,
                                 float* grad_x, float* grad_values, cudaStream_t stream);

}  // namespace tcsparse
