// The grouped Tensor-Core SpMM (grouped_spmm.h): one warp per (chunk of a group's blocks, slice of
// 32 output columns). Per block the warp gathers the rows of X of the block's 8 columns once (as
// the ME-TCF kernels do, metcf_spmm.cuh) and multiplies them by the group's four 16 x 8
// sub-blocks, one per window: each gather serves four windows. Everything goes through the warp's
// own cp.async ring, as in the ME-TCF kernels, so warps never wait for each other.
//
// The warp copies what a step needs as a whole, in 16-byte pieces split among its lanes: the
// block's 8 rows of X at the slice's 32 columns (one or two pieces per lane) and each window's
// fragment slot as the layout stores it (formats/grouped.py; a quarter warp per window). A lane
// then reads its operands out of what other lanes copied: fp32 B operands as 16-byte words of
// the tile, 16-bit ones through ldmatrix (transposed), which hands each lane its B operands
// directly. Against each lane copying its own operands, that takes half the copies and one
// address per lane and step instead of six for 16-bit types, and fewer instructions per step.
// Lanes read each other's copies, so the warp syncs after its wait and before it refills a stage.
//
// 16-bit types take two blocks per step, one m16n8k16 per window and n-tile (kStepBlocks): faster
// than one block per step with m16n8k8 on all but one measured layout (docs/DECISIONS.md).
//
// Where every group is one chunk (band matrices) and Y is 16-bit, the warps round their rows
// into Y themselves (kDirect): the zeroed fp32 sums and the rounding launch cost more than the
// kernel's own time saves there. Not elsewhere: a last-arriving chunk that rounds its group needs
// a fence after its atomics, which slows the 16-bit kernel more than the rounding launch costs;
// and float32 stores ran slower than atomics into zeroed rows (docs/DECISIONS.md).
#include <algorithm>
#include <type_traits>

#include "grouped_spmm.h"
#include "metcf_spmm.cuh"

