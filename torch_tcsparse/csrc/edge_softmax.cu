// Attention's softmax with in-kernel edge scores (edge_softmax.h).
//
// One thread per (piece, head), the heads of a piece on consecutive threads: a warp reads whole
// [heads] rows of the per-node arrays and writes alpha's rows contiguously. A piece's row term
// (GAT's dst[row, h], the query row) is read once. Each pass over a piece recomputes the scores
// from the per-node arrays (L1/L2 hits on a piece's second pass) rather than storing them.
//
// Forward: pass 1 keeps an online (max, sum) over the piece; a row of one piece then writes alpha
// in pass 2 at once, a split row's pieces leave (max, sum) in their slots, one thread per
// (split row, head) merges them in order and writes the row's totals back to every slot, and a
// second launch runs pass 2 of the split rows' pieces. The backward follows the same plan with
// sum(alpha * g) for the slots, then the row sums of the score gradients.
#include "edge_softmax.h"

#include <cmath>

#include "elements.cuh"

namespace tcsparse {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr float kSumEpsilon = 1e-16f;  // PyG's softmax adds it to each row's sum

template <typename T>
__device__ __forceinline__ float as_float(T v) {
    return Element<T>::to_float(v);
}

template <typename T>
struct GatRule {
    GatScores<T> s;
    int64_t heads;
    struct Row {
        float dst;
    };
    __device__ Row row(int64_t row, int64_t h) const {
        return {s.dst != nullptr ? as_float(s.dst[row * heads + h]) : 0.f};
    }
    __device__ float input(const Row& r, int64_t col, int64_t h) const { return as_float(s.src[col * heads + h]) + r.dst; }
    __device__ float score(const Row& r, int64_t col, int64_t h) const {
        const float v = input(r, col, h);
        return v > 0.f ? v : v * s.negative_slope;
    }
    // torch's leaky_relu backward: slope 1 where the input is positive, else negative_slope.
    __device__ float slope(const Row& r, int64_t col, int64_t h) const {
        return input(r, col, h) > 0.f ? 1.f : s.negative_slope;
    }
};

template <typename T>
struct DotRule {
    DotScores<T> s;
    int64_t heads;
    struct Row {
        const T* query;
    };
    __device__ Row row(int64_t row, int64_t h) const { return {s.query + (row * heads + h) * s.channels}; }
    __device__ float score(const Row& r, int64_t col, int64_t h) const {
        const T* key = s.key + (col * heads + h) * s.channels;
        float sum = 0.f;
        for (int64_t c = 0; c < s.channels; ++c) sum += as_float(r.query[c]) * as_float(key[c]);
        return sum * s.scale;
    }
    __device__ float slope(const Row&, int64_t, int64_t) const { return s.scale; }
};

template <typename T>
struct RuleOf;
template <typename T>
struct RuleOf<GatScores<T>> {
    using type = GatRule<T>;
};
template <typename T>
struct RuleOf<DotScores<T>> {
    using type = DotRule<T>;
};

struct PieceThread {
    int64_t piece, head, slot, row, begin, end;
};

// The (piece, head) of this thread, or false past the last piece (or, with split_only, on a
// piece of a row of one piece).
__device__ __forceinline__ bool piece_thread(const RowPieces& pieces, int64_t heads, bool split_only, PieceThread& t) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    t.piece = thread / heads;
    if (t.piece >= pieces.count) return false;
    t.slot = pieces.slot[t.piece];
    if (split_only && t.slot < 0) return false;
    t.head = thread % heads;
    t.row = pieces.row[t.piece];
    t.begin = pieces.begin[t.piece];
    t.end = pieces.begin[t.piece + 1];
    return true;
}

// Calls f(k, v) for the edges k of [begin, end) in order, v = load(k), the loads of kBatch edges
// issued before any of them is used: a walk of dependent loads (column, then the node's array)
// keeps kBatch of them in flight.
constexpr int kBatch = 4;

template <typename Load, typename F>
__device__ __forceinline__ void walk(int64_t begin, int64_t end, const Load& load, const F& f) {
    for (int64_t k = begin; k < end; k += kBatch) {
        decltype(load(k)) v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            if (k + u < end) v[u] = load(k + u);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            if (k + u < end) f(k + u, v[u]);
        }
    }
}

// Online softmax: (m, s) with s = sum exp(e - m) over what was seen, m its maximum.
__device__ __forceinline__ void add_score(float e, float& m, float& s) {
    if (e > m) {
        s = s * expf(m - e) + 1.f;
        m = e;
    } else {
        s += expf(e - m);
    }
}

