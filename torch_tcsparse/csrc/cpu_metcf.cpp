// The ME-TCF layout (torch_tcsparse/formats/metcf.py) of a canonical CSR on the CPU, window by
// window, entry for entry the layout of the torch build; loaded by torch_tcsparse/formats/
// native.py through ctypes. Each window is independent: its distinct columns, ascending, are its
// block columns; a nonzero's rank among them gives its block and lane, and its bit in the block's
// occupancy bitmap; its place in block order is the window's first nonzero plus the bits before
// its own. No sort over every nonzero and no int64 key per nonzero: a column-indexed stamp finds a
// window's distinct columns, and only those are sorted.
//
// Two calls: ``tcs_metcf_count`` (blocks per window, which size the arrays), then
// ``tcs_metcf_fill``. Every index read is checked against the sizes given before it addresses
// memory, and the fill checks the window offsets against the blocks it finds, so crafted input
// returns a negative code, never a write out of bounds.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kBadColumn = -1;
constexpr int64_t kBadRowptr = -2;
constexpr int64_t kBadRowMap = -3;
constexpr int64_t kBadOffsets = -4;
constexpr int64_t kBadWidth = -5;
constexpr int64_t kBlockWidth = 8;
constexpr int64_t kBitmapWords = 4;

template <typename Index>
struct Matrix {
    int64_t rows, cols, nnz, window, windows;
    const Index* rowptr;
    const Index* col;
    const int32_t* row_map;  // windows * window slots, -1 past the last row

    // Calls ``visit(slot_in_window, position)`` for every nonzero of window ``w``; false where an
    // index is out of range (nothing is visited past it).
    template <typename Visit>
    bool each_nonzero(int64_t w, Visit&& visit) const {
        for (int64_t s = 0; s < window; ++s) {
            const int64_t row = row_map[w * window + s];
            if (row < 0) continue;
            if (row >= rows) return false;
            const int64_t begin = rowptr[row], end = rowptr[row + 1];
            if (begin < 0 || begin > end || end > nnz) return false;
            for (int64_t p = begin; p < end; ++p) visit(s, p);
        }
        return true;
    }

    bool columns_in_range() const {
        for (int64_t p = 0; p < nnz; ++p)
            if (col[p] < 0 || col[p] >= cols) return false;
        return true;
    }
};

// The window's distinct columns, ascending, in ``distinct``; ``stamp[c] == w`` marks those seen.
template <typename Index>
bool distinct_columns(const Matrix<Index>& m, int64_t w, std::vector<int64_t>& stamp, std::vector<int64_t>& distinct) {
    distinct.clear();
    return m.each_nonzero(w, [&](int64_t, int64_t p) {
        const int64_t c = m.col[p];
        if (stamp[c] != w) {
            stamp[c] = w;
            distinct.push_back(c);
        }
    });
}

template <typename Index>
int64_t count(const Matrix<Index>& m, int64_t* blocks) {
    if (!m.columns_in_range()) return kBadColumn;
    std::vector<int64_t> stamp(m.cols, -1), distinct;
    for (int64_t w = 0; w < m.windows; ++w) {
        if (!distinct_columns(m, w, stamp, distinct)) return kBadRowMap;
        blocks[w] = (static_cast<int64_t>(distinct.size()) + kBlockWidth - 1) / kBlockWidth;
    }
    return 0;
}

inline int popcount(uint32_t word) { return __builtin_popcount(word); }

