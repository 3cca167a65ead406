// The CPU's counting sorts of the conversion (loaded by torch_tcsparse/formats/native.py through
// ctypes): COO entries into canonical CSR, the transpose of a canonical CSR, and the link between
// the block orders of a matrix and of its transpose. A counting sort by row (or column) is stable,
// so entries of one row keep their input order, and the transpose of a canonical CSR is canonical
// without a sort. Index arrays are int32 or int64 (``*_bytes`` says which); every index read is
// checked against the sizes given before it is used to address memory, and a bad one returns a
// negative code instead of writing anything past it.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_parallel.h"

namespace {

constexpr int64_t kBadColumn = -1;
constexpr int64_t kBadRowptr = -2;
constexpr int64_t kBadIndex = -3;
constexpr int64_t kBadWidth = -4;
constexpr int64_t kBadRow = -5;

// Columns per bucket of the first pass: 2^kBucketBits buckets at most, so that the first pass
// writes to few streams and each bucket's nonzeros (a few hundred kB on large graphs) are sorted
// by column in cache by the second.
constexpr int kBucketBits = 8;

int bit_width(int64_t largest) {
    int bits = 0;
    while (bits < 63 && (int64_t{1} << bits) <= largest) ++bits;
    return bits;
}

// rowptr_t and col_t of the transpose, and for each of its nonzeros the position of that entry in
// the CSR (``order``) and ``carried`` at that position (``carried_t``); either may be null.
template <typename Index, typename Order, typename Carried>
int64_t transpose(int64_t threads, int64_t rows, int64_t cols, int64_t nnz, const Index* rowptr, const Index* col,
                  Index* rowptr_t, Index* col_t, Order* order, const Carried* carried, Carried* carried_t) {
    if (rowptr[0] != 0 || rowptr[rows] != nnz) return kBadRowptr;
    for (int64_t r = 0; r < rows; ++r)
        if (rowptr[r] > rowptr[r + 1]) return kBadRowptr;
    for (int64_t c = 0; c <= cols; ++c) rowptr_t[c] = 0;
    for (int64_t p = 0; p < nnz; ++p) {
        const int64_t c = col[p];
        if (c < 0 || c >= cols) return kBadColumn;
        ++rowptr_t[c + 1];
    }
    for (int64_t c = 0; c < cols; ++c) rowptr_t[c + 1] += rowptr_t[c];
    // A stable counting sort in two passes: by bucket of columns into the outputs' places (the
    // column kept aside), then by column inside each bucket through a copy of its range. One pass
    // by column would scatter every nonzero to a random place of the whole outputs. The buckets of
    // the second pass are independent: they go to the threads.
    const int shift = std::max(bit_width(cols - 1) - kBucketBits, 0);
    const int64_t buckets = cols == 0 ? 0 : ((cols - 1) >> shift) + 1;
    std::vector<int64_t> next(buckets);
    for (int64_t b = 0; b < buckets; ++b) next[b] = rowptr_t[b << shift];
    std::vector<Index> bucket_col(nnz);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t p = rowptr[r]; p < rowptr[r + 1]; ++p) {
            const Index c = col[p];
            const int64_t q = next[c >> shift]++;
            bucket_col[q] = c;
            col_t[q] = static_cast<Index>(r);
            if (order != nullptr) order[q] = static_cast<Order>(p);
            if (carried_t != nullptr) carried_t[q] = carried[p];
        }
    }
    return tcsparse::cpu::in_parallel(
        threads, buckets, [&](int64_t b) { return static_cast<int64_t>(rowptr_t[std::min(b << shift, cols)]); },
        [&](int64_t b0, int64_t b1) {
            std::vector<Index> rows_of, columns;
            std::vector<Order> positions;
            std::vector<Carried> values;
            std::vector<int64_t> column_next;
            for (int64_t b = b0; b < b1; ++b) {
                const int64_t first_col = b << shift, last_col = std::min((b + 1) << shift, cols);
                const int64_t begin = rowptr_t[first_col], end = rowptr_t[last_col];
                rows_of.assign(col_t + begin, col_t + end);
                columns.assign(bucket_col.begin() + begin, bucket_col.begin() + end);
                if (order != nullptr) positions.assign(order + begin, order + end);
                if (carried_t != nullptr) values.assign(carried_t + begin, carried_t + end);
                column_next.assign(rowptr_t + first_col, rowptr_t + last_col);
                for (int64_t i = 0; i < end - begin; ++i) {
                    const int64_t q = column_next[columns[i] - first_col]++;
                    col_t[q] = rows_of[i];
                    if (order != nullptr) order[q] = positions[i];
                    if (carried_t != nullptr) carried_t[q] = values[i];
                }
            }
            return int64_t{0};
        });
}

