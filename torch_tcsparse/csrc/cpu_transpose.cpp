// The transpose of a canonical CSR on the CPU, and the link between the block orders of a matrix
// and of its transpose, each as one counting pass (loaded by torch_tcsparse/formats/native.py
// through ctypes). A counting sort by column is stable, so every column's rows come out ascending:
// the transpose of a canonical CSR is canonical without a sort. Index arrays are int32 or int64
// (``*_bytes`` says which); every index read is checked against the sizes given before it is used
// to address memory, and a bad one returns a negative code instead of writing anything past it.
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kBadColumn = -1;
constexpr int64_t kBadRowptr = -2;
constexpr int64_t kBadIndex = -3;
constexpr int64_t kBadWidth = -4;

template <typename Index, typename Order>
int64_t transpose(int64_t rows, int64_t cols, int64_t nnz, const Index* rowptr, const Index* col, Index* rowptr_t,
                  Index* col_t, Order* order) {
    if (rowptr[0] != 0 || rowptr[rows] != nnz) return kBadRowptr;
    for (int64_t c = 0; c <= cols; ++c) rowptr_t[c] = 0;
    for (int64_t p = 0; p < nnz; ++p) {
        const int64_t c = col[p];
        if (c < 0 || c >= cols) return kBadColumn;
        ++rowptr_t[c + 1];
    }
    for (int64_t c = 0; c < cols; ++c) rowptr_t[c + 1] += rowptr_t[c];
    std::vector<int64_t> next(rowptr_t, rowptr_t + cols);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t begin = rowptr[r], end = rowptr[r + 1];
        if (begin > end || end > nnz) return kBadRowptr;
        for (int64_t p = begin; p < end; ++p) {
            const int64_t q = next[col[p]]++;
            col_t[q] = static_cast<Index>(r);
            order[q] = static_cast<Order>(p);
        }
    }
    return 0;
}

template <typename Index>
int64_t transpose_index(int64_t order_bytes, int64_t rows, int64_t cols, int64_t nnz, const void* rowptr,
                        const void* col, void* rowptr_t, void* col_t, void* order) {
    const auto* rp = static_cast<const Index*>(rowptr);
    const auto* c = static_cast<const Index*>(col);
    auto* rpt = static_cast<Index*>(rowptr_t);
    auto* ct = static_cast<Index*>(col_t);
    if (order_bytes == 4) return transpose(rows, cols, nnz, rp, c, rpt, ct, static_cast<int32_t*>(order));
    if (order_bytes == 8) return transpose(rows, cols, nnz, rp, c, rpt, ct, static_cast<int64_t*>(order));
    return kBadWidth;
}

// gather[ours[order[p]]] = theirs[p] and, where gather_t is given, gather_t[theirs[p]] =
// ours[order[p]]: both are permutations of [0, nnz), checked as they are read.
template <typename Order, typename Gather>
int64_t link(int64_t nnz, const Order* order, const Gather* ours, const Gather* theirs, Gather* gather,
             Gather* gather_t) {
    for (int64_t p = 0; p < nnz; ++p) {
        const int64_t source = order[p];
        if (source < 0 || source >= nnz) return kBadIndex;
        const int64_t mine = ours[source], other = theirs[p];
        if (mine < 0 || mine >= nnz || other < 0 || other >= nnz) return kBadIndex;
        gather[mine] = static_cast<Gather>(other);
        if (gather_t != nullptr) gather_t[other] = static_cast<Gather>(mine);
    }
    return 0;
}

template <typename Order>
int64_t link_order(int64_t gather_bytes, int64_t nnz, const Order* order, const void* ours, const void* theirs,
                   void* gather, void* gather_t) {
    if (gather_bytes == 4)
        return link(nnz, order, static_cast<const int32_t*>(ours), static_cast<const int32_t*>(theirs),
                    static_cast<int32_t*>(gather), static_cast<int32_t*>(gather_t));
    if (gather_bytes == 8)
        return link(nnz, order, static_cast<const int64_t*>(ours), static_cast<const int64_t*>(theirs),
                    static_cast<int64_t*>(gather), static_cast<int64_t*>(gather_t));
    return kBadWidth;
}

}  // namespace

extern "C" {

// rowptr_t holds cols + 1 entries, col_t and order nnz each; rowptr rows + 1, col nnz.
int64_t tcs_csr_transpose(int64_t index_bytes, int64_t order_bytes, int64_t rows, int64_t cols, int64_t nnz,
                          const void* rowptr, const void* col, void* rowptr_t, void* col_t, void* order) {
    if (rows < 0 || cols < 0 || nnz < 0) return kBadRowptr;
    if (index_bytes == 4)
        return transpose_index<int32_t>(order_bytes, rows, cols, nnz, rowptr, col, rowptr_t, col_t, order);
    if (index_bytes == 8)
        return transpose_index<int64_t>(order_bytes, rows, cols, nnz, rowptr, col, rowptr_t, col_t, order);
    return kBadWidth;
}

// Every array holds nnz entries; gather_t may be null.
int64_t tcs_link_gathers(int64_t order_bytes, int64_t gather_bytes, int64_t nnz, const void* order, const void* ours,
                         const void* theirs, void* gather, void* gather_t) {
    if (nnz < 0) return kBadIndex;
    if (order_bytes == 4)
        return link_order(gather_bytes, nnz, static_cast<const int32_t*>(order), ours, theirs, gather, gather_t);
    if (order_bytes == 8)
        return link_order(gather_bytes, nnz, static_cast<const int64_t*>(order), ours, theirs, gather, gather_t);
    return kBadWidth;
}

}  // extern "C"
