// The "rows" SpMM (csr_rows_spmm.h says why a CUDA-core kernel, and how long rows are split).
//
// Lanes and columns. Each lane reads 16 bytes of a row of X per nonzero, as CH loads of W bytes:
// W = 16 where N, both row strides and both base pointers allow it, else the widest of 8, 4 and
// one element that they allow (a column slice of a wider X need not be 16-byte aligned). The L
// lanes of a *slot* thus cover L * 16 bytes of columns, L being the fewest lanes (a power of two,
// at most 32) that cover N; wider N runs in column tiles of a whole warp (grid.y). A warp holds
// S = 32 / L slots: 4 at N = 32 in float32, 8 at N = 32 in 16 bits, 1 from 128 float32 columns.
//
// Rows and warps. A warp takes S consecutive rows; short rows are packed, each slot walking its
// own row, so that at small N every lane gathers even where rows hold a few nonzeros. Where
// streams apply (kStreamMinElementBytes), a warp takes R groups of S rows, and where none of them
// is longer than 2 U each slot walks R consecutive rows as one stream of nonzeros (walk_rows):
// rows of a few nonzeros then share gather rounds instead of each taking a round of its own. A row
// much longer than its neighbours would leave the other slots idle while its slot walks it, so
// the warp runs such rows one after another on all its slots (slot s takes every S-th nonzero;
// shuffles add the slots' sums). Which rows go which way is decided per warp from their lengths
// by counting gather rounds (packed_limit). Rows longer than the piece size are cut into pieces
// that run before the rows, a whole warp per piece, and add into the row's fp32 sums; the last
// piece to add, or a finishing kernel, rounds them into Y (csr_rows_spmm.h).
//
// Gathers. A slot loads the rows of X of U nonzeros before using any: U * CH loads in flight per
// lane, and every lane loading, keep the kernel bound by the gathers' bandwidth. Where streams
// apply, the columns of a round's nonzeros are loaded during the previous round's gathers: a
// round then waits for one memory round trip, not for a column load and the gather it feeds.
// Sums are fp32 FMAs in a fixed order per launch shape: with no split rows (deterministic mode)
// every output is the same sum from call to call.
#include "csr_rows_spmm.h"

#include <algorithm>
#include <type_traits>

#include "loads.cuh"
#include "static_switch.h"

namespace tcsparse {
namespace {

constexpr int kWarpsPerBlock = 8;
// U: nonzeros each slot loads before the FMAs, U * CH loads per lane. Loads of one 16-bit
// element take a register each: half as many nonzeros keep them in registers.
template <int W>
constexpr int kGathersInFlight = W >= 4 ? 4 : 2;
// Elements of at least this many bytes take the streams: warps of short rows walked as streams
// (walk_rows) and each round's columns loaded during the previous round's gathers. 4: float32
// only; 2 would take float16 and bfloat16 too.
constexpr int kStreamMinElementBytes = 4;
template <typename T>
constexpr bool kStreams = static_cast<int>(sizeof(T)) >= kStreamMinElementBytes;
constexpr int kLaneBytes = 16;       // bytes of a row of X per lane and nonzero
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kLastArrivalPieceColumns = int64_t{1} << 18;  // csr_rows_spmm says why

// The registers of one load of W bytes: float vectors for floats, raw words otherwise. With uint4
// words for floats, ptxas sinks each gather down to its FMAs, leaving one in flight per lane.
template <typename T, int W>
struct Gather {
    using type = typename Raw<W>::type;
};
template <>
struct Gather<float, 16> {
    using type = float4;
};
template <>
struct Gather<float, 8> {
    using type = float2;
};
template <>
struct Gather<float, 4> {
    using type = float;
};

// Blocks per SM ptxas must fit (__launch_bounds__): 5 (at most 48 registers) with loads of 16
// bytes, and of 8 without streams; left alone, ptxas sinks 16-bit gathers to their FMAs to save
// registers (docs/DECISIONS.md). Narrower loads hold fewer bytes per register and need 4 blocks
// (64 registers) to keep theirs without spilling, and so do 8-byte loads with the next round's
// columns beside them.
template <typename T, int W>
constexpr int kMinBlocksPerSM = W == 16 || (W == 8 && !kStreams<T>) ? 5 : 4;

// A launch's shape: W-byte loads, L lanes per slot.
template <typename T, int W, int L>
struct Shape {
    static_assert(W >= static_cast<int>(sizeof(T)) && kLaneBytes % W == 0 && 32 % L == 0, "bad rows kernel shape");
    static constexpr int V = W / static_cast<int>(sizeof(T));   // elements per load
    static constexpr int CH = kLaneBytes / W;                    // loads per lane and nonzero
    static constexpr int S = 32 / L;                             // slots per warp
    static constexpr int kTileColumns = L * CH * V;              // columns per launch tile (grid.y)
    using Load = typename Gather<T, W>::type;
    using Sums = float[CH][V];  // a lane's fp32 sums
};

// The operands of one launch, and where in them a lane works: load c of the lane's slot lane
// `lane_in_slot` covers the V columns from col0 + (lane_in_slot + c * L) * V, where it lies
// in the tile (c < CH).
template <typename T, int W, int L>
struct Operands {
    using Sh = Shape<T, W, L>;
    const T* values;
    const T* x;  // X + col0 + lane_in_slot * V: the lane's first column of row 0
    int64_t ldx;
    T* y;
    int64_t ldy;
    int64_t n;
    int64_t col0;
    const T* bias;
    const float* addend;
    int lane_in_slot;
    int tile_vectors;  // loads of V columns in this tile

