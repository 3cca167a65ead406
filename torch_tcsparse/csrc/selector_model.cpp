// The selector's cost model (selector_model.h).
#include "selector_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <queue>
#include <vector>

namespace tcsparse::selector {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A kernel's time: the work spread evenly over the slots, then the imbalance tail.
double kernel_time_us(const KernelPrices& p, double makespan, double work, int64_t slots, double miss) {
    const double even = work / static_cast<double>(slots);
    const double unit = p.unit_us + p.miss_unit_us * miss;
    return p.launch_us + unit * even + p.tail_us * std::max(0.0, makespan - even);
}

// csr (and rows): the gather of X per nonzero, the write of Y per row, the longest row's imbalance.
double linear_time_us(const LinearPrices& p, int64_t nnz, int64_t rows, int64_t longest, double miss) {
    return p.launch_us + p.nnz_us * static_cast<double>(nnz) + p.row_us * static_cast<double>(rows) +
           p.max_row_us * static_cast<double>(longest) + p.miss_nnz_us * static_cast<double>(nnz) * miss;
}

// rows: the warps that take the rows (the per-row price is one warp's, which a warp shares among
// the rows it packs), the longest piece, a launch of its own when a row is split, scaled by the
// order.
double rows_time_us(const LinearPrices& p, const Matrix& m, int64_t nnz, double miss, int64_t piece_nnz, int64_t n,
                    int64_t value_bytes) {
    const double split_launch = m.max_row_nnz > piece_nnz ? p.split_launch_us : 0.0;
    // selector/native.py's rows_in_order is this factor, which the calibration's fit divides out.
    const double in_order = 1.0 - rows_order_gain(value_bytes) * miss * (1.0 - m.rows_share_ratio);
    const int64_t warps = ceil_div(m.rows, rows_per_warp(n, value_bytes));
    return linear_time_us(p, nnz, warps, std::min(m.max_row_nnz, piece_nnz), miss) * in_order + split_launch;
}

// List scheduling of the base kernel's warps, `copies` adjacent warps per window of cost
// `block_units + blocks`, when there are at most a few per slot (exact). Free times of identical slots are interchangeable, so only their multiset matters:
// with every cost on the half-unit grid (block_units of every fitted calibration) a count per
// half unit is a priority queue whose pops never go back in time; otherwise a heap.
double exact_base_makespan(const Matrix& m, int64_t max_blocks, double block_units, int64_t copies, int64_t slots) {
    const double doubled = 2.0 * block_units;
    constexpr int64_t kMaxRing = int64_t{1} << 24;
    if (doubled == std::floor(doubled) && doubled >= 0 && doubled + 2.0 * static_cast<double>(max_blocks) < kMaxRing) {
        const int64_t unit = static_cast<int64_t>(doubled);
        // Free times in the queue span at most one job: a ring of that many half units, indexed
        // by time modulo its size (`at` is `now`'s index).
        const int64_t ring = unit + 2 * max_blocks + 1;
        // The first wave starts at once, so its end times are its costs. They are counted in four
        // interleaved histograms (one where the ring outgrows the wave): one alone would make each
        // increment of a repeated cost wait for the previous one's store.
        const int64_t lane_mask = ring <= slots ? 3 : 0;
        std::vector<int32_t> lanes((lane_mask + 1) * ring, 0);
        const int64_t whole = std::min(m.windows, slots / copies);  // windows whose copies all start at once
        int64_t latest = 0;
        for (int64_t w = 0; w < whole; ++w) {
            const int64_t cost = unit + 2 * (m.block_start[w + 1] - m.block_start[w]);
            lanes[(w & lane_mask) * ring + cost] += static_cast<int32_t>(copies);
            latest = std::max(latest, cost);
        }
        // The next window may start some of its copies in the first wave.
        const int64_t cut_short = whole < m.windows ? std::min(copies, slots - whole * copies) : 0;
        if (cut_short > 0) {
            const int64_t cost = unit + 2 * (m.block_start[whole + 1] - m.block_start[whole]);
            lanes[cost] += static_cast<int32_t>(cut_short);
            latest = std::max(latest, cost);
        }
        // The lanes summed into the first: the count the rest of the schedule pops and pushes.
        int32_t* count = lanes.data();
        for (int64_t lane = 1; lane <= lane_mask; ++lane) {
            for (int64_t t = 0; t < ring; ++t) count[t] += lanes[lane * ring + t];
        }
        // The rest of the window the first wave cut short, then every later window.
        int64_t now = 0, at = 0;
        for (int64_t w = whole; w < m.windows; ++w) {
            const int64_t cost = unit + 2 * (m.block_start[w + 1] - m.block_start[w]);
            const int64_t jobs = w == whole ? copies - cut_short : copies;
            for (int64_t copy = 0; copy < jobs; ++copy) {
                while (count[at] == 0) {
                    ++now;
                    if (++at == ring) at = 0;
                }
                --count[at];
                const int64_t end_at = at + cost;
                ++count[end_at >= ring ? end_at - ring : end_at];
                latest = std::max(latest, now + cost);
            }
        }
        return static_cast<double>(latest) / 2.0;
    }
    std::priority_queue<double, std::vector<double>, std::greater<double>> free;
    for (int64_t slot = 0; slot < slots; ++slot) free.push(0.0);
    double latest = 0.0;
    for (int64_t w = 0; w < m.windows; ++w) {
        const double cost = block_units + static_cast<double>(m.block_start[w + 1] - m.block_start[w]);
        for (int64_t copy = 0; copy < copies; ++copy) {
            const double end = free.top() + cost;
            free.pop();
            free.push(end);
            latest = std::max(latest, end);
        }
    }
    return latest;
}

// The base kernel beyond a few jobs per slot, a fluid estimate: each window's start estimated
// from the work before it, less half a mean job still running per slot (within 5% of exact list
// scheduling on random costs, up to half a job high on equal ones, which run in lockstep waves).
double fluid_base_makespan(const Matrix& m, const Summary& s, double block_units, int64_t copies, int64_t slots) {
    const double mean = block_units + static_cast<double>(s.tc_blocks) / static_cast<double>(m.windows);
    const int64_t first_wave = ceil_div(slots, copies);
    double makespan = 0.0;
    for (int64_t w = 0; w < m.windows; ++w) {
        const double cost = block_units + static_cast<double>(m.block_start[w + 1] - m.block_start[w]);
        double start = 0.0;
        if (w >= first_wave) {
            const double before = block_units * static_cast<double>(w) + static_cast<double>(m.block_start[w]);
            const double last_copy_before = before * static_cast<double>(copies) + cost * static_cast<double>(copies - 1);
            start = std::max(0.0, last_copy_before / static_cast<double>(slots) - mean / 2.0);
        }
        makespan = std::max(makespan, start + cost);
    }
    const double total = (block_units * static_cast<double>(m.windows) + static_cast<double>(s.tc_blocks)) *
                         static_cast<double>(copies);
    return std::max(makespan, total / static_cast<double>(slots));
}

double base_work(const Matrix& m, const Summary& s, int64_t slices, double block_units) {
    return static_cast<double>(slices) * (static_cast<double>(m.windows) * block_units + static_cast<double>(s.tc_blocks));
}

Units base_units(const Matrix& m, const Summary& s, int64_t slices, int64_t slots, double block_units) {
    if (m.windows == 0) return {};
    const double work = base_work(m, s, slices, block_units);
    const int64_t jobs = m.windows * slices;
    if (jobs <= slots) return {block_units + static_cast<double>(s.max_blocks), work};
    if (jobs <= kExactJobsPerSlot * slots) return {exact_base_makespan(m, s.max_blocks, block_units, slices, slots), work};
    return {fluid_base_makespan(m, s, block_units, slices, slots), work};
}

// The balanced grid priced at the kernel's units and at base's block cost
// without atomics (AR's denominator), in one pass over the warp boundaries.
struct Balanced {
    Units kernel;
    double same_cost_makespan = 0;
    int64_t zeroed_windows = 0;
};

// What lies before an item of the balanced grid (laps of whole slices added): TC blocks, first chunks of a window, and whether the item is a first chunk. Items are
// asked in increasing order, so the cursor walks forward: no division, and the window found by
// galloping from the previous one.
struct Before {
    int64_t blocks, firsts;
    bool first;
};

class ItemCursor {
  public:
    ItemCursor(const Matrix& m, const Summary& s, int64_t chunk) : m_(m), s_(s), chunk_(chunk) {}

