// CSR -> ME-TCF conversion kernels (metcf_convert.h says how the layout is found without a sort).
// Wide windows: one thread per nonzero (or per window) in grid-stride loops; the binary searches
// read rows of the same window, which neighbouring threads share, so they are served by L1 and L2.
// Narrow windows: one thread block per window, a column bitmap in shared memory.
#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "metcf_convert.h"

namespace tcsparse {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 1 << 20;
constexpr int kNarrowWords = static_cast<int>(kNarrowSpan / 32);
constexpr int kWordsPerThread = kNarrowWords / kThreads;
// Thread blocks of the narrow-window kernels (at most; see for_each_narrow_window).
constexpr int64_t kNarrowGrid = 4096;

template <typename I>
__device__ __forceinline__ I lower_bound(const I* __restrict__ a, I lo, I hi, I value) {
    while (lo < hi) {
        const I mid = lo + (hi - lo) / 2;
        if (__ldg(a + mid) < value) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Where nonzero e sits: its window, its slot inside the window and its column.
struct Entry {
    int64_t window;
    int slot;
    int64_t column;
};

template <typename I>
__device__ __forceinline__ Entry locate(const CsrWindows<I>& a, I e) {
    // The row of e is the last r < num_rows with rowptr[r] <= e (empty rows share their start).
    I lo = 0, hi = static_cast<I>(a.num_rows);
    while (hi - lo > 1) {
        const I mid = lo + (hi - lo) / 2;
        if (__ldg(a.rowptr + mid) <= e) lo = mid; else hi = mid;
    }
    const int64_t slot = a.slot_of_row ? static_cast<int64_t>(__ldg(a.slot_of_row + lo)) : static_cast<int64_t>(lo);
    return Entry{slot / a.window, static_cast<int>(slot % a.window), static_cast<int64_t>(__ldg(a.col + e))};
}

__device__ __forceinline__ int64_t first_thread() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__global__ void __launch_bounds__(kThreads)
    row_map_kernel(const int64_t* __restrict__ row_perm, int64_t num_rows, int64_t num_slots,
                   int32_t* __restrict__ row_map, int32_t* __restrict__ slot_of_row) {
    for (int64_t s = first_thread(); s < num_slots; s += thread_stride()) {
        if (s >= num_rows) {
            row_map[s] = -1;
        } else if (row_perm) {
            const int64_t row = row_perm[s];
            row_map[s] = static_cast<int32_t>(row);
            slot_of_row[row] = static_cast<int32_t>(s);
        } else {
            row_map[s] = static_cast<int32_t>(s);
        }
    }
}

template <typename I>
__global__ void __launch_bounds__(kThreads) narrow_windows_kernel(CsrWindows<I> a, I* __restrict__ narrow_base) {
    for (int64_t w = first_thread(); w < a.num_windows; w += thread_stride()) {
        int64_t low = INT64_MAX, high = -1;
        for (int q = 0; q < a.window; ++q) {
            const int32_t row = __ldg(a.row_map + w * a.window + q);
            if (row < 0) break;
            const I begin = __ldg(a.rowptr + row), end = __ldg(a.rowptr + row + 1);
            if (begin == end) continue;
            low = min(low, static_cast<int64_t>(__ldg(a.col + begin)));
            high = max(high, static_cast<int64_t>(__ldg(a.col + end - 1)));
        }
        narrow_base[w] = high >= 0 && high - low < kNarrowSpan ? static_cast<I>(low) : static_cast<I>(-1);
    }
}

// A narrow window's rows as the thread block walks them: nonzero k of the window (rows in slot
// order) is nonzero begin[q] + k - before[q] of the CSR, q the last slot with before[q] <= k.
template <typename I>
struct WindowRows {
    I begin[16];
    int64_t before[17];
    int rows;

    __device__ void load(const CsrWindows<I>& a, int64_t w) {  // one thread
        before[0] = 0;
        rows = 0;
        for (int q = 0; q < a.window; ++q) {
            const int32_t row = __ldg(a.row_map + w * a.window + q);
            if (row < 0) break;
            begin[q] = __ldg(a.rowptr + row);
            before[q + 1] = before[q] + (__ldg(a.rowptr + row + 1) - begin[q]);
            rows = q + 1;
        }
    }

    __device__ int64_t total() const { return before[rows]; }

    __device__ int slot_of(int64_t k) const {
        int q = 0;
        while (k >= before[q + 1]) ++q;
        return q;
    }
};

// Runs window(w) for every narrow window w, a thread block per window. Thread block b screens
// windows b, b + G, b + 2G, ... (G thread blocks), kThreads of them at a time, and works through
// the narrow ones it lists: with fewer windows than thread blocks every window gets a block of
// its own, and millions of wide windows cost each block a few screening passes.
template <typename I, typename F>
__device__ __forceinline__ void for_each_narrow_window(const CsrWindows<I>& a, F&& window) {
    __shared__ int64_t listed[kThreads];
    __shared__ int count;
    const int64_t blocks = gridDim.x;
    for (int64_t start = blockIdx.x; start < a.num_windows; start += blocks * kThreads) {
        if (threadIdx.x == 0) count = 0;
        __syncthreads();
        const int64_t w = start + threadIdx.x * blocks;
        if (w < a.num_windows && __ldg(a.narrow_base + w) >= 0) listed[atomicAdd(&count, 1)] = w;
        __syncthreads();
        for (int i = 0; i < count; ++i) window(listed[i]);
        __syncthreads();
    }
}

// Sets the bit of every column of window w (relative to its base) in `bits`, zeroed here first;
// on_bit(e, old) sees each nonzero with the word as it was before its bit went in.
template <typename I, typename F>
__device__ __forceinline__ void mark_columns(const CsrWindows<I>& a, int64_t w, WindowRows<I>& rows, uint32_t* bits,
                                             F&& on_bit) {
    if (threadIdx.x == 0) rows.load(a, w);
    for (int i = threadIdx.x; i < kNarrowWords; i += kThreads) bits[i] = 0;
    __syncthreads();
    const I base = __ldg(a.narrow_base + w);
    for (int64_t k = threadIdx.x; k < rows.total(); k += kThreads) {
        const int q = rows.slot_of(k);
        const I e = rows.begin[q] + static_cast<I>(k - rows.before[q]);
        const int64_t c = static_cast<int64_t>(__ldg(a.col + e)) - base;
        const uint32_t bit = 1u << (c & 31);
        on_bit(e, atomicOr(bits + (c >> 5), bit) & bit);
    }
    __syncthreads();
}

template <typename I>
__global__ void __launch_bounds__(kThreads) narrow_mark_kernel(CsrWindows<I> a, I* __restrict__ first) {
    __shared__ uint32_t bits[kNarrowWords];
    __shared__ WindowRows<I> rows;
    for_each_narrow_window(a, [&](int64_t w) {
        mark_columns(a, w, rows, bits, [&](I e, uint32_t was_set) { first[e + 1] = was_set ? 0 : 1; });
    });
}

template <typename I>
__global__ void __launch_bounds__(kThreads)
    narrow_place_kernel(CsrWindows<I> a, const I* __restrict__ first_before, const int32_t* __restrict__ window_offsets,
                        int32_t* __restrict__ block_cols, uint32_t* __restrict__ block_bitmap,
                        int32_t* __restrict__ block_nnz, I* __restrict__ nnz_block, uint8_t* __restrict__ nnz_local) {
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ uint32_t bits[kNarrowWords];
    __shared__ int below_word[kNarrowWords];  // set bits in the words before each word
    __shared__ WindowRows<I> rows;
    __shared__ typename Scan::TempStorage scan;
    for_each_narrow_window(a, [&](int64_t w) {
        mark_columns(a, w, rows, bits, [](I, uint32_t) {});
        int counts[kWordsPerThread];
        int sum = 0;
#pragma unroll
        for (int j = 0; j < kWordsPerThread; ++j) {
            counts[j] = __popc(bits[threadIdx.x * kWordsPerThread + j]);
            sum += counts[j];
        }
        Scan(scan).ExclusiveSum(sum, sum);
#pragma unroll
        for (int j = 0; j < kWordsPerThread; ++j) {
            below_word[threadIdx.x * kWordsPerThread + j] = sum;
            sum += counts[j];
        }
        __syncthreads();
        const I base = __ldg(a.narrow_base + w);
        const int64_t first_block = __ldg(window_offsets + w);
        for (int64_t k = threadIdx.x; k < rows.total(); k += kThreads) {
            const int q = rows.slot_of(k);
            const I e = rows.begin[q] + static_cast<I>(k - rows.before[q]);
            const I column = __ldg(a.col + e);
            const int64_t c = static_cast<int64_t>(column) - base;
            const int rank = below_word[c >> 5] + __popc(bits[c >> 5] & ((1u << (c & 31)) - 1u));
            const int64_t block = first_block + rank / 8;
            const int lane = rank % 8;
            const int local = q * 8 + lane;
            if (__ldg(first_before + e + 1) != __ldg(first_before + e)) block_cols[block * 8 + lane] = static_cast<int32_t>(column);
            atomicOr(block_bitmap + block * 4 + (local >> 5), 1u << (local & 31));
            atomicAdd(block_nnz + block + 1, 1);
            nnz_block[e] = static_cast<I>(block);
            nnz_local[e] = static_cast<uint8_t>(local);
        }
        __syncthreads();
    });
}

template <typename I>
__global__ void __launch_bounds__(kThreads)
    mark_first_kernel(CsrWindows<I> a, I* __restrict__ first, I* __restrict__ owner) {
    for (int64_t e = first_thread(); e < a.nnz; e += thread_stride()) {
        const Entry entry = locate(a, static_cast<I>(e));
        if (__ldg(a.narrow_base + entry.window) >= 0) continue;  // narrow_mark_kernel's
        const I c = static_cast<I>(entry.column);
        I found = static_cast<I>(e);
        for (int q = 0; q < entry.slot; ++q) {
            const int32_t row = __ldg(a.row_map + entry.window * a.window + q);
            const I end = __ldg(a.rowptr + row + 1);
            const I at = lower_bound(a.col, __ldg(a.rowptr + row), end, c);
            if (at != end && __ldg(a.col + at) == c) {
                found = at;  // the earliest row holding c: its nonzero is the first
                break;
            }
        }
        first[e + 1] = found == static_cast<I>(e) ? 1 : 0;
        owner[e] = found;
    }
}

template <typename I>
__global__ void __launch_bounds__(kThreads)
    window_counts_kernel(CsrWindows<I> a, const I* __restrict__ first_before, int chunk,
                         int64_t* __restrict__ counts) {
    const int64_t stride = a.num_windows + 1;
    unsigned long long longest = 0;
    for (int64_t w = first_thread(); w < a.num_windows; w += thread_stride()) {
        int64_t distinct = 0;
        for (int q = 0; q < a.window; ++q) {
            const int32_t row = __ldg(a.row_map + w * a.window + q);
            if (row < 0) break;  // past the last row: the rest of the window is padding
            const I begin = __ldg(a.rowptr + row), end = __ldg(a.rowptr + row + 1);
            distinct += __ldg(first_before + end) - __ldg(first_before + begin);
            longest = max(longest, static_cast<unsigned long long>(end - begin));
        }
        const int64_t blocks = (distinct + 7) / 8;
        counts[1 + w] = blocks;
        counts[stride + 1 + w] = (blocks + chunk - 1) / chunk;
        counts[2 * stride + 1 + w] = blocks > 0;
    }
    if (longest) atomicMax(reinterpret_cast<unsigned long long*>(counts + 3 * stride), longest);
}

// The first nonzero of each column: the column's rank among the window's distinct columns is the
// number of first nonzeros of smaller columns, row by row (in its own row, those before it).
template <typename I>
__global__ void __launch_bounds__(kThreads)
    place_first_kernel(CsrWindows<I> a, const I* __restrict__ first_before, const int32_t* __restrict__ window_offsets,
                       int32_t* __restrict__ block_cols, uint32_t* __restrict__ block_bitmap,
                       int32_t* __restrict__ block_nnz, I* __restrict__ nnz_block, uint8_t* __restrict__ nnz_local) {
    for (int64_t e = first_thread(); e < a.nnz; e += thread_stride()) {
        if (__ldg(first_before + e + 1) == __ldg(first_before + e)) continue;
        const Entry entry = locate(a, static_cast<I>(e));
        if (__ldg(a.narrow_base + entry.window) >= 0) continue;  // narrow_place_kernel's
        const I c = static_cast<I>(entry.column);
        int64_t rank = 0;
        for (int q = 0; q < a.window; ++q) {
            const int32_t row = __ldg(a.row_map + entry.window * a.window + q);
            if (row < 0) break;
            const I begin = __ldg(a.rowptr + row);
            const I below = q == entry.slot ? static_cast<I>(e) : lower_bound(a.col, begin, __ldg(a.rowptr + row + 1), c);
            rank += __ldg(first_before + below) - __ldg(first_before + begin);
        }
        const int64_t block = __ldg(window_offsets + entry.window) + rank / 8;
        const int lane = static_cast<int>(rank % 8);
        const int local = entry.slot * 8 + lane;
        block_cols[block * 8 + lane] = static_cast<int32_t>(c);
        atomicOr(block_bitmap + block * 4 + (local >> 5), 1u << (local & 31));
        atomicAdd(block_nnz + block + 1, 1);
        nnz_block[e] = static_cast<I>(block);
        nnz_local[e] = static_cast<uint8_t>(local);
    }
}

// Every other nonzero shares its first's block and column lane, in its own row.
template <typename I>
__global__ void __launch_bounds__(kThreads)
    place_rest_kernel(CsrWindows<I> a, const I* __restrict__ first_before, uint32_t* __restrict__ block_bitmap,
                      int32_t* __restrict__ block_nnz, I* __restrict__ nnz_block, uint8_t* __restrict__ nnz_local) {
    for (int64_t e = first_thread(); e < a.nnz; e += thread_stride()) {
        if (__ldg(first_before + e + 1) != __ldg(first_before + e)) continue;
        const Entry entry = locate(a, static_cast<I>(e));
        if (__ldg(a.narrow_base + entry.window) >= 0) continue;
        const I owner = nnz_block[e];  // a first nonzero, placed by place_first_kernel
        const I block = nnz_block[owner];
        const int local = entry.slot * 8 + (nnz_local[owner] & 7);
        atomicOr(block_bitmap + static_cast<int64_t>(block) * 4 + (local >> 5), 1u << (local & 31));
        atomicAdd(block_nnz + block + 1, 1);
        nnz_block[e] = block;
        nnz_local[e] = static_cast<uint8_t>(local);
    }
}

template <typename I>
__global__ void __launch_bounds__(kThreads)
    order_kernel(int64_t nnz, const I* __restrict__ nnz_block, const uint8_t* __restrict__ nnz_local,
                 const uint32_t* __restrict__ block_bitmap, const int32_t* __restrict__ block_offsets,
                 uint8_t* __restrict__ local_ids, I* __restrict__ csr_gather) {
    for (int64_t e = first_thread(); e < nnz; e += thread_stride()) {
        const int64_t block = nnz_block[e];
        const int local = nnz_local[e];
        const uint4 words = __ldg(reinterpret_cast<const uint4*>(block_bitmap) + block);
        const uint32_t word[4] = {words.x, words.y, words.z, words.w};
        int below = __popc(word[local >> 5] & ((1u << (local & 31)) - 1u));
#pragma unroll
        for (int k = 0; k < 3; ++k) below += k < (local >> 5) ? __popc(word[k]) : 0;
        const int64_t position = __ldg(block_offsets + block) + below;
        local_ids[position] = static_cast<uint8_t>(local);
        csr_gather[e] = static_cast<I>(position);
    }
}

unsigned grid_for(int64_t items) {
    return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxGrid)));
}

}  // namespace