    __device__ bool covers(int c) const { return lane_in_slot + c * L < tile_vectors; }
    __device__ int column(int c) const { return (lane_in_slot + c * L) * Sh::V; }  // in the tile
};

// 32-bit word i of a load's registers (no pointer casts: they split vector stores into scalar ones).
__device__ __forceinline__ uint32_t word_of(const float4& v, int i) {
    return __float_as_uint(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
}
__device__ __forceinline__ uint32_t word_of(const float2& v, int i) { return __float_as_uint(i == 0 ? v.x : v.y); }
__device__ __forceinline__ uint32_t word_of(float v, int) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) { return word(v, i); }
__device__ __forceinline__ uint32_t word_of(const uint2& v, int i) { return i == 0 ? v.x : v.y; }
__device__ __forceinline__ uint32_t word_of(unsigned int v, int) { return v; }
__device__ __forceinline__ uint32_t word_of(unsigned short v, int) { return v; }

// The V elements of one load as floats.
template <typename T, int V, typename Load>
__device__ __forceinline__ void to_floats(const Load& load, float (&f)[V]) {
    if constexpr (std::is_same_v<T, float>) {
#pragma unroll
        for (int q = 0; q < V; ++q) f[q] = __uint_as_float(word_of(load, q));
    } else if constexpr (V == 1) {
        f[0] = Element<T>::unpack2(word_of(load, 0)).x;  // the element in the low half
    } else {
#pragma unroll
        for (int i = 0; i < V / 2; ++i) {
            const float2 p = Element<T>::unpack2(word_of(load, i));
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        }
    }
}

// V floats rounded to T, as one store of W bytes.
template <typename T, int W>
__device__ __forceinline__ typename Gather<T, W>::type from_floats(const float (&f)[W / sizeof(T)]) {
    if constexpr (std::is_same_v<T, float>) {
        if constexpr (W == 16) return make_float4(f[0], f[1], f[2], f[3]);
        else if constexpr (W == 8) return make_float2(f[0], f[1]);
        else return f[0];
    } else {
        if constexpr (W == 16)
            return make_uint4(Element<T>::pack2(f[0], f[1]), Element<T>::pack2(f[2], f[3]), Element<T>::pack2(f[4], f[5]),
                              Element<T>::pack2(f[6], f[7]));
        else if constexpr (W == 8)
            return make_uint2(Element<T>::pack2(f[0], f[1]), Element<T>::pack2(f[2], f[3]));
        else if constexpr (W == 4)
            return Element<T>::pack2(f[0], f[1]);
        else
            return static_cast<unsigned short>(Element<T>::pack2(f[0], 0.f) & 0xffffu);
    }
}

// The columns of the U nonzeros k, k + stride, ... (-1 from `end`).
template <int U>
__device__ __forceinline__ void load_columns(const int32_t* __restrict__ col, uint32_t k, uint32_t end,
                                             uint32_t stride, int32_t (&cols)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const uint32_t j = k + u * stride;
        cols[u] = j < end ? __ldg(col + j) : -1;
    }
}

// The values of the same nonzeros as floats (0 from `end`).
template <typename T, int U>
__device__ __forceinline__ void load_values(const T* __restrict__ values, uint32_t k, uint32_t end, uint32_t stride,
                                            float (&vals)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const uint32_t j = k + u * stride;
        vals[u] = j < end ? load_float(values + j) : 0.f;
    }
}

