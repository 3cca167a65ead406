// The ME-TCF layout (torch_tcsparse/formats/metcf.py) of a canonical CSR on the CPU, window by
// window, entry for entry the layout of the torch build; loaded by torch_tcsparse/formats/
// native.py through ctypes. Each window is independent: its distinct columns, ascending, are its
// block columns; a nonzero's rank among them gives its block and lane, and its bit in the block's
// occupancy bitmap; its place in block order is the window's first nonzero plus the bits before
// its own. Only a window's nonzeros are sorted at a time (in cache), with no int64 key per
// nonzero of the matrix and no array per column.
//
// Two calls: ``tcs_metcf_count`` (blocks per window, which size the arrays), then
// ``tcs_metcf_fill``, each over ranges of windows of about equal nonzeros on a few threads
// (cpu_parallel.h). Every index read is checked against the sizes given before it addresses
// memory, and the fill checks the window offsets against the blocks it finds, so crafted input
// returns a negative code, never a write out of bounds.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <vector>

#include "cpu_parallel.h"

namespace {

constexpr int64_t kBadColumn = -1;
constexpr int64_t kBadRowMap = -3;
constexpr int64_t kBadOffsets = -4;
constexpr int64_t kBadWidth = -5;
constexpr int64_t kBlockWidth = 8;
constexpr int64_t kBitmapWords = 4;
constexpr int64_t kMaxWindow = 16;
constexpr int kRowBits = 4;  // of a row in its window
constexpr int64_t kMaxColumns = int64_t{1} << (63 - kRowBits);  // a column and a row fit a key

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

// Sorts ``keys`` ascending. They arrive by row in window, then column (the order of the window's
// rows), so a stable sort by column alone orders them: least significant digit first over the
// span of the window's columns, each digit's pass a stable counting sort (a window's keys are a
// few hundred of a wide range: a comparison sort mispredicts a branch on most of its steps). A
// few keys by insertion.
constexpr int kMaxDigitBits = 8;
constexpr size_t kInsertionKeys = 24;

void sort_keys(std::vector<uint64_t>& keys, std::vector<uint64_t>& spare) {
    const size_t n = keys.size();
    if (n <= kInsertionKeys) {
        for (size_t i = 1; i < n; ++i) {
            const uint64_t key = keys[i];
            size_t j = i;
            for (; j > 0 && keys[j - 1] > key; --j) keys[j] = keys[j - 1];
            keys[j] = key;
        }
        return;
    }
    uint64_t low = keys[0] >> kRowBits, high = low;
    for (const uint64_t key : keys) {
        low = std::min(low, key >> kRowBits);
        high = std::max(high, key >> kRowBits);
    }
    int bits = 0;
    while (bits < 64 && ((high - low) >> bits) != 0) ++bits;
    if (bits == 0) return;  // one column: the rows' order is the keys' order
    const int passes = (bits + kMaxDigitBits - 1) / kMaxDigitBits;
    const int digit = (bits + passes - 1) / passes;
    const uint64_t mask = (uint64_t{1} << digit) - 1;
    constexpr int kMaxPasses = (64 + kMaxDigitBits - 1) / kMaxDigitBits;
    size_t count[kMaxPasses][(1 << kMaxDigitBits) + 1];
    for (int pass = 0; pass < passes; ++pass) std::fill(count[pass], count[pass] + mask + 2, size_t{0});
    for (const uint64_t key : keys) {
        const uint64_t column = (key >> kRowBits) - low;
        for (int pass = 0; pass < passes; ++pass) ++count[pass][((column >> (pass * digit)) & mask) + 1];
    }
    spare.resize(n);
    for (int pass = 0; pass < passes; ++pass) {
        size_t* place = count[pass];
        for (uint64_t d = 0; d < mask + 1; ++d) place[d + 1] += place[d];
        for (const uint64_t key : keys) spare[place[(((key >> kRowBits) - low) >> (pass * digit)) & mask]++] = key;
        keys.swap(spare);
    }
}

// The window's nonzeros as keys column << 4 | row in window, ascending: distinct (a canonical row
// holds a column once), sorted alone in cache. Equal columns come together, ranked by their order,
// and inside a row the keys come in the row's order (its columns ascend), so a row's next key is
// its next nonzero.
template <typename Index>
bool sorted_keys(const Matrix<Index>& m, int64_t w, std::vector<uint64_t>& keys, std::vector<uint64_t>& spare) {
    keys.clear();
    const bool ok = m.each_nonzero(w, [&](int64_t s, int64_t p) {
        keys.push_back(static_cast<uint64_t>(m.col[p]) << kRowBits | static_cast<uint64_t>(s));
    });
    sort_keys(keys, spare);
    return ok;
}

int64_t distinct_count(const std::vector<uint64_t>& keys) {
    int64_t d = 0;
    for (size_t i = 0; i < keys.size(); ++i) d += i == 0 || (keys[i] >> kRowBits) != (keys[i - 1] >> kRowBits);
    return d;
}

// Nonzeros of the windows before each window (windows + 1 entries): a window's nonzeros are those
// of its rows. False where a row is out of range, or rows listed twice hold more nonzeros than
// there are.
template <typename Index>
bool nonzeros_before(const Matrix<Index>& m, std::vector<int64_t>& before) {
    before.assign(m.windows + 1, 0);
    for (int64_t w = 0; w < m.windows; ++w) {
        int64_t total = before[w];
        for (int64_t s = 0; s < m.window; ++s) {
            const int64_t row = m.row_map[w * m.window + s];
            if (row < 0) continue;
            if (row >= m.rows) return false;
            const int64_t begin = m.rowptr[row], end = m.rowptr[row + 1];
            if (begin < 0 || begin > end || end > m.nnz) return false;
            total += end - begin;
        }
        if (total > m.nnz) return false;
        before[w + 1] = total;
    }
    return true;
}

// Runs ``work(w0, w1)`` over ranges of windows of about equal nonzeros on up to ``threads``.
template <typename Work>
int64_t over_windows(int64_t threads, const std::vector<int64_t>& before, Work&& work) {
    return tcsparse::cpu::in_parallel(threads, static_cast<int64_t>(before.size()) - 1,
                                      [&](int64_t w) { return before[w]; }, work);
}

template <typename Index>
int64_t count(const Matrix<Index>& m, int64_t threads, int64_t* blocks) {
    if (!m.columns_in_range()) return kBadColumn;
    std::vector<int64_t> before;
    if (!nonzeros_before(m, before)) return kBadRowMap;
    return over_windows(threads, before, [&](int64_t w0, int64_t w1) {
        std::vector<uint64_t> keys, spare;
        for (int64_t w = w0; w < w1; ++w) {
            if (!sorted_keys(m, w, keys, spare)) return kBadRowMap;
            blocks[w] = (distinct_count(keys) + kBlockWidth - 1) / kBlockWidth;
        }
        return int64_t{0};
    });
}

// Bit count without a popcount instruction (the library is built for any CPU of the
// architecture, where __builtin_popcount may become a library call).
inline int64_t popcount(uint32_t word) {
    word -= (word >> 1) & 0x55555555u;
    word = (word & 0x33333333u) + ((word >> 2) & 0x33333333u);
    word = (word + (word >> 4)) & 0x0F0F0F0Fu;
    return static_cast<int64_t>((word * 0x01010101u) >> 24);
}

// Windows [w0, w1) of the layout; ``first_nonzero``: the nonzeros of the windows before w0.
template <typename Index, typename Gather>
int64_t fill_windows(const Matrix<Index>& m, int64_t w0, int64_t w1, int64_t first_nonzero,
                     const int32_t* window_offsets, int64_t num_blocks, int32_t* block_cols, uint32_t* bitmap,
                     int32_t* block_offsets, uint8_t* local_ids, Gather* csr_gather) {
    std::vector<uint64_t> keys, spare;
    std::vector<int64_t> bits;
    int64_t next[kMaxWindow];  // the next nonzero of each row of the window
    for (int64_t w = w0; w < w1; ++w) {
        if (!sorted_keys(m, w, keys, spare)) return kBadRowMap;
        const int64_t b0 = window_offsets[w], b1 = window_offsets[w + 1];
        const int64_t d = distinct_count(keys);
        if (b0 < 0 || b1 > num_blocks || b1 - b0 != (d + kBlockWidth - 1) / kBlockWidth) return kBadOffsets;
        int32_t* cols = block_cols + b0 * kBlockWidth;
        uint32_t* words = bitmap + b0 * kBitmapWords;
        std::fill(cols, cols + (b1 - b0) * kBlockWidth, -1);
        std::fill(words, words + (b1 - b0) * kBitmapWords, 0u);
        // A nonzero's bit: block * 128 + row_in_window * 8 + lane, from its column's rank.
        bits.resize(keys.size());
        int64_t rank = -1;
        for (size_t i = 0; i < keys.size(); ++i) {
            const int64_t column = static_cast<int64_t>(keys[i] >> kRowBits), s = keys[i] & (kMaxWindow - 1);
            if (i == 0 || column != static_cast<int64_t>(keys[i - 1] >> kRowBits))
                cols[++rank] = static_cast<int32_t>(column);
            const int64_t bit = (rank / kBlockWidth) * 128 + s * kBlockWidth + rank % kBlockWidth;
            bits[i] = bit;
            words[bit >> 5] |= 1u << (bit & 31);
        }
        int64_t before = first_nonzero;
        for (int64_t b = b0; b < b1; ++b) {
            block_offsets[b] = static_cast<int32_t>(before);
            const uint32_t* block = bitmap + b * kBitmapWords;
            for (int64_t k = 0; k < kBitmapWords; ++k) before += popcount(block[k]);
        }
        for (int64_t s = 0; s < m.window; ++s) {
            const int64_t row = m.row_map[w * m.window + s];
            next[s] = row < 0 ? 0 : m.rowptr[row];
        }
        for (size_t i = 0; i < keys.size(); ++i) {
            const int64_t bit = bits[i];
            const uint32_t* block = words + (bit >> 7) * kBitmapWords;
            const int64_t word = (bit >> 5) & 3;
            int64_t place = block_offsets[b0 + (bit >> 7)];
            for (int64_t k = 0; k < word; ++k) place += popcount(block[k]);
            place += popcount(block[word] & ((1u << (bit & 31)) - 1u));
            local_ids[place] = static_cast<uint8_t>(bit & 127);
            csr_gather[next[keys[i] & (kMaxWindow - 1)]++] = static_cast<Gather>(place);
        }
        first_nonzero = before;
    }
    return 0;
}

template <typename Index, typename Gather>
int64_t fill(const Matrix<Index>& m, int64_t threads, const int32_t* window_offsets, int64_t num_blocks,
             int32_t* block_cols, uint32_t* bitmap, int32_t* block_offsets, uint8_t* local_ids, Gather* csr_gather) {
    if (!m.columns_in_range()) return kBadColumn;
    if (window_offsets[0] != 0 || window_offsets[m.windows] != num_blocks) return kBadOffsets;
    std::vector<int64_t> before;
    if (!nonzeros_before(m, before)) return kBadRowMap;
    const int64_t code = over_windows(threads, before, [&](int64_t w0, int64_t w1) {
        return fill_windows(m, w0, w1, before[w0], window_offsets, num_blocks, block_cols, bitmap, block_offsets,
                            local_ids, csr_gather);
    });
    block_offsets[num_blocks] = static_cast<int32_t>(before[m.windows]);
    return code;
}

template <typename Index>
Matrix<Index> matrix(int64_t rows, int64_t cols, int64_t nnz, int64_t window, int64_t windows, const void* rowptr,
                     const void* col, const int32_t* row_map) {
    return {rows, cols, nnz, window, windows, static_cast<const Index*>(rowptr), static_cast<const Index*>(col),
            row_map};
}

bool valid_sizes(int64_t rows, int64_t cols, int64_t nnz, int64_t window, int64_t windows) {
    return rows >= 0 && cols >= 0 && cols <= kMaxColumns && nnz >= 0 && (window == 8 || window == 16) &&
           windows == (rows + window - 1) / window;
}

}  // namespace

