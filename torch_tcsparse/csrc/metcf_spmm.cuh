// Tensor-Core SpMM on ME-TCF (DTC-SpMM, ASPLOS'24, sections 4.4 and 4.5.1), written anew;
// templates over the element type of X and Y (elements.cuh), instantiated by kernels_<type>.cu.
//
// Work decomposition. The unit of work is one warp: a range of TC blocks of one row window times
// a slice of 8 * E * NV output columns (E = elements per 16-byte copy: 4 for fp32, 8 for fp16/bf16). "base" gives each warp a whole window (each output row
// written once); "balanced" gives each warp of a persistent grid an equal share of all chunks
// (BALANCE_CHUNK TC blocks, never straddling windows), so hub windows spread over many warps and
// their partial rows are added atomically. Warps never wait for each other: each has its own
// shared-memory ring, and there is no block-wide barrier.
//
// Per TC block, per lane (g = lane / 4, t = lane % 4), all through cp.async into the warp's ring
// of S stages (registers hold no data in flight, so S - 1 blocks of gathers stay in flight):
//   - rows of X for two of the block's columns, 16 bytes per copy (DTC-SpMM gathers these
//     into registers, 4.4.1; an asynchronous copy keeps them in flight without registers);
//   - the lane's A fragment straight from the matrix's values, read where they are (CSR order,
//     X's element type, no copy): a row's CSR entries are sorted by column and a window's block
//     columns are its distinct columns ascending, so entry (r, c) of a block sits at the CSR
//     position where row r's entries of the warp's range start (chunk_row_starts), plus row r's
//     entries in the range's earlier blocks (a running count the lane keeps for its rows g and
//     g + 8, blocks being issued in order), plus the bits of row r below c in the block's 128-bit
//     occupancy bitmap (bit r * 8 + c set when entry (r, c) is a nonzero). No tile is scattered
//     in shared memory and absent entries are zero-filled by the copy.
// The metadata of a block (columns, bitmap) is loaded one step before its copies start, so its
// latency hides behind the current multiply.
//
// Column mapping (why one 16-byte copy per lane feeds E mma and stores come out as 16-byte
// vectors): lane (g, t) copies X[col[k0]][c0 + E g .. E g + E - 1] and X[col[k1]][...], k0 and k1
// the B rows the mma gives the lane (t and t + 4 for TF32, 2t and 2t + 1 for 16-bit types);
// element m of those copies is operand B of the m-th mma, whose logical column g is output column
// c0 + E g + m. The accumulator of mma m then holds output columns c0 + 2E t + m and
// c0 + 2E t + E + m, so a lane owns 2E consecutive output columns of rows g and g + 8: two
// 16-byte stores per row.
#pragma once

#include <algorithm>

#include "elements.cuh"
#include "metcf_spmm.h"
#include "mma.cuh"
#include "static_switch.h"

