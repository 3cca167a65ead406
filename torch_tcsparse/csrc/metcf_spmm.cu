// TF32 Tensor-Core SpMM on ME-TCF (DTC-SpMM, ASPLOS'24, sections 4.4 and 4.5.1), written anew.
//
// Work decomposition. The unit of work is one warp: a range of TC blocks of one row window times
// a slice of 32 * NV output columns. "base" gives each warp a whole window (each output row
// written once); "balanced" gives each warp of a persistent grid an equal share of all chunks
// (BALANCE_CHUNK TC blocks, never straddling windows), so hub windows spread over many warps and
// their partial rows are added atomically. Warps never wait for each other: each has its own
// shared-memory ring, and there is no block-wide barrier.
//
// Per TC block, per lane (g = lane / 4, t = lane % 4), all through cp.async into the warp's ring
// of S stages (registers hold no data in flight, so S - 1 blocks of gathers stay in flight):
//   - rows of X for the block's columns t and t + 4, 16 bytes per copy (DTC-SpMM gathers these
//     into registers, 4.4.1; an asynchronous copy keeps them in flight without registers);
//   - the lane's A fragment straight from the values: the block's 128-bit occupancy bitmap (bit
//     r * 8 + c set when entry (r, c) is a nonzero) gives, by popcount, where each fragment entry
//     sits among the block's values (stored in bit order), so no tile is scattered in shared
//     memory and absent entries are zero-filled by the copy.
// The metadata of a block (columns, bitmap, value offset) is loaded one step before its copies
// start, so its latency hides behind the current multiply.
//
// Column mapping (why one float4 per lane feeds 4 mma and stores come out as float4): lane (g, t)
// loads X[col[t]][c0 + 4g .. 4g+3] and X[col[t+4]][...]; element m of those vectors is operand B
// of the m-th mma, whose logical column g is output column c0 + 4g + m. The accumulator of mma m
// then holds output columns c0 + 8t + m and c0 + 8t + 4 + m, so a lane owns 8 consecutive output
// columns of rows g and g + 8: two float4 stores per row.
#include <algorithm>

#include "metcf_spmm.h"
#include "mma.cuh"
#include "static_switch.h"

namespace tcsparse {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockCols = 8;  // columns of a TC block (the mma k)

enum class StoreMode { kStore, kAtomic, kWorkspace };

template <int NV>
using Acc = float[NV][4][4];

__device__ __forceinline__ float component(const float4& v, int m) {
    return m == 0 ? v.x : m == 1 ? v.y : m == 2 ? v.z : v.w;
}

// What a lane needs to start the copies of one TC block.
struct BlockMeta {
    int32_t col[2];  // original columns t and t + 4 of the block; -1 for padding or no block
    uint4 bits;      // occupancy bitmap
    int32_t offset;  // first value of the block
};

__device__ __forceinline__ BlockMeta load_meta(const MetcfArrays& a, int64_t b, int64_t re, int t) {
    BlockMeta m{{-1, -1}, make_uint4(0, 0, 0, 0), 0};
    if (b < re) {
        m.col[0] = __ldg(a.block_cols + b * kBlockCols + t);
        m.col[1] = __ldg(a.block_cols + b * kBlockCols + t + 4);
        m.bits = __ldg(reinterpret_cast<const uint4*>(a.block_bitmap) + b);
        m.offset = __ldg(a.block_offsets + b);
    }
    return m;
}

// A warp's ring of S stages, one TC block each. Every lane copies into, and later reads, only
// its own slots ([...][lane]), so a lane needs nothing but its own cp.async.wait_group: no
// barrier, and conflict-free 16-byte shared accesses.
template <int NV, int S>
struct alignas(16) WarpRing {
    float4 x[S][2][NV][32];  // X[col[t + 4h]][c0 + 4g .. + 3] for each 32-column step s
    float a[S][4][32];       // entry k of the lanes' A fragments (zero where the block has none):
                             // lanes side by side, so the 4-byte copies hit 32 distinct banks
};

// Start the copies of one block into `stage`. A fragment entry (r, c) of lane (g, t) is one of
// (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); it is bit (r % 4) * 8 + c of bitmap word r / 4,
// and its value's index in the block is the number of set bits before it. Missing entries,
// padding columns and columns past n are zero-filled by the copies themselves.
template <int NV, int S, bool kVec4>
__device__ __forceinline__ void issue_block(WarpRing<NV, S>& ring, int stage, const BlockMeta& m,
                                            const float* __restrict__ values, const float* __restrict__ x, int64_t n,
                                            int64_t nbase, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int32_t col = m.col[h];
        const float* row = x + static_cast<int64_t>(col < 0 ? 0 : col) * n;
#pragma unroll
        for (int s = 0; s < NV; ++s) {
            const int64_t c0 = nbase + 32 * s + 4 * g;
            float4* dst = &ring.x[stage][h][s][lane];
            if constexpr (kVec4) {
                const bool ok = col >= 0 && c0 < n;
                ptx::cp_async_16(dst, ok ? row + c0 : x, ok ? 16 : 0);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const bool ok = col >= 0 && c0 + e < n;
                    ptx::cp_async_4(reinterpret_cast<float*>(dst) + e, ok ? row + c0 + e : x, ok ? 4 : 0);
                }
            }
        }
    }
    const int low = g >> 2;  // word of row g (0 or 1); row g + 8 is in word low + 2
    const uint32_t w_low = low ? m.bits.y : m.bits.x;
    const uint32_t w_high = low ? m.bits.w : m.bits.z;
    const int before_low = low ? __popc(m.bits.x) : 0;
    const int before_high = __popc(m.bits.x) + __popc(m.bits.y) + (low ? __popc(m.bits.z) : 0);
    const int bit = (g & 3) * 8 + t;
    const uint32_t word[4] = {w_low, w_high, w_low, w_high};
    const int before[4] = {before_low, before_high, before_low, before_high};
    const int pos[4] = {bit, bit, bit + 4, bit + 4};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const bool present = (word[k] >> pos[k]) & 1u;
        const uint32_t index = static_cast<uint32_t>(m.offset) + before[k] + __popc(word[k] & ((1u << pos[k]) - 1u));
        ptx::cp_async_4(&ring.a[stage][k][lane], values + (present ? index : 0u), present ? 4 : 0);
    }
}

