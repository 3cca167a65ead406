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
    int64_t num_rows;
    int64_t nnz;
    int64_t num_windows;
    int window;  // 8 or 16
};

// first[0] = 0 and first[e + 1] = 1 when nonzero e is the first of its column in its window (no
// row at an earlier slot of the window holds the column), else 0. The caller turns `first` into
// its inclusive prefix sum, `first_before`: first_before[e] counts the first nonzeros before e.
template <typename I>
cudaError_t metcf_mark_first(const CsrWindows<I>& a, I* first, cudaStream_t stream);

// TC blocks of every window: its distinct columns (the first nonzeros of its rows) over 8,
// rounded up.
template <typename I>
cudaError_t metcf_window_blocks(const CsrWindows<I>& a, const I* first_before, int64_t* blocks, cudaStream_t stream);

// Places every nonzero: its block and local id (row_in_window * 8 + col_in_block) into
// nnz_block / nnz_local, its column into block_cols (by the first nonzero of the column; the
// caller fills -1 first), its bit into block_bitmap and a count into block_nnz[block + 1] (both
// zeroed by the caller).
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
