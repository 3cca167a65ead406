// The "rows" SpMM: one warp per CSR row piece (csr_rows_spmm.h says why).
//
// Inside a warp, groups of L lanes each take every G-th nonzero of the piece (G = 32 / L) and
// each lane owns CH vectors of V elements of the output row: L is chosen so that the L * CH * V
// columns just cover N (no idle lanes on N = 48: 16 lanes x one float4). Each group gathers U
// rows of X before using any, so a lane has U * CH independent loads in flight: the kernel is
// bound by gathers, and their latency is hidden by that count, not by occupancy alone. The
// groups' partial rows are combined with shuffles and written once. The pieces of a split row add
// theirs to the row's fp32 sums; in a small launch the piece that adds last rounds them into Y, in
// a large one a finishing kernel does (csr_rows_spmm.h). A 16-byte gather brings 4 floats or 8
// halves, so 16-bit X moves half the bytes per column.
#include "csr_rows_spmm.h"

#include <algorithm>
#include <type_traits>

#include "elements.cuh"
#include "static_switch.h"

namespace tcsparse {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kGathersInFlight = 4;  // U: nonzeros each group loads before the FMAs
constexpr int64_t kLastArrivalPieceColumns = int64_t{1} << 18;  // csr_rows_spmm says why

// Raw words for the loads: __ldg has no overloads for packs of halves or bfloat16s.
template <int Bytes>
struct Raw;
template <>
struct Raw<16> {
    using type = uint4;
};
template <>
struct Raw<4> {
    using type = unsigned int;
};
template <>
struct Raw<2> {
    using type = unsigned short;
};

// The registers of one gather of V elements: float4 for floats, raw words otherwise. With uint4
// words for floats, ptxas sinks each gather down to its FMAs, leaving one in flight per lane.
template <typename T, int V>
struct Gather {
    using type = typename Raw<V * sizeof(T)>::type;
};
template <>
struct Gather<float, 4> {
    using type = float4;
};

// Blocks per SM ptxas must fit (__launch_bounds__). Float: 0, its own choice, the fastest
// measured. 16-bit: left alone, ptxas sinks every gather to its FMAs to save registers; 5 blocks
// (at most 48 registers) keep the gathers in flight, and 1 or 4 blocks, with more registers,
// measured slower (docs/DECISIONS.md).
template <typename T>
constexpr int kMinBlocksPerSM = std::is_same_v<T, float> ? 0 : 5;

template <typename T>
__device__ __forceinline__ float load_float(const T* p) {
    using R = typename Raw<sizeof(T)>::type;
    const R r = __ldg(reinterpret_cast<const R*>(p));
    return Element<T>::to_float(*reinterpret_cast<const T*>(&r));
}

struct Piece {
    int32_t row;    // -1: a split row's own warp, which has nothing to do (its pieces are listed)
    int32_t begin;
    int32_t end;
    int32_t slot;   // index into split_rows, or -1 for a whole row (written once)
    int32_t count;  // pieces of the row
};

__device__ __forceinline__ Piece piece_of(const CsrRows& a, int64_t warp) {
    if (warp < a.num_rows) {
        const int32_t row = static_cast<int32_t>(warp);
        const int32_t begin = a.rowptr[row], end = a.rowptr[row + 1];
        return {end - begin > a.piece_nnz ? -1 : row, begin, end, -1, 1};
    }
    const int64_t p = warp - a.num_rows;
    const int32_t slot = a.piece_slots[p], row = a.split_rows[slot], begin = a.piece_starts[p];
    const int32_t row_begin = a.rowptr[row], row_end = a.rowptr[row + 1];
    const int32_t count = (row_end - row_begin + a.piece_nnz - 1) / a.piece_nnz;
    return {row, begin, min(begin + a.piece_nnz, row_end), slot, count};
}

// Whether this warp's piece is the last of its row to add to the row's sums in this column tile
// (for the L lanes of group 0, the only ones left). Every piece fences its atomics before it
// counts itself, so the one that counts last reads complete sums (the memory-fence pattern of
// the CUDA programming guide); it resets the count for the next call.
template <int L>
__device__ __forceinline__ bool last_arrival(int32_t* arrivals, int32_t count) {
    constexpr unsigned kGroupMask = L == 32 ? 0xffffffffu : (1u << L) - 1;
    __threadfence();
    __syncwarp(kGroupMask);
    int32_t arrived = 0;
    if (threadIdx.x % 32 == 0) arrived = atomicAdd(arrivals, 1);
    arrived = __shfl_sync(kGroupMask, arrived, 0);
    if (arrived != count - 1) return false;
    __threadfence();
    if (threadIdx.x % 32 == 0) *arrivals = 0;
    return true;
}

__device__ __forceinline__ int64_t output_row(const CsrRows& a, int32_t row) {
    return a.row_map != nullptr ? __ldg(a.row_map + row) : row;
}

// Columns [tile * tile_cols, ...) of every row piece; nv: vectors of V elements in this tile.
// kAddend: whether `addend` is read; a template flag, so that the kernel without an addend
// compiles to code with no trace of it (a runtime test slowed the 16-bit kernel).
template <typename T, int L, int CH, int V, bool kAddend, bool kLastArrival>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocksPerSM<T>)
    csr_rows_kernel(CsrRows a, const T* __restrict__ values, const T* __restrict__ x, int64_t ldx,
                    T* __restrict__ y, int64_t ldy, int64_t n, int tile_cols, const T* __restrict__ bias,
                    const float* __restrict__ addend, SplitSums split) {
    using Vec = typename Gather<T, V>::type;
    constexpr int G = 32 / L;
    constexpr int U = kGathersInFlight;
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    if (warp >= a.num_rows + a.num_pieces) return;
    const Piece piece = piece_of(a, warp);
    if (piece.row < 0) return;
    const int lane = threadIdx.x & 31, group = lane / L, lane_in_group = lane % L;
    const int64_t col0 = static_cast<int64_t>(blockIdx.y) * tile_cols;
    const int nv = static_cast<int>((min(n - col0, static_cast<int64_t>(tile_cols)) + V - 1) / V);

    float acc[CH][V] = {};
    const Vec* xv = reinterpret_cast<const Vec*>(x + col0);
    const int64_t ldv = ldx / V;
    for (int32_t j = piece.begin + group; j < piece.end; j += G * U) {
        int32_t cols[U];
        float vals[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int32_t k = j + u * G;
            cols[u] = k < piece.end ? __ldg(a.col + k) : -1;
            vals[u] = k < piece.end ? load_float(values + k) : 0.f;
        }
        Vec rows[U][CH];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int v = lane_in_group + c * L;
                rows[u][c] = cols[u] >= 0 && v < nv ? __ldg(xv + cols[u] * ldv + v) : Vec{};
            }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const T* r = reinterpret_cast<const T*>(&rows[u][c]);
#pragma unroll
                for (int q = 0; q < V; ++q) acc[c][q] = fmaf(vals[u], Element<T>::to_float(r[q]), acc[c][q]);
            }
    }
