// Launch API of the CSR -> ME-TCF conversion on the GPU: raw pointers and a stream, no torch
// types (bindings.cpp wraps it). The layout is the one formats/metcf.py documents and builds with
// torch ops on the CPU, entry for entry.
//
// Why no sort: a window's nonzeros are the rows it holds, each already sorted by column (canonical
// CSR). A nonzero is the "first" of its column when no earlier row of its window holds that
// column; the rank of a column among the window's distinct columns is the number of first
// nonzeros with a smaller column, which a binary search in each row of the window and a prefix
// sum of the first-flags give. Every step is one thread per nonzero, so a hub row of 10^6
// nonzeros costs no more per nonzero than a short one.
//
// Narrow windows (columns spanning at most kNarrowSpan ids: banded, clustered and small dense
// graphs, whose windows hold thousands of nonzeros on few distinct columns) skip the searches:
// one thread block per window sets a bit per column in shared memory, and a column's rank is
// the set bits below it (a prefix sum of the words' popcounts). There, one nonzero per column
// (whichever sets its bit first) is flagged first.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace tcsparse {

// A canonical CSR (rows ascending, columns ascending and distinct inside a row) and its row order:
// slot s holds original row row_map[s] (-1 past the last row); original row r sits at slot
// slot_of_row[r], or at slot r when slot_of_row is null. I is the index type (int32 or int64).
template <typename I>
struct CsrWindows {
    const I* rowptr;             // [num_rows + 1]
    const I* col;                // [nnz]
    const int32_t* row_map;      // [num_windows * window]
    const int32_t* slot_of_row;  // [num_rows] or nullptr
    // [num_windows]: a narrow window's smallest column, -1 for the others (wide or empty);
    // written by metcf_narrow_windows, which every later step needs first.
    const I* narrow_base;
    int64_t num_rows;
    int64_t nnz;
    int64_t num_windows;
    int window;  // 8 or 16
};

// row_map[s] = the original row at slot s (row_perm[s], or s when row_perm is null), -1 for the
// num_slots - num_rows slots past the last row; with a permutation, slot_of_row[row_perm[s]] = s.
cudaError_t metcf_row_map(const int64_t* row_perm, int64_t num_rows, int64_t num_slots, int32_t* row_map,
                          int32_t* slot_of_row, cudaStream_t stream);

constexpr int64_t kNarrowSpan = int64_t{1} << 16;  // columns: a bitmap of 8 KB in shared memory

// narrow_base[w] = the smallest column of window w when its columns span at most kNarrowSpan ids,
// else -1 (also for windows without nonzeros).
template <typename I>
cudaError_t metcf_narrow_windows(const CsrWindows<I>& a, I* narrow_base, cudaStream_t stream);

// first[0] = 0 and first[e + 1] = 1 when nonzero e is the first of its column in its window (no
// row at an earlier slot of the window holds the column), else 0; owner[e] = that first nonzero
// (e itself when it is first; owners are left unset in narrow windows). The caller turns `first` into its inclusive prefix sum,
// `first_before`: first_before[e] counts the first nonzeros before e.
template <typename I>
cudaError_t metcf_mark_first(const CsrWindows<I>& a, I* first, I* owner, cudaStream_t stream);

// Per window w, counts[1 + w] = its TC blocks (distinct columns over 8, rounded up),
// counts[W + 2 + w] = its balanced chunks (blocks over `chunk`, rounded up) and
// counts[2 W + 3 + w] = 1 when it has a block (W windows); counts[3 W + 3] = the longest row
// (atomicMax: the caller zeroes counts). Inclusive prefix sums of the three rows of W + 1 then
// give window_offsets, chunk_offsets and the non-empty windows before each window.
template <typename I>
cudaError_t metcf_window_counts(const CsrWindows<I>& a, const I* first_before, int chunk, int64_t* counts,
                                cudaStream_t stream);

// Places every nonzero: its block and local id (row_in_window * 8 + col_in_block) into
// nnz_block / nnz_local, its column into block_cols (by the first nonzero of the column; the
// caller fills -1 first), its bit into block_bitmap and a count into block_nnz[block + 1] (both
// zeroed by the caller). nnz_block holds metcf_mark_first's owners on entry: the first nonzeros
// rank their column (a binary search per row of the window), the others take their first's.
template <typename I>
cudaError_t metcf_place(const CsrWindows<I>& a, const I* first_before, const int32_t* window_offsets,
                        int32_t* block_cols, uint32_t* block_bitmap, int32_t* block_nnz, I* nnz_block,
                        uint8_t* nnz_local, cudaStream_t stream);

// Block order: nonzero e goes to block_offsets[block] plus the set bits of its block's bitmap
// below its local id; local_ids[position] = its local id, csr_gather[e] = position.
template <typename I>
cudaError_t metcf_order(int64_t nnz, const I* nnz_block, const uint8_t* nnz_local, const uint32_t* block_bitmap,
                        const int32_t* block_offsets, uint8_t* local_ids, I* csr_gather, cudaStream_t stream);

}  // namespace tcsparse
