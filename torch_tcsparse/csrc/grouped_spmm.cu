// The grouped Tensor-Core SpMM (grouped_spmm.h): one warp per (chunk of a group's blocks, slice of
// 32 output columns). Per block the warp gathers the rows of X of the block's 8 columns once (as
// the ME-TCF kernels do, metcf_spmm.cuh) and multiplies them by the lane's A fragments of the
// group's four sub-blocks, one per window: each gather serves four windows. Everything goes
// through the warp's own cp.async ring, as in the ME-TCF kernels, so warps never wait for each
// other.
//
// Every copy is four elements of T (16 bytes for fp32, 8 for 16-bit types): of a row of X, and of
// a lane's fragment, which the layout stores fragment by fragment (formats/grouped.py). The
// ME-TCF kernels copy 16 bytes, 8 elements of a 16-bit type; here that would double the
// accumulators (32 floats per window), and four windows of them would not fit the registers.
// With four elements per copy, a warp's step is 32 columns and its accumulators 16 floats per
// window for every type, and the lane owns output columns 8t .. 8t + 7 of the step as for fp32
// (store_tile<float>).
#include <type_traits>

#include "grouped_spmm.h"
#include "metcf_spmm.cuh"

namespace tcsparse {
namespace {

constexpr int kGroupedBlocksPerSm = 4;
constexpr int kQuad = 4;                   // elements of T per copy
constexpr int kGroupedStep = 8 * kQuad;    // output columns per warp: 8 lane groups x 4 elements

// Four elements of T in one copy.
template <typename T>
using Quad = std::conditional_t<sizeof(T) == 4, uint4, uint2>;

template <typename T, int S>
struct alignas(16) GroupRing {
    Quad<T> x[S][2][32];              // rows of X of the lane's two block columns
    Quad<T> a[S][kGroupWindows][32];  // the lane's fragment of each window's sub-block
};

// Stages: four float32 rings fill a thread block's 48 KB of static shared memory. A 16-bit stage
// is half the size, but 8 stages ran no faster than 4 (H200, N = 128: ogbl-ddi 0.060 against
// 0.059 ms, the ordered SBM 0.756 against 0.747 ms).
constexpr int kGroupedStages = 4;

// What a lane needs to start the copies of one block: its two columns and each window's
// fragment slot (-1: the window has no nonzero in the block).
struct GroupMeta {
    int32_t col[2];
    int32_t slot[kGroupWindows];
};

__device__ __forceinline__ GroupMeta load_group_meta(const GroupedArrays& a, int64_t b, int64_t re, int t,
                                                     int col0, int col1) {
    GroupMeta m{{-1, -1}, {-1, -1, -1, -1}};
    if (b < re) {
        m.col[0] = __ldg(a.block_cols + b * kBlockCols + col0);
        m.col[1] = __ldg(a.block_cols + b * kBlockCols + col1);
        const int4 v = __ldg(reinterpret_cast<const int4*>(a.sub_slots) + b);
        m.slot[0] = v.x, m.slot[1] = v.y, m.slot[2] = v.z, m.slot[3] = v.w;
    }
    return m;
}

// One copy of four elements from src into dst; zero-filled when !valid (nothing read).
template <typename T>
__device__ __forceinline__ void copy_quad(Quad<T>* dst, const T* src, bool valid, const T* any) {
    if constexpr (sizeof(Quad<T>) == 16) {
        ptx::cp_async_16(dst, valid ? src : any, valid ? 16 : 0);
    } else {
        ptx::cp_async_8(dst, valid ? src : any, valid ? 8 : 0);
    }
}

// Start the copies of the rows of X of the lane's two block columns (-1: padding) at the lane's
// four columns of the step, zero past n: one copy each with kVec (n a multiple of 4, X 16-byte
// aligned), else element by element.
template <typename T, bool kVec>
__device__ __forceinline__ void issue_x_quads(Quad<T> (&dst)[2][32], const int32_t (&cols)[2],
                                              const T* __restrict__ x, int64_t n, int64_t nbase, int lane) {
    const int64_t c0 = nbase + kQuad * (lane >> 2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int32_t col = cols[h];
        const T* row = x + static_cast<int64_t>(col < 0 ? 0 : col) * n;
        if constexpr (kVec) {
            copy_quad<T>(&dst[h][lane], row + c0, col >= 0 && c0 < n, x);
        } else {
            copy_elements<T, kQuad>(&dst[h][lane], row, c0, n, col >= 0, x);
        }
    }
}

template <typename T, int S, bool kVec>
__device__ __forceinline__ void issue_group_block(GroupRing<T, S>& ring, int stage, const GroupMeta& m,
                                                  const T* __restrict__ fragments, const T* __restrict__ x, int64_t n,
                                                  int64_t nbase, int lane) {
    issue_x_quads<T, kVec>(ring.x[stage], m.col, x, n, nbase, lane);
#pragma unroll
    for (int r = 0; r < kGroupWindows; ++r) {
        const bool present = m.slot[r] >= 0;
        const int64_t first = present ? static_cast<int64_t>(m.slot[r]) * kFragmentEntries + kQuad * lane : 0;
        copy_quad<T>(&ring.a[stage][r][lane], fragments + first, present, fragments);
    }
}

template <typename T, int S, bool kVec, bool kSplit>
__global__ void __launch_bounds__(kThreads, kGroupedBlocksPerSm)
    grouped_spmm_kernel(GroupedArrays a, const T* __restrict__ fragments, const T* __restrict__ x,
                        float* __restrict__ out, int64_t n, int slices) {
    __shared__ GroupRing<T, S> rings[kWarps];
    const int64_t item = global_warp();
    if (item >= a.num_chunks * slices) return;
    const int lane = threadIdx.x & 31, t = lane & 3;
    const int col0 = Element<T>::block_col(t, 0), col1 = Element<T>::block_col(t, 1);
    // Slices of one chunk side by side: they read the same sparse data, which L1 then serves.
    const int64_t c = item / slices;
    const int64_t nbase = item % slices * kGroupedStep;
    const int64_t rb = a.chunk_starts[c], re = a.chunk_starts[c + 1];
    GroupRing<T, S>& ring = rings[threadIdx.x >> 5];

    Acc<float, 1> acc[kGroupWindows];
#pragma unroll
    for (int r = 0; r < kGroupWindows; ++r) zero_acc<float, 1>(acc[r]);
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (rb + s < re)
            issue_group_block<T, S, kVec>(ring, s, load_group_meta(a, rb + s, re, t, col0, col1), fragments, x, n,
                                          nbase, lane);
        ptx::cp_async_commit();
    }
    GroupMeta next = load_group_meta(a, rb + S - 1, re, t, col0, col1);
    int stage = 0, fill = S - 1;
    for (int64_t b = rb; b < re; ++b) {
        if (b + S - 1 < re) issue_group_block<T, S, kVec>(ring, fill, next, fragments, x, n, nbase, lane);
        ptx::cp_async_commit();
        next = load_group_meta(a, b + S, re, t, col0, col1);
        ptx::cp_async_wait<S - 1>();
#pragma unroll
        for (int r = 0; r < kGroupWindows; ++r) {
            const Tile<T, kSplit> tile(ring.a[stage][r][lane]);
            tile.multiply(acc[r][0], ring.x[stage][0][lane], ring.x[stage][1][lane]);
        }
        stage = stage + 1 == S ? 0 : stage + 1;
        fill = fill + 1 == S ? 0 : fill + 1;
    }
    ptx::cp_async_wait<0>();
    const int64_t slot0 = static_cast<int64_t>(a.chunk_group[c]) * kGroupRows;
#pragma unroll
    for (int r = 0; r < kGroupWindows; ++r)
        store_tile<float, 16, 1, kVec>(acc[r], StoreMode::kAtomic, nullptr, out, a.row_map, slot0 + 16 * r, n, nbase,
                                       lane);
}

}  // namespace

