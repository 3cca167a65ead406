// Launch API of multi-head attention's two sparse products on a CSR (attention.cu): raw pointers
// and a stream, no torch types (attention_binding.cpp wraps them). Features are [rows, heads *
// channels], head h owning the channels [h * channels, (h + 1) * channels) of a row.
//
// - multihead_spmm: Y[i, h, :] = sum over the nonzeros k of row i of W[k, h] * X[col[k], h, :],
//   the weighted sum that attention's softmax weights feed; one weight per edge and head, where
//   an SpMM per head would read the sparse structure once per head and gather rows of `channels`
//   elements only.
// - multihead_sddmm: S[k, h] = <A[row[k], h, :], B[col[k], h, :]>, the gradient of those weights
//   and TransformerConv's scores.
// - multihead_row_sums: O[i, h] = sum over the nonzeros k of row i of V[k, h], GAT's gradient of
//   the per-node source scores when run on the transpose (V read through the edge ids).
//
// Why not the Tensor-Core layout: its blocks hold one value per nonzero, and a value per head
// would multiply the MMAs by the heads for tiles of `channels` columns each. Why not E x heads x
// channels messages, as PyG gathers them: that is the memory and traffic this avoids.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tcsparse {

// The rows of a CSR cut into pieces of at most a fixed number of nonzeros, so that a hub row is
// shared among several groups of lanes. Piece p covers nonzeros [begin[p], begin[p + 1]) of row
// row[p]; an empty row has one empty piece (which writes its zeros). A row of one piece writes Y
// directly (slot[p] = -1); the pieces of a longer row write fp32 partial sums to partial[slot[p]],
// and split row s (Y row split_rows[s]) sums its slots [split_begin[s], split_begin[s + 1]) in
// order: no atomics, the same sums on every run.
struct RowPieces {
    const int32_t* begin;  // [count + 1]
    const int32_t* row;    // [count]
    const int32_t* slot;   // [count]
    int64_t count;
    const int32_t* split_rows;   // [num_split]
    const int32_t* split_begin;  // [num_split + 1]
    int64_t num_split;
};

// T = float, __half or __nv_bfloat16 (W, X, Y all T); products summed in fp32, rounded once to T.
// col [nnz]: the column of each nonzero. edge_ids, when not null, gives the row of W each
// nonzero reads (the transpose's product reads the forward's weights through it); else nonzero
// k reads W[k]. X is contiguous [num_cols, heads * channels], Y contiguous [num_rows, heads *
// channels] (every row written), partial holds the pieces' slots (fp32, slots x heads * channels).
template <typename T>
cudaError_t multihead_spmm(const RowPieces& pieces, const int32_t* col, const int32_t* edge_ids, const T* weights,
                           const T* x, int64_t heads, int64_t channels, T* y, float* partial, cudaStream_t stream);

// S [nnz, heads] for the nonzeros (row[k], col[k]); A and B contiguous [*, heads * channels].
template <typename T>
cudaError_t multihead_sddmm(const int32_t* row, const int32_t* col, int64_t nnz, const T* a, const T* b,
                            int64_t heads, int64_t channels, T* out, cudaStream_t stream);

// O [num_rows, heads] (every row written) from V [nnz, heads], nonzero k reading V[edge_ids[k]]
// (else V[k]); partial: fp32 slots x heads. Sums in fp32, rounded once to T.
template <typename T>
cudaError_t multihead_row_sums(const RowPieces& pieces, const int32_t* edge_ids, const T* values, int64_t heads,
                               T* out, float* partial, cudaStream_t stream);

}  // namespace tcsparse
