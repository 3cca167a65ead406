// PTX wrappers used by the SpMM/SDDMM kernels: TF32/FP16/BF16 mma.sync, cp.async, vector atomics.
// Nothing here knows about sparse formats; kernels compose these.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace tcsparse {
namespace ptx {

// Round an fp32 value to TF32 (round to nearest, ties away), kept in a 32-bit register.
// mma.sync ignores the low 13 mantissa bits; rounding first halves the worst-case error.
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// D = A * B + D for one m16n8k8 TF32 tile. Fragment layout (PTX ISA, "mma.m16n8k8 .tf32"),
// with g = lane / 4 and t = lane % 4:
//   a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
//   b0 (k = t, n = g), b1 (k = t + 4, n = g)
//   d0 (g, 2t), d1 (g, 2t + 1), d2 (g + 8, 2t), d3 (g + 8, 2t + 1)
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A * B + D for one m16n8k8 tile of 16-bit operands (fp16 or bf16) with fp32 accumulation.
// Fragment layout (PTX ISA, "mma.m16n8k8" for .f16/.bf16), g = lane / 4, t = lane % 4, the lower
// 16 bits of a register holding the element of smaller column (A) or row (B) index:
//   a0 = (g, 2t | 2t + 1), a1 = (g + 8, 2t | 2t + 1); b = (k = 2t | 2t + 1, n = g)
//   d as for TF32: d0 (g, 2t), d1 (g, 2t + 1), d2 (g + 8, 2t), d3 (g + 8, 2t + 1)
__device__ __forceinline__ void mma_m16n8k8_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
}

__device__ __forceinline__ void mma_m16n8k8_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
}

// D = A * B + D for one m16n8k16 tile of 16-bit operands with fp32 accumulation: two m16n8k8
// tiles side by side along k. a0, a1 as for m16n8k8 over k < 8 and a2, a3 the same over k >= 8;
// b0 (k = 2t | 2t + 1, n = g), b1 (k = 2t + 8 | 2t + 9, n = g); d as for m16n8k8.
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 4-byte asynchronous copy global -> shared; only the first src_bytes (0..4) are read,
// the rest of the destination word is zero-filled.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
                 "r"(src_bytes));
}

// 16-byte asynchronous copy global -> shared through L1 (.ca: the L1 hits on rows of X that
// neighbouring warps gather too save enough L2 bandwidth that .cg, bypassing L1, runs slower);
// src_bytes is 16 or 0 (zero fill, nothing read). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem)), "l"(gmem),
                 "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

// Four 8 x 8 matrices of 16-bit elements from shared memory, transposed: lanes 8i .. 8i + 7 give
// the addresses of the 8 rows (16 bytes each) of matrix i, and lane (g, t) receives in r[i] the
// elements (2t, g) and (2t + 1, g) of matrix i: the B operand of an m16n8k8 mma whose k runs down
// the rows.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(smem))
                 : "memory");
}

// Read-only 16-byte global load (LDG.128 through the non-coherent path); not volatile, so the
// compiler may hoist and batch these gathers.
__device__ __forceinline__ float4 load_global_f4(const float* p) {
    float4 v;
    asm("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

// Vector fp32 atomic add (one instruction on sm_90, four scalar atomics on older GPUs).
__device__ __forceinline__ void atomic_add_f4(float* p, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(p), v);
#else
    atomicAdd(p + 0, v.x);
    atomicAdd(p + 1, v.y);
    atomicAdd(p + 2, v.z);
    atomicAdd(p + 3, v.w);
#endif
}

// Vector fp32 atomic add of two neighbours (one instruction on sm_90, two scalar atomics on older GPUs).
__device__ __forceinline__ void atomic_add_f2(float* p, float2 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2*>(p), v);
#else
    atomicAdd(p + 0, v.x);
    atomicAdd(p + 1, v.y);
#endif
}

}  // namespace ptx
}  // namespace tcsparse
