#include "row_scale.h"

namespace tcsparse {
namespace {

constexpr int kThreads = 256;

template <typename I, typename T>
__global__ void row_scale_kernel(const I* __restrict__ rowptr, int64_t num_rows, int64_t nnz, T* __restrict__ scale) {
    const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (k >= nnz) return;
    // The last row r with rowptr[r] <= k: rowptr[0] = 0 <= k and rowptr[num_rows] = nnz > k bound
    // the search, and an empty row before r's is passed over (its successor starts where it does).
    int64_t low = 0, high = num_rows;
    while (high - low > 1) {
        const int64_t middle = low + (high - low) / 2;
        if (static_cast<int64_t>(__ldg(rowptr + middle)) <= k) {
            low = middle;
        } else {
            high = middle;
        }
    }
    scale[k] = T(1) / static_cast<T>(__ldg(rowptr + low + 1) - __ldg(rowptr + low));
}

}  // namespace

template <typename I, typename T>
cudaError_t row_scale(const I* rowptr, int64_t num_rows, int64_t nnz, T* scale, cudaStream_t stream) {
    if (nnz == 0) return cudaSuccess;
    const int64_t blocks = (nnz + kThreads - 1) / kThreads;
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    row_scale_kernel<I, T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(rowptr, num_rows, nnz, scale);
    return cudaGetLastError();
}

template cudaError_t row_scale<int32_t, float>(const int32_t*, int64_t, int64_t, float*, cudaStream_t);
template cudaError_t row_scale<int64_t, float>(const int64_t*, int64_t, int64_t, float*, cudaStream_t);
template cudaError_t row_scale<int32_t, double>(const int32_t*, int64_t, int64_t, double*, cudaStream_t);
template cudaError_t row_scale<int64_t, double>(const int64_t*, int64_t, int64_t, double*, cudaStream_t);

}  // namespace tcsparse