// The passes run on up to ``threads`` threads. No exception crosses the C ABI: a failed allocation
// returns tcsparse::cpu::kNoMemory.
extern "C" {

// blocks: windows entries. rowptr rows + 1, col nnz, row_map windows * window.
int64_t tcs_metcf_count(int64_t index_bytes, int64_t threads, int64_t rows, int64_t cols, int64_t nnz, int64_t window,
                        int64_t windows, const void* rowptr, const void* col, const int32_t* row_map,
                        int64_t* blocks) {
    if (!valid_sizes(rows, cols, nnz, window, windows)) return kBadRowMap;
    try {
        if (index_bytes == 4)
            return count(matrix<int32_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), threads, blocks);
        if (index_bytes == 8)
            return count(matrix<int64_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), threads, blocks);
    } catch (const std::exception&) {
        return tcsparse::cpu::kNoMemory;
    }
    return kBadWidth;
}

// window_offsets: windows + 1 entries; block_cols num_blocks * 8, bitmap num_blocks * 4,
// block_offsets num_blocks + 1, local_ids and csr_gather nnz.
int64_t tcs_metcf_fill(int64_t index_bytes, int64_t gather_bytes, int64_t threads, int64_t rows, int64_t cols,
                       int64_t nnz, int64_t window, int64_t windows, const void* rowptr, const void* col,
                       const int32_t* row_map, const int32_t* window_offsets, int64_t num_blocks, int32_t* block_cols,
                       uint32_t* bitmap, int32_t* block_offsets, uint8_t* local_ids, void* csr_gather) {
    if (!valid_sizes(rows, cols, nnz, window, windows) || num_blocks < 0) return kBadOffsets;
    try {
        if (index_bytes == 4 && gather_bytes == 4)
            return fill(matrix<int32_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), threads,
                        window_offsets, num_blocks, block_cols, bitmap, block_offsets, local_ids,
                        static_cast<int32_t*>(csr_gather));
        if (index_bytes == 8 && gather_bytes == 4)
            return fill(matrix<int64_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), threads,
                        window_offsets, num_blocks, block_cols, bitmap, block_offsets, local_ids,
                        static_cast<int32_t*>(csr_gather));
        if (index_bytes == 8 && gather_bytes == 8)
            return fill(matrix<int64_t>(rows, cols, nnz, window, windows, rowptr, col, row_map), threads,
                        window_offsets, num_blocks, block_cols, bitmap, block_offsets, local_ids,
                        static_cast<int64_t*>(csr_gather));
    } catch (const std::exception&) {
        return tcsparse::cpu::kNoMemory;
    }
    return kBadWidth;
}

}  // extern "C"