cudaError_t metcf_row_map(const int64_t* row_perm, int64_t num_rows, int64_t num_slots, int32_t* row_map,
                          int32_t* slot_of_row, cudaStream_t stream) {
    if (num_slots == 0) return cudaSuccess;
    row_map_kernel<<<grid_for(num_slots), kThreads, 0, stream>>>(row_perm, num_rows, num_slots, row_map, slot_of_row);
    return cudaGetLastError();
}

unsigned narrow_grid(int64_t num_windows) {
    return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(num_windows, kNarrowGrid)));
}

template <typename I>
cudaError_t metcf_narrow_windows(const CsrWindows<I>& a, I* narrow_base, cudaStream_t stream) {
    if (a.num_windows == 0) return cudaSuccess;
    narrow_windows_kernel<I><<<grid_for(a.num_windows), kThreads, 0, stream>>>(a, narrow_base);
    return cudaGetLastError();
}

template <typename I>
cudaError_t metcf_mark_first(const CsrWindows<I>& a, I* first, I* owner, cudaStream_t stream) {
    if (a.nnz == 0) return cudaSuccess;
    narrow_mark_kernel<I><<<narrow_grid(a.num_windows), kThreads, 0, stream>>>(a, first);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    mark_first_kernel<I><<<grid_for(a.nnz), kThreads, 0, stream>>>(a, first, owner);
    return cudaGetLastError();
}

