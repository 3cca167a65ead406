// The rows kernel's SplitSums (csr_rows_spmm.h) for a call: where the pieces of split rows meet.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "csr_rows_spmm.h"

namespace tcsparse_binding {

// Buffers that stay zero between calls, so a product needs no memset: one pair per device, on
// its default stream, grown to the largest call seen (calls on one stream never overlap, and
// each leaves them zero). Under CUDA graph capture, and on any other stream, each call takes
// fresh zeroed buffers instead: a replay may run beside eager calls on the stream it was
// captured on, and torch.compile's CUDA graphs run their warm-up on a stream of their own, from
// the graphs' memory pool, which must hold nothing once the call returns.
// The tensors keep the buffers alive until the call has been queued.
struct SplitBuffers {
    at::Tensor sums;
    at::Tensor arrivals;

    tcsparse::SplitSums pointers() const;
};

SplitBuffers split_buffers(const at::Device& device, int64_t num_split_rows, int64_t n);

}  // namespace tcsparse_binding