// The A fragment as the mma takes it: TF32 (hi), and for the 3xTF32 split also the remainder (lo).
template <bool kSplit>
struct Fragment {
    uint32_t hi[4];
    uint32_t lo[kSplit ? 4 : 1];
};

template <bool kSplit>
__device__ __forceinline__ Fragment<kSplit> to_fragment(const float (&a)[4]) {
    Fragment<kSplit> f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f.hi[i] = ptx::to_tf32(a[i]);
        if constexpr (kSplit) f.lo[i] = ptx::to_tf32(a[i] - __uint_as_float(f.hi[i]));
    }
    return f;
}

template <bool kSplit>
__device__ __forceinline__ void mma_tile(float (&d)[4], const Fragment<kSplit>& a, float b0, float b1) {
    const uint32_t b0h = ptx::to_tf32(b0), b1h = ptx::to_tf32(b1);
    if constexpr (kSplit) {
        const uint32_t b0l = ptx::to_tf32(b0 - __uint_as_float(b0h)), b1l = ptx::to_tf32(b1 - __uint_as_float(b1h));
        // Small terms first, so they are not lost against the large partial sum.
        ptx::mma_m16n8k8_tf32(d, a.lo, b0h, b1h);
        ptx::mma_m16n8k8_tf32(d, a.hi, b0l, b1l);
    }
    ptx::mma_m16n8k8_tf32(d, a.hi, b0h, b1h);
}

template <int NV, int S, bool kSplit>
__device__ __forceinline__ void multiply_stage(const WarpRing<NV, S>& ring, int stage, int lane, Acc<NV>& acc) {
    const float a[4] = {ring.a[stage][0][lane], ring.a[stage][1][lane], ring.a[stage][2][lane], ring.a[stage][3][lane]};
    const Fragment<kSplit> frag = to_fragment<kSplit>(a);
#pragma unroll
    for (int s = 0; s < NV; ++s) {
        const float4 x0 = ring.x[stage][0][s][lane], x1 = ring.x[stage][1][s][lane];
#pragma unroll
        for (int m = 0; m < 4; ++m) mma_tile<kSplit>(acc[s][m], frag, component(x0, m), component(x1, m));
    }
}

