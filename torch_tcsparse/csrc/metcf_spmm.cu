// TF32 Tensor-Core SpMM on ME-TCF (DTC-SpMM, ASPLOS'24, sections 4.4 and 4.5.1), written anew.
//
// Work decomposition. A thread block has 4 warps; KS of them (4 as dispatched) share one range of
// TC blocks (a whole row window for "base"; for "balanced", the consecutive chunks of one window
// that fall in the thread block's equal share of all chunks) and one slice of 32 or 64 output
// columns. The KS warps take groups of 4 TC blocks in turn, so each warp works alone on its
// groups: no block-wide barrier inside the main loop. At the end their partial 16 x slice tiles
// are summed in shared memory in a fixed order and written once (stored, or added atomically
// when a window is cut between thread blocks of the balanced grid).
//
// Per group, per warp:
//   1. cp.async brings the group's sparse data (values, one-byte local ids, block column ids,
//      block offsets) into the warp's shared stage; two stages, so group i+1 is in flight while
//      group i computes (sparse double buffering, 4.4.2).
//   2. Rows of X for the group's 4 x 8 block columns are gathered straight into registers,
//      16 bytes per load (shared-memory bypass, 4.4.1).
//   3. The group's nonzeros are scattered into dense 16 x 8 tiles stored in mma fragment order,
//      so each lane reads its A fragment of a block with one 16-byte shared load.
//   4. mma.m16n8k8 (TF32) per block and 8 output columns.
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

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kGroup = 4;                            // TC blocks per warp per pipeline step
constexpr int kBlockCols = 8;                        // columns of a TC block (the mma k)
constexpr int kTileElems = 16 * kBlockCols;          // entries of a 16 x 8 A tile
constexpr int kGroupNnzMax = kGroup * kTileElems;    // a group of dense blocks

// One warp's shared memory: two stages of raw sparse data and the dense tiles of one group.
struct alignas(16) WarpStage {
    float values[2][kGroupNnzMax];
    uint32_t id_words[2][kGroupNnzMax / 4 + 4];      // +1 word for a misaligned start, padded to 16 B
    int32_t cols[2][kGroup * kBlockCols];
    int32_t offs[2][8];                              // [0..kGroup]: block starts, [kGroup + 1]: id byte skew
    float4 tile[kGroup * 32];                        // A tiles, fragment order: tile[block * 32 + lane]
};

enum class StoreMode { kStore, kAtomic, kWorkspace };

template <int NV>
using Acc = float[NV][4][4];

__device__ __forceinline__ float component(const float4& v, int m) {
    return m == 0 ? v.x : m == 1 ? v.y : m == 2 ? v.z : v.w;
}

// Start the asynchronous copy of blocks [b0, b0 + nb) into stage `buf`.
__device__ __forceinline__ void issue_group(const MetcfArrays& a, const float* __restrict__ values, WarpStage& st,
                                            int buf, int64_t b0, int nb, int lane) {
    int off = 0;
    if (lane <= nb) off = a.block_offsets[b0 + lane];
    const int p0 = __shfl_sync(kFullMask, off, 0);
    const int p1 = __shfl_sync(kFullMask, off, nb);
    const int cnt = p1 - p0;
    if (lane <= kGroup) st.offs[buf][lane] = (lane <= nb ? off : p1) - p0;
    if (lane == kGroup + 1) st.offs[buf][lane] = p0 & 3;
    for (int i = lane; i < cnt; i += 32) ptx::cp_async_4(&st.values[buf][i], values + p0 + i, 4);
    // Ids are bytes: copy the 4-byte words that cover [p0, p1); the last word may run past nnz,
    // so only the bytes that exist are read (the rest zero-filled).
    const int64_t w0 = p0 >> 2;
    const int words = static_cast<int>(((static_cast<int64_t>(p1) + 3) >> 2) - w0);
    for (int i = lane; i < words; i += 32) {
        const int64_t byte = (w0 + i) * 4;
        const int bytes = static_cast<int>(a.nnz - byte < 4 ? a.nnz - byte : 4);
        ptx::cp_async_4(&st.id_words[buf][i], a.local_ids + byte, bytes);
    }
    if (lane < nb * kBlockCols) ptx::cp_async_4(&st.cols[buf][lane], a.block_cols + b0 * kBlockCols + lane, 4);
}

