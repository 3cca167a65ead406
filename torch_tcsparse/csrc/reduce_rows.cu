// The max/min SpMM (reduce_rows.h): a group of L lanes per CSR row, each lane owning CH columns
// of the row's outputs (column lane + c * L of the block's tile). A lane walks the row's nonzeros
// in order and keeps its running extreme and winner per column, so no lane ever combines with
// another and a tie keeps the earlier nonzero. It loads U nonzeros' rows of X before comparing
// any, for U * CH independent loads in flight (the kernel is bound by those gathers). L is the
// fewest lanes whose columns cover N (8 lanes for N <= 8), wider N runs in tiles along grid.y.
#include "reduce_rows.h"

#include "elements.cuh"
#include "static_switch.h"

namespace tcsparse {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kLoadsInFlight = 4;  // U

template <typename T>
__device__ __forceinline__ float load_float(const T* p) {
    if constexpr (sizeof(T) == 4) {
        return __ldg(reinterpret_cast<const float*>(p));
    } else {
        // __ldg of a 16-bit word; the element types have no overloads of their own on every toolkit.
        const unsigned short r = __ldg(reinterpret_cast<const unsigned short*>(p));
        return Element<T>::to_float(*reinterpret_cast<const T*>(&r));
    }
}

// Whether product v replaces the running extreme `best` (winner `win`, -1 for none yet).
template <bool kMax>
__device__ __forceinline__ bool replaces(float v, float best, int32_t win) {
    if (win < 0) return true;
    if (isnan(best)) return false;
    return isnan(v) || (kMax ? v > best : v < best);
}

template <typename T, int L, int CH, bool kMax>
__global__ void __launch_bounds__(kThreadsPerBlock)
    reduce_rows_kernel(const int32_t* __restrict__ rowptr, const int32_t* __restrict__ col, int64_t num_rows,
                       const T* __restrict__ values, const T* __restrict__ x, int64_t ldx, int64_t n,
                       T* __restrict__ y, int32_t* __restrict__ winners) {
    constexpr int U = kLoadsInFlight;
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t row = thread / L;
    if (row >= num_rows) return;
    const int lane = static_cast<int>(thread % L);
    const int64_t col0 = static_cast<int64_t>(blockIdx.y) * (L * CH);
    int64_t column[CH];
    bool active[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        column[c] = col0 + lane + c * L;
        active[c] = column[c] < n;
    }
    float best[CH];
    int32_t win[CH];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        best[c] = 0.f;
        win[c] = -1;
    }
    // 64-bit positions: k + U must not wrap near 2^31 nonzeros.
    const int64_t begin = rowptr[row], end = rowptr[row + 1];
    for (int64_t k = begin; k < end; k += U) {
        int32_t cols[U];
        float vals[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool in_row = k + u < end;
            cols[u] = in_row ? __ldg(col + k + u) : -1;
            vals[u] = in_row ? load_float(values + k + u) : 0.f;
        }
        float xs[U][CH];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CH; ++c)
                xs[u][c] = cols[u] >= 0 && active[c] ? load_float(x + cols[u] * ldx + column[c]) : 0.f;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (cols[u] < 0) break;
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const float v = vals[u] * xs[u][c];
                if (replaces<kMax>(v, best[c], win[c])) {
                    best[c] = v;
                    win[c] = static_cast<int32_t>(k + u);
                }
            }
        }
    }
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        if (!active[c]) continue;
        y[row * n + column[c]] = Element<T>::from_float(win[c] >= 0 ? best[c] : 0.f);
        winners[row * n + column[c]] = win[c];
    }
}

template <typename T, int L, int CH>
cudaError_t launch(const int32_t* rowptr, const int32_t* col, int64_t num_rows, const T* values, const T* x,
                   int64_t ldx, int64_t n, bool is_max, T* y, int32_t* winners, cudaStream_t stream) {
    constexpr int tile_cols = L * CH;
    const int64_t tiles = (n + tile_cols - 1) / tile_cols;
    const int64_t blocks = (num_rows * L + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (tiles > 65535 || blocks > INT32_MAX) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles));
    TCS_BOOL_SWITCH(is_max, kMax, [&] {
        reduce_rows_kernel<T, L, CH, kMax>
            <<<grid, kThreadsPerBlock, 0, stream>>>(rowptr, col, num_rows, values, x, ldx, n, y, winners);
    });
    return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t reduce_rows(const int32_t* rowptr, const int32_t* col, int64_t num_rows, const T* values, const T* x,
                        int64_t ldx, int64_t n, bool is_max, T* y, int32_t* winners, cudaStream_t stream) {
    if (num_rows == 0 || n == 0) return cudaSuccess;
    if (n <= 8) return launch<T, 8, 1>(rowptr, col, num_rows, values, x, ldx, n, is_max, y, winners, stream);
    if (n <= 16) return launch<T, 16, 1>(rowptr, col, num_rows, values, x, ldx, n, is_max, y, winners, stream);
    if (n <= 32) return launch<T, 32, 1>(rowptr, col, num_rows, values, x, ldx, n, is_max, y, winners, stream);
    if (n <= 64) return launch<T, 32, 2>(rowptr, col, num_rows, values, x, ldx, n, is_max, y, winners, stream);
    return launch<T, 32, 4>(rowptr, col, num_rows, values, x, ldx, n, is_max, y, winners, stream);
}

#define TCSPARSE_INSTANTIATE_REDUCE_ROWS(T)                                                                  \
    template cudaError_t reduce_rows<T>(const int32_t*, const int32_t*, int64_t, const T*, const T*, int64_t, \
                                        int64_t, bool, T*, int32_t*, cudaStream_t);
TCSPARSE_INSTANTIATE_REDUCE_ROWS(float)
TCSPARSE_INSTANTIATE_REDUCE_ROWS(__half)
TCSPARSE_INSTANTIATE_REDUCE_ROWS(__nv_bfloat16)

}  // namespace tcsparse