// The rows of X of the U nonzeros whose columns are `cols` (none for -1), every load issued
// before any is used.
template <typename T, int W, int L, int U>
__device__ __forceinline__ void gather_rows(const Operands<T, W, L>& o, const int32_t (&cols)[U],
                                            typename Shape<T, W, L>::Load (&rows)[U][Shape<T, W, L>::CH]) {
    using Sh = Shape<T, W, L>;
    using Load = typename Sh::Load;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int c = 0; c < Sh::CH; ++c) {
            const T* p = o.x + cols[u] * o.ldx + c * L * Sh::V;
            rows[u][c] = cols[u] >= 0 && o.covers(c) ? __ldg(reinterpret_cast<const Load*>(p)) : Load{};
        }
}

// acc += the nonzeros k, k + stride, k + 2 stride, ... below `end`, U of them per round: all
// their rows of X loaded before any FMA. With streams, the next round's columns are loaded while
// this round's rows are in flight (the gathers depend on the columns; the values, which only the
// FMAs need, are loaded with the gathers). Indices are unsigned: with nnz < 2^31 a round's last
// index cannot wrap.
template <typename T, int W, int L>
__device__ __forceinline__ void walk(const Operands<T, W, L>& o, const int32_t* __restrict__ col, uint32_t k,
                                     uint32_t end, uint32_t stride, typename Shape<T, W, L>::Sums& acc) {
    using Sh = Shape<T, W, L>;
    constexpr int U = kGathersInFlight<W>;
    int32_t cols[U];
    if constexpr (kStreams<T>) load_columns<U>(col, k, end, stride, cols);
    for (; k < end; k += U * stride) {
        float vals[U];
        if constexpr (!kStreams<T>) {
            load_columns<U>(col, k, end, stride, cols);
            load_values<T, U>(o.values, k, end, stride, vals);
        }
        typename Sh::Load rows[U][Sh::CH];
        gather_rows<T, W, L, U>(o, cols, rows);
        if constexpr (kStreams<T>) {
            load_values<T, U>(o.values, k, end, stride, vals);
            load_columns<U>(col, k + U * stride, end, stride, cols);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int c = 0; c < Sh::CH; ++c) {
                float f[Sh::V];
                to_floats<T, Sh::V>(rows[u][c], f);
#pragma unroll
                for (int q = 0; q < Sh::V; ++q) acc[c][q] = fmaf(vals[u], f[q], acc[c][q]);
            }
    }
}

// Every slot's sums become the sum over the warp's slots (a butterfly: the same order in each).
template <int L, int CH, int V>
__device__ __forceinline__ void add_slots(float (&acc)[CH][V]) {
#pragma unroll
    for (int offset = L; offset < 32; offset <<= 1)
#pragma unroll
        for (int c = 0; c < CH; ++c)
#pragma unroll
            for (int q = 0; q < V; ++q) acc[c][q] += __shfl_xor_sync(kFullMask, acc[c][q], offset);
}

// Row y_row of Y in this tile: the lane's sums plus the bias and the addend, rounded once.
template <typename T, int W, int L, bool kAddend>
__device__ __forceinline__ void write_row(const Operands<T, W, L>& o, int64_t y_row,
                                          const typename Shape<T, W, L>::Sums& acc) {
    using Sh = Shape<T, W, L>;
    using Load = typename Sh::Load;
    T* out = o.y + y_row * o.ldy + o.col0;
    const float* add = kAddend ? o.addend + y_row * o.n + o.col0 : nullptr;
#pragma unroll
    for (int c = 0; c < Sh::CH; ++c) {
        if (!o.covers(c)) continue;
        const int e0 = o.column(c);
        float e[Sh::V];
#pragma unroll
        for (int q = 0; q < Sh::V; ++q) {
            const float b = o.bias != nullptr ? load_float(o.bias + o.col0 + e0 + q) : 0.f;
            const float s = kAddend ? add[e0 + q] : 0.f;
            e[q] = acc[c][q] + b + s;
        }
        // One store of W bytes (a plain assignment was split into 4-byte stores), evict-first:
        // Y is written once, and L2 is better spent on the rows of X that nonzeros share.
        __stcs(reinterpret_cast<Load*>(out + e0), from_floats<T, W>(e));
    }
}