namespace tcsparse {
namespace {

constexpr int kGroupedBlocksPerSm = 4;
constexpr int kGroupedStep = 32;  // output columns per warp

// 16-byte pieces (kPerCopy<T> elements each) of a row of X in a step, and of a fragment slot.
template <typename T>
constexpr int kRowChunks = kGroupedStep / kPerCopy<T>;  // 8 fp32, 4 16-bit
template <typename T>
constexpr int kSlotChunks = kFragmentEntries / kPerCopy<T>;  // 32 fp32, 16 16-bit
// Blocks per step: 16-bit types take two consecutive blocks of the chunk through one m16n8k16 per
// window and n-tile (the first block's columns are k < 8), so a step copies as many bytes as an
// fp32 step and the loop's fixed work per block halves.
template <typename T>
constexpr int kStepBlocks = sizeof(T) == 4 ? 1 : 2;

template <typename T, int S>
struct alignas(16) GroupRing {
    // the step's rows of X, 8 per block, row-major (x_chunk)
    uint4 x[S][kStepBlocks<T> * kBlockCols * kRowChunks<T>];
    // fragment slot of window w of the step's block h at [h * kGroupWindows + w], as stored
    uint4 a[S][kStepBlocks<T> * kGroupWindows][kSlotChunks<T>];
};

// Stages: four rings of either type fill a thread block's 48 KB of static shared memory; 8 stages
// ran no faster than 4.
constexpr int kGroupedStages = 4;

// Where piece c of row r of a step's tile of X lies. Swizzled so that the reads of one shared
// memory wavefront hit 8 distinct 16-byte bank groups: for fp32 a quarter warp's 16-byte words
// (rows t, pieces g in {0, 1} or {2, 3}, ...), for 16-bit types the 8 rows of one ldmatrix matrix.
template <typename T>
__device__ __forceinline__ int x_chunk(int r, int c) {
    if constexpr (sizeof(T) == 4) {
        return r * kRowChunks<T> + (c ^ ((2 * r) & 7));
    } else {
        return r * kRowChunks<T> + (c ^ ((r >> 1) & 3));
    }
}

// What a lane copies for the step of blocks b .. b + P - 1: row (lane * P / 4) of the step's
// tile of X (its column, -1 for padding) and part of fragment slot (lane * P / 8) of the step
// (-1: that window has no nonzero in that block). Both lie in block b + lane * P / 32, and the
// blocks' columns and slots are consecutive in block_cols and sub_slots. A block past the chunk's
// end (re) counts as empty.
struct GroupMeta {
    int32_t col;
    int32_t slot;
};

template <int P>
__device__ __forceinline__ GroupMeta load_group_meta(const GroupedArrays& a, int64_t b, int64_t re, int lane) {
    GroupMeta m{-1, -1};
    if (b + lane * P / 32 < re) {
        m.col = __ldg(a.block_cols + b * kBlockCols + lane * P / 4);
        m.slot = __ldg(a.sub_slots + b * kGroupWindows + lane * P / 8);
    }
    return m;
}

// Start the lane's copies of one step into `stage`: with L = 4 / P lanes per row of X, pieces
// (lane % L) + L i of its row, zero past n or for padding (whole pieces with kVec: n a multiple of
// a piece, X 16-byte aligned; else element by element), and with L' = 8 / P lanes per slot,
// pieces (lane % L') + L' i of its fragment slot (zero for an empty sub-block).
template <typename T, int S, bool kVec>
__device__ __forceinline__ void issue_group_step(GroupRing<T, S>& ring, int stage, const GroupMeta& m,
                                                 const T* __restrict__ fragments, const T* __restrict__ x, int64_t n,
                                                 int64_t nbase, int lane) {
    constexpr int E = kPerCopy<T>, P = kStepBlocks<T>;
    constexpr int kRowLanes = 4 / P, kSlotLanes = 8 / P;
    const int r = lane / kRowLanes;
    const T* row = x + static_cast<int64_t>(m.col < 0 ? 0 : m.col) * n;
#pragma unroll
    for (int i = 0; i < kRowChunks<T> / kRowLanes; ++i) {
        const int c = lane % kRowLanes + kRowLanes * i;
        const int64_t c0 = nbase + E * c;
        uint4* dst = &ring.x[stage][x_chunk<T>(r, c)];
        if constexpr (kVec) {
            const bool ok = m.col >= 0 && c0 < n;
            ptx::cp_async_16(dst, ok ? row + c0 : x, ok ? 16 : 0);
        } else {
            copy_elements<T>(dst, row, c0, n, m.col >= 0, x);
        }
    }
    // The lanes of a slot copy 16 * L' contiguous bytes of it per instruction.
    const T* slot = fragments + (m.slot < 0 ? 0 : static_cast<int64_t>(m.slot) * kFragmentEntries);
#pragma unroll
    for (int i = 0; i < kSlotChunks<T> / kSlotLanes; ++i) {
        const int piece = lane % kSlotLanes + kSlotLanes * i;
        ptx::cp_async_16(&ring.a[stage][lane / kSlotLanes][piece], slot + E * piece, m.slot >= 0 ? 16 : 0);
    }
}

// The products of one step for the four windows. fp32: lane (g, t) takes piece g of rows t and
// t + 4 (B operands of 4 n-tiles whose columns interleave, as store_tile<float> expects). 16-bit:
// ldmatrix reads n-tile i of each block from piece i of its 8 rows, and each window's two
// fragments (one per block) make the m16n8k16's A.
template <typename T, int S, bool kSplit>
__device__ __forceinline__ void multiply_group_step(const GroupRing<T, S>& ring, int stage, Acc<float, 1> (&acc)[kGroupWindows],
                                                    int lane) {
    if constexpr (sizeof(T) == 4) {
        const int g = lane >> 2, t = lane & 3;
        const uint4 x0 = ring.x[stage][x_chunk<T>(t, g)], x1 = ring.x[stage][x_chunk<T>(t + 4, g)];
#pragma unroll
        for (int r = 0; r < kGroupWindows; ++r) Tile<float, kSplit>(ring.a[stage][r][lane]).multiply(acc[r][0], x0, x1);
    } else {
        uint32_t b0[4], b1[4];
        ptx::ldmatrix_x4_trans(b0, &ring.x[stage][x_chunk<T>(lane & 7, lane >> 3)]);
        ptx::ldmatrix_x4_trans(b1, &ring.x[stage][x_chunk<T>(8 + (lane & 7), lane >> 3)]);
#pragma unroll
        for (int r = 0; r < kGroupWindows; ++r) {
            const uint2 f0 = reinterpret_cast<const uint2*>(ring.a[stage][r])[lane];
            const uint2 f1 = reinterpret_cast<const uint2*>(ring.a[stage][kGroupWindows + r])[lane];
            const uint32_t a[4] = {f0.x, f0.y, f1.x, f1.y};
#pragma unroll
            for (int i = 0; i < 4; ++i) Element<T>::mma16(acc[r][0][i], a, b0[i], b1[i]);
        }
    }
}

// Writes columns c and c + 1 (`both`: c + 1 < n) of a row at p: added into fp32 sums (kAtomic)
// or rounded into a 16-bit Y. kVec: n a multiple of 8 and the row 16-byte aligned, so the pair is
// one aligned word.
template <bool kAtomic, bool kVec, typename Out>
__device__ __forceinline__ void write_pair(Out* p, float lo, float hi, bool both) {
    if constexpr (kAtomic) {
        static_assert(std::is_same_v<Out, float>, "atomics add into fp32 sums");
        if constexpr (kVec) {
            ptx::atomic_add_f2(p, make_float2(lo, hi));
        } else {
            atomicAdd(p, lo);
            if (both) atomicAdd(p + 1, hi);
        }
    } else if constexpr (kVec) {
        *reinterpret_cast<uint32_t*>(p) = Element<Out>::pack2(lo, hi);
    } else {
        p[0] = Element<Out>::from_float(lo);
        if (both) p[1] = Element<Out>::from_float(hi);
    }
}

// Writes a 16-bit step's sums of one window (+ bias, when given): lane (g, t) holds rows g and
// g + 8 at columns 8i + 2t and 8i + 2t + 1 of the slice for n-tile i (the mma's layout of
// ldmatrix's columns).
template <bool kAtomic, bool kVec, typename Out, typename T>
__device__ __forceinline__ void write_pairs(const float (&acc)[4][4], Out* __restrict__ out, const T* __restrict__ bias,
                                            const int32_t* row_map, int64_t slot0, int64_t n, int64_t nbase,
                                            int lane) {
    const int g = lane >> 2, t = lane & 3;
    float b[4][2] = {};
    if (bias != nullptr) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int64_t c = nbase + 8 * i + 2 * t + e;
                b[i][e] = c < n ? Element<T>::to_float(bias[c]) : 0.f;
            }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int64_t row = row_map[slot0 + g + 8 * h];
        if (row < 0) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t c = nbase + 8 * i + 2 * t;
            if (c < n)
                write_pair<kAtomic, kVec>(out + row * n + c, acc[i][2 * h] + b[i][0], acc[i][2 * h + 1] + b[i][1],
                                          c + 1 < n);
        }
    }
}

