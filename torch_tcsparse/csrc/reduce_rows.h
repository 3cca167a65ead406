// Launch API of the max/min SpMM (reduce="max"/"min"): raw pointers and a stream, no torch types
// (reduce_rows_binding.cpp wraps it).
//
// Y[i, c] = max (min) over the nonzeros k of row i of values[k] * X[col[k], c], and winners[i, c]
// = that k (the first one on a tie; a NaN product beats every number, the first NaN wins). An
// empty row gives Y = 0 and winner -1. The winners are what the backward sends the gradient to.
//
// Why not the Tensor-Core layout: an extreme is no sum, the MMA cannot form it. Why not split
// long rows as the sum kernel does: pieces of one row would have to merge a value and an index
// atomically; a group of lanes per row keeps the result exact and the winners deterministic, and
// a hub row costs one group's walk over it.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tcsparse {

// T = float, __half or __nv_bfloat16 (values, X and Y all T). rowptr [num_rows + 1] and col
// [nnz]: a CSR with int32 indices (any order of columns within a row: ties go to the lower k).
// X rows have stride ldx (columns contiguous); Y and winners are contiguous [num_rows, n].
// Products are formed in fp32 (exact for 16-bit operands) and the extreme rounded once to T.
template <typename T>
cudaError_t reduce_rows(const int32_t* rowptr, const int32_t* col, int64_t num_rows, const T* values, const T* x,
                        int64_t ldx, int64_t n, bool is_max, T* y, int32_t* winners, cudaStream_t stream);

}  // namespace tcsparse