// COO entries (row[p], col[p]) in canonical CSR order, repeats kept: ``rowptr`` (int64) counts the
// entries of every row, ``col_out`` and ``order`` (each entry's position p) list each row's entries
// by ascending (column, position). Sorted by counting, in two passes as the transpose: by bucket
// of rows into the outputs' places, then by row inside each bucket (its entries' rows read again
// at their positions, which ascend: no row array is kept), then each row by column in cache.
// Returns how many entries repeat their predecessor's (row, column); ``merge_repeats`` folds them.
template <typename Row, typename Col, typename Out, typename Order>
int64_t coo_sort(int64_t threads, int64_t rows, int64_t cols, int64_t nnz, const Row* row, const Col* col,
                 int64_t* rowptr, Out* col_out, Order* order) {
    for (int64_t r = 0; r <= rows; ++r) rowptr[r] = 0;
    for (int64_t p = 0; p < nnz; ++p) {
        const int64_t r = row[p], c = col[p];
        if (r < 0 || r >= rows) return kBadRow;
        if (c < 0 || c >= cols) return kBadColumn;
        ++rowptr[r + 1];
    }
    for (int64_t r = 0; r < rows; ++r) rowptr[r + 1] += rowptr[r];
    const int shift = std::max(bit_width(rows - 1) - kBucketBits, 0);
    const int64_t buckets = rows == 0 ? 0 : ((rows - 1) >> shift) + 1;
    std::vector<int64_t> next(buckets);
    for (int64_t b = 0; b < buckets; ++b) next[b] = rowptr[b << shift];
    for (int64_t p = 0; p < nnz; ++p) {
        const int64_t q = next[static_cast<int64_t>(row[p]) >> shift]++;
        col_out[q] = static_cast<Out>(col[p]);
        order[q] = static_cast<Order>(p);
    }
    std::vector<int64_t> repeats(buckets, 0);
    const int64_t code = tcsparse::cpu::in_parallel(
        threads, buckets, [&](int64_t b) { return rowptr[std::min(b << shift, rows)]; },
        [&](int64_t b0, int64_t b1) {
            std::vector<Out> columns;
            std::vector<Order> positions;
            std::vector<int64_t> row_next;
            std::vector<std::pair<Out, Order>> entries;
            for (int64_t b = b0; b < b1; ++b) {
                const int64_t first_row = b << shift, last_row = std::min((b + 1) << shift, rows);
                const int64_t begin = rowptr[first_row], end = rowptr[last_row];
                columns.assign(col_out + begin, col_out + end);
                positions.assign(order + begin, order + end);
                row_next.assign(rowptr + first_row, rowptr + last_row);
                for (int64_t i = 0; i < end - begin; ++i) {
                    const int64_t q = row_next[row[positions[i]] - first_row]++;
                    col_out[q] = columns[i];
                    order[q] = positions[i];
                }
                for (int64_t r = first_row; r < last_row; ++r) {
                    Out* row_cols = col_out + rowptr[r];
                    const int64_t length = rowptr[r + 1] - rowptr[r];
                    if (!std::is_sorted(row_cols, row_cols + length)) {
                        // Positions ascend within the row already: sorting the pairs is stable by column.
                        Order* row_order = order + rowptr[r];
                        entries.resize(length);
                        for (int64_t i = 0; i < length; ++i) entries[i] = {row_cols[i], row_order[i]};
                        std::sort(entries.begin(), entries.end());
                        for (int64_t i = 0; i < length; ++i) std::tie(row_cols[i], row_order[i]) = entries[i];
                    }
                    for (int64_t i = 1; i < length; ++i) repeats[b] += row_cols[i] == row_cols[i - 1];
                }
            }
            return int64_t{0};
        });
    if (code < 0) return code;
    int64_t total = 0;
    for (const int64_t count : repeats) total += count;
    return total;
}

