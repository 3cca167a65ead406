// Multi-head attention's sparse products (attention.h).
//
// multihead_spmm: a group of L lanes per row piece, each lane owning CH features of the row
// (feature lane + c * L of the block's tile, so that the group's loads of one X row are
// contiguous), and the head of each feature fixed for the lane. A lane walks the piece's
// nonzeros in order with U nonzeros' loads in flight, then writes Y (or its slot) once. L is the
// fewest lanes whose features cover heads * channels (8 lanes for up to 8 features); wider rows
// run in tiles along grid.y. A second kernel sums the slots of the split rows.
//
// multihead_sddmm: one thread per (nonzero, head), a dot product over the head's channels, element
// by element (16-byte copies are not yet checked on a GPU); consecutive threads take consecutive
// heads of a nonzero, so a warp reads whole rows of A and B and writes S contiguously.
//
// multihead_row_sums: one thread per (piece, head), the heads of a piece on consecutive threads,
// split rows merged by multihead_spmm's merge (features = heads).
#include "attention.h"

#include "elements.cuh"

namespace tcsparse {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kLoadsInFlight = 4;  // U

template <typename T>
__device__ __forceinline__ float as_float(T v) {
    return Element<T>::to_float(v);
}

template <typename T, int L, int CH>
__global__ void __launch_bounds__(kThreadsPerBlock)
    multihead_spmm_kernel(RowPieces pieces, const int32_t* __restrict__ col, const int32_t* __restrict__ edge_ids,
                          const T* __restrict__ weights, const T* __restrict__ x, int64_t heads, int64_t channels,
                          T* __restrict__ y, float* __restrict__ partial) {
    constexpr int U = kLoadsInFlight;
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t piece = thread / L;
    if (piece >= pieces.count) return;
    const int lane = static_cast<int>(thread % L);
    const int64_t features = heads * channels;
    const int64_t feature0 = static_cast<int64_t>(blockIdx.y) * (L * CH);
    int64_t feature[CH], head[CH];
    bool active[CH];
    float acc[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        feature[c] = feature0 + lane + c * L;
        active[c] = feature[c] < features;
        head[c] = active[c] ? feature[c] / channels : 0;
        acc[c] = 0.f;
    }
    // 64-bit positions: k + U must not wrap near 2^31 nonzeros.
    const int64_t begin = pieces.begin[piece], end = pieces.begin[piece + 1];
    for (int64_t k = begin; k < end; k += U) {
        int64_t cols[U], ids[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool in_piece = k + u < end;
            cols[u] = in_piece ? col[k + u] : -1;
            ids[u] = !in_piece ? 0 : edge_ids != nullptr ? edge_ids[k + u] : k + u;
        }
        float w[U][CH], xs[U][CH];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const bool load = cols[u] >= 0 && active[c];
                w[u][c] = load ? as_float(weights[ids[u] * heads + head[c]]) : 0.f;
                xs[u][c] = load ? as_float(x[cols[u] * features + feature[c]]) : 0.f;
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (cols[u] < 0) break;
#pragma unroll
            for (int c = 0; c < CH; ++c) acc[c] += w[u][c] * xs[u][c];
        }
    }
    const int64_t slot = pieces.slot[piece];
    const int64_t row = pieces.row[piece];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        if (!active[c]) continue;
        if (slot < 0) {
            y[row * features + feature[c]] = Element<T>::from_float(acc[c]);
        } else {
            partial[slot * features + feature[c]] = acc[c];
        }
    }
}

// One thread per (split row, feature): the row's slots summed in order.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    merge_slots_kernel(RowPieces pieces, const float* __restrict__ partial, int64_t features, T* __restrict__ y) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t split = thread / features;
    if (split >= pieces.num_split) return;
    const int64_t feature = thread % features;
    float sum = 0.f;
    for (int64_t slot = pieces.split_begin[split]; slot < pieces.split_begin[split + 1]; ++slot) {
        sum += partial[slot * features + feature];
    }
    y[static_cast<int64_t>(pieces.split_rows[split]) * features + feature] = Element<T>::from_float(sum);
}