    Before at(int64_t item) {
        chunk_in_lap_ += item - item_;
        item_ = item;
        while (chunk_in_lap_ >= s_.chunks) {
            chunk_in_lap_ -= s_.chunks;
            ++laps_;
            window_ = 0;
        }
        const int64_t c = chunk_in_lap_;
        const int64_t* starts = m_.chunk_start;
        const int64_t end = m_.windows + 1;
        // The last window whose chunks start at or before c.
        int64_t step = 1, lo = window_, hi = window_ + 1;
        while (hi < end && starts[hi] <= c) {
            lo = hi;
            hi = std::min(end, hi + step);
            step *= 2;
        }
        window_ = (std::upper_bound(starts + lo, starts + hi, c) - starts) - 1;
        const int64_t inside = c - starts[window_];
        const bool first = inside == 0 && c < starts[m_.windows];
        const int64_t nonempty = m_.windows - s_.empty_windows;
        return {m_.block_start[window_] + inside * chunk_ + laps_ * s_.tc_blocks,
                m_.nonempty_before[window_] + (inside > 0 ? 1 : 0) + laps_ * nonempty, first};
    }

  private:
    const Matrix& m_;
    const Summary& s_;
    int64_t chunk_;
    int64_t item_ = 0, chunk_in_lap_ = 0, laps_ = 0, window_ = 0;
};

Balanced balanced_units(const Matrix& m, const Summary& s, const KernelPrices& p, double block_units,
                        int64_t slices, int64_t slots, int64_t chunk) {
    Balanced out;
    const int64_t items = s.chunks * slices;
    out.zeroed_windows = s.empty_windows;
    if (items == 0) return out;
    if (items <= slots) {  // one chunk per warp: every chunk a segment, cut when its window has several
        out.zeroed_windows += slices * (s.chunks_of_split_windows - s.split_windows);
        auto makespan = [&](double segment, double split) {
            const double full_split = s.split_windows ? static_cast<double>(chunk) + split : 0.0;
            return segment + std::max(static_cast<double>(s.max_single_chunk_blocks), full_split);
        };
        out.kernel.makespan = makespan(p.segment_units, p.split_units);
        out.kernel.work = static_cast<double>(slices) *
                          (p.segment_units * static_cast<double>(s.chunks) + static_cast<double>(s.tc_blocks) +
                           p.split_units * static_cast<double>(s.chunks_of_split_windows));
        out.same_cost_makespan = makespan(block_units, 0.0);
        return out;
    }
    const int64_t upper = (m.windows + s.tc_blocks / chunk + 1) * slices;
    const int64_t per = ceil_div(items, std::min(upper, slots));
    ItemCursor cursor(m, s, chunk);
    Before start = cursor.at(0);
    for (int64_t begin = 0; begin < items; begin += per) {
        const int64_t next = std::min(items, begin + per);
        const Before end = cursor.at(next);
        const bool starts_inside = !start.first;
        const bool ends_inside = next < items && !end.first;
        const int64_t segments = end.firsts - start.firsts + (starts_inside ? 1 : 0);
        const int64_t cut = segments == 1 ? (starts_inside || ends_inside) : int64_t{starts_inside} + ends_inside;
        const double blocks = static_cast<double>(end.blocks - start.blocks);
        const double cost = p.segment_units * static_cast<double>(segments) + blocks + p.split_units * static_cast<double>(cut);
        out.kernel.makespan = std::max(out.kernel.makespan, cost);
        out.kernel.work += cost;
        out.same_cost_makespan = std::max(out.same_cost_makespan, block_units * static_cast<double>(segments) + blocks);
        out.zeroed_windows += ends_inside;
        start = end;
    }
    return out;
}

bool has(unsigned candidates, int path) { return (candidates >> path) & 1u; }

double l2_miss_fraction(const Matrix& m, int64_t n, int64_t value_bytes, int64_t l2_bytes) {
    const double x_bytes = static_cast<double>(m.cols) * static_cast<double>(n) * static_cast<double>(value_bytes);
    return x_bytes > 0 ? std::max(0.0, 1.0 - static_cast<double>(l2_bytes) / x_bytes) : 0.0;
}

// Whether the grouped kernel writes a 16-bit Y itself (csrc/grouped_spmm.h).
bool grouped_direct(int64_t value_bytes, bool one_chunk, int64_t rest_nnz) {
    return value_bytes < 4 && one_chunk && rest_nnz == 0;
}

// The grouped kernel's time, plus the rows kernel's on the nonzeros its layout leaves out (none:
// no launch).
double grouped_us(const Matrix& m, const Prices& p, int64_t n, int64_t value_bytes, int64_t blocks, int64_t rest_nnz,
                  bool one_chunk, double miss) {
    const GroupedPrices g = grouped_prices(value_bytes);
    const double b = static_cast<double>(blocks);
    const double steps = b * static_cast<double>(ceil_div(n, kGroupedColumnsPerWarp));
    const double y_mb = static_cast<double>(m.rows) * static_cast<double>(n) / 1e6;
    const double y_us = grouped_direct(value_bytes, one_chunk, rest_nnz)
                            ? g.direct_us_per_mb * y_mb * static_cast<double>(value_bytes)
                            : g.sums_us_per_mb * y_mb * 4.0;
    double us = g.fixed_us + (g.block_ns * b + g.step_ns * steps) * g.reference_sms / static_cast<double>(p.sm_count) / 1e3 +
                y_us;
    if (rest_nnz != 0) us += rows_time_us(p.rows, m, rest_nnz, miss, p.rest_piece_nnz, n, value_bytes);
    return us;
}

// A kernel's time is at least kernel_time_us at a lower bound of its makespan (the tail only grows
// with it) and its host floor. Where the work is a lower bound too, the tail is kept only while
// more work cannot shorten it by more than it costs (unit >= tail). -infinity where a negative
// constant would break that.
double kernel_lower_bound_us(const KernelPrices& p, double makespan, double work, bool work_exact, int64_t slots,
                             double miss, double extra_us) {
    const double unit = p.unit_us + p.miss_unit_us * miss;
    if (p.tail_us < 0 || unit < 0 || extra_us < 0) return -INFINITY;
    const double kernel = work_exact || unit >= p.tail_us
                              ? kernel_time_us(p, makespan, work, slots, miss)
                              : p.launch_us + unit * (work / static_cast<double>(slots));
    return std::max(p.floor_us, kernel + extra_us);
}

// Every job of the base grid runs whole on one slot: the heaviest window bounds the makespan.
double base_makespan_lower_bound(const Matrix& m, const Summary& s, double block_units) {
    return m.windows == 0 ? 0.0 : block_units + static_cast<double>(s.max_blocks);
}

// Items (chunks times slices) each warp of the balanced grid takes: balanced_units' `per`, 1 where
// there is a warp per item.
int64_t balanced_items_per_warp(const Matrix& m, const Summary& s, int64_t slices, int64_t slots, int64_t chunk) {
    const int64_t items = s.chunks * slices;
    if (items <= slots) return 1;
    const int64_t upper = (m.windows + s.tc_blocks / chunk + 1) * slices;
    return ceil_div(items, std::min(upper, slots));
}

// Every warp of the balanced grid takes `per` consecutive chunks, a segment of its own at least.
// The heaviest chunk bounds the makespan; and a window of at least 2 per - 1 full chunks (all of
// a window's chunks but its last are full) holds some warp's `per` chunks whole, at both the
// kernel's units and base's block cost.
double balanced_makespan_lower_bound(const Summary& s, double segment_units, int64_t chunk, int64_t per) {
    if (s.chunks == 0) return 0.0;
    int64_t heaviest = s.max_single_chunk_blocks;
    if (s.split_windows) heaviest = s.max_blocks / chunk >= 2 * per - 1 ? per * chunk : chunk;
    return segment_units + static_cast<double>(heaviest);
}

// The balanced grid does at least its TC blocks and a segment per warp and per non-empty window
// of each slice, and zeroes at least the empty windows.
double balanced_lower_bound_us(const Matrix& m, const Summary& s, const KernelPrices& p, int64_t slices,
                               int64_t slots, double miss, int64_t chunk, int64_t per) {
    if (p.segment_units < 0 || p.split_units < 0 || p.zero_us < 0) return -INFINITY;
    const int64_t warps = ceil_div(s.chunks * slices, per);
    const int64_t segments = std::max(warps, (m.windows - s.empty_windows) * slices);
    const double work = static_cast<double>(slices) * static_cast<double>(s.tc_blocks) +
                        p.segment_units * static_cast<double>(segments);
    return kernel_lower_bound_us(p, balanced_makespan_lower_bound(s, p.segment_units, chunk, per), work, false, slots,
                                 miss, p.zero_us * static_cast<double>(s.empty_windows * m.window));
}

// The choice ``decide`` makes whatever the kernels cost at or above their bounds, or -1 when
// their costs matter: "rows" (then "grouped" if cheaper still) when it beats every first-step
// choice, or "grouped" when it beats every second-step one.
int settled_without_kernels(const Choice& c, unsigned candidates, int64_t tc_blocks, double base_bound,
                            double balanced_bound, const Rule& rule) {
    const double* cost = c.costs_us;
    double first_step = cost[kCsr];  // decide's choice between csr and the kernel costs at least this
    if (tc_blocks != 0 && has(candidates, kBase)) first_step = std::min(first_step, base_bound);
    if (tc_blocks != 0 && has(candidates, kBalanced)) first_step = std::min(first_step, balanced_bound);
    const bool grouped = has(candidates, kGrouped) && c.priced[kGrouped];
    if (rule.rows_margin <= 1.0 && has(candidates, kRows) && cost[kRows] < (1.0 - rule.rows_margin) * first_step) {
        return grouped && cost[kGrouped] < cost[kRows] ? kGrouped : kRows;
    }
    const double second_step = has(candidates, kRows) ? std::min(first_step, cost[kRows]) : first_step;
    if (grouped && cost[kGrouped] < second_step) return kGrouped;
    return -1;
}

// The rule's kernel unless csr is predicted faster or within the kernel's margin, then "rows" where
// predicted at least its margin faster than that, then "grouped" where predicted faster still;
// `kernel` is the Tensor-Core kernel the rule picked (kernel_by_rule).
int decide(const Choice& c, unsigned candidates, int kernel, int64_t tc_blocks, const Rule& rule) {
    const double* cost = c.costs_us;
    int choice = kCsr;
    if (tc_blocks != 0 && has(candidates, kernel)) {
        const double margin = kernel == kBase ? rule.csr_margin_base : rule.csr_margin_balanced;
        const bool csr_closer = has(candidates, kCsr) && cost[kernel] > (1.0 - margin) * cost[kCsr];
        choice = csr_closer ? kCsr : kernel;
    }
    if (has(candidates, kRows) && cost[kRows] < (1.0 - rule.rows_margin) * cost[choice]) choice = kRows;
    if (has(candidates, kGrouped) && c.priced[kGrouped] && cost[kGrouped] < cost[choice]) choice = kGrouped;
    return choice;
}

int kernel_by_rule(const Choice& c, double ar, const Rule& rule) {
    if (rule.by_cost) return c.costs_us[kBalanced] < c.costs_us[kBase] ? kBalanced : kBase;
    return ar > rule.ar_threshold ? kBalanced : kBase;
}

// Whether the rule picks base whatever the balanced grid's schedule, for a base makespan and
// cost at most these: by AR, when even the lower bound of its denominator leaves AR at or under
// the threshold; by cost, when balanced's lower bound is no cheaper than base.
bool base_by_rule_for_any_balanced(const Summary& s, const Prices& p, int64_t balanced_per, double base_makespan,
                                   double base_cost_us, double balanced_bound) {
    if (p.rule.by_cost) return balanced_bound >= base_cost_us;
    if (p.base.block_units < 0) return false;
    const double denominator = balanced_makespan_lower_bound(s, p.base.block_units, p.chunk, balanced_per);
    return denominator > 0 && base_makespan / denominator <= p.rule.ar_threshold;
}

// List scheduling ends by the time the work before the last job is spread over the slots plus
// that job (Graham), so at most the heaviest window after the even share; a hair more covers the
// schedules' rounding.
double base_makespan_upper_bound(const Matrix& m, const Summary& s, double work, int64_t slots, double block_units) {
    return (work / static_cast<double>(slots) + base_makespan_lower_bound(m, s, block_units)) * (1.0 + 1e-9);
}

}  // namespace

