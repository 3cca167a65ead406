// The ME-TCF SpMM and SDDMM kernels for __half X and Y (one file per type, so they build in parallel).
#include "metcf_spmm.cuh"
#include "sddmm.cuh"

namespace tcsparse {

template cudaError_t metcf_spmm_base<__half>(const MetcfArrays&, const float*, const __half*, __half*, int64_t, Precision,
                                          cudaStream_t);
template cudaError_t metcf_spmm_balanced<__half>(const MetcfArrays&, const float*, const __half*, __half*, int64_t, Precision,
                                              float*, float*, cudaStream_t);
template cudaError_t metcf_spmm_launch_shape<__half>(int, int64_t, int64_t, bool, Precision, int*, int64_t*);
template cudaError_t metcf_sddmm<__half>(const MetcfArrays&, const __half*, const __half*, float*, int64_t, cudaStream_t);

}  // namespace tcsparse
