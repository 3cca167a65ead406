// The backward of the max/min SpMM (reduce_rows.h): every output's gradient goes to the one
// nonzero that won it, k = winners[i, c]: dX[col[k], c] += values[k] * dY[i, c] and d(values)[k]
// += X[col[k], c] * dY[i, c], summed in fp32 by atomics.
//
// Why a scatter by atomics: it adds once per output of Y, each add landing on the row of X that
// won, where torch's accumulating index_put_ sorts all of those adds first (int64 keys, several
// passes) and a gather over the transpose would read a winner per nonzero and column, the mean
// degree times the winners this reads. A hub column's adds queue on its row of dX, one per row
// it won, no more than its nonzeros per address. The order of the adds is not fixed, so the sums
// may differ in their last bits between runs; deterministic mode takes the torch ops instead.
//
// One thread per V consecutive outputs of a row: V = 4 where N is a multiple of 4 and the rows of
// dY and the winners start 16-byte aligned (one vector load of each), else 1. A thread whose V
// outputs share one winner adds them to dX in one 16-byte atomic on sm_90, and it adds each run of
// equal winners to the values' gradient once: a row with one nonzero, or columns won by one
// neighbour, then costs a quarter of the atomics.
#include "reduce_rows.h"

#include <algorithm>

#include "loads.cuh"

namespace tcsparse {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill any GPU many times over; the threads stride over the rest.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

template <int V>
__device__ __forceinline__ void load_winners(const int32_t* __restrict__ p, int32_t (&out)[V]) {
    if constexpr (V == 4) {
        const int4 w = __ldg(reinterpret_cast<const int4*>(p));
        out[0] = w.x, out[1] = w.y, out[2] = w.z, out[3] = w.w;
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = __ldg(p + v);
    }
}

// p[0..3] += a * g[0..3] (p 16-byte aligned): one vector atomic where the GPU has it (sm_90).
__device__ __forceinline__ void add4(float* p, float a, const float (&g)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(p), make_float4(a * g[0], a * g[1], a * g[2], a * g[3]));
#else
#pragma unroll
    for (int v = 0; v < 4; ++v) atomicAdd(p + v, a * g[v]);
#endif
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreadsPerBlock)
    reduce_rows_backward_kernel(const T* __restrict__ grad_y, const int32_t* __restrict__ winners,
                                const int32_t* __restrict__ col, const T* __restrict__ values,
                                const T* __restrict__ x, int64_t ldx, int64_t num_rows, int64_t n,
                                float* __restrict__ grad_x, float* __restrict__ grad_values) {
    const int64_t groups = (n + V - 1) / V;  // V divides n where V > 1
    const int64_t total = num_rows * groups;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += stride) {
        const int64_t row = t / groups;
        const int64_t c0 = (t - row * groups) * V;
        const int64_t at = row * n + c0;
        int32_t win[V];
        float g[V];
        load_winners<V>(winners + at, win);
        load_row<T, V>(grad_y + at, g);
        int64_t j[V];
        bool shared = true;  // every output of the thread has the same winner
#pragma unroll
        for (int v = 0; v < V; ++v) {
            j[v] = win[v] >= 0 ? __ldg(col + win[v]) : -1;
            shared = shared && win[v] == win[0];
        }
        if (grad_x != nullptr) {
            bool added = false;
            if constexpr (V == 4) {
                if (shared && win[0] >= 0) {
                    add4(grad_x + j[0] * n + c0, load_float(values + win[0]), g);
                    added = true;
                }
            }
            if (!added) {
#pragma unroll
                for (int v = 0; v < V; ++v)
                    if (win[v] >= 0) atomicAdd(grad_x + j[v] * n + c0 + v, load_float(values + win[v]) * g[v]);
            }
        }
        if (grad_values != nullptr) {
            int32_t run = -1;
            float sum = 0.f;
#pragma unroll
            for (int v = 0; v < V; ++v) {
                if (win[v] < 0) continue;
                const float p = load_float(x + j[v] * ldx + c0 + v) * g[v];
                if (win[v] == run) {
                    sum += p;
                } else {
                    if (run >= 0) atomicAdd(grad_values + run, sum);
                    run = win[v];
                    sum = p;
                }
            }
            if (run >= 0) atomicAdd(grad_values + run, sum);
        }
    }
}

template <typename T, int V>
cudaError_t launch(const T* grad_y, const int32_t* winners, const int32_t* col, const T* values, const T* x,
                   int64_t ldx, int64_t num_rows, int64_t n, float* grad_x, float* grad_values, cudaStream_t stream) {
    const int64_t threads = num_rows * ((n + V - 1) / V);
    const int64_t blocks = std::min((threads + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxBlocks);
    reduce_rows_backward_kernel<T, V><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
        grad_y, winners, col, values, x, ldx, num_rows, n, grad_x, grad_values);
    return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t reduce_rows_backward(const T* grad_y, const int32_t* winners, const int32_t* col, const T* values,
                                 const T* x, int64_t ldx, int64_t num_rows, int64_t n, bool vector_rows,
                                 float* grad_x, float* grad_values, cudaStream_t stream) {
    if (num_rows == 0 || n == 0 || (grad_x == nullptr && grad_values == nullptr)) return cudaSuccess;
    if (vector_rows && n % 4 == 0)
        return launch<T, 4>(grad_y, winners, col, values, x, ldx, num_rows, n, grad_x, grad_values, stream);
    return launch<T, 1>(grad_y, winners, col, values, x, ldx, num_rows, n, grad_x, grad_values, stream);
}

#define TCSPARSE_INSTANTIATE_REDUCE_ROWS_BACKWARD(T)                                                          \
    template cudaError_t reduce_rows_backward<T>(const T*, const int32_t*, const int32_t*, const T*, const T*, \
                                                 int64_t, int64_t, int64_t, bool, float*, float*, cudaStream_t);
TCSPARSE_INSTANTIATE_REDUCE_ROWS_BACKWARD(float)
TCSPARSE_INSTANTIATE_REDUCE_ROWS_BACKWARD(__half)
TCSPARSE_INSTANTIATE_REDUCE_ROWS_BACKWARD(__nv_bfloat16)

}  // namespace tcsparse
