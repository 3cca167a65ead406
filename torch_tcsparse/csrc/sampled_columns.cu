#include "sampled_columns.h"

namespace tcsparse {
namespace {

constexpr int kThreads = 256;

template <typename I>
__global__ void sort_row_sources_kernel(const I* __restrict__ rowptr, int64_t num_rows,
                                        const int64_t* __restrict__ source, I* __restrict__ col) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (row >= num_rows) return;
    const int64_t begin = rowptr[row], end = rowptr[row + 1];
    for (int64_t i = begin; i < end; ++i) {
        const int64_t mine = __ldg(source + i);
        int64_t rank = 0;
        for (int64_t j = begin; j < end; ++j) {
            const int64_t other = __ldg(source + j);
            rank += other < mine || (other == mine && j < i);
        }
        col[begin + rank] = static_cast<I>(mine);
    }
}

}  // namespace

template <typename I>
cudaError_t sort_row_sources(const I* rowptr, int64_t num_rows, const int64_t* source, I* col, cudaStream_t stream) {
    if (num_rows == 0) return cudaSuccess;
    const int64_t blocks = (num_rows + kThreads - 1) / kThreads;
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    sort_row_sources_kernel<I><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(rowptr, num_rows, source, col);
    return cudaGetLastError();
}

template cudaError_t sort_row_sources<int32_t>(const int32_t*, int64_t, const int64_t*, int32_t*, cudaStream_t);
template cudaError_t sort_row_sources<int64_t>(const int64_t*, int64_t, const int64_t*, int64_t*, cudaStream_t);

}  // namespace tcsparse
