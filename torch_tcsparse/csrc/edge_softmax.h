// Launch API of attention's softmax over each row of a CSR with the edges' scores formed inside
// the kernel from per-node arrays (edge_softmax.cu): raw pointers and a stream, no torch types
// (attention_binding.cpp wraps them). Nothing of size edges x heads is read besides what the
// softmax itself needs: the scores are never stored.
//
// Rows are cut into pieces (RowPieces, attention.h) of at most 64 edges, one thread per
// (piece, head): a hub row is shared among many threads, and a split row's partial results are
// merged in order by one thread per (split row, head), so no atomics and the same result on
// every run. The forward's pieces keep (max, sum of exp) as an online softmax does; the
// backward's keep sum(alpha * g) and then the row sums of the score gradients.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "attention.h"

namespace tcsparse {

// GAT: e[k, h] = leaky_relu(src[col[k], h] + dst[row, h]), dst null for no target term.
// src [num_cols, heads], dst [num_rows, heads].
template <typename T>
struct GatScores {
    const T* src;
    const T* dst;
    float negative_slope;
};

// Dot-product attention: e[k, h] = scale * <query[row, h, :], key[col[k], h, :]>, query
// [num_rows, heads, channels] and key [num_cols, heads, channels] contiguous.
template <typename T>
struct DotScores {
    const T* query;
    const T* key;
    int64_t channels;
    float scale;
};

// alpha [nnz, heads]: alpha[k, h] = exp(e[k, h] - max_row) / (sum_row exp(e - max_row) + 1e-16),
// PyG's softmax, in fp32 and rounded once to T. slots: fp32 scratch of 2 * num_slots * heads.
template <typename T, typename Scores>
cudaError_t edge_softmax(const RowPieces& pieces, const int32_t* col, const Scores& scores, int64_t heads, T* alpha,
                         float* slots, cudaStream_t stream);

// The gradient of the scores before their last step (GAT: the leaky_relu's input, whose slope
// is 1 or negative_slope by the sign of e; dot: the dot product, slope `scale`):
// grad_score[k, h] = alpha * (g - sum_row(alpha * g)) * slope. grad_dst (GAT only, may be null):
// its row sums [num_rows, heads]. slots as the forward's.
template <typename T, typename Scores>
cudaError_t edge_softmax_backward(const RowPieces& pieces, const int32_t* col, const Scores& scores, int64_t heads,
                                  const T* alpha, const T* grad_alpha, T* grad_score, T* grad_dst, float* slots,
                                  cudaStream_t stream);

}  // namespace tcsparse