template <typename Index, typename Gather>
int64_t fill(const Matrix<Index>& m, const int32_t* window_offsets, int64_t num_blocks, int32_t* block_cols,
             uint32_t* bitmap, int32_t* block_offsets, uint8_t* local_ids, Gather* csr_gather) {
    if (!m.columns_in_range()) return kBadColumn;
    if (window_offsets[0] != 0 || window_offsets[m.windows] != num_blocks) return kBadOffsets;
    std::vector<int64_t> stamp(m.cols, -1), distinct;
    std::vector<int64_t> rank(m.cols);
    int64_t first_nonzero = 0;  // of the window, in block order
    for (int64_t w = 0; w < m.windows; ++w) {
        if (!distinct_columns(m, w, stamp, distinct)) return kBadRowMap;
        const int64_t b0 = window_offsets[w], b1 = window_offsets[w + 1];
        const int64_t d = static_cast<int64_t>(distinct.size());
        if (b0 < 0 || b1 > num_blocks || b1 - b0 != (d + kBlockWidth - 1) / kBlockWidth) return kBadOffsets;
        std::sort(distinct.begin(), distinct.end());
        int32_t* cols = block_cols + b0 * kBlockWidth;
        for (int64_t i = 0; i < d; ++i) {
            cols[i] = static_cast<int32_t>(distinct[i]);
            rank[distinct[i]] = i;
        }
        for (int64_t i = d; i < (b1 - b0) * kBlockWidth; ++i) cols[i] = -1;
        uint32_t* words = bitmap + b0 * kBitmapWords;
        std::fill(words, words + (b1 - b0) * kBitmapWords, 0u);
        // A nonzero's bit: block * 128 + row_in_window * 8 + lane, from its column's rank.
        auto bit_of = [&](int64_t s, int64_t p) {
            const int64_t r = rank[m.col[p]];
            return (r / kBlockWidth) * 128 + s * kBlockWidth + r % kBlockWidth;
        };
        m.each_nonzero(w, [&](int64_t s, int64_t p) {
            const int64_t bit = bit_of(s, p);
            words[bit >> 5] |= 1u << (bit & 31);
        });
        int64_t before = first_nonzero;
        for (int64_t b = b0; b < b1; ++b) {
            block_offsets[b] = static_cast<int32_t>(before);
            const uint32_t* block = bitmap + b * kBitmapWords;
            for (int64_t k = 0; k < kBitmapWords; ++k) before += popcount(block[k]);
        }
        // A row listed twice in row_map would place more nonzeros than there are.
        if (before > m.nnz) return kBadRowMap;
        m.each_nonzero(w, [&](int64_t s, int64_t p) {
            const int64_t bit = bit_of(s, p);
            const uint32_t* block = words + (bit >> 7) * kBitmapWords;
            const int64_t word = (bit >> 5) & 3;
            int64_t place = block_offsets[b0 + (bit >> 7)];
            for (int64_t k = 0; k < word; ++k) place += popcount(block[k]);
            place += popcount(block[word] & ((1u << (bit & 31)) - 1u));
            local_ids[place] = static_cast<uint8_t>(bit & 127);
            csr_gather[p] = static_cast<Gather>(place);
        });
        first_nonzero = before;
    }
    block_offsets[num_blocks] = static_cast<int32_t>(first_nonzero);
    return 0;
}

template <typename Index>
Matrix<Index> matrix(int64_t rows, int64_t cols, int64_t nnz, int64_t window, int64_t windows, const void* rowptr,
                     const void* col, const int32_t* row_map) {
    return {rows, cols, nnz, window, windows, static_cast<const Index*>(rowptr), static_cast<const Index*>(col),
            row_map};
}

bool valid_sizes(int64_t rows, int64_t cols, int64_t nnz, int64_t window, int64_t windows) {
    return rows >= 0 && cols >= 0 && nnz >= 0 && (window == 8 || window == 16) && windows == (rows + window - 1) / window;
}

}  // namespace

extern "C" {

// blocks: windows entries. rowptr rows + 1, col nnz, row_map windows * window.
int64_t tcs_metcf_count(int64_t index_bytes, int64_t rows, int64_t cols, int64_t nnz, int64_t window,
                        int64_t windows, const void* rowptr, const void* col, const int32_t* row_map,
                        int64_t* blocks) {
    if (!valid_sizes(rows, cols, nnz, window, windows)) return kBadRowMap;
    if (index_bytes == 4) return count(matrix<int32_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), blocks);
    if (index_bytes == 8) return count(matrix<int64_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), blocks);
    return kBadWidth;
}

// window_offsets: windows + 1 entries; block_cols num_blocks * 8, bitmap num_blocks * 4,
// block_offsets num_blocks + 1, local_ids and csr_gather nnz.
int64_t tcs_metcf_fill(int64_t index_bytes, int64_t gather_bytes, int64_t rows, int64_t cols, int64_t nnz,
                       int64_t window, int64_t windows, const void* rowptr, const void* col, const int32_t* row_map,
                       const int32_t* window_offsets, int64_t num_blocks, int32_t* block_cols, uint32_t* bitmap,
                       int32_t* block_offsets, uint8_t* local_ids, void* csr_gather) {
    if (!valid_sizes(rows, cols, nnz, window, windows) || num_blocks < 0) return kBadOffsets;
    if (index_bytes == 4 && gather_bytes == 4)
        return fill(matrix<int32_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), window_offsets, num_blocks,
                    block_cols, bitmap, block_offsets, local_ids, static_cast<int32_t*>(csr_gather));
    if (index_bytes == 8 && gather_bytes == 4)
        return fill(matrix<int64_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), window_offsets, num_blocks,
                    block_cols, bitmap, block_offsets, local_ids, static_cast<int32_t*>(csr_gather));
    if (index_bytes == 8 && gather_bytes == 8)
        return fill(matrix<int64_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), window_offsets, num_blocks,
                    block_cols, bitmap, block_offsets, local_ids, static_cast<int64_t*>(csr_gather));
    return kBadWidth;
}

}  // extern "C"