// Folds the repeats of ``coo_sort``'s output in place: each row keeps its first entry of every
// column (``col`` and ``order`` compacted, ``rowptr`` rewritten), and every repeat is listed in
// order, with the position it came from (``repeat_order``, where ``order`` is given) and the
// distinct entry it adds to (``repeat_target``). Returns the distinct entries' count.
template <typename Out, typename Order>
int64_t merge_repeats(int64_t rows, int64_t repeats, int64_t* rowptr, Out* col, Order* order, Order* repeat_order,
                      int64_t* repeat_target) {
    int64_t kept = 0, listed = 0, begin = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t end = rowptr[r + 1];
        rowptr[r] = kept;
        for (int64_t i = begin; i < end; ++i) {
            if (i > begin && col[i] == col[i - 1]) {
                if (listed == repeats) return kBadIndex;
                repeat_target[listed] = kept - 1;
                if (order != nullptr) repeat_order[listed] = order[i];
                ++listed;
                continue;
            }
            col[kept] = col[i];
            if (order != nullptr) order[kept] = order[i];
            ++kept;
        }
        begin = end;
    }
    rowptr[rows] = kept;
    return listed == repeats ? kept : kBadIndex;
}

// Calls ``f`` with a value of the integer type of ``bytes`` bytes (int32 or int64).
template <typename F>
int64_t with_width(int64_t bytes, F&& f) {
    if (bytes == 4) return f(int32_t{});
    if (bytes == 8) return f(int64_t{});
    return kBadWidth;
}

// How far ahead the link asks for the entry of ``gather`` it will write: those land anywhere in
// the array, and waiting for each in turn would leave the memory idle.
constexpr int64_t kAhead = 16;

// gather[ours[p]] = theirs[p] and, where gather_t is given, gather_t[theirs[p]] = ours[p]: both
// are permutations of [0, nnz), checked as they are read.
template <typename Gather>
int64_t link(int64_t threads, int64_t nnz, const Gather* ours, const Gather* theirs, Gather* gather,
             Gather* gather_t) {
    return tcsparse::cpu::in_parallel(threads, nnz, [](int64_t p) { return p; }, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            if (p + kAhead < end) {
                const int64_t soon = ours[p + kAhead];
                if (soon >= 0 && soon < nnz) __builtin_prefetch(gather + soon, 1);
            }
            const int64_t mine = ours[p], other = theirs[p];
            if (mine < 0 || mine >= nnz || other < 0 || other >= nnz) return kBadIndex;
            gather[mine] = static_cast<Gather>(other);
            if (gather_t != nullptr) gather_t[other] = static_cast<Gather>(mine);
        }
        return int64_t{0};
    });
}

}  // namespace