// acc += the TC blocks [rb, re) of one window times X's columns [nbase, nbase + 32 * NV). Block
// b + S - 1 is copied while block b multiplies (S - 1 blocks of gathers in flight per warp);
// the metadata of the block after that is loaded one step ahead, so its latency hides too.
template <int NV, int S, bool kVec4, bool kSplit>
__device__ __forceinline__ void warp_blocks(const MetcfArrays& a, const float* __restrict__ values,
                                            const float* __restrict__ x, int64_t n, int64_t nbase, int64_t rb,
                                            int64_t re, int lane, WarpRing<NV, S>& ring, Acc<NV>& acc) {
    const int t = lane & 3;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (rb + s < re) issue_block<NV, S, kVec4>(ring, s, load_meta(a, rb + s, re, t), values, x, n, nbase, lane);
        ptx::cp_async_commit();
    }
    BlockMeta next = load_meta(a, rb + S - 1, re, t);
    int stage = 0, fill = S - 1;
    for (int64_t b = rb; b < re; ++b) {
        if (b + S - 1 < re) issue_block<NV, S, kVec4>(ring, fill, next, values, x, n, nbase, lane);
        ptx::cp_async_commit();
        next = load_meta(a, b + S, re, t);
        ptx::cp_async_wait<S - 1>();
        multiply_stage<NV, S, kSplit>(ring, stage, lane, acc);
        stage = stage + 1 == S ? 0 : stage + 1;
        fill = fill + 1 == S ? 0 : fill + 1;
    }
    ptx::cp_async_wait<0>();
}

// Write (or add) the warp's tile: window rows g and g + 8, 8 columns per lane per 32-column step.
template <int WINDOW, int NV, bool kVec4>
__device__ __forceinline__ void store_tile(const Acc<NV>& acc, StoreMode mode, float* dst, const int32_t* row_map,
                                           int64_t slot0, int64_t n, int64_t nbase, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < WINDOW / 8; ++h) {
        const int slot = g + 8 * h;
        int64_t row = slot;
        if (mode != StoreMode::kWorkspace) {
            row = row_map[slot0 + slot];
            if (row < 0) continue;
        }
        float* yrow = dst + row * n;
#pragma unroll
        for (int s = 0; s < NV; ++s) {
            const int64_t c0 = nbase + 32 * s + 8 * t;
            float v[8];
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                v[m] = acc[s][m][2 * h];
                v[4 + m] = acc[s][m][2 * h + 1];
            }
            if constexpr (kVec4) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    if (c0 + 4 * q < n) {
                        const float4 f = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
                        if (mode == StoreMode::kAtomic) {
                            ptx::atomic_add_f4(yrow + c0 + 4 * q, f);
                        } else {
                            *reinterpret_cast<float4*>(yrow + c0 + 4 * q) = f;
                        }
                    }
                }
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    if (c0 + e < n) {
                        if (mode == StoreMode::kAtomic) {
                            atomicAdd(yrow + c0 + e, v[e]);
                        } else {
                            yrow[c0 + e] = v[e];
                        }
                    }
                }
            }
        }
    }
}

template <int NV>
__device__ __forceinline__ void zero_acc(Acc<NV>& acc) {
#pragma unroll
    for (int s = 0; s < NV; ++s)
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[s][m][e] = 0.f;
}

__device__ __forceinline__ int64_t global_warp() {
    return static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
}

// Stages per warp and resident thread blocks per SM: the rings fill shared memory (228 KB per SM
// on sm_90: 6 x 36 KB or 5 x 40 KB), leaving each warp S - 1 blocks of gathers in flight.
template <int NV>
constexpr int stages() { return NV == 1 ? 6 : 4; }
template <int NV>
constexpr int min_blocks_per_sm() { return NV == 1 ? 6 : 5; }

// One warp per (row window, column slice), slices of a window adjacent so that they share the
// window's sparse data in L1.
template <int WINDOW, int NV, int S, bool kVec4, bool kSplit>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<NV>())
    metcf_base_kernel(MetcfArrays a, const float* __restrict__ values, const float* __restrict__ x,
                      float* __restrict__ y, int64_t n, int slices) {
    __shared__ WarpRing<NV, S> rings[kWarps];
    const int64_t item = global_warp();
    if (item >= a.num_windows * slices) return;
    const int lane = threadIdx.x & 31;
    const int64_t w = item / slices;
    const int64_t nbase = (item % slices) * (32 * NV);
    Acc<NV> acc;
    zero_acc<NV>(acc);
    warp_blocks<NV, S, kVec4, kSplit>(a, values, x, n, nbase, a.window_offsets[w], a.window_offsets[w + 1], lane,
                                      rings[threadIdx.x >> 5], acc);
    store_tile<WINDOW, NV, kVec4>(acc, StoreMode::kStore, y, a.row_map, w * WINDOW, n, nbase, lane);
}