__device__ __forceinline__ void add_partial(float pm, float ps, float& m, float& s) {
    if (pm > m) {
        s = s * expf(m - pm) + ps;
        m = pm;
    } else if (ps > 0.f) {
        s += ps * expf(pm - m);
    }
}

template <typename T, typename Rule>
__global__ void __launch_bounds__(kThreadsPerBlock)
    softmax_kernel(RowPieces pieces, const int32_t* __restrict__ col, Rule rule, T* __restrict__ alpha,
                   float2* __restrict__ slots, bool split_only) {
    PieceThread t;
    if (!piece_thread(pieces, rule.heads, split_only, t)) return;
    const typename Rule::Row r = rule.row(t.row, t.head);
    const auto score = [&](int64_t k) { return rule.score(r, col[k], t.head); };
    float m = -INFINITY, s = 0.f;
    if (split_only) {
        const float2 total = slots[t.slot * rule.heads + t.head];
        m = total.x;
        s = total.y;
    } else {
        walk(t.begin, t.end, score, [&](int64_t, float e) { add_score(e, m, s); });
        if (t.slot >= 0) {
            slots[t.slot * rule.heads + t.head] = make_float2(m, s);
            return;
        }
    }
    const float denominator = s + kSumEpsilon;
    walk(t.begin, t.end, score, [&](int64_t k, float e) {
        alpha[k * rule.heads + t.head] = Element<T>::from_float(expf(e - m) / denominator);
    });
}

// One thread per (split row, head): its slots' (max, sum) merged in order, the total written back
// to every slot.
__global__ void __launch_bounds__(kThreadsPerBlock)
    merge_softmax_kernel(RowPieces pieces, int64_t heads, float2* __restrict__ slots) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t split = thread / heads;
    if (split >= pieces.num_split) return;
    const int64_t h = thread % heads;
    const int64_t first = pieces.split_begin[split], last = pieces.split_begin[split + 1];
    float m = -INFINITY, s = 0.f;
    for (int64_t slot = first; slot < last; ++slot) {
        const float2 part = slots[slot * heads + h];
        add_partial(part.x, part.y, m, s);
    }
    for (int64_t slot = first; slot < last; ++slot) slots[slot * heads + h] = make_float2(m, s);
}

// Backward, pass 1 (not split_only): sum(alpha * g) over the piece; a split row's pieces leave
// it in slot.x and stop. Pass 2: the score gradients, and their sum over the piece written to
// grad_dst (a row of one piece) or slot.y.
template <typename T, typename Rule>
__global__ void __launch_bounds__(kThreadsPerBlock)
    softmax_backward_kernel(RowPieces pieces, const int32_t* __restrict__ col, Rule rule,
                            const T* __restrict__ alpha, const T* __restrict__ grad_alpha, T* __restrict__ grad_score,
                            T* __restrict__ grad_dst, float2* __restrict__ slots, bool split_only) {
    PieceThread t;
    if (!piece_thread(pieces, rule.heads, split_only, t)) return;
    const int64_t heads = rule.heads;
    float weighted = 0.f;
    if (split_only) {
        weighted = slots[t.slot * heads + t.head].x;
    } else {
        for (int64_t k = t.begin; k < t.end; ++k) {
            weighted += as_float(alpha[k * heads + t.head]) * as_float(grad_alpha[k * heads + t.head]);
        }
        if (t.slot >= 0) {
            slots[t.slot * heads + t.head].x = weighted;
            return;
        }
    }
    const typename Rule::Row r = rule.row(t.row, t.head);
    // (alpha * (g - weighted), the slope) of an edge: both loaded before the batch's stores.
    const auto load = [&](int64_t k) {
        const int64_t e = k * heads + t.head;
        return make_float2(as_float(alpha[e]) * (as_float(grad_alpha[e]) - weighted), rule.slope(r, col[k], t.head));
    };
    float row_sum = 0.f;
    walk(t.begin, t.end, load, [&](int64_t k, float2 v) {
        const float g = v.x * v.y;
        grad_score[k * heads + t.head] = Element<T>::from_float(g);
        row_sum += g;
    });
    if (grad_dst == nullptr) return;
    if (t.slot < 0) {
        grad_dst[t.row * heads + t.head] = Element<T>::from_float(row_sum);
    } else {
        slots[t.slot * heads + t.head].y = row_sum;
    }
}

