// The ME-TCF SpMM and SDDMM kernels for float X and Y (one file per type, so they build in parallel).
#include "metcf_spmm.cuh"
#include "sddmm.cuh"

namespace tcsparse {

template cudaError_t metcf_spmm_base<float>(const MetcfArrays&, const float*, const float*, float*, int64_t, Precision,
                                          cudaStream_t);
template cudaError_t metcf_spmm_balanced<float>(const MetcfArrays&, const float*, const float*, float*, int64_t, Precision,
                                              float*, float*, cudaStream_t);
template cudaError_t metcf_spmm_launch_shape<float>(int, int64_t, int64_t, bool, Precision, int*, int64_t*);
template cudaError_t metcf_sddmm<float>(const MetcfArrays&, const float*, const float*, float*, int64_t, cudaStream_t);

}  // namespace tcsparse