Summary summarize(const Matrix& m, int64_t chunk) {
    Summary s;
    if (m.windows == 0) return s;
    int64_t split_windows = 0;
    for (int64_t w = 0; w < m.windows; ++w) {
        const int64_t blocks = m.block_start[w + 1] - m.block_start[w];
        s.max_blocks = std::max(s.max_blocks, blocks);
        if (blocks > chunk) {
            ++split_windows;
        } else {
            s.max_single_chunk_blocks = std::max(s.max_single_chunk_blocks, blocks);
        }
    }
    s.tc_blocks = m.block_start[m.windows];
    s.chunks = m.chunk_start[m.windows];
    s.empty_windows = m.windows - m.nonempty_before[m.windows];
    s.split_windows = split_windows;
    s.chunks_of_split_windows = s.chunks - (m.windows - s.empty_windows - split_windows);
    return s;
}

Choice choose(const Matrix& m, const Summary& s, const Prices& p, const Query& q) {
    const int64_t base_slots = p.sm_count * std::max<int64_t>(1, q.base.resident);
    const int64_t balanced_slots = p.sm_count * std::max<int64_t>(1, q.balanced.resident);
    const int64_t base_slices = std::max<int64_t>(1, q.base.slices);
    const int64_t balanced_slices = std::max<int64_t>(1, q.balanced.slices);
    const double miss = l2_miss_fraction(m, q.n, q.value_bytes, p.l2_bytes);

    Choice c;
    c.costs_us[kCsr] = std::max(p.csr.floor_us, linear_time_us(p.csr, m.nnz, m.rows, m.max_row_nnz, miss));
    c.costs_us[kRows] =
        std::max(p.rows.floor_us, rows_time_us(p.rows, m, m.nnz, miss, q.piece_nnz, q.n, q.value_bytes));
    c.priced[kCsr] = c.priced[kRows] = true;
    c.costs_us[kGrouped] = std::nan("");
    if (m.grouped_blocks >= 0) {
        const double us = grouped_us(m, p, q.n, q.value_bytes, m.grouped_blocks, m.grouped_rest_nnz,
                                     m.grouped_one_chunk, miss);
        // Its host side is balanced's (a zeroed fp32 output, the kernel, for 16-bit X a rounding
        // launch), or the rows path's where the kernel writes Y alone.
        c.costs_us[kGrouped] = std::max(grouped_direct(q.value_bytes, m.grouped_one_chunk, m.grouped_rest_nnz)
                                            ? p.rows.floor_us : p.balanced.floor_us, us);
        c.priced[kGrouped] = true;
    }
    c.costs_us[kBase] = c.costs_us[kBalanced] = std::nan("");
    const int64_t balanced_per = balanced_items_per_warp(m, s, balanced_slices, balanced_slots, p.chunk);
    const double balanced_bound =
        balanced_lower_bound_us(m, s, p.balanced, balanced_slices, balanced_slots, miss, p.chunk, balanced_per);
    if (!q.all_costs) {
        const double work = base_work(m, s, base_slices, p.base.block_units);
        const double base_bound = kernel_lower_bound_us(p.base, base_makespan_lower_bound(m, s, p.base.block_units),
                                                        work, true, base_slots, miss, 0.0);
        const int settled = settled_without_kernels(c, q.candidates, s.tc_blocks, base_bound, balanced_bound, p.rule);
        if (settled >= 0) {
            c.path = settled;
            return c;
        }
        // Base chosen at the top of its range is chosen anywhere below it (decide turns away from
        // base only when base costs more), so its schedule need not be simulated then.
        const double upper_makespan = base_makespan_upper_bound(m, s, work, base_slots, p.base.block_units);
        Choice at_top = c;
        at_top.costs_us[kBase] =
            std::max(p.base.floor_us, kernel_time_us(p.base, upper_makespan, work, base_slots, miss));
        if (p.base.tail_us >= 0 && p.rule.rows_margin <= 1.0 &&
            base_by_rule_for_any_balanced(s, p, balanced_per, upper_makespan, at_top.costs_us[kBase], balanced_bound) &&
            decide(at_top, q.candidates, kBase, s.tc_blocks, p.rule) == kBase) {
            c.path = kBase;
            return c;
        }
    }

    const Units base = base_units(m, s, base_slices, base_slots, p.base.block_units);
    c.costs_us[kBase] = std::max(p.base.floor_us, kernel_time_us(p.base, base.makespan, base.work, base_slots, miss));
    c.priced[kBase] = true;
    if (!q.all_costs) {
        // The balanced grid is walked only where the choice depends on it: where the rule may pick
        // balanced and the choice would then turn on its cost, or differ from the choice with base.
        const int with_base = decide(c, q.candidates, kBase, s.tc_blocks, p.rule);
        if (base_by_rule_for_any_balanced(s, p, balanced_per, base.makespan, c.costs_us[kBase], balanced_bound) ||
            settled_without_kernels(c, q.candidates, s.tc_blocks, INFINITY, balanced_bound, p.rule) == with_base) {
            c.path = with_base;
            return c;
        }
    }
    const Balanced balanced =
        balanced_units(m, s, p.balanced, p.base.block_units, balanced_slices, balanced_slots, p.chunk);
    c.costs_us[kBalanced] =
        std::max(p.balanced.floor_us,
                 kernel_time_us(p.balanced, balanced.kernel.makespan, balanced.kernel.work, balanced_slots, miss) +
                     p.balanced.zero_us * static_cast<double>(balanced.zeroed_windows * m.window));
    c.priced[kBalanced] = true;
    double ar = 1.0;
    if (!p.rule.by_cost && balanced.same_cost_makespan > 0) ar = base.makespan / balanced.same_cost_makespan;
    c.path = decide(c, q.candidates, kernel_by_rule(c, ar, p.rule), s.tc_blocks, p.rule);
    return c;
}


