// The rows kernel's SplitSums (csr_rows_spmm.h) for a call: where the pieces of split rows meet.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "csr_rows_spmm.h"

namespace tcsparse_binding {

// Buffers that stay zero between calls, so a product needs no memset: one pair per (device,
// stream), grown to the largest call seen on it (calls on one stream never overlap, and each
// leaves them zero). Under CUDA graph capture each call takes fresh zeroed buffers from the
// graph's pool instead: a replay may run beside eager calls on the stream it was captured on.
// The tensors keep the buffers alive until the call has been queued.
struct SplitBuffers {
    at::Tensor sums;
    at::Tensor arrivals;

    tcsparse::SplitSums pointers() const;
};

SplitBuffers split_buffers(const at::Device& device, int64_t num_split_rows, int64_t n);

}  // namespace tcsparse_binding