namespace tcsparse {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockCols = 8;  // columns of a TC block (the mma k)

enum class StoreMode { kStore, kAtomic, kWorkspace };

// Elements of T per 16-byte copy, and the output columns one copy per lane covers across the
// warp (8 lane groups g): a step.
template <typename T>
constexpr int kPerCopy = Element<T>::kPerCopy;
template <typename T>
constexpr int kStep = 8 * kPerCopy<T>;

template <typename T, int NV>
using Acc = float[NV][kPerCopy<T>][4];

// What a lane needs to start the copies of one TC block.
struct BlockMeta {
    int32_t col[2];  // original ids of the lane's two block columns; -1 for padding or no block
    uint4 bits;      // occupancy bitmap
};

template <typename T>
__device__ __forceinline__ BlockMeta load_meta(const MetcfArrays& a, int64_t b, int64_t re, int t) {
    BlockMeta m{{-1, -1}, make_uint4(0, 0, 0, 0)};
    if (b < re) {
        m.col[0] = __ldg(a.block_cols + b * kBlockCols + Element<T>::block_col(t, 0));
        m.col[1] = __ldg(a.block_cols + b * kBlockCols + Element<T>::block_col(t, 1));
        m.bits = __ldg(reinterpret_cast<const uint4*>(a.block_bitmap) + b);
    }
    return m;
}

// A warp's ring of S stages, one TC block each. Every lane copies into, and later reads, only
// its own slots ([...][lane]), so a lane needs nothing but its own cp.async.wait_group: no
// barrier, and conflict-free 16-byte shared accesses.
template <int NV, int S>
struct alignas(16) WarpRing {
    uint4 x[S][2][NV][32];  // 16 bytes of X[col[h]] at the lane's columns for each step s
    uint32_t a[S][4][32];   // entry k of the lanes' A fragments (zero where the block has none):
                            // lanes side by side, so the 4-byte copies hit 32 distinct banks. A
                            // 16-bit entry comes with the other half of its aligned 4-byte word
                            // (cp.async copies 4 bytes at least); the lane's `halves` says which.
};

// Where a lane is in the values of its two rows (g and g + 8 of the window): the CSR position
// of each row's next entry in the blocks still to be issued, and for 16-bit values which half
// of each copied word is the entry (bit stage * 4 + k).
struct ValueCursor {
    uint32_t next[2];
    uint32_t halves;
};

// The cursor at the first block of chunk c (a window's blocks start at its first chunk).
template <int WINDOW>
__device__ __forceinline__ ValueCursor start_cursor(const MetcfArrays& a, int64_t c, int lane) {
    const int g = lane >> 2;
    const int32_t* starts = a.chunk_row_starts + c * WINDOW;
    return ValueCursor{{static_cast<uint32_t>(__ldg(starts + g)),
                        WINDOW == 16 ? static_cast<uint32_t>(__ldg(starts + g + 8)) : 0u},
                       0u};
}

// Copy the value at CSR position `pos` (or zero-fill) into the lane's entry k of `stage`.
template <typename T, int NV, int S>
__device__ __forceinline__ void copy_value(WarpRing<NV, S>& ring, int stage, int k, int lane, const T* values,
                                           bool present, uint32_t pos, uint32_t& halves) {
    if constexpr (sizeof(T) == 4) {
        ptx::cp_async_4(&ring.a[stage][k][lane], present ? values + pos : values, present ? 4 : 0);
    } else {
        // The 4-byte word holding the element: any 2-byte aligned element lies in one, inside
        // the same page as the element itself.
        const uintptr_t address = reinterpret_cast<uintptr_t>(present ? values + pos : values);
        ptx::cp_async_4(&ring.a[stage][k][lane], reinterpret_cast<const void*>(address & ~uintptr_t{3}),
                        present ? 4 : 0);
        const int bit = stage * 4 + k;
        halves = (halves & ~(1u << bit)) | (static_cast<uint32_t>((address >> 1) & 1u) << bit);
    }
}

// 16 bytes of a row of X without cp.async (n not a multiple of the copy, or X misaligned):
// element by element, zero past n or for padding. fp32 elements still go asynchronously; 2-byte
// elements are below cp.async's 4-byte minimum, so they are loaded and stored here.
template <typename T>
__device__ __forceinline__ void copy_elements(uint4* dst, const T* __restrict__ row, int64_t c0, int64_t n, bool valid,
                                              const T* __restrict__ any) {
    constexpr int E = kPerCopy<T>;
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const bool ok = valid && c0 + e < n;
            ptx::cp_async_4(reinterpret_cast<T*>(dst) + e, ok ? row + c0 + e : any, ok ? 4 : 0);
        }
    } else {
        const auto* src = reinterpret_cast<const unsigned short*>(row);
        auto* out = reinterpret_cast<unsigned short*>(dst);
#pragma unroll
        for (int e = 0; e < E; ++e) out[e] = valid && c0 + e < n ? __ldg(src + c0 + e) : 0;
    }
}