// The window holding chunk c: the last w with chunk_offsets[w] <= c.
__device__ __forceinline__ int64_t window_of_chunk(const MetcfArrays& a, int64_t c) {
    int64_t lo = 0, hi = a.num_windows;
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) >> 1;
        if (a.chunk_offsets[mid] <= c) lo = mid; else hi = mid;
    }
    return lo;
}

// Items are (column slice, chunk) pairs in slice-major order; warp i of the persistent grid of
// `warps` warps takes the contiguous items [i * per, (i + 1) * per). Consecutive chunks of one
// window are one segment (one pass, one store); a window entirely inside one warp's range
// stores, a window cut by a range boundary adds atomically into rows zeroed beforehand.
__device__ __forceinline__ int64_t items_per_warp(int64_t items, int64_t warps) { return (items + warps - 1) / warps; }

template <int WINDOW, int NV, int S, bool kVec4, bool kSplit>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<NV>())
    metcf_balanced_kernel(MetcfArrays a, const float* __restrict__ values, const float* __restrict__ x,
                          float* __restrict__ y, int64_t n, int slices, int64_t warps) {
    __shared__ WarpRing<NV, S> rings[kWarps];
    const int lane = threadIdx.x & 31;
    const int64_t chunks = a.chunk_offsets[a.num_windows];
    const int64_t items = chunks * slices;
    const int64_t per = items_per_warp(items, warps);
    const int64_t begin = per * global_warp();
    const int64_t end = begin + per < items ? begin + per : items;
    int64_t slice = -1, w = 0;
    for (int64_t item = begin; item < end;) {
        const int64_t s = item / chunks, c = item % chunks;
        if (s != slice) {
            slice = s;
            w = window_of_chunk(a, c);
        } else {
            while (a.chunk_offsets[w + 1] <= c) ++w;  // next non-empty window, usually w + 1
        }
        const int64_t first = a.chunk_offsets[w], last = a.chunk_offsets[w + 1];
        const int64_t stop = last < c + (end - item) ? last : c + (end - item);
        const int64_t wb = a.window_offsets[w], we = a.window_offsets[w + 1];
        const int64_t rb = wb + (c - first) * a.chunk;
        const int64_t re = wb + (stop - first) * a.chunk < we ? wb + (stop - first) * a.chunk : we;
        const int64_t nbase = s * (32 * NV);
        Acc<NV> acc;
        zero_acc<NV>(acc);
        warp_blocks<NV, S, kVec4, kSplit>(a, values, x, n, nbase, rb, re, lane, rings[threadIdx.x >> 5], acc);
        const StoreMode mode = c == first && stop == last ? StoreMode::kStore : StoreMode::kAtomic;
        store_tile<WINDOW, NV, kVec4>(acc, mode, y, a.row_map, w * WINDOW, n, nbase, lane);
        item += stop - c;
    }
}

// One warp per window: zero the rows that metcf_balanced_kernel will not simply store, i.e. of
// windows with no chunk, or cut by a warp's range boundary in some column slice.
__global__ void zero_shared_windows_kernel(MetcfArrays a, float* __restrict__ y, int64_t n, int slices, int64_t warps) {
    const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= a.num_windows) return;
    const int64_t chunks = a.chunk_offsets[a.num_windows];
    const int64_t per = items_per_warp(chunks * slices, warps);
    const int64_t first = a.chunk_offsets[w], count = a.chunk_offsets[w + 1] - first;
    bool shared = count == 0;
    for (int64_t s = 0; s < slices && !shared; ++s) {
        const int64_t lo = s * chunks + first;
        shared = lo / per != (lo + count - 1) / per;
    }
    if (!shared) return;
    for (int slot = 0; slot < a.window; ++slot) {
        const int64_t row = a.row_map[w * a.window + slot];
        if (row < 0) continue;
        for (int64_t col = lane; col < n; col += 32) y[row * n + col] = 0.f;
    }
}