#pragma unroll
    for (int offset = L; offset < 32; offset <<= 1)
#pragma unroll
        for (int c = 0; c < CH; ++c)
#pragma unroll
            for (int q = 0; q < V; ++q) acc[c][q] += __shfl_xor_sync(0xffffffffu, acc[c][q], offset);
    if (group != 0) return;
    if (piece.slot >= 0) {
        // A split row: add this piece to the row's sums; the last piece takes them (read from L2,
        // where the atomics landed) and leaves them zero for the next call.
        float* sum = split.sums + piece.slot * n + col0;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int v = lane_in_group + c * L;
            if (v >= nv) continue;
            if constexpr (V % 4 == 0) {
#pragma unroll
                for (int q = 0; q < V; q += 4)
                    ptx::atomic_add_f4(sum + v * V + q, make_float4(acc[c][q], acc[c][q + 1], acc[c][q + 2], acc[c][q + 3]));
            } else {
#pragma unroll
                for (int q = 0; q < V; ++q) atomicAdd(sum + v * V + q, acc[c][q]);
            }
        }
        if constexpr (!kLastArrival) return;
        if (!last_arrival<L>(split.arrivals + piece.slot * gridDim.y + blockIdx.y, piece.count)) return;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int v = lane_in_group + c * L;
            if (v >= nv) continue;
#pragma unroll
            for (int q = 0; q < V; ++q) {
                acc[c][q] = __ldcg(sum + v * V + q);
                __stcg(sum + v * V + q, 0.f);
            }
        }
    }
    const int64_t y_row = output_row(a, piece.row);
    T* out = y + y_row * ldy + col0;
    const float* add = kAddend ? addend + y_row * n + col0 : nullptr;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int v = lane_in_group + c * L;
        if (v >= nv) continue;
        Vec packed;
        T* e = reinterpret_cast<T*>(&packed);
#pragma unroll
        for (int q = 0; q < V; ++q) {
            const float b = bias != nullptr ? load_float(bias + col0 + v * V + q) : 0.f;
            const float s = kAddend ? add[v * V + q] : 0.f;
            e[q] = Element<T>::from_float(acc[c][q] + b + s);
        }
        *reinterpret_cast<Vec*>(out + v * V) = packed;
    }
}

template <typename T, int L, int CH, int V>
cudaError_t launch(const CsrRows& a, const T* values, const T* x, int64_t ldx, T* y, int64_t ldy, int64_t n,
                   const T* bias, const float* addend, const SplitSums& split, bool last_arrival,
                   cudaStream_t stream) {
    constexpr int tile_cols = L * CH * V;
    const int64_t warps = a.num_rows + a.num_pieces;
    const int64_t tiles = (n + tile_cols - 1) / tile_cols;
    if (tiles > 65535 || (a.num_split_rows > 0 && tiles > csr_rows_max_tiles(n))) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock), static_cast<unsigned>(tiles));
    TCS_BOOL_SWITCH(addend != nullptr, kAddend, [&] {
        TCS_BOOL_SWITCH(last_arrival, kLastArrival, [&] {
            csr_rows_kernel<T, L, CH, V, kAddend, kLastArrival>
                <<<grid, kWarpsPerBlock * 32, 0, stream>>>(a, values, x, ldx, y, ldy, n, tile_cols, bias, addend, split);
        });
    });
    return cudaGetLastError();
}

