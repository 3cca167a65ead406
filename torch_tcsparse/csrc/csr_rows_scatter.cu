// dX = A^T dY by scatter from the "rows" SpMM's operands (csr_rows_scatter.h says why).
//
// A slot of L lanes takes one row piece: a row up to the piece size, or a piece of a longer row
// (the same split the product runs, so a hub row's nonzeros spread over many slots). It loads its
// row of dY once, V columns per lane, and for each nonzero (i, j, a) adds a * dY[i] to dX[j]:
// one V-wide fp32 atomic per lane and nonzero (a single instruction for V = 4 and V = 2 on sm_90,
// V scalar atomics on older GPUs). Slots share no data, so a warp needs no shuffles and its slots
// may walk rows of different lengths; the nonzeros' columns and values are read a few at a time
// before their atomics, which do not wait for an answer.
//
// V = 4 where N, dY's row stride and base pointer allow aligned loads of 4 elements, else 2, else
// 1; L is the fewest lanes (a power of two, at most 32) whose V columns cover N, and wider N runs
// in column tiles (grid.y) of 32 V columns.
#include "csr_rows_scatter.h"

#include "loads.cuh"
#include "static_switch.h"

namespace tcsparse {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kNonzerosInFlight = 4;  // columns and values a slot reads before their atomics

// p[0..V) += a * g (p aligned to V floats).
template <int V>
__device__ __forceinline__ void add_row(float* p, float a, const float (&g)[V]) {
    if constexpr (V == 4) {
        ptx::atomic_add_f4(p, make_float4(a * g[0], a * g[1], a * g[2], a * g[3]));
    } else if constexpr (V == 2) {
        ptx::atomic_add_f2(p, make_float2(a * g[0], a * g[1]));
    } else {
        atomicAdd(p, a * g[0]);
    }
}

// Slots [0, num_pieces) take a piece each, the rest a row each; blockIdx.y is the column tile.
template <typename T, int V, int L>
__global__ void __launch_bounds__(kThreadsPerBlock)
    csr_rows_scatter_kernel(CsrRows a, const T* __restrict__ values, const T* __restrict__ grad_y, int64_t ldg,
                            float* __restrict__ grad_x, int64_t n) {
    constexpr int U = kNonzerosInFlight;
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t slot = thread / L;
    const int64_t column = static_cast<int64_t>(blockIdx.y) * (L * V) + (threadIdx.x % L) * V;
    if (column >= n) return;  // V divides N: a lane's V columns lie all inside or all outside
    int64_t begin, end, row;
    if (slot < a.num_pieces) {
        begin = __ldg(a.piece_starts + slot);
        if (begin < 0) return;  // padding (csr_rows_spmm.h)
        row = __ldg(a.split_rows + __ldg(a.piece_slots + slot));
        end = min(begin + a.piece_nnz, static_cast<int64_t>(__ldg(a.rowptr + row + 1)));
    } else {
        row = slot - a.num_pieces;
        if (row >= a.num_rows) return;
        begin = __ldg(a.rowptr + row);
        end = __ldg(a.rowptr + row + 1);
        if (end - begin > a.piece_nnz) return;  // a split row: its pieces scatter it
    }
    if (begin >= end) return;  // an empty row: nothing to add, its row of dY unread
    const int64_t y_row = a.row_map != nullptr ? __ldg(a.row_map + row) : row;
    float g[V];
    load_row<T, V>(grad_y + y_row * ldg + column, g);
    for (int64_t k = begin; k < end; k += U) {
        int32_t cols[U];
        float vals[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t j = k + u;
            cols[u] = j < end ? __ldg(a.col + j) : -1;
            vals[u] = j < end ? load_float(values + j) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (cols[u] >= 0) add_row<V>(grad_x + cols[u] * n + column, vals[u], g);
    }
}

template <typename T, int V, int L>
cudaError_t launch(const CsrRows& a, const T* values, const T* grad_y, int64_t ldg, float* grad_x, int64_t n,
                   cudaStream_t stream) {
    const int64_t tiles = (n + L * V - 1) / (L * V);
    const int64_t blocks = ((a.num_pieces + a.num_rows) * L + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (tiles > 65535 || blocks > INT32_MAX) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles));
    csr_rows_scatter_kernel<T, V, L><<<grid, kThreadsPerBlock, 0, stream>>>(a, values, grad_y, ldg, grad_x, n);
    return cudaGetLastError();
}

// The fewest lanes per slot (a power of two, at most 32) whose V columns each cover N.
template <typename T, int V>
cudaError_t launch_lanes(const CsrRows& a, const T* values, const T* grad_y, int64_t ldg, float* grad_x, int64_t n,
                         cudaStream_t stream) {
    const int64_t lanes = (n + V - 1) / V;
    return TCS_LANES_SWITCH(lanes, L, [&] { return launch<T, V, L>(a, values, grad_y, ldg, grad_x, n, stream); });
}

// The widest of 4, 2 and 1 elements that N, dY's row stride and base pointer allow.
template <typename T>
int row_vector(const T* grad_y, int64_t ldg, int64_t n) {
    for (int v = 4; v > 1; v /= 2)
        if (n % v == 0 && ldg % v == 0 && reinterpret_cast<uintptr_t>(grad_y) % (v * sizeof(T)) == 0) return v;
    return 1;
}

}  // namespace

template <typename T>
cudaError_t csr_rows_scatter(const CsrRows& a, const T* values, const T* grad_y, int64_t ldg, float* grad_x,
                             int64_t n, cudaStream_t stream) {
    if (a.num_rows == 0 || n == 0) return cudaSuccess;
    switch (row_vector(grad_y, ldg, n)) {
        case 4:
            return launch_lanes<T, 4>(a, values, grad_y, ldg, grad_x, n, stream);
        case 2:
            return launch_lanes<T, 2>(a, values, grad_y, ldg, grad_x, n, stream);
        default:
            return launch_lanes<T, 1>(a, values, grad_y, ldg, grad_x, n, stream);
    }
}

#define TCSPARSE_INSTANTIATE_CSR_ROWS_SCATTER(T)                                                                 \
    template cudaError_t csr_rows_scatter<T>(const CsrRows&, const T*, const T*, int64_t, float*, int64_t, \
                                             cudaStream_t);
TCSPARSE_INSTANTIATE_CSR_ROWS_SCATTER(float)
TCSPARSE_INSTANTIATE_CSR_ROWS_SCATTER(__half)
TCSPARSE_INSTANTIATE_CSR_ROWS_SCATTER(__nv_bfloat16)

}  // namespace tcsparse
