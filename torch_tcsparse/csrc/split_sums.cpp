#include "split_sums.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>

namespace tcsparse_binding {

tcsparse::SplitSums SplitBuffers::pointers() const {
    if (!sums.defined()) return {nullptr, nullptr};
    return {sums.data_ptr<float>(), arrivals.data_ptr<int32_t>()};
}

SplitBuffers split_buffers(const at::Device& device, int64_t num_split_rows, int64_t n) {
    if (num_split_rows == 0 || n == 0) return {};
    const int64_t sums = num_split_rows * n, arrivals = num_split_rows * tcsparse::csr_rows_max_tiles(n);
    const auto options = at::TensorOptions().device(device);
    const auto zeroed = [&](int64_t floats, int64_t counts) {
        return SplitBuffers{at::zeros({floats}, options.dtype(at::kFloat)), at::zeros({counts}, options.dtype(at::kInt))};
    };
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
    if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None ||
        stream != c10::cuda::getDefaultCUDAStream(device.index()))
        return zeroed(sums, arrivals);
    static std::mutex mutex;
    // Never destroyed: freeing device memory while the process exits can outlive the CUDA context.
    static auto* kept = new std::map<int, SplitBuffers>();
    const std::lock_guard<std::mutex> lock(mutex);
    SplitBuffers& buffers = (*kept)[device.index()];
    if (!buffers.sums.defined() || buffers.sums.numel() < sums || buffers.arrivals.numel() < arrivals) {
        const int64_t had_sums = buffers.sums.defined() ? buffers.sums.numel() : 0;
        const int64_t had_arrivals = buffers.arrivals.defined() ? buffers.arrivals.numel() : 0;
        buffers = zeroed(std::max(sums, had_sums), std::max(arrivals, had_arrivals));
    }
    return buffers;
}

}  // namespace tcsparse_binding
