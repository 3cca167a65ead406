// Launch API of the CUDA-core CSR SpMM ("rows" path): raw pointers and a stream, no torch types
// (csr_rows_binding.cpp wraps it).
//
// Why a CUDA-core kernel next to the Tensor-Core ones: on graphs whose 16-row windows share few
// columns (R-MAT, uniform random) a 16 x 8 TC block holds a few nonzeros, so the MMA multiplies
// mostly zeros, while each nonzero's row of X has to be gathered anyway. A kernel whose every
// lane keeps several 16-byte gathers in flight, whatever the row lengths and N, is bound only by
// those gathers (csr_rows_spmm.cu: how rows are packed into warps at small N).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tcsparse {

// The pattern of a canonical CSR (int32 indices) split into pieces of at most `piece_nnz`
// nonzeros. Rows up to `piece_nnz` long are one piece each, summed by the warp that takes their
// group of consecutive rows; the rows longer than that (split_rows, ascending) are cut into the
// listed pieces (piece_slots: the piece's index into split_rows; piece_starts: its first
// nonzero), a warp each, and their pieces are summed with fp32 atomics. A power-law hub thus
// costs many short pieces, not one long warp. With `piece_nnz` = INT32_MAX no row is split and
// every output is one warp's sum in an order fixed by the matrix and the launch: bitwise the
// same from call to call.
//
// The arrays may end in padding, where their sizes are bounds set on the host without reading
// the counts back (csr_rows.padded_row_pieces): a piece with a negative start and a negative
// split row are skipped. The padding follows every real piece, so its warps form a tail of the
// pieces' warps that exits at once.
//
// `row_map` (null: the identity) is the row of Y that each CSR row is written to. A reordered
// matrix passes its rows in the reordering's order with their original column ids: rows that
// share columns then run side by side and find their rows of X still in L2, while X and Y stay in
// the user's order.
struct CsrRows {
    const int32_t* rowptr;        // [num_rows + 1]
    const int32_t* col;           // [nnz]
    const int32_t* row_map;       // [num_rows] or null
    const int32_t* piece_slots;   // [num_pieces]
    const int32_t* piece_starts;  // [num_pieces]
    const int32_t* split_rows;    // [num_split_rows]
    int64_t num_rows;
    int64_t num_pieces;
    int64_t num_split_rows;
    int64_t nnz;  // col's entries: with num_rows, the mean row length a launch's warp shape follows
    int piece_nnz;
};

// Where the pieces of the split rows meet: each adds its fp32 sums to its row's `sums`. In a small
// launch (pieces x N up to 2^18) each piece then counts itself in `arrivals` (per split row and
// column tile), and the piece that counts last rounds the sums into Y and sets both back to zero:
// the product is one launch, where the host's time per launch is what counts. A larger launch
// rounds the sums in a second kernel, which zeroes them too. Either way no memset: a caller keeps
// one zeroed SplitSums per stream and hands it to every call on that stream: a scratch, a memset
// and a finishing launch per call would double the host time of a small product.
struct SplitSums {
    float* sums;        // [num_split_rows, n]: zero on entry, zero on return
    int32_t* arrivals;  // [num_split_rows, csr_rows_max_tiles(n)]: zero on entry, zero on return
};

// The most column tiles (grid.y) any launch of csr_rows_spmm takes for N = n.
int64_t csr_rows_max_tiles(int64_t n);

// Y[num_rows, n] = A @ X (+ bias on every row when bias is not null) for T = float, __half or
// __nv_bfloat16 (values, X, Y and bias all T), every product summed in fp32 with ordinary FMAs (no
// TF32 rounding; outputs rounded once). X rows have stride ldx, Y rows ldy (>= n). `split` may
// be null pointers when no row is split.
// `addend` (null: none) is an fp32 [Y rows, n] matrix (row stride n) added to every row of Y
// before its one rounding: the sums of another kernel over the same Y, such as the grouped
// kernel's over a matrix's dense part while this one runs its sparse rest. It must not alias Y.
template <typename T>
cudaError_t csr_rows_spmm(const CsrRows& a, const T* values, const T* x, int64_t ldx, T* y, int64_t ldy, int64_t n,
                          const T* bias, const float* addend, const SplitSums& split, cudaStream_t stream);

}  // namespace tcsparse