template <bool kSplit>
__device__ __forceinline__ void mma_tile(float (&d)[4], const float4& av, float b0, float b1) {
    if constexpr (!kSplit) {
        const uint32_t a[4] = {ptx::to_tf32(av.x), ptx::to_tf32(av.y), ptx::to_tf32(av.z), ptx::to_tf32(av.w)};
        ptx::mma_m16n8k8_tf32(d, a, ptx::to_tf32(b0), ptx::to_tf32(b1));
    } else {
        const float af[4] = {av.x, av.y, av.z, av.w};
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            hi[i] = ptx::to_tf32(af[i]);
            lo[i] = ptx::to_tf32(af[i] - __uint_as_float(hi[i]));
        }
        const uint32_t b0h = ptx::to_tf32(b0), b1h = ptx::to_tf32(b1);
        const uint32_t b0l = ptx::to_tf32(b0 - __uint_as_float(b0h)), b1l = ptx::to_tf32(b1 - __uint_as_float(b1h));
        // Small terms first, so they are not lost against the large partial sum.
        ptx::mma_m16n8k8_tf32(d, lo, b0h, b1h);
        ptx::mma_m16n8k8_tf32(d, hi, b0l, b1l);
        ptx::mma_m16n8k8_tf32(d, hi, b0h, b1h);
    }
}

// Gather X for stage `buf`, build the dense tiles, multiply-accumulate into acc.
template <int NV, bool kVec4, bool kSplit>
__device__ __forceinline__ void compute_group(WarpStage& st, int buf, int nb, const float* __restrict__ x, int64_t n,
                                              int64_t nbase, int lane, Acc<NV>& acc) {
    const int g = lane >> 2, t = lane & 3;
    float4 xv[kGroup][2][NV];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int col = j < nb ? st.cols[buf][j * kBlockCols + t + 4 * h] : -1;
            const float* xrow = x + static_cast<int64_t>(col) * n;
#pragma unroll
            for (int s = 0; s < NV; ++s) {
                const int64_t c0 = nbase + 32 * s + 4 * g;
                float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                if constexpr (kVec4) {
                    if (col >= 0 && c0 < n) v = ptx::load_global_f4(xrow + c0);
                } else {
                    if (col >= 0) {
                        if (c0 + 0 < n) v.x = __ldg(xrow + c0 + 0);
                        if (c0 + 1 < n) v.y = __ldg(xrow + c0 + 1);
                        if (c0 + 2 < n) v.z = __ldg(xrow + c0 + 2);
                        if (c0 + 3 < n) v.w = __ldg(xrow + c0 + 3);
                    }
                }
                xv[j][h][s] = v;
            }
        }
    }

    // Dense A tiles: zero, then scatter this group's nonzeros in fragment order. Entry (r, c) of
    // a block goes to lane (r % 8) * 4 + c % 4, register (r / 8) + 2 * (c / 4).
#pragma unroll
    for (int i = lane; i < kGroup * 32; i += 32) st.tile[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    __syncwarp();
    const int32_t* offs = st.offs[buf];
    const int cnt = offs[kGroup];
    const uint8_t* ids = reinterpret_cast<const uint8_t*>(st.id_words[buf]) + offs[kGroup + 1];
    float* tile = reinterpret_cast<float*>(st.tile);
    for (int i = lane; i < cnt; i += 32) {
        int j = 0;
#pragma unroll
        for (int k = 1; k < kGroup; ++k) j += i >= offs[k];
        const int id = ids[i];
        const int r = id >> 3, c = id & 7;
        tile[j * kTileElems + ((r & 7) * 4 + (c & 3)) * 4 + (r >> 3) + 2 * (c >> 2)] = st.values[buf][i];
    }
    __syncwarp();

#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
        if (j < nb) {
            const float4 av = st.tile[j * 32 + lane];
#pragma unroll
            for (int s = 0; s < NV; ++s) {
#pragma unroll
                for (int m = 0; m < 4; ++m) {
                    mma_tile<kSplit>(acc[s][m], av, component(xv[j][0][s], m), component(xv[j][1][s], m));
                }
            }
        }
    }
}

