// A sampled block's columns in CSR order, from the sources of its edges grouped by target: each
// row's sources sorted, one thread per row. Raw pointers and a stream (bindings.cpp wraps it).
//
// Why not torch.sort of row-major keys: a batch's first block holds about a million edges, and
// the 64-bit keys' radix sort takes eight passes (about 150 us on an H200, most of a batch's
// conversion), where a sampled row holds a handful of edges. A thread places each of its row's
// sources at its rank (the sources below it, and the equal ones before it), so no row needs
// scratch of its own length; a row of d sources costs d^2 comparisons, which the caller bounds by
// taking this route only for rows of at most kSortedRowLimit sources.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace tcsparse {

constexpr int64_t kSortedRowLimit = 64;

// col[k] for k in row r's range [rowptr[r], rowptr[r + 1]): that row's sources, ascending. I is
// the index type of rowptr and col (int32 or int64).
template <typename I>
cudaError_t sort_row_sources(const I* rowptr, int64_t num_rows, const int64_t* source, I* col, cudaStream_t stream);

}  // namespace tcsparse