GroupedPrices grouped_prices(int64_t value_bytes) {
    if (value_bytes >= 4) return {7.6, 0.415, 0.344, 1.25, 0.0, 132};
    return {5.6, 0.215, 0.305, 1.23, 0.179, 132};
}

int64_t rows_per_warp(int64_t n, int64_t value_bytes) {
    const int64_t lanes_needed = ceil_div(std::max<int64_t>(n, 1) * value_bytes, kRowsLaneBytes);
    int64_t lanes = 1;
    while (lanes < lanes_needed && lanes < 32) lanes *= 2;
    return 32 / lanes;
}

int64_t default_column_slices(int64_t n, int64_t value_bytes) {
    const int64_t step = value_bytes >= 4 ? 32 : 64;
    const bool wide = n >= 2 * step && (n % (2 * step) == 0 || n % (2 * step) > step);
    return ceil_div(n, wide ? 2 * step : step);
}

void prefixes(const int64_t* window_blocks, int64_t windows, int64_t chunk, int64_t* chunk_start,
              int64_t* block_start, int64_t* nonempty_before) {
    chunk_start[0] = block_start[0] = nonempty_before[0] = 0;
    for (int64_t w = 0; w < windows; ++w) {
        const int64_t blocks = window_blocks[w];
        chunk_start[w + 1] = chunk_start[w] + ceil_div(blocks, chunk);
        block_start[w + 1] = block_start[w] + blocks;
        nonempty_before[w + 1] = nonempty_before[w] + (blocks > 0 ? 1 : 0);
    }
}