__device__ __forceinline__ int32_t output_row(const CsrRows& a, int64_t row) {
    return a.row_map != nullptr ? __ldg(a.row_map + row) : static_cast<int32_t>(row);
}

// Whether this warp's piece is the last of its row to add to the row's sums in this column tile
// (for the L lanes of slot 0, the only ones left). Every piece fences its atomics before it
// counts itself, so the one that counts last reads complete sums (the memory-fence pattern of
// the CUDA programming guide); it resets the count for the next call.
template <int L>
__device__ __forceinline__ bool last_arrival(int32_t* arrivals, int64_t count) {
    constexpr unsigned kSlotMask = L == 32 ? kFullMask : (1u << L) - 1;
    __threadfence();
    __syncwarp(kSlotMask);
    int32_t arrived = 0;
    if (threadIdx.x % 32 == 0) arrived = atomicAdd(arrivals, 1);
    arrived = __shfl_sync(kSlotMask, arrived, 0);
    if (arrived != count - 1) return false;
    __threadfence();
    if (threadIdx.x % 32 == 0) *arrivals = 0;
    return true;
}

// Piece p of a split row, all slots on it: its sums added to the row's; the last piece to add
// (where the launch rounds split rows itself) takes the row's sums, leaves them zero and writes
// the row. A padding entry (negative start, csr_rows_spmm.h) is no piece: the warp leaves before
// adding or counting anything, so a row's count (from rowptr) sees its real pieces only.
template <typename T, int W, int L, bool kAddend>
__device__ __forceinline__ void run_piece(const CsrRows& a, const Operands<T, W, L>& o, const SplitSums& split,
                                          bool rounds_split_rows, int64_t p, int slot) {
    using Sh = Shape<T, W, L>;
    const int64_t begin = __ldg(a.piece_starts + p);
    if (begin < 0) return;  // the same p on every lane: the whole warp leaves
    const int64_t row_end = __ldg(a.rowptr + __ldg(a.split_rows + __ldg(a.piece_slots + p)) + 1);
    const int64_t end = min(begin + a.piece_nnz, row_end);
    typename Sh::Sums acc = {};
    walk(o, a.col, static_cast<uint32_t>(begin + slot), static_cast<uint32_t>(end), Sh::S, acc);
    add_slots<L>(acc);
    if (slot != 0) return;
    // The piece's row read again (from L1) rather than kept in registers through the gathers,
    // which the 16-bit kernels then keep in flight four at a time.
    const int32_t split_slot = __ldg(a.piece_slots + p), row = __ldg(a.split_rows + split_slot);
    const int64_t count = (static_cast<int64_t>(__ldg(a.rowptr + row + 1)) - __ldg(a.rowptr + row) + a.piece_nnz - 1) / a.piece_nnz;
    float* sum = split.sums + split_slot * o.n + o.col0;
#pragma unroll
    for (int c = 0; c < Sh::CH; ++c) {
        if (!o.covers(c)) continue;
        float* s = sum + o.column(c);
        if constexpr (Sh::V % 4 == 0) {
#pragma unroll
            for (int q = 0; q < Sh::V; q += 4)
                ptx::atomic_add_f4(s + q, make_float4(acc[c][q], acc[c][q + 1], acc[c][q + 2], acc[c][q + 3]));
        } else {
#pragma unroll
            for (int q = 0; q < Sh::V; ++q) atomicAdd(s + q, acc[c][q]);
        }
    }
    if (!rounds_split_rows) return;
    if (!last_arrival<L>(split.arrivals + split_slot * gridDim.y + blockIdx.y, count)) return;
    // The sums are read from L2, where the atomics landed, and left zero for the next call.
#pragma unroll
    for (int c = 0; c < Sh::CH; ++c) {
        if (!o.covers(c)) continue;
        float* s = sum + o.column(c);
#pragma unroll
        for (int q = 0; q < Sh::V; ++q) {
            acc[c][q] = __ldcg(s + q);
            __stcg(s + q, 0.f);
        }
    }
    write_row<T, W, L, kAddend>(o, output_row(a, row), acc);
}

