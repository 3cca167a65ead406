// Checks shared by the torch bindings (bindings.cpp, csr_rows_binding.cpp): messages that name
// the problem and the value, raised through TORCH_CHECK; and the dtype dispatch they share.
#pragma once

#include <ATen/ATen.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace tcsparse_binding {

// Error messages are joined as strings and handed to TORCH_CHECK whole, never streamed: with
// torch's wheels (built with gcc-toolset, parts of libstdc++ linked in and exported) and an
// extension built by the system g++, c10::str's `ostringstream << int64_t` in this library
// crashed the process (SIGSEGV) instead of raising. A single std::string argument skips the
// stream (c10::str passes it through).
inline std::string text(const char* s) { return s; }
inline std::string text(const std::string& s) { return s; }
inline std::string text(int64_t v) { return std::to_string(v); }
inline std::string text(at::ScalarType dtype) { return c10::toString(dtype); }
inline std::string text(const at::Device& device) { return device.str(); }
inline std::string text(at::IntArrayRef sizes) {
    std::string out = "[";
    for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
    return out + "]";
}

template <typename... Args>
inline std::string message(const Args&... args) {
    return (text(args) + ...);
}

#define TCS_CHECK(cond, ...) TORCH_CHECK(cond, ::tcsparse_binding::message(__VA_ARGS__))

inline void check_index(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t numel, const at::Device& device) {
    TCS_CHECK(t.device() == device, name, " is on ", t.device(), " but the operands are on ", device);
    TCS_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
    TCS_CHECK(t.dim() == 1 && t.numel() == numel, name, " must be 1-D with ", numel, " entries, got shape ", t.sizes());
    TCS_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// Calls f with a value of the CUDA element type matching `dtype` (float, __half, __nv_bfloat16).
template <typename F>
inline auto with_element_type(at::ScalarType dtype, F&& f) {
    switch (dtype) {
        case at::kFloat:
            return f(float{});
        case at::kHalf:
            return f(__half{});
        case at::kBFloat16:
            return f(__nv_bfloat16{});
        default:
            TCS_CHECK(false, "the kernels take float32, float16 or bfloat16, got ", dtype);
    }
}

inline void check_launch(cudaError_t err, const char* what) {
    TCS_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

}  // namespace tcsparse_binding
