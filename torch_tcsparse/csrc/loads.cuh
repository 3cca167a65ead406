// Loads of elements from memory a kernel only reads, as fp32 (the kernels' accumulation type).
#pragma once

#include <type_traits>

#include "elements.cuh"

namespace tcsparse {

// Raw words for the loads: __ldg has no overloads for halves, bfloat16s or their packs.
template <int Bytes>
struct Raw;
template <>
struct Raw<16> {
    using type = uint4;
};
template <>
struct Raw<8> {
    using type = uint2;
};
template <>
struct Raw<4> {
    using type = unsigned int;
};
template <>
struct Raw<2> {
    using type = unsigned short;
};

// One element as a float.
template <typename T>
__device__ __forceinline__ float load_float(const T* p) {
    using R = typename Raw<sizeof(T)>::type;
    const R r = __ldg(reinterpret_cast<const R*>(p));
    return Element<T>::to_float(*reinterpret_cast<const T*>(&r));
}

// V = 1, 2 or 4 consecutive elements from p (aligned to V elements) as floats: one load.
template <typename T, int V>
__device__ __forceinline__ void load_row(const T* p, float (&out)[V]) {
    static_assert(V == 1 || V == 2 || V == 4, "load_row takes 1, 2 or 4 elements");
    if constexpr (V == 1) {
        out[0] = load_float(p);
    } else if constexpr (std::is_same_v<T, float> && V == 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(p));
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    } else if constexpr (std::is_same_v<T, float>) {
        const float2 v = __ldg(reinterpret_cast<const float2*>(p));
        out[0] = v.x, out[1] = v.y;
    } else if constexpr (V == 4) {
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(p));
        const float2 lo = Element<T>::unpack2(w.x), hi = Element<T>::unpack2(w.y);
        out[0] = lo.x, out[1] = lo.y, out[2] = hi.x, out[3] = hi.y;
    } else {
        const float2 v = Element<T>::unpack2(__ldg(reinterpret_cast<const unsigned int*>(p)));
        out[0] = v.x, out[1] = v.y;
    }
}

}  // namespace tcsparse