// The split rows' sums rounded into Y with the bias and the addend, and set back to zero.
template <typename T>
__global__ void finish_split_rows_kernel(CsrRows a, SplitSums split, T* __restrict__ y, int64_t ldy, int64_t n,
                                         const T* __restrict__ bias, const float* __restrict__ addend) {
    const int64_t total = a.num_split_rows * n;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / n, c = i % n;
        const int64_t row = output_row(a, a.split_rows[r]);
        const float b = bias != nullptr ? load_float(bias + c) : 0.f;
        const float s = addend != nullptr ? addend[row * n + c] : 0.f;
        y[row * ldy + c] = Element<T>::from_float(split.sums[i] + b + s);
        split.sums[i] = 0.f;
    }
}

// 16-byte gathers: the fewest lanes whose vectors cover N, at most a warp. Wider rows run in
// tiles of a warp's width (grid.y), a warp per tile: more, lighter warps keep more gathers in
// flight per SM than one warp covering 256 float columns, which measured slower.
template <typename T>
cudaError_t launch_vector(const CsrRows& a, const T* values, const T* x, int64_t ldx, T* y, int64_t ldy, int64_t n,
                          const T* bias, const float* addend, const SplitSums& split, bool last_arrival,
                          cudaStream_t stream) {
    constexpr int V = 16 / sizeof(T);
    const int64_t nv = n / V;
    if (nv <= 4) return launch<T, 4, 1, V>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    if (nv <= 8) return launch<T, 8, 1, V>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    if (nv <= 16) return launch<T, 16, 1, V>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    return launch<T, 32, 1, V>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
}

// One element per gather (odd N, strides or pointers off 16 bytes): several per lane instead.
template <typename T>
cudaError_t launch_scalar(const CsrRows& a, const T* values, const T* x, int64_t ldx, T* y, int64_t ldy, int64_t n,
                          const T* bias, const float* addend, const SplitSums& split, bool last_arrival,
                          cudaStream_t stream) {
    if (n <= 8) return launch<T, 8, 1, 1>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    if (n <= 16) return launch<T, 16, 1, 1>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    if (n <= 32) return launch<T, 32, 1, 1>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    if (n <= 48) return launch<T, 16, 3, 1>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    if (n <= 64) return launch<T, 32, 2, 1>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    if (n <= 96) return launch<T, 32, 3, 1>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    return launch<T, 32, 4, 1>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// Every launch above covers N in one tile up to 96 columns, and in tiles of at least 128 beyond.
int64_t csr_rows_max_tiles(int64_t n) { return std::max<int64_t>(1, (n + 127) / 128); }

template <typename T>
cudaError_t csr_rows_spmm(const CsrRows& a, const T* values, const T* x, int64_t ldx, T* y, int64_t ldy, int64_t n,
                          const T* bias, const float* addend, const SplitSums& split, cudaStream_t stream) {
    if (a.num_rows == 0 || n == 0) return cudaSuccess;
    if (a.num_split_rows > 0 && (split.sums == nullptr || split.arrivals == nullptr)) return cudaErrorInvalidValue;
    constexpr int V = 16 / sizeof(T);
    const bool vector = n % V == 0 && ldx % V == 0 && ldy % V == 0 && aligned16(x) && aligned16(y);
    // The last piece of a row saves the finishing launch but waits for its atomics (a fence per
    // piece): faster up to kLastArrivalPieceColumns pieces x N, where the launch dominates; slower
    // beyond, where the fences do (docs/DECISIONS.md).
    const bool last_arrival = a.num_pieces * n <= kLastArrivalPieceColumns;
    const cudaError_t err =
        vector ? launch_vector(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream)
               : launch_scalar(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
    if (err != cudaSuccess || a.num_split_rows == 0 || last_arrival) return err;
    const int64_t total = a.num_split_rows * n;
    const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
    finish_split_rows_kernel<T><<<blocks, 256, 0, stream>>>(a, split, y, ldy, n, bias, addend);
    return cudaGetLastError();
}

#define TCSPARSE_INSTANTIATE_CSR_ROWS(T)                                                                      \
    template cudaError_t csr_rows_spmm<T>(const CsrRows&, const T*, const T*, int64_t, T*, int64_t, int64_t, \
                                          const T*, const float*, const SplitSums&, cudaStream_t);
TCSPARSE_INSTANTIATE_CSR_ROWS(float)
TCSPARSE_INSTANTIATE_CSR_ROWS(__half)
TCSPARSE_INSTANTIATE_CSR_ROWS(__nv_bfloat16)

}  // namespace tcsparse