// Start the copies of one block into `stage` and move the cursor past it. A fragment entry (r, c)
// of lane (g, t) is one of (g, k0), (g + 8, k0), (g, k1), (g + 8, k1); it is bit (r % 4) * 8 + c
// of bitmap word r / 4, and its CSR position is the cursor of row r plus the row's bits below c.
// Missing entries, padding columns and columns past n are zero-filled by the copies themselves.
template <typename T, int NV, int S, bool kVec>
__device__ __forceinline__ void issue_block(WarpRing<NV, S>& ring, int stage, const BlockMeta& m,
                                            const T* __restrict__ values, const T* __restrict__ x, int64_t n,
                                            int64_t nbase, int lane, ValueCursor& cursor) {
    constexpr int E = kPerCopy<T>;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int32_t col = m.col[h];
        const T* row = x + static_cast<int64_t>(col < 0 ? 0 : col) * n;
#pragma unroll
        for (int s = 0; s < NV; ++s) {
            const int64_t c0 = nbase + kStep<T> * s + E * g;
            uint4* dst = &ring.x[stage][h][s][lane];
            if constexpr (kVec) {
                const bool ok = col >= 0 && c0 < n;
                ptx::cp_async_16(dst, ok ? row + c0 : x, ok ? 16 : 0);
            } else {
                copy_elements<T>(dst, row, c0, n, col >= 0, x);
            }
        }
    }
    const int low = g >> 2;  // word of row g (0 or 1); row g + 8 is in word low + 2
    const int shift = (g & 3) * 8;
    const uint32_t row_bits[2] = {((low ? m.bits.y : m.bits.x) >> shift) & 0xffu,
                                  ((low ? m.bits.w : m.bits.z) >> shift) & 0xffu};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t bits = row_bits[k & 1];
        const int c = Element<T>::block_col(t, k >> 1);
        const bool present = (bits >> c) & 1u;
        const uint32_t pos = cursor.next[k & 1] + __popc(bits & ((1u << c) - 1u));
        copy_value<T, NV, S>(ring, stage, k, lane, values, present, pos, cursor.halves);
    }
    cursor.next[0] += __popc(row_bits[0]);
    cursor.next[1] += __popc(row_bits[1]);
}

// Entry k of the lane's A fragment in `stage`, as float.
template <typename T, int NV, int S>
__device__ __forceinline__ float stage_value(const WarpRing<NV, S>& ring, int stage, int k, int lane,
                                             uint32_t halves) {
    const uint32_t word = ring.a[stage][k][lane];
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(word);
    } else {
        const float2 pair = Element<T>::unpack2(word);
        return (halves >> (stage * 4 + k)) & 1u ? pair.y : pair.x;
    }
}

template <typename T, int NV, int S, bool kSplit>
__device__ __forceinline__ void multiply_stage(const WarpRing<NV, S>& ring, int stage, int lane, uint32_t halves,
                                               Acc<T, NV>& acc) {
    const float e[4] = {stage_value<T>(ring, stage, 0, lane, halves), stage_value<T>(ring, stage, 1, lane, halves),
                        stage_value<T>(ring, stage, 2, lane, halves), stage_value<T>(ring, stage, 3, lane, halves)};
    const Tile<T, kSplit> tile(e);
#pragma unroll
    for (int s = 0; s < NV; ++s) tile.multiply(acc[s], ring.x[stage][0][s][lane], ring.x[stage][1][s][lane]);
}

