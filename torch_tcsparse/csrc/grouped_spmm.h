// Launch API of the grouped Tensor-Core SpMM ("grouped" path): raw pointers and a stream, no torch
// types (grouped_binding.cpp wraps it).
//
// Why groups: ME-TCF condenses the columns of each 16-row window, and a warp gathers the rows of X
// that its window's blocks name, so each row of X is read once per window that touches it. On
// dense-ish graphs nearly every window touches nearly every column (ogbl-ddi: 4,267 nodes, ~500
// nonzeros per row): X is read as many times as there are windows. Here the columns are condensed
// per group of kGroupWindows consecutive windows (64 rows), the group's 8-column blocks are shared
// by its windows, and one warp multiplies the rows of X it gathers for a block by the 16 x 8
// sub-blocks of several windows: X is read once per group, a quarter as often. On sparse graphs
// (R-MAT) the windows of a group share few columns and the sub-blocks are mostly empty: the
// selector leaves the path out there.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "metcf_spmm.h"

namespace tcsparse {

constexpr int kGroupWindows = 4;   // 16-row windows per group
constexpr int kGroupRows = 16 * kGroupWindows;
constexpr int kFragmentEntries = 16 * 8;  // entries of a 16 x 8 sub-block: 4 per lane

// A grouped layout (torch_tcsparse/formats/grouped.py). Blocks are numbered across groups, those
// of a group consecutive; a chunk is a run of blocks of one group, the unit of work of one warp
// (with a slice of output columns), so a group of many blocks spreads over many warps whose
// partial sums are added atomically. Every group has at least one chunk (an empty group's holds
// no block).
struct GroupedArrays {
    const int32_t* chunk_starts;  // [num_chunks + 1]: first block of each chunk, then num_blocks
    const int32_t* chunk_group;   // [num_chunks]
    const int32_t* block_cols;    // [num_blocks * 8]: original column ids, -1 for padding
    const int32_t* sub_slots;     // [num_blocks * kGroupWindows]: the fragment slot of sub-block
                                  // (block, window), -1 where it is empty
    const int32_t* row_map;       // [num_groups * kGroupRows]: original row of each slot, -1 past the end
    int64_t num_chunks;
};

// Y = A @ X, [num_rows, n], in one of two ways:
//   out set: out += A @ X in fp32, out zeroed (or holding the bias) by the caller; then, for a
//     16-bit T and y not null, y = out rounded to T. bias is not read.
//   out null (16-bit T, every group of one chunk: num_chunks == num_groups, the layout giving
//     every group at least one): each chunk's warps write their rows (+ bias, when not null)
//     rounded into y; nothing to zero beforehand.
// X (T) row-major with leading dimension n; fragments [slots * kFragmentEntries] (T, 16-byte
// aligned): per slot and lane, the lane's four A entries (formats/grouped.py, fragment_values).
// precision: TF32 or the 3xTF32 split (fp32 X only).
template <typename T>
cudaError_t grouped_spmm(const GroupedArrays& a, const T* fragments, const T* x, float* out, T* y, const T* bias,
                         int64_t num_rows, int64_t n, Precision precision, cudaStream_t stream);

}  // namespace tcsparse