template <typename I>
cudaError_t metcf_window_counts(const CsrWindows<I>& a, const I* first_before, int chunk, int64_t* counts,
                                cudaStream_t stream) {
    if (a.num_windows == 0) return cudaSuccess;
    window_counts_kernel<I><<<grid_for(a.num_windows), kThreads, 0, stream>>>(a, first_before, chunk, counts);
    return cudaGetLastError();
}

template <typename I>
cudaError_t metcf_place(const CsrWindows<I>& a, const I* first_before, const int32_t* window_offsets,
                        int32_t* block_cols, uint32_t* block_bitmap, int32_t* block_nnz, I* nnz_block,
                        uint8_t* nnz_local, cudaStream_t stream) {
    if (a.nnz == 0) return cudaSuccess;
    narrow_place_kernel<I><<<narrow_grid(a.num_windows), kThreads, 0, stream>>>(
        a, first_before, window_offsets, block_cols, block_bitmap, block_nnz, nnz_block, nnz_local);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    place_first_kernel<I><<<grid_for(a.nnz), kThreads, 0, stream>>>(a, first_before, window_offsets, block_cols,
                                                                    block_bitmap, block_nnz, nnz_block, nnz_local);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    place_rest_kernel<I><<<grid_for(a.nnz), kThreads, 0, stream>>>(a, first_before, block_bitmap, block_nnz,
                                                                   nnz_block, nnz_local);
    return cudaGetLastError();
}