// The longest row the warp packs, one row per slot, given each row's length (lane i < S: row
// i's, 0 where none): longer rows run one after another on all slots. Priced in gather rounds:
// the packed rows take as many as the longest of them, ceil(d / U); a row on all slots takes
// ceil(d / (S U)) and one more for its start and the shuffles that add its slots' sums. Rows of
// up to 2 U nonzeros are always packed (all slots would not take them in fewer rounds).
template <int S, uint32_t U>
__device__ __forceinline__ uint32_t packed_limit(uint32_t d) {
    const uint32_t longest = __reduce_max_sync(kFullMask, d);
    uint32_t best_limit = longest, best_rounds = (longest + U - 1) / U;
    for (uint32_t limit = 2 * U; limit < longest; limit *= 2) {
        const uint32_t packed = __reduce_max_sync(kFullMask, d <= limit ? d : 0u);
        const uint32_t shared = __reduce_add_sync(kFullMask, d > limit ? (d + S * U - 1) / (S * U) + 1 : 0u);
        const uint32_t rounds = (packed + U - 1) / U + shared;
        if (rounds < best_rounds) {
            best_rounds = rounds;
            best_limit = limit;
        }
    }
    return best_limit;
}

// S consecutive rows from `first`: lane i < S reads row first + i's bounds and output row.
template <typename T, int W, int L, bool kAddend>
__device__ __forceinline__ void run_rows(const CsrRows& a, const Operands<T, W, L>& o, int64_t first, int lane, int slot) {
    using Sh = Shape<T, W, L>;
    constexpr int S = Sh::S;
    const int64_t row = first + lane;
    const bool has_row = lane < S && row < a.num_rows;
    int32_t begin = 0, end = 0, y_row = 0;
    if (has_row) {
        begin = __ldg(a.rowptr + row);
        end = __ldg(a.rowptr + row + 1);
        y_row = output_row(a, row);
    }
    // A split row is its pieces' to write.
    const uint32_t length = static_cast<uint32_t>(end - begin);
    const bool whole = has_row && length <= static_cast<uint32_t>(a.piece_nnz);
    bool packed = whole;
    if constexpr (S > 1) {
        const uint32_t limit = packed_limit<S, kGathersInFlight<W>>(whole ? length : 0u);  // every lane takes part
        packed = whole && length <= limit;
    }
    const unsigned shared_rows = S > 1 ? __ballot_sync(kFullMask, whole && !packed) : 0u;

    // Packed rows: slot s walks row first + s.
    const int32_t my_begin = __shfl_sync(kFullMask, begin, slot), my_end = __shfl_sync(kFullMask, end, slot);
    const int32_t my_y_row = __shfl_sync(kFullMask, y_row, slot);
    if (__shfl_sync(kFullMask, static_cast<int>(packed), slot)) {
        typename Sh::Sums acc = {};
        walk(o, a.col, static_cast<uint32_t>(my_begin), static_cast<uint32_t>(my_end), 1u, acc);
        write_row<T, W, L, kAddend>(o, my_y_row, acc);
    }
    // The rest on all slots, one row at a time; their bounds read again (from L1) rather than
    // kept in registers through the packed rows' gathers.
    if constexpr (S > 1) {
        for (unsigned rest = shared_rows; rest != 0; rest &= rest - 1) {
            const int64_t r = first + __ffs(rest) - 1;
            const uint32_t row_begin = __ldg(a.rowptr + r), row_end = __ldg(a.rowptr + r + 1);
            typename Sh::Sums acc = {};
            walk(o, a.col, row_begin + slot, row_end, S, acc);
            add_slots<L>(acc);
            if (slot == 0) write_row<T, W, L, kAddend>(o, output_row(a, r), acc);
        }
    }
}