// Deterministic variant: a warp-stride loop over (chunk, slice) items; windows of one chunk
// store, the chunks of larger windows write their tile to the workspace, which
// sum_workspace_kernel adds up in chunk order.
template <int WINDOW, int NV, int S, bool kVec4, bool kSplit>
__global__ void __launch_bounds__(kThreads, min_blocks_per_sm<NV>())
    metcf_balanced_workspace_kernel(MetcfArrays a, const float* __restrict__ values, const float* __restrict__ x,
                                    float* __restrict__ y, int64_t n, int slices, int64_t warps,
                                    float* __restrict__ workspace) {
    __shared__ WarpRing<NV, S> rings[kWarps];
    const int lane = threadIdx.x & 31;
    const int64_t chunks = a.chunk_offsets[a.num_windows];
    const int64_t items = chunks * slices;
    for (int64_t item = global_warp(); item < items; item += warps) {
        const int64_t c = item / slices;
        const int64_t nbase = (item % slices) * (32 * NV);
        const int64_t w = window_of_chunk(a, c);
        const int64_t first = a.chunk_offsets[w];
        const int64_t count = a.chunk_offsets[w + 1] - first;
        const int64_t wend = a.window_offsets[w + 1];
        const int64_t rb = a.window_offsets[w] + (c - first) * a.chunk;
        const int64_t re = rb + a.chunk < wend ? rb + a.chunk : wend;
        Acc<NV> acc;
        zero_acc<NV>(acc);
        warp_blocks<NV, S, kVec4, kSplit>(a, values, x, n, nbase, rb, re, lane, rings[threadIdx.x >> 5], acc);
        const StoreMode mode = count == 1 ? StoreMode::kStore : StoreMode::kWorkspace;
        float* dst = mode == StoreMode::kWorkspace ? workspace + c * WINDOW * n : y;
        store_tile<WINDOW, NV, kVec4>(acc, mode, dst, a.row_map, w * WINDOW, n, nbase, lane);
    }
}

// Deterministic combine: rows of windows not written by exactly one chunk get the sum of their
// chunks' tiles in chunk order (or zero). Grid: (window, 1024-entry piece of the window's tile).
__global__ void sum_workspace_kernel(MetcfArrays a, const float* __restrict__ workspace, float* __restrict__ y, int64_t n) {
    const int64_t w = blockIdx.x;
    const int64_t first = a.chunk_offsets[w];
    const int64_t count = a.chunk_offsets[w + 1] - first;
    if (count == 1) return;
    const int64_t tile = static_cast<int64_t>(a.window) * n;
    for (int64_t e = static_cast<int64_t>(blockIdx.y) * 1024 + threadIdx.x; e < tile && e < (blockIdx.y + 1) * 1024ll;
         e += blockDim.x) {
        const int64_t slot = e / n, col = e % n;
        const int64_t row = a.row_map[w * a.window + slot];
        if (row < 0) continue;
        float sum = 0.f;
        for (int64_t c = first; c < first + count; ++c) sum += workspace[c * tile + e];
        y[row * n + col] = sum;
    }
}

int device_sm_count() {
    static int counts[64] = {};  // per device; benign race: every writer stores the same value
    int device = 0;
    cudaGetDevice(&device);
    if (device >= 64) device = 63;
    if (counts[device] == 0) cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device);
    return counts[device] > 0 ? counts[device] : 1;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Column slices of 64 (NV = 2) halve the per-column share of the sparse work (metadata, fragment
// copies) but waste half a warp when only 32 columns are left; take them when that waste is at
// most the last slice.
bool use_wide_slices(int64_t n) { return n >= 64 && (n % 64 == 0 || n % 64 > 32); }

template <typename Launch>
cudaError_t dispatch(const MetcfArrays& a, const float* x, float* y, int64_t n, Precision precision, Launch&& launch) {
    const bool vec4 = n % 4 == 0 && aligned16(x) && aligned16(y);
    return TCS_WINDOW_SWITCH(a.window, WINDOW, [&] {
        return TCS_SLICE_SWITCH(use_wide_slices(n), NV, [&] {
            return TCS_BOOL_SWITCH(vec4, kVec4, [&] {
                return TCS_BOOL_SWITCH(precision == Precision::kTF32x3, kSplit, [&] {
                    return launch.template operator()<WINDOW, NV, stages<NV>(), kVec4, kSplit>();
                });
            });
        });
    });
}

template <int NV>
int64_t slices_for(int64_t n) { return ceil_div(n, 32 * NV); }

struct BaseLaunch {
    const MetcfArrays& a;
    const float* values;
    const float* x;
    float* y;
    int64_t n;
    cudaStream_t stream;
    template <int WINDOW, int NV, int S, bool kVec4, bool kSplit>
    cudaError_t operator()() const {
        const int64_t slices = slices_for<NV>(n);
        const int64_t grid = ceil_div(a.num_windows * slices, kWarps);
        if (grid > 0x7fffffffll) return cudaErrorInvalidConfiguration;
        metcf_base_kernel<WINDOW, NV, S, kVec4, kSplit>
            <<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a, values, x, y, n, static_cast<int>(slices));
        return cudaGetLastError();
    }
};