template <typename I>
cudaError_t metcf_order(int64_t nnz, const I* nnz_block, const uint8_t* nnz_local, const uint32_t* block_bitmap,
                        const int32_t* block_offsets, uint8_t* local_ids, I* csr_gather, cudaStream_t stream) {
    if (nnz == 0) return cudaSuccess;
    order_kernel<I><<<grid_for(nnz), kThreads, 0, stream>>>(nnz, nnz_block, nnz_local, block_bitmap, block_offsets,
                                                            local_ids, csr_gather);
    return cudaGetLastError();
}

#define TCSPARSE_INSTANTIATE_CONVERT(I)                                                                             \
    template cudaError_t metcf_narrow_windows<I>(const CsrWindows<I>&, I*, cudaStream_t);                           \
    template cudaError_t metcf_mark_first<I>(const CsrWindows<I>&, I*, I*, cudaStream_t);                           \
    template cudaError_t metcf_window_counts<I>(const CsrWindows<I>&, const I*, int, int64_t*, cudaStream_t);       \
    template cudaError_t metcf_place<I>(const CsrWindows<I>&, const I*, const int32_t*, int32_t*, uint32_t*,        \
                                        int32_t*, I*, uint8_t*, cudaStream_t);                                      \
    template cudaError_t metcf_order<I>(int64_t, const I*, const uint8_t*, const uint32_t*, const int32_t*,         \
                                        uint8_t*, I*, cudaStream_t);

TCSPARSE_INSTANTIATE_CONVERT(int32_t)
TCSPARSE_INSTANTIATE_CONVERT(int64_t)

}  // namespace tcsparse