// R groups of S rows per warp: with streams up to 4, R S <= 32 (a lane reads each row's length);
// 1 without. `groups_rows` says when a launch takes them.
template <typename T, int S>
constexpr int kGroups = !kStreams<T> ? 1 : 32 / S < 4 ? 32 / S : 4;

// Rows row .. row_last - 1 (consecutive, none split), whose nonzeros [k, end) the slot walks as
// one stream, U per round with the next round's columns loaded during the gathers, writing each
// row where its nonzeros end (and the empty rows between). Each row is summed in its nonzeros'
// order from zero, as the packed walk sums it.
template <typename T, int W, int L, bool kAddend>
__device__ __forceinline__ void walk_rows(const CsrRows& a, const Operands<T, W, L>& o, int64_t row, int64_t row_last,
                                          uint32_t k, uint32_t end) {
    using Sh = Shape<T, W, L>;
    constexpr int U = kGathersInFlight<W>;
    uint32_t row_end = __ldg(a.rowptr + row + 1);
    typename Sh::Sums acc = {};
    const auto next_row = [&] {
        write_row<T, W, L, kAddend>(o, output_row(a, row), acc);
#pragma unroll
        for (int c = 0; c < Sh::CH; ++c)
#pragma unroll
            for (int q = 0; q < Sh::V; ++q) acc[c][q] = 0.f;
        ++row;
    };
    int32_t cols[U];
    load_columns<U>(a.col, k, end, 1u, cols);
    for (; k < end; k += U) {
        typename Sh::Load rows[U][Sh::CH];
        gather_rows<T, W, L, U>(o, cols, rows);
        float vals[U];
        load_values<T, U>(o.values, k, end, 1u, vals);
        load_columns<U>(a.col, k + U, end, 1u, cols);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            // The rows that end before nonzero k + u (empty ones too) are complete.
            while (k + u < end && k + u >= row_end) {
                next_row();
                row_end = __ldg(a.rowptr + row + 1);
            }
            // The FMAs as walk writes them (docs/DECISIONS.md says why not one helper).
#pragma unroll
            for (int c = 0; c < Sh::CH; ++c) {
                float f[Sh::V];
                to_floats<T, Sh::V>(rows[u][c], f);
#pragma unroll
                for (int q = 0; q < Sh::V; ++q) acc[c][q] = fmaf(vals[u], f[q], acc[c][q]);
            }
        }
    }
    // The row in progress, then the empty rows after the stream's last nonzero.
    while (row < row_last) next_row();
}

// The warp's R S rows from `first`. Where none is longer than 2 U (nor split), slot s walks rows
// first + s R .. first + s R + R - 1 as one stream (walk_rows); else the R groups of S rows run
// one after another (run_rows), as they would on R warps.
template <typename T, int W, int L, bool kAddend, int R>
__device__ __forceinline__ void run_warp_rows(const CsrRows& a, const Operands<T, W, L>& o, int64_t first, int lane,
                                              int slot) {
    constexpr int S = Shape<T, W, L>::S;
    if constexpr (R > 1) {
        constexpr uint32_t U = kGathersInFlight<W>;
        const int64_t row = first + lane;
        uint32_t length = 0;
        if (lane < S * R && row < a.num_rows) length = __ldg(a.rowptr + row + 1) - __ldg(a.rowptr + row);
        const uint32_t longest = __reduce_max_sync(kFullMask, length);
        if (longest <= min(2 * U, static_cast<uint32_t>(a.piece_nnz))) {
            const int64_t my_first = first + static_cast<int64_t>(slot) * R;
            const int64_t my_last = min(my_first + R, a.num_rows);
            if (my_first < my_last)
                walk_rows<T, W, L, kAddend>(a, o, my_first, my_last, __ldg(a.rowptr + my_first),
                                            __ldg(a.rowptr + my_last));
            return;
        }
    }
#pragma unroll 1
    for (int g = 0; g < R; ++g) {
        if (first + g * S >= a.num_rows) return;
        run_rows<T, W, L, kAddend>(a, o, first + g * S, lane, slot);
    }
}