// kDirect: every group is one chunk and T is 16-bit; the warp rounds its rows (+ bias) into y.
// Else it adds them into the fp32 sums `out`.
template <typename T, int S, bool kVec, bool kSplit, bool kDirect>
__global__ void __launch_bounds__(kThreads, kGroupedBlocksPerSm)
    grouped_spmm_kernel(GroupedArrays a, const T* __restrict__ fragments, const T* __restrict__ x,
                        float* __restrict__ out, T* __restrict__ y, const T* __restrict__ bias, int64_t n,
                        int slices) {
    __shared__ GroupRing<T, S> rings[kWarps];
    const int64_t item = global_warp();
    if (item >= a.num_chunks * slices) return;
    const int lane = threadIdx.x & 31;
    // Slices of one chunk side by side: they read the same sparse data, which L1 then serves.
    const int64_t c = item / slices;
    const int64_t nbase = item % slices * kGroupedStep;
    const int64_t rb = a.chunk_starts[c], re = a.chunk_starts[c + 1];
    GroupRing<T, S>& ring = rings[threadIdx.x >> 5];

    Acc<float, 1> acc[kGroupWindows];
#pragma unroll
    for (int r = 0; r < kGroupWindows; ++r) zero_acc<float, 1>(acc[r]);
    constexpr int P = kStepBlocks<T>;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (rb + P * s < re)
            issue_group_step<T, S, kVec>(ring, s, load_group_meta<P>(a, rb + P * s, re, lane), fragments, x, n, nbase,
                                         lane);
        ptx::cp_async_commit();
    }
    GroupMeta next = load_group_meta<P>(a, rb + P * (S - 1), re, lane);
    int stage = 0, fill = S - 1;
    for (int64_t b = rb; b < re; b += P) {
        __syncwarp();  // every lane has read the stage this refills
        if (b + P * (S - 1) < re) issue_group_step<T, S, kVec>(ring, fill, next, fragments, x, n, nbase, lane);
        ptx::cp_async_commit();
        next = load_group_meta<P>(a, b + P * S, re, lane);
        ptx::cp_async_wait<S - 1>();
        __syncwarp();  // and every lane's copies of this stage have landed
        multiply_group_step<T, S, kSplit>(ring, stage, acc, lane);
        stage = stage + 1 == S ? 0 : stage + 1;
        fill = fill + 1 == S ? 0 : fill + 1;
    }
    ptx::cp_async_wait<0>();
    const int64_t slot0 = static_cast<int64_t>(a.chunk_group[c]) * kGroupRows;
