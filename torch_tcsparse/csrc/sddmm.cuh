// SDDMM on ME-TCF: the gradient of the values of Y = A @ X is, for each nonzero (r, c),
// <dY[r], X[c]>. One warp per TC block: the block's window is found once by binary search, then
// each of its nonzeros is a dot product over n (summed in fp32) with the lanes striding the columns.
#pragma once

#include "elements.cuh"
#include "metcf_spmm.h"

namespace tcsparse {
namespace sddmm_detail {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 8;

template <typename T, bool kVec>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    metcf_sddmm_kernel(MetcfArrays a, const T* __restrict__ grad_y, const T* __restrict__ x, float* __restrict__ out,
                       int64_t n) {
    constexpr int E = Element<T>::kPerCopy;
    const int lane = threadIdx.x & 31;
    const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (b >= a.num_blocks) return;
    // The window holding block b: the last w with window_offsets[w] <= b.
    int64_t lo = 0, hi = a.num_windows;
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) >> 1;
        if (a.window_offsets[mid] <= b) lo = mid; else hi = mid;
    }
    const int64_t p0 = a.block_offsets[b], p1 = a.block_offsets[b + 1];
    for (int64_t p = p0; p < p1; ++p) {
        const int id = a.local_ids[p];
        const int64_t row = a.row_map[lo * a.window + (id >> 3)];
        const int64_t col = a.block_cols[b * 8 + (id & 7)];
        float sum = 0.f;
        if (row >= 0 && col >= 0) {
            const T* gy = grad_y + row * n;
            const T* xr = x + col * n;
            if constexpr (kVec) {
                for (int64_t c = E * lane; c < n; c += 32 * E) {
                    sum += Element<T>::dot(__ldg(reinterpret_cast<const uint4*>(gy + c)),
                                           __ldg(reinterpret_cast<const uint4*>(xr + c)));
                }
            } else {
                for (int64_t c = lane; c < n; c += 32) sum += Element<T>::to_float(gy[c]) * Element<T>::to_float(xr[c]);
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullMask, sum, offset);
        if (lane == 0) out[p] = sum;
    }
}

}  // namespace sddmm_detail

template <typename T>
cudaError_t metcf_sddmm(const MetcfArrays& a, const T* grad_y, const T* x, float* out, int64_t n,
                        cudaStream_t stream) {
    using namespace sddmm_detail;
    if (a.num_blocks == 0) return cudaSuccess;
    const int64_t grid = (a.num_blocks + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (grid > 0x7fffffffll) return cudaErrorInvalidConfiguration;
    const bool vec = n % Element<T>::kPerCopy == 0 && (reinterpret_cast<uintptr_t>(grad_y) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    const auto kernel = vec ? metcf_sddmm_kernel<T, true> : metcf_sddmm_kernel<T, false>;
    kernel<<<static_cast<unsigned>(grid), kWarpsPerBlock * 32, 0, stream>>>(a, grad_y, x, out, n);
    return cudaGetLastError();
}

}  // namespace tcsparse
