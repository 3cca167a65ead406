// What the ME-TCF kernels do differently per element type of X and Y: fp32 (TF32 Tensor Cores,
// optionally the 3xTF32 split) or a 16-bit type (fp16, bf16 Tensor Cores), always with fp32
// accumulation. Everything moves in 16-byte copies, so a copy holds 4 or 8 elements of a row of X,
// and the lane layout of the mma decides which block columns a lane gathers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma.cuh"

namespace tcsparse {

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <typename T>
struct Element;

// TF32: lane (g, t) holds B rows k = t and t + 4 (mma.m16n8k8.tf32).
template <>
struct Element<float> {
    static constexpr int kPerCopy = 4;
    __device__ static int block_col(int t, int h) { return t + 4 * h; }
    __device__ static float from_float(float v) { return v; }
    __device__ static float to_float(float v) { return v; }
    __device__ static uint4 pack(const float* v) {
        return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    }
    __device__ static float dot(const uint4& u, const uint4& v) {
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) sum += __uint_as_float(word(u, i)) * __uint_as_float(word(v, i));
        return sum;
    }
};

// 16-bit types: lane (g, t) holds B rows k = 2t and 2t + 1, packed into one register.
template <typename T, typename T2>
struct Element16 {
    static constexpr int kPerCopy = 8;
    __device__ static int block_col(int t, int h) { return 2 * t + h; }
    __device__ static uint32_t pack2(float lo, float hi) {
        const T2 p = Element<T>::from_float2(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&p);
    }
    __device__ static float2 unpack2(uint32_t w) { return Element<T>::to_float2(*reinterpret_cast<const T2*>(&w)); }
    __device__ static uint4 pack(const float* v) {
        return make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
    }
    __device__ static float dot(const uint4& u, const uint4& v) {
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 a = unpack2(word(u, i)), b = unpack2(word(v, i));
            sum += a.x * b.x + a.y * b.y;
        }
        return sum;
    }
};

template <>
struct Element<__half> : Element16<__half, __half2> {
    __device__ static __half from_float(float v) { return __float2half_rn(v); }
    __device__ static float to_float(__half v) { return __half2float(v); }
    __device__ static __half2 from_float2(float lo, float hi) { return __floats2half2_rn(lo, hi); }
    __device__ static float2 to_float2(__half2 v) { return __half22float2(v); }
    __device__ static void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) { ptx::mma_m16n8k8_f16(d, a0, a1, b); }
    __device__ static void mma16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        ptx::mma_m16n8k16_f16(d, a, b0, b1);
    }
};

template <>
struct Element<__nv_bfloat16> : Element16<__nv_bfloat16, __nv_bfloat162> {
    __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
    __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ static __nv_bfloat162 from_float2(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
    __device__ static float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
    __device__ static void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) { ptx::mma_m16n8k8_bf16(d, a0, a1, b); }
    __device__ static void mma16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        ptx::mma_m16n8k16_bf16(d, a, b0, b1);
    }
};

// One TC block as lane (g, t) feeds it to the mma, built from the lane's four A entries
// e[k] = (row g + 8 * (k & 1), block column block_col(t, k >> 1)), and its products with one
// 16-byte copy of X from each of the lane's two block columns: product m (m < kPerCopy) takes
// element m of both copies as its B operand and accumulates into acc[m].
template <typename T, bool kSplit>
struct Tile;

// TF32, and for the 3xTF32 split (a = hi + lo) also the remainder of each entry.
template <bool kSplit>
struct Tile<float, kSplit> {
    uint32_t hi[4];
    uint32_t lo[kSplit ? 4 : 1];

    __device__ explicit Tile(const float (&e)[4]) { init(e); }

    // From a lane's fragment as the grouped layout stores it: e[0..3] in one 16-byte word.
    __device__ explicit Tile(const uint4& w) {
        const float e[4] = {__uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z), __uint_as_float(w.w)};
        init(e);
    }

    __device__ void init(const float (&e)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            hi[i] = ptx::to_tf32(e[i]);
            if constexpr (kSplit) lo[i] = ptx::to_tf32(e[i] - __uint_as_float(hi[i]));
        }
    }

    __device__ void multiply(float (&acc)[4][4], const uint4& x0, const uint4& x1) const {
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const float b0 = __uint_as_float(word(x0, m)), b1 = __uint_as_float(word(x1, m));
            const uint32_t b0h = ptx::to_tf32(b0), b1h = ptx::to_tf32(b1);
            if constexpr (kSplit) {
                const uint32_t b0l = ptx::to_tf32(b0 - __uint_as_float(b0h));
                const uint32_t b1l = ptx::to_tf32(b1 - __uint_as_float(b1h));
                // Small terms first, so they are not lost against the large partial sum.
                ptx::mma_m16n8k8_tf32(acc[m], lo, b0h, b1h);
                ptx::mma_m16n8k8_tf32(acc[m], hi, b0l, b1l);
            }
            ptx::mma_m16n8k8_tf32(acc[m], hi, b0h, b1h);
        }
    }
};

// fp16/bf16: the A values arrive as fp32 and are exact in T (they were T to begin with).
template <typename T, bool kSplit>
struct Tile {
    static_assert(!kSplit, "the 3xTF32 split applies to fp32 only");
    uint32_t a0, a1;

    __device__ explicit Tile(const float (&e)[4])
        : a0(Element<T>::pack2(e[0], e[2])), a1(Element<T>::pack2(e[1], e[3])) {}

    __device__ void multiply(float (&acc)[8][4], const uint4& x0, const uint4& x1) const {
#pragma unroll
        for (int m = 0; m < 8; ++m) {
            // Element m of each copy (low or high half of word m / 2), x0's in the low half.
            const uint32_t b = __byte_perm(word(x0, m >> 1), word(x1, m >> 1), (m & 1) ? 0x7632 : 0x5410);
            Element<T>::mma(acc[m], a0, a1, b);
        }
    }
};

}  // namespace tcsparse