#pragma unroll
    for (int r = 0; r < kGroupWindows; ++r) {
        if constexpr (sizeof(T) == 4) {
            store_tile<float, 16, 1, kVec>(acc[r], StoreMode::kAtomic, nullptr, out, a.row_map, slot0 + 16 * r, n,
                                           nbase, lane);
        } else if constexpr (kDirect) {
            write_pairs<false, kVec>(acc[r][0], y, bias, a.row_map, slot0 + 16 * r, n, nbase, lane);
        } else {
            write_pairs<true, kVec>(acc[r][0], out, static_cast<const T*>(nullptr), a.row_map, slot0 + 16 * r, n,
                                    nbase, lane);
        }
    }
}

// y = the fp32 sums rounded to a 16-bit T, four at a time (count a multiple of 4, both aligned).
template <typename T>
__global__ void round_sums_kernel(const float4* __restrict__ sums, uint2* __restrict__ y, int64_t quads) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < quads; i += stride) {
        const float4 v = sums[i];
        y[i] = make_uint2(Element<T>::pack2(v.x, v.y), Element<T>::pack2(v.z, v.w));
    }
}

template <typename T>
__global__ void round_sums_scalar_kernel(const float* __restrict__ sums, T* __restrict__ y, int64_t count) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
        y[i] = Element<T>::from_float(sums[i]);
}

template <typename T>
cudaError_t round_sums(const float* sums, T* y, int64_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    constexpr int kRoundThreads = 256;
    const bool vec = count % 4 == 0 && aligned16(sums) && aligned16(y);
    const int64_t items = vec ? count / 4 : count;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(items, kRoundThreads), 8 * 1024));
    if (vec) {
        round_sums_kernel<T><<<blocks, kRoundThreads, 0, stream>>>(reinterpret_cast<const float4*>(sums),
                                                                   reinterpret_cast<uint2*>(y), items);
    } else {
        round_sums_scalar_kernel<T><<<blocks, kRoundThreads, 0, stream>>>(sums, y, items);
    }
    return cudaGetLastError();
}

template <typename T>
cudaError_t grouped_products(const GroupedArrays& a, const T* fragments, const T* x, float* out, T* y, const T* bias,
                             int64_t n, Precision precision, cudaStream_t stream) {
    if (a.num_chunks == 0 || n == 0) return cudaSuccess;
    // n a multiple of a 16-byte piece keeps every copy of X and every vector write of Y or the
    // sums inside its row.
    const bool vec = n % kPerCopy<T> == 0 && aligned16(x) && aligned16(out) && aligned16(y);
    const bool split = sizeof(T) == 4 && precision == Precision::kTF32x3;
    const int64_t slices = ceil_div(n, kGroupedStep);
    const int64_t grid = ceil_div(a.num_chunks * slices, kWarps);
    if (grid > 0x7fffffffll) return cudaErrorInvalidConfiguration;
    return TCS_BOOL_SWITCH(vec, kVec, [&] {
        return TCS_BOOL_SWITCH(split, kSplit, [&] {
            return TCS_BOOL_SWITCH(out == nullptr, kDirect, [&] {
                // The 3xTF32 split is fp32's, the direct rounding into Y 16-bit types'.
                constexpr bool kValid = sizeof(T) == 4 ? !kDirect : !kSplit;
                if constexpr (!kValid) {
                    return cudaErrorInvalidValue;
                } else {
                    grouped_spmm_kernel<T, kGroupedStages, kVec, kSplit, kDirect>
                        <<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a, fragments, x, out, y, bias, n,
                                                                               static_cast<int>(slices));
                    return cudaGetLastError();
                }
            });
        });
    });
}

}  // namespace

template <typename T>
cudaError_t grouped_spmm(const GroupedArrays& a, const T* fragments, const T* x, float* out, T* y, const T* bias,
                         int64_t num_rows, int64_t n, Precision precision, cudaStream_t stream) {
    if (out == nullptr && y == nullptr) return cudaErrorInvalidValue;
    const cudaError_t err = grouped_products(a, fragments, x, out, y, bias, n, precision, stream);
    if constexpr (sizeof(T) == 4) {
        return err;
    } else {
        return err != cudaSuccess || out == nullptr || y == nullptr ? err : round_sums(out, y, num_rows * n, stream);
    }
}

template cudaError_t grouped_spmm<float>(const GroupedArrays&, const float*, const float*, float*, float*,
                                         const float*, int64_t, int64_t, Precision, cudaStream_t);
template cudaError_t grouped_spmm<__half>(const GroupedArrays&, const __half*, const __half*, float*, __half*,
                                          const __half*, int64_t, int64_t, Precision, cudaStream_t);
template cudaError_t grouped_spmm<__nv_bfloat16>(const GroupedArrays&, const __nv_bfloat16*, const __nv_bfloat16*,
                                                 float*, __nv_bfloat16*, const __nv_bfloat16*, int64_t, int64_t,
                                                 Precision, cudaStream_t);

}  // namespace tcsparse
