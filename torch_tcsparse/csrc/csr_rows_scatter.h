// Launch API of dX = A^T dY summed from the "rows" SpMM's own operands (csr_rows_spmm.h's
// CsrRows, its values in the kernel's order), without the transpose: raw pointers and a stream,
// no torch types (csr_rows_binding.cpp wraps it).
//
// Why a scatter next to the product by the transpose: building the transpose's CSR and its
// split costs a few dozen small torch ops, milliseconds of host time, where a matrix multiplied
// once forward and once backward (a sampled mini-batch's block) runs a fraction of that on the
// GPU. The scatter reads the forward's arrays as they are; its sums meet in fp32 atomics, so
// their order (and last bits) change from call to call (product.py decides when it runs).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "csr_rows_spmm.h"

namespace tcsparse {

// grad_x[num_cols, n] += A^T grad_y for T = float, __half or __nv_bfloat16 (values and grad_y
// T): for every nonzero (i, j, a) of `a`, grad_x[j] += a * grad_y[row_map[i]] in fp32 atomics.
// Rows up to a.piece_nnz long are scattered whole, longer ones by their pieces (padding skipped),
// each loading its row of grad_y once. grad_y rows have stride ldg; grad_x is fp32 with row
// stride n, zeroed by the caller.
template <typename T>
cudaError_t csr_rows_scatter(const CsrRows& a, const T* values, const T* grad_y, int64_t ldg, float* grad_x,
                             int64_t n, cudaStream_t stream);

}  // namespace tcsparse