// This warp's share of TC blocks [rb, re): groups kpart, kpart + KS, ... of kGroup blocks.
template <int NV, int KS, bool kVec4, bool kSplit>
__device__ __forceinline__ void warp_range(const MetcfArrays& a, const float* __restrict__ values,
                                           const float* __restrict__ x, int64_t n, int64_t nbase, int64_t rb,
                                           int64_t re, WarpStage& st, int kpart, int lane, Acc<NV>& acc) {
    constexpr int64_t kStep = KS * kGroup;
    int64_t b0 = rb + kpart * kGroup;
    if (b0 >= re || nbase >= n) return;
    issue_group(a, values, st, 0, b0, static_cast<int>(re - b0 < kGroup ? re - b0 : kGroup), lane);
    ptx::cp_async_commit();
    for (int it = 0; b0 < re; ++it, b0 += kStep) {
        const int64_t next = b0 + kStep;
        if (next < re) issue_group(a, values, st, (it + 1) & 1, next, static_cast<int>(re - next < kGroup ? re - next : kGroup), lane);
        ptx::cp_async_commit();
        ptx::cp_async_wait<1>();
        __syncwarp();
        compute_group<NV, kVec4, kSplit>(st, it & 1, static_cast<int>(re - b0 < kGroup ? re - b0 : kGroup), x, n, nbase,
                                         lane, acc);
        __syncwarp();
    }
    ptx::cp_async_wait<0>();
}

// Write (or add) warp 0's tile: rows slot0 + g and slot0 + g + 8 of the window, 8 columns per lane.
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

