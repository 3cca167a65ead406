// The max/min SpMM (reduce_rows.h): a group of L lanes per CSR row, each lane owning CH columns
// of the row's outputs (column lane + c * L of the block's tile). A lane walks the row's nonzeros
// in order and keeps its running extreme and winner per column, so no lane ever combines with
// another and a tie keeps the earlier nonzero. It loads U nonzeros' rows of X before comparing
// any, for U * CH independent loads in flight (the kernel is bound by those gathers). L is the
// fewest lanes whose columns cover N (8 lanes for N <= 8), wider N runs in tiles along grid.y.
//
// A row longer than 2 B nonzeros (B = kPieceNnz) is cut into pieces by a launch of its own: the
// nonzeros are cut into chunks of B, and the group of chunk c takes the row holding nonzero c B,
// from there to the chunk's end or the row's end, plus the row's head when the row began inside
// chunk c - 1 (which no other chunk takes). Every piece but a row's last is then B to 2 B - 1
// nonzeros, no more than the longest row left whole, and a row's chunks are its pieces in order.
// Each piece leaves its extreme and winner per column in its chunk's partial row; a second launch
// walks a long row's partials in chunk order under the same rule as nonzeros, which gives the
// unsplit walk's extreme and winner: the rule keeps the first of the best, and the first of the
// pieces' firsts is it (NaN counting as the best, ties included). The rows launch then takes the
// rows left whole, with the mapping and registers it had before any row was split.
#include "reduce_rows.h"

#include "loads.cuh"
#include "static_switch.h"

namespace tcsparse {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kLoadsInFlight = 4;  // U

// Whether product v replaces the running extreme `best` (winner `win`, -1 for none yet).
template <bool kMax>
__device__ __forceinline__ bool replaces(float v, float best, int32_t win) {
    if (win < 0) return true;
    if (isnan(best)) return false;
    return isnan(v) || (kMax ? v > best : v < best);
}

// A lane's columns of the block's tile and its running extreme and winner in each.
template <int L, int CH, bool kMax>
struct Lane {
    int64_t column[CH];
    bool active[CH];
    float best[CH];
    int32_t win[CH];

    __device__ Lane(int lane, int64_t n) {
        const int64_t col0 = static_cast<int64_t>(blockIdx.y) * (L * CH);
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            column[c] = col0 + lane + c * L;
            active[c] = column[c] < n;
            best[c] = 0.f;
            win[c] = -1;
        }
    }

    __device__ __forceinline__ void offer(int c, float v, int32_t k) {
        if (replaces<kMax>(v, best[c], win[c])) {
            best[c] = v;
            win[c] = k;
        }
    }

    // The nonzeros [begin, end) in order.
    template <typename T>
    __device__ __forceinline__ void walk(int64_t begin, int64_t end, const int32_t* __restrict__ col,
                                         const T* __restrict__ values, const T* __restrict__ x, int64_t ldx) {
        constexpr int U = kLoadsInFlight;
        // 64-bit positions: k + U must not wrap near 2^31 nonzeros.
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
                for (int c = 0; c < CH; ++c) offer(c, vals[u] * xs[u][c], static_cast<int32_t>(k + u));
            }
        }
    }

    // Y and the winners of the lane's columns of `row` (0 and -1 where nothing was offered).
    template <typename T>
    __device__ __forceinline__ void store(int64_t row, int64_t n, T* __restrict__ y, int32_t* __restrict__ winners) {
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            if (!active[c]) continue;
            y[row * n + column[c]] = Element<T>::from_float(win[c] >= 0 ? best[c] : 0.f);
            winners[row * n + column[c]] = win[c];
        }
    }

    // The partial rows [first, last] of the pieces of one row, in order.
    __device__ __forceinline__ void merge(int64_t first, int64_t last, const float* __restrict__ partial_best,
                                          const int32_t* __restrict__ partial_win, int64_t n) {
        constexpr int U = kLoadsInFlight;
        for (int64_t p = first; p <= last; p += U) {
            float bests[U][CH];
            int32_t wins[U][CH];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                // One offset per partial row, the columns at constant steps from it.
                const int64_t at = (p + u) * n + column[0];
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    const bool in = p + u <= last && active[c];
                    bests[u][c] = in ? __ldg(partial_best + at + c * L) : 0.f;
                    wins[u][c] = in ? __ldg(partial_win + at + c * L) : -1;
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (p + u > last) break;
#pragma unroll
                for (int c = 0; c < CH; ++c) offer(c, bests[u][c], wins[u][c]);
            }
        }
    }
};