template <typename T, int L, int CH>
cudaError_t launch_spmm(const RowPieces& pieces, const int32_t* col, const int32_t* edge_ids, const T* weights,
                        const T* x, int64_t heads, int64_t channels, T* y, float* partial, cudaStream_t stream) {
    constexpr int tile = L * CH;
    const int64_t features = heads * channels;
    const int64_t tiles = (features + tile - 1) / tile;
    const int64_t blocks = (pieces.count * L + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (tiles > 65535 || blocks > INT32_MAX) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles));
    multihead_spmm_kernel<T, L, CH>
        <<<grid, kThreadsPerBlock, 0, stream>>>(pieces, col, edge_ids, weights, x, heads, channels, y, partial);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || pieces.num_split == 0) return err;
    const int64_t merge_blocks = (pieces.num_split * features + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (merge_blocks > INT32_MAX) return cudaErrorInvalidValue;
    merge_slots_kernel<T><<<static_cast<unsigned>(merge_blocks), kThreadsPerBlock, 0, stream>>>(pieces, partial,
                                                                                               features, y);
    return cudaGetLastError();
}

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    multihead_sddmm_kernel(const int32_t* __restrict__ row, const int32_t* __restrict__ col, int64_t nnz,
                           const T* __restrict__ a, const T* __restrict__ b, int64_t heads, int64_t channels,
                           T* __restrict__ out) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (thread >= nnz * heads) return;
    const int64_t k = thread / heads, h = thread % heads;
    const int64_t features = heads * channels;
    const T* ar = a + static_cast<int64_t>(row[k]) * features + h * channels;
    const T* br = b + static_cast<int64_t>(col[k]) * features + h * channels;
    float sum = 0.f;
    for (int64_t c = 0; c < channels; ++c) sum += as_float(ar[c]) * as_float(br[c]);
    out[thread] = Element<T>::from_float(sum);
}

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    multihead_row_sums_kernel(RowPieces pieces, const int32_t* __restrict__ edge_ids, const T* __restrict__ values,
                              int64_t heads, T* __restrict__ out, float* __restrict__ partial) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t piece = thread / heads;
    if (piece >= pieces.count) return;
    const int64_t h = thread % heads;
    float sum = 0.f;
    for (int64_t k = pieces.begin[piece]; k < pieces.begin[piece + 1]; ++k) {
        const int64_t id = edge_ids != nullptr ? edge_ids[k] : k;
        sum += as_float(values[id * heads + h]);
    }
    const int64_t slot = pieces.slot[piece];
    if (slot < 0) {
        out[static_cast<int64_t>(pieces.row[piece]) * heads + h] = Element<T>::from_float(sum);
    } else {
        partial[slot * heads + h] = sum;
    }
}

}  // namespace

template <typename T>
cudaError_t multihead_row_sums(const RowPieces& pieces, const int32_t* edge_ids, const T* values, int64_t heads,
                               T* out, float* partial, cudaStream_t stream) {
    if (pieces.count == 0 || heads == 0) return cudaSuccess;
    const int64_t blocks = (pieces.count * heads + kThreadsPerBlock - 1) / kThreadsPerBlock;
    const int64_t merge_blocks = (pieces.num_split * heads + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (blocks > INT32_MAX || merge_blocks > INT32_MAX) return cudaErrorInvalidValue;
    multihead_row_sums_kernel<T><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
        pieces, edge_ids, values, heads, out, partial);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || pieces.num_split == 0) return err;
    merge_slots_kernel<T><<<static_cast<unsigned>(merge_blocks), kThreadsPerBlock, 0, stream>>>(pieces, partial,
                                                                                               heads, out);
    return cudaGetLastError();
}

template <typename T>
cudaError_t multihead_spmm(const RowPieces& pieces, const int32_t* col, const int32_t* edge_ids, const T* weights,
                           const T* x, int64_t heads, int64_t channels, T* y, float* partial, cudaStream_t stream) {
    const int64_t features = heads * channels;
    if (pieces.count == 0 || features == 0) return cudaSuccess;
    if (features <= 8) return launch_spmm<T, 8, 1>(pieces, col, edge_ids, weights, x, heads, channels, y, partial, stream);
    if (features <= 16) return launch_spmm<T, 16, 1>(pieces, col, edge_ids, weights, x, heads, channels, y, partial, stream);
    if (features <= 32) return launch_spmm<T, 32, 1>(pieces, col, edge_ids, weights, x, heads, channels, y, partial, stream);
    if (features <= 64) return launch_spmm<T, 32, 2>(pieces, col, edge_ids, weights, x, heads, channels, y, partial, stream);
    return launch_spmm<T, 32, 4>(pieces, col, edge_ids, weights, x, heads, channels, y, partial, stream);
}

template <typename T>
cudaError_t multihead_sddmm(const int32_t* row, const int32_t* col, int64_t nnz, const T* a, const T* b,
                            int64_t heads, int64_t channels, T* out, cudaStream_t stream) {
    if (nnz == 0 || heads == 0) return cudaSuccess;
    const int64_t blocks = (nnz * heads + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    multihead_sddmm_kernel<T><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(row, col, nnz, a, b, heads,
                                                                                         channels, out);
    return cudaGetLastError();
}

#define TCSPARSE_INSTANTIATE_ATTENTION(T)                                                                        \
    template cudaError_t multihead_spmm<T>(const RowPieces&, const int32_t*, const int32_t*, const T*, const T*, \
                                           int64_t, int64_t, T*, float*, cudaStream_t);                          \
    template cudaError_t multihead_sddmm<T>(const int32_t*, const int32_t*, int64_t, const T*, const T*, int64_t, \
                                            int64_t, T*, cudaStream_t);                          \
    template cudaError_t multihead_row_sums<T>(const RowPieces&, const int32_t*, const T*, int64_t, T*, float*,  \
                                               cudaStream_t);
TCSPARSE_INSTANTIATE_ATTENTION(float)
TCSPARSE_INSTANTIATE_ATTENTION(__half)
TCSPARSE_INSTANTIATE_ATTENTION(__nv_bfloat16)

}  // namespace tcsparse
