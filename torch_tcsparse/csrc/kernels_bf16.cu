// The ME-TCF SpMM and SDDMM kernels for __nv_bfloat16 X and Y (one file per type, so they build in parallel).
#include "metcf_spmm.cuh"
#include "sddmm.cuh"

TCSPARSE_INSTANTIATE_METCF_KERNELS(__nv_bfloat16)
