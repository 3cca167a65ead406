// Work over ranges of [0, n) on a few threads, for the CPU conversion's passes (cpu_metcf.cpp,
// cpu_transpose.cpp): each range is independent and writes its own part of the outputs. A pass
// returns 0 or a negative code; so does a range, and the first failing range's code is the pass's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace tcsparse::cpu {

// What a range returns where it could not allocate its scratch.
constexpr int64_t kNoMemory = -100;
// Threads started at most, whatever the caller asks.
constexpr int64_t kMaxThreads = 64;
// Work below which one thread does it all: starting threads costs tens of microseconds.
constexpr int64_t kMinParallelWork = 1 << 16;

// Runs ``work(begin, end)`` over consecutive ranges of [0, n) on up to ``threads`` threads (the
// caller's among them); ``weight_before(i)`` is the work of [0, i), non-decreasing, which the
// ranges split evenly.
template <typename Work, typename Weight>
int64_t in_parallel(int64_t threads, int64_t n, Weight&& weight_before, Work&& work) {
    const int64_t total = n > 0 ? weight_before(n) : 0;
    threads = std::clamp<int64_t>(threads, 1, kMaxThreads);
    if (total < kMinParallelWork || n < threads) threads = 1;
    std::vector<int64_t> bounds(threads + 1, n);
    bounds[0] = 0;
    for (int64_t t = 1; t < threads; ++t) {
        const int64_t target = total / threads * t;
        int64_t low = bounds[t - 1], high = n;  // the first i with weight_before(i) >= target
        while (low < high) {
            const int64_t mid = low + (high - low) / 2;
            if (weight_before(mid) < target) low = mid + 1; else high = mid;
        }
        bounds[t] = low;
    }
    std::vector<int64_t> codes(threads, 0);
    auto run = [&](int64_t t) {
        try {
            codes[t] = work(bounds[t], bounds[t + 1]);
        } catch (const std::exception&) {
            codes[t] = kNoMemory;
        }
    };
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) {
        try {
            pool.emplace_back(run, t);
        } catch (const std::exception&) {
            run(t);  // no thread to be had: this one does the range
        }
    }
    run(0);
    for (auto& thread : pool) thread.join();
    for (const int64_t code : codes)
        if (code < 0) return code;
    return 0;
}

}  // namespace tcsparse::cpu