// acc += the TC blocks [rb, re) of one window times X's columns from nbase on; rb is the first
// block of chunk c. Block b + S - 1 is copied while block b multiplies (S - 1 blocks of gathers
// in flight per warp); the metadata of the block after that is loaded one step ahead, so its
// latency hides too.
template <typename T, int WINDOW, int NV, int S, bool kVec, bool kSplit>
__device__ __forceinline__ void warp_blocks(const MetcfArrays& a, const T* __restrict__ values,
                                            const T* __restrict__ x, int64_t n, int64_t nbase, int64_t c, int64_t rb,
                                            int64_t re, int lane, WarpRing<NV, S>& ring, Acc<T, NV>& acc) {
    if (rb >= re) return;
    const int t = lane & 3;
    ValueCursor cursor = start_cursor<WINDOW>(a, c, lane);
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (rb + s < re) {
            issue_block<T, NV, S, kVec>(ring, s, load_meta<T>(a, rb + s, re, t), values, x, n, nbase, lane, cursor);
        }
        ptx::cp_async_commit();
    }
    BlockMeta next = load_meta<T>(a, rb + S - 1, re, t);
    int stage = 0, fill = S - 1;
    for (int64_t b = rb; b < re; ++b) {
        if (b + S - 1 < re) issue_block<T, NV, S, kVec>(ring, fill, next, values, x, n, nbase, lane, cursor);
        ptx::cp_async_commit();
        next = load_meta<T>(a, b + S, re, t);
        ptx::cp_async_wait<S - 1>();
        multiply_stage<T, NV, S, kSplit>(ring, stage, lane, cursor.halves, acc);
        stage = stage + 1 == S ? 0 : stage + 1;
        fill = fill + 1 == S ? 0 : fill + 1;
    }
    ptx::cp_async_wait<0>();
}

// Write the warp's tile (window rows g and g + 8, 2E columns per lane per step): rounded to T
// into y (kStore), or in fp32 added into `partial` (kAtomic) or stored to a workspace tile
// (kWorkspace, rows indexed by window slot).
template <typename T, int WINDOW, int NV, bool kVec>
__device__ __forceinline__ void store_tile(const Acc<T, NV>& acc, StoreMode mode, T* y, float* partial,
                                           const int32_t* row_map, int64_t slot0, int64_t n, int64_t nbase, int lane) {
    constexpr int E = kPerCopy<T>;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < WINDOW / 8; ++h) {
        const int slot = g + 8 * h;
        int64_t row = slot;
        if (mode != StoreMode::kWorkspace) {
            row = row_map[slot0 + slot];
            if (row < 0) continue;
        }
#pragma unroll
        for (int s = 0; s < NV; ++s) {
            const int64_t c0 = nbase + kStep<T> * s + 2 * E * t;
            float v[2 * E];
#pragma unroll
            for (int m = 0; m < E; ++m) {
                v[m] = acc[s][m][2 * h];
                v[E + m] = acc[s][m][2 * h + 1];
            }
            if constexpr (kVec) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    if (c0 + E * q >= n) continue;
                    const float* vq = v + E * q;
                    if (mode == StoreMode::kStore) {
                        *reinterpret_cast<uint4*>(y + row * n + c0 + E * q) = Element<T>::pack(vq);
                    } else {
                        float* p = partial + row * n + c0 + E * q;
#pragma unroll
                        for (int j = 0; j < E; j += 4) {
                            const float4 f = make_float4(vq[j], vq[j + 1], vq[j + 2], vq[j + 3]);
                            if (mode == StoreMode::kAtomic) {
                                ptx::atomic_add_f4(p + j, f);
                            } else {
                                *reinterpret_cast<float4*>(p + j) = f;
                            }
                        }
                    }
                }
            } else {
#pragma unroll
                for (int e = 0; e < 2 * E; ++e) {
                    if (c0 + e >= n) continue;
                    if (mode == StoreMode::kStore) {
                        y[row * n + c0 + e] = Element<T>::from_float(v[e]);
                    } else if (mode == StoreMode::kAtomic) {
                        atomicAdd(partial + row * n + c0 + e, v[e]);
                    } else {
                        partial[row * n + c0 + e] = v[e];
                    }
                }
            }
        }
    }
}