// Whether a row of this many nonzeros is cut into pieces.
__device__ __forceinline__ bool is_long(int64_t length) { return length > 2 * kPieceNnz; }

// The row holding nonzero k < rowptr[num_rows]: the last row that begins at or before k.
__device__ __forceinline__ int64_t row_of(const int32_t* __restrict__ rowptr, int64_t num_rows, int64_t k) {
    int64_t lo = 0, hi = num_rows;  // rowptr[lo] <= k < rowptr[hi]
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (__ldg(rowptr + mid) <= k) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// One group of lanes per chunk of kPieceNnz nonzeros: the piece it takes, if any (see the top).
// The chunk of a long row's first piece names the row in first_of (every other chunk -1), so
// that the merge finds its rows with one load per chunk.
template <typename T, int L, int CH, bool kMax>
__global__ void __launch_bounds__(kThreadsPerBlock)
    pieces_kernel(const int32_t* __restrict__ rowptr, const int32_t* __restrict__ col, int64_t num_rows,
                  int64_t num_chunks, const T* __restrict__ values, const T* __restrict__ x, int64_t ldx, int64_t n,
                  float* __restrict__ partial_best, int32_t* __restrict__ partial_win, int32_t* __restrict__ first_of) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t chunk = thread / L;
    if (chunk >= num_chunks) return;
    const int64_t start = chunk * kPieceNnz;
    const int64_t row = row_of(rowptr, num_rows, start);
    const int64_t begin = __ldg(rowptr + row), end = __ldg(rowptr + row + 1);
    const bool split = is_long(end - begin);
    const bool head = begin > start - kPieceNnz;  // the row began in this chunk or the one before
    if (thread % L == 0 && blockIdx.y == 0) first_of[chunk] = split && head ? static_cast<int32_t>(row) : -1;
    if (!split) return;
    const int64_t piece_end = end < start + kPieceNnz ? end : start + kPieceNnz;
    Lane<L, CH, kMax> lane(static_cast<int>(thread % L), n);
    lane.walk(head ? begin : start, piece_end, col, values, x, ldx);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        if (!lane.active[c]) continue;
        partial_best[chunk * n + lane.column[c]] = lane.best[c];
        partial_win[chunk * n + lane.column[c]] = lane.win[c];
    }
}

// One group of lanes per chunk again: the chunk of a long row's first piece merges the row's
// pieces, chunks ceil(begin / B) to (end - 1) / B (those whose first nonzero lies in the row). A
// launch of its own rather than a branch of the rows kernel, whose registers (and so its occupancy
// over the short rows) the merge's loads in flight would raise; 4 blocks per SM keep the chunks
// without a row, which exit after one load, from taking waves of 2 blocks.
template <typename T, int L, int CH, bool kMax>
__global__ void __launch_bounds__(kThreadsPerBlock, 4)
    merge_kernel(const int32_t* __restrict__ rowptr, int64_t num_chunks, int64_t n,
                 const float* __restrict__ partial_best, const int32_t* __restrict__ partial_win,
                 const int32_t* __restrict__ first_of, T* __restrict__ y, int32_t* __restrict__ winners) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t chunk = thread / L;
    if (chunk >= num_chunks) return;
    const int64_t row = __ldg(first_of + chunk);
    if (row < 0) return;
    const int64_t end = __ldg(rowptr + row + 1);
    Lane<L, CH, kMax> lane(static_cast<int>(thread % L), n);
    lane.merge(chunk, (end - 1) / kPieceNnz, partial_best, partial_win, n);
    lane.store(row, n, y, winners);
}