Units base_launch(const Matrix& m, const Summary& s, int64_t slices, int64_t slots, double block_units) {
    return base_units(m, s, std::max<int64_t>(1, slices), std::max<int64_t>(1, slots), block_units);
}

BalancedUnits balanced_launch(const Matrix& m, const Summary& s, int64_t slices, int64_t slots, double segment_units,
                              double split_units, int64_t chunk) {
    KernelPrices p;
    p.segment_units = segment_units;
    p.split_units = split_units;
    const Balanced b =
        balanced_units(m, s, p, segment_units, std::max<int64_t>(1, slices), std::max<int64_t>(1, slots), chunk);
    return {b.kernel.makespan, b.kernel.work, b.zeroed_windows};
}

double grouped_path_us(const Matrix& m, const Prices& p, int64_t n, int64_t value_bytes, int64_t blocks,
                       int64_t rest_nnz, bool one_chunk) {
    return grouped_us(m, p, n, value_bytes, blocks, rest_nnz, one_chunk, l2_miss_fraction(m, n, value_bytes, p.l2_bytes));
}

namespace {

const char* const kPathNames[kNumPaths] = {"base", "balanced", "csr", "rows", "grouped"};

// decide's choice, and why in words.
int decide_explained(const Choice& c, unsigned candidates, double ar, int64_t tc_blocks, const Rule& rule,
                     char* reason, size_t size) {
    const double* cost = c.costs_us;
    const int kernel = kernel_by_rule(c, ar, rule);
    char rule_reason[160];
    if (rule.by_cost) {
        std::snprintf(rule_reason, sizeof rule_reason, "%s predicted faster of the kernels (AR %.2f)",
                      kPathNames[kernel], ar);
    } else {
        std::snprintf(rule_reason, sizeof rule_reason, "AR %.2f %s %.2f", ar, kernel == kBalanced ? ">" : "<=",
                      rule.ar_threshold);
    }
    int choice = kCsr;
    if (tc_blocks == 0) {
        std::snprintf(reason, size, "the matrix has no TC blocks");
    } else if (!has(candidates, kernel)) {
        std::snprintf(reason, size, "the Tensor-Core kernels cannot run on this device and dtype");
    } else {
        const double margin = kernel == kBase ? rule.csr_margin_base : rule.csr_margin_balanced;
        if (has(candidates, kCsr) && cost[kernel] > (1.0 - margin) * cost[kCsr]) {
            std::snprintf(reason, size,
                          "%s picks %s, but csr is predicted faster or too close (%.1f vs %.1f us, margin %.0f%%)",
                          rule_reason, kPathNames[kernel], cost[kCsr], cost[kernel], margin * 100.0);
        } else {
            choice = kernel;
            std::snprintf(reason, size, "%s; predicted %.1f us vs csr %.1f us", rule_reason, cost[kernel], cost[kCsr]);
        }
    }
    const auto append = [&](int path) {
        const size_t used = std::strlen(reason);
        std::snprintf(reason + used, size - used, "; %s predicted faster still (%.1f us)", kPathNames[path], cost[path]);
    };
    if (has(candidates, kRows) && cost[kRows] < (1.0 - rule.rows_margin) * cost[choice]) {
        choice = kRows;
        append(kRows);
    }
    if (has(candidates, kGrouped) && c.priced[kGrouped] && cost[kGrouped] < cost[choice]) {
        choice = kGrouped;
        append(kGrouped);
    }
    return choice;
}

}  // namespace

