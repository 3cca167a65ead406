// The ME-TCF SpMM and SDDMM kernels for __nv_bfloat16 X and Y (one file per type, so they build in parallel).
#include "metcf_spmm.cuh"
#include "sddmm.cuh"

namespace tcsparse {

template cudaError_t metcf_spmm_base<__nv_bfloat16>(const MetcfArrays&, const float*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, Precision,
                                          cudaStream_t);
template cudaError_t metcf_spmm_balanced<__nv_bfloat16>(const MetcfArrays&, const float*, const __nv_bfloat16*, __nv_bfloat16*, int64_t, Precision,
                                              float*, float*, cudaStream_t);
template cudaError_t metcf_spmm_launch_shape<__nv_bfloat16>(int, int64_t, int64_t, bool, Precision, int*, int64_t*);
template cudaError_t metcf_sddmm<__nv_bfloat16>(const MetcfArrays&, const __nv_bfloat16*, const __nv_bfloat16*, float*, int64_t, cudaStream_t);

}  // namespace tcsparse
