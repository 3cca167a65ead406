// The "rows" SpMM: one warp per CSR row piece (csr_rows_spmm.h says why).
//
// Inside a warp, groups of L lanes each take every G-th nonzero of the piece (G = 32 / L) and
// each lane owns CH vectors of V floats of the output row: L is chosen so that the L * CH * V
// columns just cover N (no idle lanes on N = 48: 16 lanes x one float4). Each group gathers U
// rows of X before using any, so a lane has U * CH independent loads in flight: the kernel is
// bound by gathers, and their latency is hidden by that count, not by occupancy alone. The
// groups' partial rows are combined with shuffles and written once (atomically for split rows).
#include "csr_rows_spmm.h"

#include <algorithm>

namespace tcsparse {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kGathersInFlight = 4;  // U: nonzeros each group loads before the FMAs

template <int V>
struct Vec;
template <>
struct Vec<1> {
    using type = float;
};
template <>
struct Vec<4> {
    using type = float4;
};

struct Piece {
    int32_t row;
    int32_t begin;
    int32_t end;
    bool split;
};

__device__ __forceinline__ Piece piece_of(const CsrRows& a, int64_t warp) {
    if (warp < a.num_rows) {
        const int32_t row = static_cast<int32_t>(warp);
        const int32_t begin = a.rowptr[row], row_end = a.rowptr[row + 1];
        const bool split = row_end - begin > a.piece_nnz;
        return {row, begin, split ? begin + a.piece_nnz : row_end, split};
    }
    const int64_t p = warp - a.num_rows;
    const int32_t row = a.piece_rows[p], begin = a.piece_starts[p];
    return {row, begin, min(begin + a.piece_nnz, a.rowptr[row + 1]), true};
}

// Columns [tile * tile_cols, ...) of every row piece; nv: vectors of V floats in this tile.
template <int L, int CH, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    csr_rows_kernel(CsrRows a, const float* __restrict__ x, int64_t ldx, float* __restrict__ y, int64_t ldy,
                    int64_t n, int tile_cols, const float* __restrict__ bias) {
    using VecT = typename Vec<V>::type;
    constexpr int G = 32 / L;
    constexpr int U = kGathersInFlight;
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    if (warp >= a.num_rows + a.num_pieces) return;
    const int lane = threadIdx.x & 31, group = lane / L, lane_in_group = lane % L;
    const int64_t col0 = static_cast<int64_t>(blockIdx.y) * tile_cols;
    const int nv = static_cast<int>((min(n - col0, static_cast<int64_t>(tile_cols)) + V - 1) / V);
    const Piece piece = piece_of(a, warp);

    float acc[CH][V] = {};
    const VecT* xv = reinterpret_cast<const VecT*>(x + col0);
    const int64_t ldv = ldx / V;
    for (int32_t j = piece.begin + group; j < piece.end; j += G * U) {
        int32_t cols[U];
        float vals[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int32_t k = j + u * G;
            cols[u] = k < piece.end ? __ldg(a.col + k) : -1;
            vals[u] = k < piece.end ? __ldg(a.values + k) : 0.f;
        }
        VecT rows[U][CH];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int v = lane_in_group + c * L;
                rows[u][c] = cols[u] >= 0 && v < nv ? __ldg(xv + cols[u] * ldv + v) : VecT{};
            }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const float* r = reinterpret_cast<const float*>(&rows[u][c]);
#pragma unroll
                for (int q = 0; q < V; ++q) acc[c][q] = fmaf(vals[u], r[q], acc[c][q]);
            }
    }
#pragma unroll
    for (int offset = L; offset < 32; offset <<= 1)
#pragma unroll
        for (int c = 0; c < CH; ++c)
#pragma unroll
            for (int q = 0; q < V; ++q) acc[c][q] += __shfl_xor_sync(0xffffffffu, acc[c][q], offset);
    if (group != 0) return;
    float* out = y + piece.row * ldy + col0;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int v = lane_in_group + c * L;
        if (v >= nv) continue;
        if (piece.split) {
#pragma unroll
            for (int q = 0; q < V; ++q) atomicAdd(out + v * V + q, acc[c][q]);
        } else {
            if (bias != nullptr)
#pragma unroll
                for (int q = 0; q < V; ++q) acc[c][q] += bias[col0 + v * V + q];
            *reinterpret_cast<VecT*>(out + v * V) = *reinterpret_cast<const VecT*>(acc[c]);
        }
    }
}

// Rows summed with atomics start from the bias (or zero).
__global__ void init_split_rows_kernel(const int32_t* __restrict__ rows, int64_t num_rows, float* __restrict__ y,
                                       int64_t ldy, int64_t n, const float* __restrict__ bias) {
    const int64_t total = num_rows * n;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / n, c = i % n;
        y[rows[r] * ldy + c] = bias != nullptr ? bias[c] : 0.f;
    }
}

template <int L, int CH, int V>
cudaError_t launch(const CsrRows& a, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n, int tile_cols,
                   const float* bias, cudaStream_t stream) {
    const int64_t warps = a.num_rows + a.num_pieces;
    const int64_t tiles = (n + tile_cols - 1) / tile_cols;
    if (tiles > 65535) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock), static_cast<unsigned>(tiles));
    csr_rows_kernel<L, CH, V><<<grid, kWarpsPerBlock * 32, 0, stream>>>(a, x, ldx, y, ldy, n, tile_cols, bias);
    return cudaGetLastError();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t csr_rows_spmm(const CsrRows& a, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n,
                          const float* bias, cudaStream_t stream) {
    if (a.num_rows == 0 || n == 0) return cudaSuccess;
    if (a.num_split_rows > 0) {
        const int64_t total = a.num_split_rows * n;
        const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
        init_split_rows_kernel<<<blocks, 256, 0, stream>>>(a.split_rows, a.num_split_rows, y, ldy, n, bias);
        if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    }
    // 16-byte gathers when every row of X and Y starts on a 16-byte boundary.
    if (n % 4 == 0 && ldx % 4 == 0 && ldy % 4 == 0 && aligned16(x) && aligned16(y)) {
        const int64_t nv = n / 4;
        if (nv <= 8) return launch<8, 1, 4>(a, x, ldx, y, ldy, n, 32, bias, stream);
        if (nv <= 16) return launch<16, 1, 4>(a, x, ldx, y, ldy, n, 64, bias, stream);
        // Wider rows run in tiles of 128 columns (grid.y), a warp per tile: on an H200 this beat
        // one warp covering 256 columns (R-MAT 21 at N = 256: 10.2 against 13.0 ms), since more,
        // lighter warps keep more gathers in flight per SM.
        return launch<32, 1, 4>(a, x, ldx, y, ldy, n, 128, bias, stream);
    }
    if (n <= 8) return launch<8, 1, 1>(a, x, ldx, y, ldy, n, 8, bias, stream);
    if (n <= 16) return launch<16, 1, 1>(a, x, ldx, y, ldy, n, 16, bias, stream);
    if (n <= 32) return launch<32, 1, 1>(a, x, ldx, y, ldy, n, 32, bias, stream);
    if (n <= 48) return launch<16, 3, 1>(a, x, ldx, y, ldy, n, 48, bias, stream);
    if (n <= 64) return launch<32, 2, 1>(a, x, ldx, y, ldy, n, 64, bias, stream);
    if (n <= 96) return launch<32, 3, 1>(a, x, ldx, y, ldy, n, 96, bias, stream);
    return launch<32, 4, 1>(a, x, ldx, y, ldy, n, 128, bias, stream);
}

}  // namespace tcsparse