// The passes run on up to ``threads`` threads. No exception crosses the C ABI: a failed allocation
// returns tcsparse::cpu::kNoMemory.
extern "C" {

// rowptr_t holds cols + 1 entries, col_t, order and carried_t nnz each; rowptr rows + 1, col nnz,
// carried nnz. order, or carried with carried_t, may be null.
int64_t tcs_csr_transpose(int64_t index_bytes, int64_t order_bytes, int64_t carried_bytes, int64_t threads,
                          int64_t rows, int64_t cols, int64_t nnz, const void* rowptr, const void* col, void* rowptr_t,
                          void* col_t, void* order, const void* carried, void* carried_t) {
    if (rows < 0 || cols < 0 || nnz < 0) return kBadRowptr;
    if ((carried == nullptr) != (carried_t == nullptr)) return kBadIndex;
    try {
        return with_width(index_bytes, [&](auto index) {
            using Index = decltype(index);
            return with_width(order_bytes, [&](auto position) {
                using Order = decltype(position);
                return with_width(carried_bytes, [&](auto value) {
                    using Carried = decltype(value);
                    return transpose(threads, rows, cols, nnz, static_cast<const Index*>(rowptr),
                                     static_cast<const Index*>(col), static_cast<Index*>(rowptr_t),
                                     static_cast<Index*>(col_t), static_cast<Order*>(order),
                                     static_cast<const Carried*>(carried), static_cast<Carried*>(carried_t));
                });
            });
        });
    } catch (const std::exception&) {
        return tcsparse::cpu::kNoMemory;
    }
}

// rowptr holds rows + 1 entries, row, col, col_out and order nnz each; order may be null (a
// scratch array then stands in for it). Returns the repeats' count.
int64_t tcs_coo_sort(int64_t row_bytes, int64_t col_bytes, int64_t out_bytes, int64_t order_bytes, int64_t threads,
                     int64_t rows, int64_t cols, int64_t nnz, const void* row, const void* col, void* rowptr,
                     void* col_out, void* order) {
    if (rows < 0 || cols < 0 || nnz < 0) return kBadRow;
    try {
        return with_width(row_bytes, [&](auto row_type) {
            using Row = decltype(row_type);
            return with_width(col_bytes, [&](auto col_type) {
                using Col = decltype(col_type);
                return with_width(out_bytes, [&](auto out_type) {
                    using Out = decltype(out_type);
                    return with_width(order_bytes, [&](auto order_type) {
                        using Order = decltype(order_type);
                        std::vector<Order> scratch(order == nullptr ? nnz : 0);
                        return coo_sort(threads, rows, cols, nnz, static_cast<const Row*>(row),
                                        static_cast<const Col*>(col), static_cast<int64_t*>(rowptr),
                                        static_cast<Out*>(col_out),
                                        order == nullptr ? scratch.data() : static_cast<Order*>(order));
                    });
                });
            });
        });
    } catch (const std::exception&) {
        return tcsparse::cpu::kNoMemory;
    }
}

// rowptr, col and order as tcs_coo_sort left them (order may be null, and repeat_order with it);
// repeat_order and repeat_target hold ``repeats`` entries each. Returns the distinct entries' count.
int64_t tcs_merge_repeats(int64_t out_bytes, int64_t order_bytes, int64_t rows, int64_t repeats, void* rowptr,
                          void* col, void* order, void* repeat_order, void* repeat_target) {
    if (rows < 0 || repeats < 0 || (order == nullptr) != (repeat_order == nullptr)) return kBadIndex;
    return with_width(out_bytes, [&](auto out_type) {
        using Out = decltype(out_type);
        return with_width(order_bytes, [&](auto order_type) {
            using Order = decltype(order_type);
            return merge_repeats(rows, repeats, static_cast<int64_t*>(rowptr), static_cast<Out*>(col),
                                 static_cast<Order*>(order), static_cast<Order*>(repeat_order),
                                 static_cast<int64_t*>(repeat_target));
        });
    });
}

// Every array holds nnz entries; gather_t may be null.
int64_t tcs_link_gathers(int64_t gather_bytes, int64_t threads, int64_t nnz, const void* ours, const void* theirs,
                         void* gather, void* gather_t) {
    if (nnz < 0) return kBadIndex;
    try {
        if (gather_bytes == 4)
            return link(threads, nnz, static_cast<const int32_t*>(ours), static_cast<const int32_t*>(theirs),
                        static_cast<int32_t*>(gather), static_cast<int32_t*>(gather_t));
        if (gather_bytes == 8)
            return link(threads, nnz, static_cast<const int64_t*>(ours), static_cast<const int64_t*>(theirs),
                        static_cast<int64_t*>(gather), static_cast<int64_t*>(gather_t));
    } catch (const std::exception&) {
        return tcsparse::cpu::kNoMemory;
    }
    return kBadWidth;
}

}  // extern "C"