template <typename T, int NV>
__device__ __forceinline__ void zero_acc(Acc<T, NV>& acc) {
#pragma unroll
    for (int s = 0; s < NV; ++s)
#pragma unroll
        for (int m = 0; m < kPerCopy<T>; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[s][m][e] = 0.f;
}

__device__ __forceinline__ int64_t global_warp() {
    return static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
}

// Stages per warp and resident thread blocks per SM: the rings fill shared memory (228 KB per SM
// on sm_90: 6 x 36 KB or 5 x 40 KB), leaving each warp S - 1 blocks of gathers in flight. Two
// steps of a 16-bit type hold 64 accumulators per lane, which spill under the 96 registers of 5
// blocks per SM: 4 blocks (128 registers) there.
template <int NV>
constexpr int stages() { return NV == 1 ? 6 : 4; }
template <typename T, int NV>
constexpr int kMinBlocksPerSm = NV == 1 ? 6 : (sizeof(T) == 4 ? 5 : 4);

// One warp per (row window, column slice), slices of a window adjacent so that they share the
// window's sparse data in L1.
template <typename T, int WINDOW, int NV, int S, bool kVec, bool kSplit>
__global__ void __launch_bounds__(kThreads, (kMinBlocksPerSm<T, NV>))
    metcf_base_kernel(MetcfArrays a, const T* __restrict__ values, const T* __restrict__ x, T* __restrict__ y,
                      int64_t n, int slices) {
    __shared__ WarpRing<NV, S> rings[kWarps];
    const int64_t item = global_warp();
    if (item >= a.num_windows * slices) return;
    const int lane = threadIdx.x & 31;
    const int64_t w = item / slices;
    const int64_t nbase = (item % slices) * (kStep<T> * NV);
    Acc<T, NV> acc;
    zero_acc<T, NV>(acc);
    warp_blocks<T, WINDOW, NV, S, kVec, kSplit>(a, values, x, n, nbase, a.chunk_offsets[w], a.window_offsets[w],
                                                a.window_offsets[w + 1], lane, rings[threadIdx.x >> 5], acc);
    store_tile<T, WINDOW, NV, kVec>(acc, StoreMode::kStore, y, nullptr, a.row_map, w * WINDOW, n, nbase, lane);
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
// stores, a window cut by a range boundary adds atomically into fp32 rows zeroed beforehand.
__device__ __forceinline__ int64_t items_per_warp(int64_t items, int64_t warps) { return (items + warps - 1) / warps; }

template <typename T, int WINDOW, int NV, int S, bool kVec, bool kSplit>
__global__ void __launch_bounds__(kThreads, (kMinBlocksPerSm<T, NV>))
    metcf_balanced_kernel(MetcfArrays a, const T* __restrict__ values, const T* __restrict__ x, T* y,
                          float* partial, int64_t n, int slices, int64_t warps) {
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
        const int64_t nbase = s * (kStep<T> * NV);
        Acc<T, NV> acc;
        zero_acc<T, NV>(acc);
        warp_blocks<T, WINDOW, NV, S, kVec, kSplit>(a, values, x, n, nbase, c, rb, re, lane, rings[threadIdx.x >> 5],
                                                    acc);
        const StoreMode mode = c == first && stop == last ? StoreMode::kStore : StoreMode::kAtomic;
        store_tile<T, WINDOW, NV, kVec>(acc, mode, y, partial, a.row_map, w * WINDOW, n, nbase, lane);
        item += stop - c;
    }
}

// Whether metcf_balanced_kernel adds into (rather than stores) window w's columns of slice s:
// the window has no chunk, or a warp's range boundary cuts it in that slice.
__device__ __forceinline__ bool window_is_cut(const MetcfArrays& a, int64_t w, int64_t s, int slices, int64_t warps) {
    const int64_t chunks = a.chunk_offsets[a.num_windows];
    const int64_t first = a.chunk_offsets[w], count = a.chunk_offsets[w + 1] - first;
    if (count == 0) return true;
    const int64_t per = items_per_warp(chunks * slices, warps);
    const int64_t lo = s * chunks + first;
    return lo / per != (lo + count - 1) / per;
}

// One warp per window: for every slice in which the window is cut, either zero its fp32 sums
// before metcf_balanced_kernel adds into them (kZero) or round them into y afterwards (T not
// fp32). Slices where the window is whole are stored by the kernel itself and left alone.
template <typename T, bool kZero>
__global__ void metcf_cut_windows_kernel(MetcfArrays a, float* __restrict__ partial, T* __restrict__ y, int64_t n,
                                   int64_t slice_width, int slices, int64_t warps) {
    const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= a.num_windows) return;
    for (int64_t s = 0; s < slices; ++s) {
        if (!window_is_cut(a, w, s, slices, warps)) continue;
        const int64_t end = (s + 1) * slice_width < n ? (s + 1) * slice_width : n;
        for (int slot = 0; slot < a.window; ++slot) {
            const int64_t row = a.row_map[w * a.window + slot];
            if (row < 0) continue;
            for (int64_t col = s * slice_width + lane; col < end; col += 32) {
                if constexpr (kZero) {
                    partial[row * n + col] = 0.f;
                } else {
                    y[row * n + col] = Element<T>::from_float(partial[row * n + col]);
                }
            }
        }
    }
}

