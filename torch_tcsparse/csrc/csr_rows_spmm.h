// Launch API of the CUDA-core CSR SpMM ("rows" path): raw pointers and a stream, no torch types
// (csr_rows_binding.cpp wraps it).
//
// Why a CUDA-core kernel next to the Tensor-Core ones: on graphs whose 16-row windows share few
// columns (R-MAT, uniform random) a 16 x 8 TC block holds a few nonzeros, so the MMA multiplies
// mostly zeros, while each nonzero's row of X has to be gathered anyway. A warp per row that keeps
// many 16-byte gathers in flight is bound only by those gathers; cuSPARSE's CSR kernel keeps
// fewer in flight at N <= 128 (measured on an H200: 1.2-3x slower on R-MAT, uniform and SBM).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace tcsparse {

// A canonical CSR (int32 indices, float32 values) split into pieces of at most `piece_nnz`
// nonzeros: piece r (r < num_rows) is the start of row r; the pieces past the first of each
// longer row are listed in (piece_rows, piece_starts). Rows longer than `piece_nnz` (split_rows)
// are summed with atomics into an output that is first set to the bias (or zero); every other
// row is written once. A power-law hub thus costs many short pieces, not one long warp.
struct CsrRows {
    const int32_t* rowptr;        // [num_rows + 1]
    const int32_t* col;           // [nnz]
    const float* values;          // [nnz]
    const int32_t* piece_rows;    // [num_pieces]
    const int32_t* piece_starts;  // [num_pieces]
    const int32_t* split_rows;    // [num_split_rows]
    int64_t num_rows;
    int64_t num_pieces;
    int64_t num_split_rows;
    int piece_nnz;
};

// Y[num_rows, n] = A @ X (+ bias on every row when bias is not null), all float32 and summed in
// fp32 with ordinary FMAs (no TF32 rounding). X rows have stride ldx, Y rows ldy (>= n).
cudaError_t csr_rows_spmm(const CsrRows& a, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n,
                          const float* bias, cudaStream_t stream);

}  // namespace tcsparse