template <typename T>
cudaError_t grouped_spmm(const GroupedArrays& a, const T* fragments, const T* x, float* out, int64_t n,
                         Precision precision, cudaStream_t stream) {
    if (a.num_chunks == 0 || n == 0) return cudaSuccess;
    // n % 4 == 0 keeps every copy of X and every float4 atomic of the sums inside its row.
    const bool vec = n % kQuad == 0 && aligned16(x) && aligned16(out);
    const bool split = sizeof(T) == 4 && precision == Precision::kTF32x3;
    const int64_t slices = ceil_div(n, kGroupedStep);
    const int64_t grid = ceil_div(a.num_chunks * slices, kWarps);
    if (grid > 0x7fffffffll) return cudaErrorInvalidConfiguration;
    return TCS_BOOL_SWITCH(vec, kVec, [&] {
        return TCS_BOOL_SWITCH(split, kSplit, [&] {
            if constexpr (kSplit && sizeof(T) != 4) {
                return cudaErrorInvalidValue;
            } else {
                grouped_spmm_kernel<T, kGroupedStages, kVec, kSplit><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
                    a, fragments, x, out, n, static_cast<int>(slices));
                return cudaGetLastError();
            }
        });
    });
}

template cudaError_t grouped_spmm<float>(const GroupedArrays&, const float*, const float*, float*, int64_t, Precision,
                                         cudaStream_t);
template cudaError_t grouped_spmm<__half>(const GroupedArrays&, const __half*, const __half*, float*, int64_t,
                                          Precision, cudaStream_t);
template cudaError_t grouped_spmm<__nv_bfloat16>(const GroupedArrays&, const __nv_bfloat16*, const __nv_bfloat16*,
                                                 float*, int64_t, Precision, cudaStream_t);

}  // namespace tcsparse