Explanation explain(const Matrix& m, const Summary& s, const Prices& p, const Query& q) {
    Explanation e;
    Query all = q;
    all.all_costs = true;
    e.choice = choose(m, s, p, all);
    const int64_t slices[2] = {std::max<int64_t>(1, q.base.slices), std::max<int64_t>(1, q.balanced.slices)};
    const int64_t slots[2] = {p.sm_count * std::max<int64_t>(1, q.base.resident),
                              p.sm_count * std::max<int64_t>(1, q.balanced.resident)};
    std::copy(slices, slices + 2, e.slices);
    std::copy(slots, slots + 2, e.slots);
    e.miss = l2_miss_fraction(m, q.n, q.value_bytes, p.l2_bytes);
    e.base = base_units(m, s, slices[0], slots[0], p.base.block_units);
    const Balanced balanced = balanced_units(m, s, p.balanced, p.base.block_units, slices[1], slots[1], p.chunk);
    e.balanced = {balanced.kernel.makespan, balanced.kernel.work, balanced.zeroed_windows};
    e.ar = balanced.same_cost_makespan > 0 ? e.base.makespan / balanced.same_cost_makespan : 1.0;

    const double zeroed_rows = static_cast<double>(balanced.zeroed_windows * m.window);
    e.device_us[kBase] = kernel_time_us(p.base, e.base.makespan, e.base.work, slots[0], e.miss);
    e.device_us[kBalanced] = kernel_time_us(p.balanced, e.balanced.makespan, e.balanced.work, slots[1], e.miss) +
                             p.balanced.zero_us * zeroed_rows;
    e.device_us[kCsr] = linear_time_us(p.csr, m.nnz, m.rows, m.max_row_nnz, e.miss);
    e.device_us[kRows] = rows_time_us(p.rows, m, m.nnz, e.miss, q.piece_nnz, q.n, q.value_bytes);
    e.device_us[kGrouped] = m.grouped_blocks >= 0 ? grouped_us(m, p, q.n, q.value_bytes, m.grouped_blocks,
                                                               m.grouped_rest_nnz, m.grouped_one_chunk, e.miss)
                                                  : std::nan("");
    e.makespans_us[0] = e.device_us[kBase] - p.base.launch_us;
    e.makespans_us[1] = e.device_us[kBalanced] - p.balanced.launch_us - p.balanced.zero_us * zeroed_rows;
    e.makespans_us[2] = p.base.unit_us * e.base.work / static_cast<double>(slots[0]);

    // Each column slice reads the sparse data again (fp32 values; per block its columns and
    // bitmap); every window writes its rows of Y.
    const double n = static_cast<double>(q.n), bytes = static_cast<double>(q.value_bytes);
    const double blocks = static_cast<double>(s.tc_blocks), nnz = static_cast<double>(m.nnz);
    const double gather = blocks * 8 * n * bytes + static_cast<double>(slices[0]) * (nnz * 4 + blocks * (8 * 4 + 16));
    const double write = static_cast<double>(m.windows * m.window) * n * bytes;
    e.bytes_moved[0] = gather + write;
    e.bytes_moved[1] = gather + write + 2 * zeroed_rows * n * bytes;
    e.bytes_moved[2] = e.bytes_moved[3] = nnz * (n * bytes + 4 + bytes) + static_cast<double>(m.rows) * n * bytes;

    e.choice.path = decide_explained(e.choice, q.candidates, e.ar, s.tc_blocks, p.rule, e.reason, sizeof e.reason);
    return e;
}

}  // namespace tcsparse::selector
