// The ME-TCF SpMM and SDDMM kernels for float X and Y (one file per type, so they build in parallel).
#include "metcf_spmm.cuh"
#include "sddmm.cuh"

TCSPARSE_INSTANTIATE_METCF_KERNELS(float)