// One thread per (split row, head): slot.x summed in order and written back to every slot
// (sum(alpha * g) of the row), or with to_rows slot.y summed in order into grad_dst.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    merge_backward_kernel(RowPieces pieces, int64_t heads, float2* __restrict__ slots, T* __restrict__ grad_dst,
                          bool to_rows) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t split = thread / heads;
    if (split >= pieces.num_split) return;
    const int64_t h = thread % heads;
    const int64_t first = pieces.split_begin[split], last = pieces.split_begin[split + 1];
    float sum = 0.f;
    for (int64_t slot = first; slot < last; ++slot) sum += to_rows ? slots[slot * heads + h].y : slots[slot * heads + h].x;
    if (to_rows) {
        grad_dst[static_cast<int64_t>(pieces.split_rows[split]) * heads + h] = Element<T>::from_float(sum);
    } else {
        for (int64_t slot = first; slot < last; ++slot) slots[slot * heads + h].x = sum;
    }
}

bool grid(int64_t threads, unsigned& blocks) {
    const int64_t count = (threads + kThreadsPerBlock - 1) / kThreadsPerBlock;
    if (count > INT32_MAX) return false;
    blocks = static_cast<unsigned>(count);
    return true;
}

}  // namespace

template <typename T, typename Scores>
cudaError_t edge_softmax(const RowPieces& pieces, const int32_t* col, const Scores& scores, int64_t heads, T* alpha,
                         float* slots, cudaStream_t stream) {
    if (pieces.count == 0 || heads == 0) return cudaSuccess;
    const typename RuleOf<Scores>::type rule{scores, heads};
    float2* slot_pairs = reinterpret_cast<float2*>(slots);
    unsigned blocks, merge_blocks;
    if (!grid(pieces.count * heads, blocks) || !grid(pieces.num_split * heads, merge_blocks)) {
        return cudaErrorInvalidValue;
    }
    softmax_kernel<T><<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, col, rule, alpha, slot_pairs, false);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || pieces.num_split == 0) return err;
    merge_softmax_kernel<<<merge_blocks, kThreadsPerBlock, 0, stream>>>(pieces, heads, slot_pairs);
    softmax_kernel<T><<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, col, rule, alpha, slot_pairs, true);
    return cudaGetLastError();
}

template <typename T, typename Scores>
cudaError_t edge_softmax_backward(const RowPieces& pieces, const int32_t* col, const Scores& scores, int64_t heads,
                                  const T* alpha, const T* grad_alpha, T* grad_score, T* grad_dst, float* slots,
                                  cudaStream_t stream) {
    if (pieces.count == 0 || heads == 0) return cudaSuccess;
    const typename RuleOf<Scores>::type rule{scores, heads};
    float2* slot_pairs = reinterpret_cast<float2*>(slots);
    unsigned blocks, merge_blocks;
    if (!grid(pieces.count * heads, blocks) || !grid(pieces.num_split * heads, merge_blocks)) {
        return cudaErrorInvalidValue;
    }
    softmax_backward_kernel<T><<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, col, rule, alpha, grad_alpha,
                                                                        grad_score, grad_dst, slot_pairs, false);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || pieces.num_split == 0) return err;
    merge_backward_kernel<T><<<merge_blocks, kThreadsPerBlock, 0, stream>>>(pieces, heads, slot_pairs, grad_dst, false);
    softmax_backward_kernel<T><<<blocks, kThreadsPerBlock, 0, stream>>>(pieces, col, rule, alpha, grad_alpha,
                                                                        grad_score, grad_dst, slot_pairs, true);
    if (grad_dst != nullptr) {
        merge_backward_kernel<T><<<merge_blocks, kThreadsPerBlock, 0, stream>>>(pieces, heads, slot_pairs, grad_dst, true);
    }
    return cudaGetLastError();
}

#define TCSPARSE_INSTANTIATE_EDGE_SOFTMAX(T, S)                                                                     \
    template cudaError_t edge_softmax<T, S<T>>(const RowPieces&, const int32_t*, const S<T>&, int64_t, T*, float*, \
                                               cudaStream_t);                                                      \
    template cudaError_t edge_softmax_backward<T, S<T>>(const RowPieces&, const int32_t*, const S<T>&, int64_t,    \
                                                        const T*, const T*, T*, T*, float*, cudaStream_t);
#define TCSPARSE_INSTANTIATE_EDGE_SOFTMAX_TYPES(T) \
    TCSPARSE_INSTANTIATE_EDGE_SOFTMAX(T, GatScores) \
    TCSPARSE_INSTANTIATE_EDGE_SOFTMAX(T, DotScores)
TCSPARSE_INSTANTIATE_EDGE_SOFTMAX_TYPES(float)
TCSPARSE_INSTANTIATE_EDGE_SOFTMAX_TYPES(__half)
TCSPARSE_INSTANTIATE_EDGE_SOFTMAX_TYPES(__nv_bfloat16)

}  // namespace tcsparse