// Deterministic variant: a warp-stride loop over (chunk, slice) items; windows of one chunk
// store, the chunks of larger windows write their tile to the workspace, which
// metcf_sum_workspace_kernel adds up in chunk order.
template <typename T, int WINDOW, int NV, int S, bool kVec, bool kSplit>
__global__ void __launch_bounds__(kThreads, (kMinBlocksPerSm<T, NV>))
    metcf_balanced_workspace_kernel(MetcfArrays a, const T* __restrict__ values, const T* __restrict__ x,
                                    T* __restrict__ y, int64_t n, int slices, int64_t warps,
                                    float* __restrict__ workspace) {
    __shared__ WarpRing<NV, S> rings[kWarps];
    const int lane = threadIdx.x & 31;
    const int64_t chunks = a.chunk_offsets[a.num_windows];
    const int64_t items = chunks * slices;
    for (int64_t item = global_warp(); item < items; item += warps) {
        const int64_t c = item / slices;
        const int64_t nbase = (item % slices) * (kStep<T> * NV);
        const int64_t w = window_of_chunk(a, c);
        const int64_t first = a.chunk_offsets[w];
        const int64_t count = a.chunk_offsets[w + 1] - first;
        const int64_t wend = a.window_offsets[w + 1];
        const int64_t rb = a.window_offsets[w] + (c - first) * a.chunk;
        const int64_t re = rb + a.chunk < wend ? rb + a.chunk : wend;
        Acc<T, NV> acc;
        zero_acc<T, NV>(acc);
        warp_blocks<T, WINDOW, NV, S, kVec, kSplit>(a, values, x, n, nbase, c, rb, re, lane, rings[threadIdx.x >> 5],
                                                    acc);
        const StoreMode mode = count == 1 ? StoreMode::kStore : StoreMode::kWorkspace;
        store_tile<T, WINDOW, NV, kVec>(acc, mode, y, workspace + c * WINDOW * n, a.row_map, w * WINDOW, n, nbase,
                                        lane);
    }
}

// Deterministic combine: rows of windows not written by exactly one chunk get the sum of their
// chunks' tiles in chunk order (or zero). Grid: (window, 1024-entry piece of the window's tile).
template <typename T>
__global__ void metcf_sum_workspace_kernel(MetcfArrays a, const float* __restrict__ workspace, T* __restrict__ y,
                                           int64_t n) {
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
        y[row * n + col] = Element<T>::from_float(sum);
    }
}

