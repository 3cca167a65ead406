// The grouped Tensor-Core SpMM (grouped_spmm.h): one warp per (chunk of a group's blocks, G of
// the group's windows, slice of output columns). Per block the warp gathers the rows of X of the
// block's 8 columns once (as the ME-TCF kernels do, metcf_spmm.cuh) and multiplies them by the
// lane's A fragments of G sub-blocks, one per window: the gathers, which bound these kernels, are
// shared by G windows. Everything goes through the warp's own cp.async ring, as in the ME-TCF
// kernels, so warps never wait for each other.
#include "grouped_spmm.h"
#include "metcf_spmm.cuh"

namespace tcsparse {
namespace {

// Windows per warp: G windows of accumulators (16 floats per window per lane for fp32's 32
// columns, 32 for a 16-bit type's 64) must fit next to the ring's addresses in the registers of 4
// blocks per SM (128 per thread): 4 windows for fp32, 2 for 16-bit types (a group then takes
// two warps per slice).
template <typename T>
constexpr int kWindowsPerWarp = sizeof(T) == 4 ? 4 : 2;
constexpr int kGroupedStages = 4;
constexpr int kGroupedBlocksPerSm = 4;

template <int G, int S>
struct alignas(16) GroupRing {
    uint4 x[S][2][1][32];   // rows of X of the lane's two block columns (one step of columns)
    float a[S][G][4][32];   // the lane's fragment entries of each window's sub-block
};

// What a lane needs to start the copies of one block: its two columns, and per window the
// sub-block's bitmap and first value.
template <int G>
struct GroupMeta {
    int32_t col[2];
    uint4 bits[G];
    int32_t offset[G];
};

template <typename T, int G>
__device__ __forceinline__ GroupMeta<G> load_group_meta(const GroupedArrays& a, int64_t b, int64_t re, int window0,
                                                        int t) {
    GroupMeta<G> m;
    m.col[0] = m.col[1] = -1;
#pragma unroll
    for (int r = 0; r < G; ++r) {
        m.bits[r] = make_uint4(0, 0, 0, 0);
        m.offset[r] = 0;
    }
    if (b < re) {
        m.col[0] = __ldg(a.block_cols + b * kBlockCols + Element<T>::block_col(t, 0));
        m.col[1] = __ldg(a.block_cols + b * kBlockCols + Element<T>::block_col(t, 1));
        const int64_t sub = b * kGroupWindows + window0;
#pragma unroll
        for (int r = 0; r < G; ++r) {
            m.bits[r] = __ldg(reinterpret_cast<const uint4*>(a.bitmaps) + sub + r);
            m.offset[r] = __ldg(a.sub_offsets + sub + r);
        }
    }
    return m;
}

template <typename T, int G, int S, bool kVec>
__device__ __forceinline__ void issue_group_block(GroupRing<G, S>& ring, int stage, const GroupMeta<G>& m,
                                                  const float* __restrict__ values, const T* __restrict__ x, int64_t n,
                                                  int64_t nbase, int lane) {
    issue_x<T, 1, kVec>(ring.x[stage], m.col, x, n, nbase, lane);
#pragma unroll
    for (int r = 0; r < G; ++r) issue_fragment<T>(ring.a[stage][r], m.bits[r], m.offset[r], values, lane);
}

template <typename T, int G, int S, bool kVec, bool kSplit>
__global__ void __launch_bounds__(kThreads, kGroupedBlocksPerSm)
    grouped_spmm_kernel(GroupedArrays a, const float* __restrict__ values, const T* __restrict__ x,
                        float* __restrict__ out, int64_t n, int slices) {
    __shared__ GroupRing<G, S> rings[kWarps];
    constexpr int kParts = kGroupWindows / G;
    const int64_t item = global_warp();
    if (item >= a.num_chunks * kParts * slices) return;
    const int lane = threadIdx.x & 31, t = lane & 3;
    // Slices of one chunk side by side: they read the same sparse data, which L1 then serves.
    const int64_t c = item / (kParts * slices);
    const int window0 = static_cast<int>(item / slices % kParts) * G;
    const int64_t nbase = item % slices * kStep<T>;
    const int64_t rb = a.chunk_starts[c], re = a.chunk_starts[c + 1];
    GroupRing<G, S>& ring = rings[threadIdx.x >> 5];

    Acc<T, 1> acc[G];
#pragma unroll
    for (int r = 0; r < G; ++r) zero_acc<T, 1>(acc[r]);
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (rb + s < re)
            issue_group_block<T, G, S, kVec>(ring, s, load_group_meta<T, G>(a, rb + s, re, window0, t), values, x, n,
                                             nbase, lane);
        ptx::cp_async_commit();
    }
    GroupMeta<G> next = load_group_meta<T, G>(a, rb + S - 1, re, window0, t);
    int stage = 0, fill = S - 1;
    for (int64_t b = rb; b < re; ++b) {
        if (b + S - 1 < re) issue_group_block<T, G, S, kVec>(ring, fill, next, values, x, n, nbase, lane);
        ptx::cp_async_commit();
        next = load_group_meta<T, G>(a, b + S, re, window0, t);
        ptx::cp_async_wait<S - 1>();
#pragma unroll
        for (int r = 0; r < G; ++r) {
            const float e[4] = {ring.a[stage][r][0][lane], ring.a[stage][r][1][lane], ring.a[stage][r][2][lane],
                                ring.a[stage][r][3][lane]};
            const Tile<T, kSplit> tile(e);
            tile.multiply(acc[r][0], ring.x[stage][0][0][lane], ring.x[stage][1][0][lane]);
        }
        stage = stage + 1 == S ? 0 : stage + 1;
        fill = fill + 1 == S ? 0 : fill + 1;
    }
    ptx::cp_async_wait<0>();
    const int64_t slot0 = static_cast<int64_t>(a.chunk_group[c]) * kGroupRows + window0 * 16;
#pragma unroll
    for (int r = 0; r < G; ++r)
        store_tile<T, 16, 1, kVec>(acc[r], StoreMode::kAtomic, nullptr, out, a.row_map, slot0 + 16 * r, n, nbase,
                                   lane);
}

template <typename T, typename Launch>
cudaError_t grouped_dispatch(bool vec, Precision precision, Launch&& launch) {
    const bool split = sizeof(T) == 4 && precision == Precision::kTF32x3;
    return TCS_BOOL_SWITCH(vec, kVec, [&] {
        return TCS_BOOL_SWITCH(split, kSplit, [&] {
            if constexpr (kSplit && sizeof(T) != 4) {
                return cudaErrorInvalidValue;
            } else {
                return launch.template operator()<kVec, kSplit>();
            }
        });
    });
}

template <typename T>
struct GroupedLaunch {
    const GroupedArrays& a;
    const float* values;
    const T* x;
    float* out;
    int64_t n;
    cudaStream_t stream;
    template <bool kVec, bool kSplit>
    cudaError_t operator()() const {
        constexpr int G = kWindowsPerWarp<T>;
        const int64_t slices = ceil_div(n, kStep<T>);
        const int64_t grid = ceil_div(a.num_chunks * (kGroupWindows / G) * slices, kWarps);
        if (grid > 0x7fffffffll) return cudaErrorInvalidConfiguration;
        grouped_spmm_kernel<T, G, kGroupedStages, kVec, kSplit>
            <<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a, values, x, out, n, static_cast<int>(slices));
        return cudaGetLastError();
    }
};

}  // namespace

template <typename T>
cudaError_t grouped_spmm(const GroupedArrays& a, const float* values, const T* x, float* out, int64_t n,
                         Precision precision, cudaStream_t stream) {
    if (a.num_chunks == 0 || n == 0) return cudaSuccess;
    const bool vec = n % kPerCopy<T> == 0 && aligned16(x) && aligned16(out);
    return grouped_dispatch<T>(vec, precision, GroupedLaunch<T>{a, values, x, out, n, stream});
}

template cudaError_t grouped_spmm<float>(const GroupedArrays&, const float*, const float*, float*, int64_t, Precision,
                                         cudaStream_t);
template cudaError_t grouped_spmm<__half>(const GroupedArrays&, const float*, const __half*, float*, int64_t,
                                          Precision, cudaStream_t);
template cudaError_t grouped_spmm<__nv_bfloat16>(const GroupedArrays&, const float*, const __nv_bfloat16*, float*,
                                                 int64_t, Precision, cudaStream_t);

}  // namespace tcsparse
