// The mean's row scale of a CSR: 1 / (nonzeros of its row) for every nonzero, in CSR order, one
// launch. Raw pointers and a stream (bindings.cpp wraps it).
//
// Why a kernel: torch builds it from the row counts in about eight launches (difference, casts,
// reciprocal, repeat_interleave's cumsum, index and gather), host work that a sampled batch pays for
// every block of a mean aggregation, in a training step that its host time bounds. A thread per
// nonzero finds its row by binary search in rowptr (rows of any length, one pass).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace tcsparse {

// scale[k] = 1 / (rowptr[r + 1] - rowptr[r]) for the row r holding nonzero k, k < nnz =
// rowptr[num_rows]. I: int32 or int64; T: float or double.
template <typename I, typename T>
cudaError_t row_scale(const I* rowptr, int64_t num_rows, int64_t nnz, T* scale, cudaStream_t stream);

}  // namespace tcsparse