inline int device_sm_count() {
    static int counts[64] = {};  // per device; benign race: every writer stores the same value
    int device = 0;
    cudaGetDevice(&device);
    if (device >= 64) device = 63;
    if (counts[device] == 0) cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device);
    return counts[device] > 0 ? counts[device] : 1;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Column slices of two steps (NV = 2) halve the per-column share of the sparse work (metadata,
// fragment copies) but waste half a warp when only one step is left; take them when that waste
// is at most the last slice. For 16-bit types two steps are 128 columns at 4 blocks per SM: on
// matrices of few windows (band, ogbl-ddi) that leaves SMs idle and runs slower than narrow
// slices, so they go wide only when that fills one wave (16 warps per SM), where wide slices are
// faster (the SBM graphs).
constexpr int64_t kWideMinWarpsPerSm = 16;

template <typename T>
bool use_wide_slices(int64_t n, int64_t num_windows) {
    constexpr int64_t step = kStep<T>;
    if (n < 2 * step || (n % (2 * step) != 0 && n % (2 * step) <= step)) return false;
    return sizeof(T) == 4 || num_windows * ceil_div(n, 2 * step) >= kWideMinWarpsPerSm * device_sm_count();
}

// Runtime shape -> template parameters. The 3xTF32 split exists for fp32 only.
template <typename T, typename Launch>
cudaError_t dispatch(const MetcfArrays& a, const void* x, const void* y, int64_t n, Precision precision,
                     Launch&& launch) {
    const bool vec = n % kPerCopy<T> == 0 && aligned16(x) && aligned16(y);
    const bool split = sizeof(T) == 4 && precision == Precision::kTF32x3;
    return TCS_WINDOW_SWITCH(a.window, WINDOW, [&] {
        return TCS_SLICE_SWITCH(use_wide_slices<T>(n, a.num_windows), NV, [&] {
            return TCS_BOOL_SWITCH(vec, kVec, [&] {
                return TCS_BOOL_SWITCH(split, kSplit, [&] {
                    if constexpr (kSplit && sizeof(T) != 4) {
                        return cudaErrorInvalidValue;
                    } else {
                        return launch.template operator()<WINDOW, NV, stages<NV>(), kVec, kSplit>();
                    }
                });
            });
        });
    });
}

template <typename T, int NV>
int64_t slices_for(int64_t n) { return ceil_div(n, kStep<T> * NV); }

template <typename T>
struct BaseLaunch {
    const MetcfArrays& a;
    const T* values;
    const T* x;
    T* y;
    int64_t n;
    cudaStream_t stream;
    template <int WINDOW, int NV, int S, bool kVec, bool kSplit>
    cudaError_t operator()() const {
        const int64_t slices = slices_for<T, NV>(n);
        const int64_t grid = ceil_div(a.num_windows * slices, kWarps);
        if (grid > 0x7fffffffll) return cudaErrorInvalidConfiguration;
        metcf_base_kernel<T, WINDOW, NV, S, kVec, kSplit>
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
inline int64_t balanced_warps(const MetcfArrays& a, int64_t slices, int resident) {
    const int64_t items = metcf_chunk_bound(a) * slices;
    return std::min<int64_t>(items, static_cast<int64_t>(device_sm_count()) * resident * kWarps);
}

template <typename T>
struct BalancedLaunch {
    const MetcfArrays& a;
    const T* values;
    const T* x;
    T* y;
    int64_t n;
    float* partial;
    float* workspace;
    cudaStream_t stream;
    template <int WINDOW, int NV, int S, bool kVec, bool kSplit>
    cudaError_t operator()() const {
        const int slices = static_cast<int>(slices_for<T, NV>(n));
        if (workspace) {
            const auto kernel = metcf_balanced_workspace_kernel<T, WINDOW, NV, S, kVec, kSplit>;
            static const int resident = resident_blocks(kernel);
            const int64_t warps = balanced_warps(a, slices, resident);
            kernel<<<static_cast<unsigned>(ceil_div(warps, kWarps)), kThreads, 0, stream>>>(a, values, x, y, n, slices,
                                                                                            warps, workspace);
            return cudaGetLastError();
        }
        const auto kernel = metcf_balanced_kernel<T, WINDOW, NV, S, kVec, kSplit>;
        static const int resident = resident_blocks(kernel);
        const int64_t warps = balanced_warps(a, slices, resident);
        const unsigned window_grid = static_cast<unsigned>(ceil_div(a.num_windows * 32, 256));
        constexpr int64_t width = kStep<T> * NV;
        metcf_cut_windows_kernel<T, true><<<window_grid, 256, 0, stream>>>(a, partial, y, n, width, slices, warps);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        kernel<<<static_cast<unsigned>(ceil_div(warps, kWarps)), kThreads, 0, stream>>>(a, values, x, y, partial, n,
                                                                                        slices, warps);
        err = cudaGetLastError();
        if (err != cudaSuccess || static_cast<const void*>(partial) == static_cast<const void*>(y)) return err;
        metcf_cut_windows_kernel<T, false><<<window_grid, 256, 0, stream>>>(a, partial, y, n, width, slices, warps);
        return cudaGetLastError();
    }
};

template <typename T>
struct ShapeQuery {
    bool balanced;
    int64_t n;
    int* resident;
    int64_t* slices;
    template <int WINDOW, int NV, int S, bool kVec, bool kSplit>
    cudaError_t operator()() const {
        *slices = slices_for<T, NV>(n);
        // Asked once per kernel and process, as the launches do: a first choice asks for both
        // kernels' shapes, and the occupancy query is a driver call.
        static const int base_blocks = resident_blocks(metcf_base_kernel<T, WINDOW, NV, S, kVec, kSplit>);
        static const int balanced_blocks = resident_blocks(metcf_balanced_kernel<T, WINDOW, NV, S, kVec, kSplit>);
        *resident = (balanced ? balanced_blocks : base_blocks) * kWarps;
        return cudaGetLastError();
    }
};

}  // namespace

template <typename T>
cudaError_t metcf_spmm_launch_shape(int window, int64_t num_windows, int64_t n, bool balanced, Precision precision,
                                    int* resident, int64_t* slices) {
    MetcfArrays a{};
    a.window = window;
    a.num_windows = num_windows;
    // Null operands count as 16-byte aligned: the shape of the vectorized variant, as for any
    // contiguous X with n a multiple of the copy.
    return dispatch<T>(a, nullptr, nullptr, n, precision, ShapeQuery<T>{balanced, n, resident, slices});
}

template <typename T>
cudaError_t metcf_spmm_base(const MetcfArrays& a, const T* values, const T* x, T* y, int64_t n,
                            Precision precision, cudaStream_t stream) {
    if (a.num_windows == 0 || n == 0) return cudaSuccess;
    return dispatch<T>(a, x, y, n, precision, BaseLaunch<T>{a, values, x, y, n, stream});
}

template <typename T>
cudaError_t metcf_spmm_balanced(const MetcfArrays& a, const T* values, const T* x, T* y, int64_t n,
                                Precision precision, float* partial, float* workspace, cudaStream_t stream) {
    if (a.num_windows == 0 || n == 0) return cudaSuccess;
    if (a.chunk < 1 || (!workspace && !partial)) return cudaErrorInvalidValue;
    cudaError_t err = dispatch<T>(a, x, y, n, precision, BalancedLaunch<T>{a, values, x, y, n, partial, workspace, stream});
    if (err != cudaSuccess || !workspace) return err;
    const dim3 grid(static_cast<unsigned>(a.num_windows), static_cast<unsigned>(ceil_div(a.window * n, 1024)));
    metcf_sum_workspace_kernel<T><<<grid, 256, 0, stream>>>(a, workspace, y, n);
    return cudaGetLastError();
}

}  // namespace tcsparse

// The explicit instantiations of the launch API for one element type (kernels_<type>.cu).
#define TCSPARSE_INSTANTIATE_METCF_KERNELS(T)                                                                       \
    namespace tcsparse {                                                                                             \
    template cudaError_t metcf_spmm_base<T>(const MetcfArrays&, const T*, const T*, T*, int64_t, Precision,     \
                                            cudaStream_t);                                                           \
    template cudaError_t metcf_spmm_balanced<T>(const MetcfArrays&, const T*, const T*, T*, int64_t, Precision, \
                                                float*, float*, cudaStream_t);                                       \
    template cudaError_t metcf_spmm_launch_shape<T>(int, int64_t, int64_t, bool, Precision, int*, int64_t*);        \
    template cudaError_t metcf_sddmm<T>(const MetcfArrays&, const T*, const T*, float*, int64_t, cudaStream_t);     \
    }