template <typename Kernel>
int resident_blocks(Kernel kernel) {
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0);
    return blocks > 0 ? blocks : 1;
}

// Warps of the balanced kernels' persistent grid: all resident at once, never more than there
// are items (an upper bound of the item count, so that no host sync reads chunk_offsets back).
int64_t balanced_warps(const MetcfArrays& a, int64_t slices, int resident) {
    const int64_t items = (a.num_windows + a.num_blocks / std::max(a.chunk, 1) + 1) * slices;
    return std::min<int64_t>(items, static_cast<int64_t>(device_sm_count()) * resident * kWarps);
}

struct BalancedLaunch {
    const MetcfArrays& a;
    const float* values;
    const float* x;
    float* y;
    int64_t n;
    float* workspace;
    cudaStream_t stream;
    template <int WINDOW, int NV, int S, bool kVec4, bool kSplit>
    cudaError_t operator()() const {
        const int slices = static_cast<int>(slices_for<NV>(n));
        if (workspace) {
            const auto kernel = metcf_balanced_workspace_kernel<WINDOW, NV, S, kVec4, kSplit>;
            static const int resident = resident_blocks(kernel);
            const int64_t warps = balanced_warps(a, slices, resident);
            kernel<<<static_cast<unsigned>(ceil_div(warps, kWarps)), kThreads, 0, stream>>>(a, values, x, y, n, slices,
                                                                                            warps, workspace);
            return cudaGetLastError();
        }
        const auto kernel = metcf_balanced_kernel<WINDOW, NV, S, kVec4, kSplit>;
        static const int resident = resident_blocks(kernel);
        const int64_t warps = balanced_warps(a, slices, resident);
        zero_shared_windows_kernel<<<static_cast<unsigned>(ceil_div(a.num_windows * 32, 256)), 256, 0, stream>>>(
            a, y, n, slices, warps);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        kernel<<<static_cast<unsigned>(ceil_div(warps, kWarps)), kThreads, 0, stream>>>(a, values, x, y, n, slices, warps);
        return cudaGetLastError();
    }
};

struct ShapeQuery {
    bool balanced;
    int64_t n;
    int* resident;
    int64_t* slices;
    template <int WINDOW, int NV, int S, bool kVec4, bool kSplit>
    cudaError_t operator()() const {
        *slices = slices_for<NV>(n);
        const int blocks = balanced ? resident_blocks(metcf_balanced_kernel<WINDOW, NV, S, kVec4, kSplit>)
                                    : resident_blocks(metcf_base_kernel<WINDOW, NV, S, kVec4, kSplit>);
        *resident = blocks * kWarps;
        return cudaGetLastError();
    }
};

}  // namespace

cudaError_t metcf_spmm_launch_shape(int window, int64_t n, bool balanced, Precision precision, int* resident,
                                    int64_t* slices) {
    MetcfArrays a{};
    a.window = window;
    // Null operands count as 16-byte aligned: the shape of the vectorized variant, as for any
    // contiguous X with n % 4 == 0.
    return dispatch(a, nullptr, nullptr, n, precision, ShapeQuery{balanced, n, resident, slices});
}

cudaError_t metcf_spmm_base_f32(const MetcfArrays& a, const float* values, const float* x, float* y, int64_t n,
                                Precision precision, cudaStream_t stream) {
    if (a.num_windows == 0 || n == 0) return cudaSuccess;
    return dispatch(a, x, y, n, precision, BaseLaunch{a, values, x, y, n, stream});
}

int64_t metcf_balanced_workspace_floats(const MetcfArrays& a, int64_t n) {
    return (a.num_windows + a.num_blocks / std::max(a.chunk, 1) + 1) * a.window * n;
}

cudaError_t metcf_spmm_balanced_f32(const MetcfArrays& a, const float* values, const float* x, float* y, int64_t n,
                                    Precision precision, float* workspace, cudaStream_t stream) {
    if (a.num_windows == 0 || n == 0) return cudaSuccess;
    if (a.chunk < 1) return cudaErrorInvalidValue;
    cudaError_t err = dispatch(a, x, y, n, precision, BalancedLaunch{a, values, x, y, n, workspace, stream});
    if (err != cudaSuccess || !workspace) return err;
    const dim3 grid(static_cast<unsigned>(a.num_windows), static_cast<unsigned>(ceil_div(a.window * n, 1024)));
    sum_workspace_kernel<<<grid, 256, 0, stream>>>(a, workspace, y, n);
    return cudaGetLastError();
}

}  // namespace tcsparse