// Warps [0, num_pieces) take a piece each, the rest R S rows each; blockIdx.y is the column tile.
template <typename T, int W, int L, bool kAddend, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocksPerSM<T, W>)
    csr_rows_kernel(CsrRows a, const T* __restrict__ values, const T* __restrict__ x, int64_t ldx, T* __restrict__ y,
                    int64_t ldy, int64_t n, const T* __restrict__ bias, const float* __restrict__ addend,
                    SplitSums split, bool rounds_split_rows) {
    using Sh = Shape<T, W, L>;
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31, slot = lane / L, lane_in_slot = lane % L;
    const int64_t col0 = static_cast<int64_t>(blockIdx.y) * Sh::kTileColumns;
    const int tile_vectors = static_cast<int>(min(n - col0, static_cast<int64_t>(Sh::kTileColumns)) / Sh::V);
    const Operands<T, W, L> o{values, x + col0 + lane_in_slot * Sh::V, ldx, y, ldy, n, col0, bias, addend,
                              lane_in_slot, tile_vectors};
    if (warp < a.num_pieces) {
        run_piece<T, W, L, kAddend>(a, o, split, rounds_split_rows, warp, slot);
        return;
    }
    const int64_t first = (warp - a.num_pieces) * Sh::S * R;
    if (first >= a.num_rows) return;
    run_warp_rows<T, W, L, kAddend, R>(a, o, first, lane, slot);
}

// Whether a launch groups rows for streams: the stream walk pays where all of a warp's R S rows
// are short (at most 2 U nonzeros), which a mean row length of at most 2 U makes common; on longer
// rows the groups only run one after another where R warps would run them side by side. A warp of
// one slot (S = 1) groups at any length: R rows are few enough that skewed graphs' many short rows
// fill them. Each choice is its own kernel: with R a runtime value the ungrouped launches ran 2-7%
// slower than the grouped kernel on the fit families at N = 32, where compiled for R = 1 they ran
// faster (H200).
template <typename T, int W, int L>
bool groups_rows(const CsrRows& a) {
    return Shape<T, W, L>::S == 1 || a.nnz <= 2 * kGathersInFlight<W> * a.num_rows;
}

template <typename T, int W, int L>
cudaError_t launch(const CsrRows& a, const T* values, const T* x, int64_t ldx, T* y, int64_t ldy, int64_t n,
                   const T* bias, const float* addend, const SplitSums& split, bool rounds_split_rows,
                   cudaStream_t stream) {
    using Sh = Shape<T, W, L>;
    const int64_t tiles = (n + Sh::kTileColumns - 1) / Sh::kTileColumns;
    if (tiles > 65535 || (a.num_split_rows > 0 && tiles > csr_rows_max_tiles(n))) return cudaErrorInvalidValue;
    const dim3 block(kWarpsPerBlock * 32);
    const bool grouped = groups_rows<T, W, L>(a);
    return TCS_BOOL_SWITCH(grouped, kGrouped, [&] {
        // One slot always groups: no ungrouped kernel of that shape is built.
        constexpr int R = kGrouped || Sh::S == 1 ? kGroups<T, Sh::S> : 1;
        const int64_t warps = a.num_pieces + (a.num_rows + Sh::S * R - 1) / (Sh::S * R);
        const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
        if (blocks > INT32_MAX) return cudaErrorInvalidValue;
        const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles));
        TCS_BOOL_SWITCH(addend != nullptr, kAddend, [&] {
            csr_rows_kernel<T, W, L, kAddend, R><<<grid, block, 0, stream>>>(a, values, x, ldx, y, ldy, n, bias,
                                                                           addend, split, rounds_split_rows);
        });
        return cudaGetLastError();
    });
}

// The fewest lanes per slot (a power of two) whose 16 bytes each cover N; 32 from N * sizeof(T)
// over 256 bytes, which then runs in tiles of a warp.
template <typename T, int W>
cudaError_t launch_lanes(const CsrRows& a, const T* values, const T* x, int64_t ldx, T* y, int64_t ldy, int64_t n,
                         const T* bias, const float* addend, const SplitSums& split, bool rounds_split_rows,
                         cudaStream_t stream) {
    const int64_t lanes = (n * static_cast<int64_t>(sizeof(T)) + kLaneBytes - 1) / kLaneBytes;
    return TCS_LANES_SWITCH(lanes, L, [&] {
        return launch<T, W, L>(a, values, x, ldx, y, ldy, n, bias, addend, split, rounds_split_rows, stream);
    });
}