// One group of lanes per row, for the rows no piece took: those of at most `whole` nonzeros.
template <typename T, int L, int CH, bool kMax>
__global__ void __launch_bounds__(kThreadsPerBlock)
    reduce_rows_kernel(const int32_t* __restrict__ rowptr, const int32_t* __restrict__ col, int64_t num_rows,
                       int64_t whole, const T* __restrict__ values, const T* __restrict__ x, int64_t ldx, int64_t n,
                       T* __restrict__ y, int32_t* __restrict__ winners) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t row = thread / L;
    if (row >= num_rows) return;
    const int64_t begin = rowptr[row], end = rowptr[row + 1];
    if (end - begin > whole) return;
    Lane<L, CH, kMax> lane(static_cast<int>(thread % L), n);
    lane.walk(begin, end, col, values, x, ldx);
    lane.store(row, n, y, winners);
}

template <typename T, int L, int CH>
cudaError_t launch(const int32_t* rowptr, const int32_t* col, int64_t num_rows, int64_t num_chunks,
                   const T* values, const T* x, int64_t ldx, int64_t n, bool is_max, float* partial_best,
                   int32_t* partial_win, int32_t* first_of, T* y, int32_t* winners, cudaStream_t stream) {
    constexpr int tile_cols = L * CH;
    const int64_t tiles = (n + tile_cols - 1) / tile_cols;
    const int64_t blocks = (num_rows * L + kThreadsPerBlock - 1) / kThreadsPerBlock;
    const int64_t chunk_blocks = (num_chunks * L + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (tiles > 65535 || blocks > INT32_MAX || chunk_blocks > INT32_MAX) return cudaErrorInvalidValue;
    TCS_BOOL_SWITCH(is_max, kMax, [&] {
        if (num_chunks > 0) {
            const dim3 grid(static_cast<unsigned>(chunk_blocks), static_cast<unsigned>(tiles));
            pieces_kernel<T, L, CH, kMax><<<grid, kThreadsPerBlock, 0, stream>>>(
                rowptr, col, num_rows, num_chunks, values, x, ldx, n, partial_best, partial_win, first_of);
            merge_kernel<T, L, CH, kMax><<<grid, kThreadsPerBlock, 0, stream>>>(
                rowptr, num_chunks, n, partial_best, partial_win, first_of, y, winners);
        }
        const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles));
        // Without pieces every row is whole.
        const int64_t whole = num_chunks > 0 ? 2 * kPieceNnz : INT64_MAX;
        reduce_rows_kernel<T, L, CH, kMax>
            <<<grid, kThreadsPerBlock, 0, stream>>>(rowptr, col, num_rows, whole, values, x, ldx, n, y, winners);
    });
    return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t reduce_rows(const int32_t* rowptr, const int32_t* col, int64_t num_rows, int64_t num_chunks,
                        const T* values, const T* x, int64_t ldx, int64_t n, bool is_max, float* partial_best,
                        int32_t* partial_win, int32_t* first_of, T* y, int32_t* winners, cudaStream_t stream) {
    if (num_rows == 0 || n == 0) return cudaSuccess;
#define TCS_REDUCE_ROWS_LAUNCH(L, CH)                                                                      \
    launch<T, L, CH>(rowptr, col, num_rows, num_chunks, values, x, ldx, n, is_max, partial_best, partial_win, \
                     first_of, y, winners, stream)
    if (n <= 8) return TCS_REDUCE_ROWS_LAUNCH(8, 1);
    if (n <= 16) return TCS_REDUCE_ROWS_LAUNCH(16, 1);
    if (n <= 32) return TCS_REDUCE_ROWS_LAUNCH(32, 1);
    if (n <= 64) return TCS_REDUCE_ROWS_LAUNCH(32, 2);
    return TCS_REDUCE_ROWS_LAUNCH(32, 4);
#undef TCS_REDUCE_ROWS_LAUNCH
}

#define TCSPARSE_INSTANTIATE_REDUCE_ROWS(T)                                                                         \
    template cudaError_t reduce_rows<T>(const int32_t*, const int32_t*, int64_t, int64_t, const T*, const T*,       \
                                        int64_t, int64_t, bool, float*, int32_t*, int32_t*, T*, int32_t*, cudaStream_t);
TCSPARSE_INSTANTIATE_REDUCE_ROWS(float)
TCSPARSE_INSTANTIATE_REDUCE_ROWS(__half)
TCSPARSE_INSTANTIATE_REDUCE_ROWS(__nv_bfloat16)

}  // namespace tcsparse