// Sum the partial tiles of the KS warps sharing a column slice into the first of them (fixed
// order: deterministic), which stores once.
template <int WINDOW, int NV, int KS, bool kVec4>
__device__ __forceinline__ void combine_and_store(Acc<NV>& acc, int active_warps, void* smem, StoreMode mode,
                                                  float* dst, const int32_t* row_map, int64_t slot0, int64_t n,
                                                  int64_t nbase, int warp, int lane) {
    constexpr int kPerLane = NV * 16;
    const int kpart = warp % KS, wslice = warp / KS;
    if (active_warps > 1) {
        float* red = static_cast<float*>(smem);
        __syncthreads();  // every warp is done with its stages, which the buffer below reuses
        if (kpart > 0 && kpart < active_warps) {
#pragma unroll
            for (int s = 0; s < NV; ++s)
#pragma unroll
                for (int m = 0; m < 4; ++m)
#pragma unroll
                    for (int e = 0; e < 4; ++e) red[((wslice * (KS - 1) + kpart - 1) * kPerLane + (s * 16 + m * 4 + e)) * 32 + lane] = acc[s][m][e];
        }
        __syncthreads();
        if (kpart == 0) {
            for (int w = 1; w < active_warps; ++w) {
#pragma unroll
                for (int s = 0; s < NV; ++s)
#pragma unroll
                    for (int m = 0; m < 4; ++m)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[s][m][e] += red[((wslice * (KS - 1) + w - 1) * kPerLane + (s * 16 + m * 4 + e)) * 32 + lane];
            }
        }
    }
    if (kpart == 0) store_tile<WINDOW, NV, kVec4>(acc, mode, dst, row_map, slot0, n, nbase, lane);
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

template <int KS>
__device__ __forceinline__ int active_warps_for(int64_t blocks) {
    const int64_t groups = (blocks + kGroup - 1) / kGroup;
    return static_cast<int>(groups < KS ? groups : KS);
}

// Output columns of one thread block: kWarps / KS warps side by side, 32 * NV columns each.
template <int NV, int KS>
__host__ __device__ constexpr int64_t columns_per_block() { return 32 * NV * (kWarps / KS); }

// One thread block per (row window, column slice). At most 128 registers (4 resident blocks), as
// the balanced kernel: at 135 registers the 64-column TF32 variant ran 20-25% slower (3 blocks).
template <int WINDOW, int NV, int KS, bool kVec4, bool kSplit>
__global__ void __launch_bounds__(kThreads, 4) metcf_base_kernel(MetcfArrays a, const float* __restrict__ values,
                                                              const float* __restrict__ x, float* __restrict__ y,
                                                              int64_t n) {
    __shared__ WarpStage stages[kWarps];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t w = blockIdx.x;
    const int64_t nbase = static_cast<int64_t>(blockIdx.y) * columns_per_block<NV, KS>() + warp / KS * (32 * NV);
    const int64_t rb = a.window_offsets[w], re = a.window_offsets[w + 1];
    Acc<NV> acc;
    zero_acc<NV>(acc);
    warp_range<NV, KS, kVec4, kSplit>(a, values, x, n, nbase, rb, re, stages[warp], warp % KS, lane, acc);
    combine_and_store<WINDOW, NV, KS, kVec4>(acc, active_warps_for<KS>(re - rb), stages, StoreMode::kStore, y, a.row_map,
                                         w * WINDOW, n, nbase, warp, lane);
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

// Items are (column slice, chunk) pairs in slice-major order; thread block i of the persistent
// grid takes the contiguous items [i * per, (i + 1) * per). Consecutive chunks of one window are
// one segment (one pipeline, one combine); a window entirely inside one thread block's range
// stores, a window cut by a range boundary adds atomically into rows zeroed beforehand.
__device__ __forceinline__ int64_t items_per_block(int64_t items, int64_t grid) { return (items + grid - 1) / grid; }

// At most 128 registers: 4 resident thread blocks (16 warps) per SM keep enough gathers in flight.
template <int WINDOW, int NV, int KS, bool kVec4, bool kSplit>
__global__ void __launch_bounds__(kThreads, 4) metcf_balanced_kernel(MetcfArrays a, const float* __restrict__ values,
                                                                  const float* __restrict__ x, float* __restrict__ y,
                                                                  int64_t n, int slices) {
    __shared__ WarpStage stages[kWarps];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t chunks = a.chunk_offsets[a.num_windows];
    const int64_t items = chunks * slices;
    const int64_t per = items_per_block(items, gridDim.x);
    const int64_t end = per * (blockIdx.x + 1) < items ? per * (blockIdx.x + 1) : items;
    int64_t slice = -1, w = 0;
    for (int64_t item = per * blockIdx.x; item < end;) {
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
        const int64_t nbase = s * columns_per_block<NV, KS>() + warp / KS * (32 * NV);
        Acc<NV> acc;
        zero_acc<NV>(acc);
        warp_range<NV, KS, kVec4, kSplit>(a, values, x, n, nbase, rb, re, stages[warp], warp % KS, lane, acc);
        const StoreMode mode = c == first && stop == last ? StoreMode::kStore : StoreMode::kAtomic;
        combine_and_store<WINDOW, NV, KS, kVec4>(acc, active_warps_for<KS>(re - rb), stages, mode, y, a.row_map, w * WINDOW, n,
                                             nbase, warp, lane);
        __syncthreads();  // the next segment refills the stages that the combine may have used
        item += stop - c;
    }
}

// One warp per window: zero the rows that metcf_balanced_kernel will not simply store, i.e. of
// windows with no chunk, or cut by a thread-block range boundary in some column slice.
__global__ void zero_shared_windows_kernel(MetcfArrays a, float* __restrict__ y, int64_t n, int slices, int64_t grid) {
    const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= a.num_windows) return;
    const int64_t chunks = a.chunk_offsets[a.num_windows];
    const int64_t per = items_per_block(chunks * slices, grid);
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

// Deterministic variant: a grid-stride loop over (chunk, slice) items; windows of one chunk
// store, the chunks of larger windows write their tile to the workspace, which
// sum_workspace_kernel adds up in chunk order.
template <int WINDOW, int NV, int KS, bool kVec4, bool kSplit>
__global__ void __launch_bounds__(kThreads)
    metcf_balanced_workspace_kernel(MetcfArrays a, const float* __restrict__ values, const float* __restrict__ x,
                                    float* __restrict__ y, int64_t n, int slices, float* __restrict__ workspace) {
    __shared__ WarpStage stages[kWarps];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t chunks = a.chunk_offsets[a.num_windows];
    const int64_t items = chunks * slices;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t c = item / slices;
        const int64_t nbase = (item % slices) * columns_per_block<NV, KS>() + warp / KS * (32 * NV);
        const int64_t w = window_of_chunk(a, c);
        const int64_t first = a.chunk_offsets[w];
        const int64_t count = a.chunk_offsets[w + 1] - first;
        const int64_t wend = a.window_offsets[w + 1];
        const int64_t rb = a.window_offsets[w] + (c - first) * a.chunk;
        const int64_t re = rb + a.chunk < wend ? rb + a.chunk : wend;
        Acc<NV> acc;
        zero_acc<NV>(acc);
        warp_range<NV, KS, kVec4, kSplit>(a, values, x, n, nbase, rb, re, stages[warp], warp % KS, lane, acc);
        const StoreMode mode = count == 1 ? StoreMode::kStore : StoreMode::kWorkspace;
        float* dst = mode == StoreMode::kWorkspace ? workspace + c * WINDOW * n : y;
        combine_and_store<WINDOW, NV, KS, kVec4>(acc, active_warps_for<KS>(re - rb), stages, mode, dst, a.row_map, w * WINDOW,
                                             n, nbase, warp, lane);
        __syncthreads();
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

// Column slices of 64 (NV = 2) halve the per-column share of the sparse work (fetch, scatter,
// tile loads) but waste half a warp when only 32 columns are left; take them when that waste is
// at most the last slice. All 4 warps of a thread block split the window's TC blocks (KS = 4):
// measured on an H200 (BENCHMARKS.md), putting the warps side by side over N instead (KS = 2 for
// N = 64, KS = 1 above) was slower at N >= 64 (geomean over the large graphs at N = 128: 0.90x
// of cuSPARSE against 1.04x), since every warp then repeats the sparse work of every group.
bool use_wide_slices(int64_t n) { return n >= 64 && (n % 64 == 0 || n % 64 > 32); }
constexpr int kKSplit = 4;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename Launch>
cudaError_t dispatch(const MetcfArrays& a, const float* x, float* y, int64_t n, Precision precision, Launch&& launch) {
    const bool vec4 = n % 4 == 0 && aligned16(x) && aligned16(y);
    return TCS_WINDOW_SWITCH(a.window, WINDOW, [&] {
        return TCS_SLICE_SWITCH(use_wide_slices(n), NV, [&] {
            return TCS_BOOL_SWITCH(vec4, kVec4, [&] {
                return TCS_BOOL_SWITCH(precision == Precision::kTF32x3, kSplit,
                                       [&] { return launch.template operator()<WINDOW, NV, kKSplit, kVec4, kSplit>(); });
            });
        });
    });
}

struct BaseLaunch {
    const MetcfArrays& a;
    const float* values;
    const float* x;
    float* y;
    int64_t n;
    cudaStream_t stream;
    template <int WINDOW, int NV, int KS, bool kVec4, bool kSplit>
    cudaError_t operator()() const {
        const dim3 grid(static_cast<unsigned>(a.num_windows), static_cast<unsigned>(ceil_div(n, columns_per_block<NV, KS>())));
        metcf_base_kernel<WINDOW, NV, KS, kVec4, kSplit><<<grid, kThreads, 0, stream>>>(a, values, x, y, n);
        return cudaGetLastError();
    }
};

template <typename Kernel>
int resident_blocks(Kernel kernel) {
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0);
    return blocks > 0 ? blocks : 1;
}

struct BalancedLaunch {
    const MetcfArrays& a;
    const float* values;
    const float* x;
    float* y;
    int64_t n;
    float* workspace;
    cudaStream_t stream;
    template <int WINDOW, int NV, int KS, bool kVec4, bool kSplit>
    cudaError_t operator()() const {
        const int slices = static_cast<int>(ceil_div(n, columns_per_block<NV, KS>()));
        // Upper bound of the item count without reading chunk_offsets back (no host sync).
        const int64_t items = (a.num_windows + a.num_blocks / std::max(a.chunk, 1) + 1) * slices;
        if (workspace) {
            const auto kernel = metcf_balanced_workspace_kernel<WINDOW, NV, KS, kVec4, kSplit>;
            static const int resident = resident_blocks(kernel);
            const int64_t grid = std::min<int64_t>(items, static_cast<int64_t>(device_sm_count()) * resident);
            kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a, values, x, y, n, slices, workspace);
            return cudaGetLastError();
        }
        const auto kernel = metcf_balanced_kernel<WINDOW, NV, KS, kVec4, kSplit>;
        static const int resident = resident_blocks(kernel);
        const int64_t grid = std::min<int64_t>(items, static_cast<int64_t>(device_sm_count()) * resident);
        const int64_t zero_threads = a.num_windows * 32;
        zero_shared_windows_kernel<<<static_cast<unsigned>(ceil_div(zero_threads, 256)), 256, 0, stream>>>(a, y, n, slices,
                                                                                                         grid);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a, values, x, y, n, slices);
        return cudaGetLastError();
    }
};

struct ShapeQuery {
    bool balanced;
    int64_t n;
    int* resident;
    int64_t* slices;
    template <int WINDOW, int NV, int KS, bool kVec4, bool kSplit>
    cudaError_t operator()() const {
        *slices = ceil_div(n, columns_per_block<NV, KS>());
        *resident = balanced ? resident_blocks(metcf_balanced_kernel<WINDOW, NV, KS, kVec4, kSplit>)
                             : resident_blocks(metcf_base_kernel<WINDOW, NV, KS, kVec4, kSplit>);
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
    if (ceil_div(n, 32) > 65535 || a.num_windows > 0x7fffffffll) return cudaErrorInvalidConfiguration;
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