// The widest load (16, 8, 4 bytes or one element) that N, both row strides and both base
// pointers allow: every load of a row of X and every store of Y is then aligned to its width.
template <typename T>
int load_bytes(const T* x, int64_t ldx, const T* y, int64_t ldy, int64_t n) {
    const auto fits = [&](int64_t w) {
        const int64_t e = sizeof(T);
        return (n * e) % w == 0 && (ldx * e) % w == 0 && (ldy * e) % w == 0 &&
               reinterpret_cast<uintptr_t>(x) % w == 0 && reinterpret_cast<uintptr_t>(y) % w == 0;
    };
    for (int w = kLaneBytes; w > static_cast<int>(sizeof(T)); w /= 2)
        if (fits(w)) return w;
    return sizeof(T);
}

// The split rows' sums rounded into Y with the bias and the addend, and set back to zero.
// Padding rows (negative, csr_rows_spmm.h) have no pieces: their sums stay zero untouched.
template <typename T>
__global__ void finish_split_rows_kernel(CsrRows a, SplitSums split, T* __restrict__ y, int64_t ldy, int64_t n,
                                         const T* __restrict__ bias, const float* __restrict__ addend) {
    const int64_t total = a.num_split_rows * n;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / n, c = i % n;
        const int32_t split_row = a.split_rows[r];
        if (split_row < 0) continue;
        const int64_t row = output_row(a, split_row);
        const float b = bias != nullptr ? load_float(bias + c) : 0.f;
        const float s = addend != nullptr ? addend[row * n + c] : 0.f;
        y[row * ldy + c] = Element<T>::from_float(split.sums[i] + b + s);
        split.sums[i] = 0.f;
    }
}

}  // namespace

// A launch takes one tile while N * sizeof(T) <= 256 bytes, tiles of 128 (float32) or 256
// (16-bit) columns beyond.
int64_t csr_rows_max_tiles(int64_t n) { return std::max<int64_t>(1, (n + 127) / 128); }

template <typename T>
cudaError_t csr_rows_spmm(const CsrRows& a, const T* values, const T* x, int64_t ldx, T* y, int64_t ldy, int64_t n,
                          const T* bias, const float* addend, const SplitSums& split, cudaStream_t stream) {
    if (a.num_rows == 0 || n == 0) return cudaSuccess;
    if (a.num_split_rows > 0 && (split.sums == nullptr || split.arrivals == nullptr)) return cudaErrorInvalidValue;
    // The last piece of a row saves the finishing launch but waits for its atomics (a fence per
    // piece): faster up to kLastArrivalPieceColumns pieces x N, where the launch dominates; slower
    // beyond, where the fences do (docs/DECISIONS.md). Padded arrays count their bound here: the
    // choice then errs towards the finishing launch, which gives the same sums.
    const bool last_arrival = a.num_pieces * n <= kLastArrivalPieceColumns;
    cudaError_t err = cudaSuccess;
    switch (load_bytes(x, ldx, y, ldy, n)) {
        case 16:
            err = launch_lanes<T, 16>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
            break;
        case 8:
            err = launch_lanes<T, 8>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
            break;
        case 4:
            err = launch_lanes<T, 4>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
            break;
        default:
            if constexpr (sizeof(T) == 2)
                err = launch_lanes<T, 2>(a, values, x, ldx, y, ldy, n, bias, addend, split, last_arrival, stream);
            break;
    }
    if (err != cudaSuccess || a.num_split_rows == 0 || last_arrival) return err;
    const int64_t total = a.num_split_rows * n;
    const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
    finish_split_rows_kernel<T><<<blocks, 256, 0, stream>>>(a, split, y, ldy, n, bias, addend);
    return cudaGetLastError();
}

#define TCSPARSE_INSTANTIATE_CSR_ROWS(T)                                                                      \
    template cudaError_t csr_rows_spmm<T>(const CsrRows&, const T*, const T*, int64_t, T*, int64_t, int64_t, \
                                          const T*, const float*, const SplitSums&, cudaStream_t);
TCSPARSE_INSTANTIATE_CSR_ROWS(float)
TCSPARSE_INSTANTIATE_CSR_ROWS(__half)
TCSPARSE_INSTANTIATE_CSR_ROWS(__nv_bfloat16)

}  // namespace tcsparse
