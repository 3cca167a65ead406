// The extension's Python module, the one route from Python to the kernels: the bindings of
// kernel_bindings.h as plain functions.
// Errors raised by TCS_CHECK reach Python as RuntimeError.
#include <torch/extension.h>

#include "attention_binding.h"
#include "kernel_bindings.h"
#include "sampled_columns.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("spmm", &tcsparse_binding::spmm);
    m.def("sddmm", &tcsparse_binding::sddmm);
    m.def("launch_shape", &tcsparse_binding::launch_shape);
    m.def("sort_row_sources", &tcsparse_binding::sort_row_sources);
    m.attr("sorted_row_limit") = tcsparse::kSortedRowLimit;
    m.def("row_scale", &tcsparse_binding::row_scale);
    m.def("metcf_row_map", &tcsparse_binding::metcf_row_map);
    m.def("metcf_count", &tcsparse_binding::metcf_count);
    m.def("metcf_fill", &tcsparse_binding::metcf_fill);
    m.def("csr_rows_spmm", &tcsparse_binding::csr_rows_spmm);
    m.def("csr_rows_scatter", &tcsparse_binding::csr_rows_scatter);
    m.def("grouped_spmm", &tcsparse_binding::grouped_spmm);
    m.def("reduce_rows", &tcsparse_binding::reduce_rows);
    m.def("reduce_rows_backward", &tcsparse_binding::reduce_rows_backward);
    m.def("attention_spmm", &tcsparse_binding::attention_spmm);
    m.def("attention_sddmm", &tcsparse_binding::attention_sddmm);
    m.def("attention_row_sums", &tcsparse_binding::attention_row_sums);
    m.def("attention_softmax", &tcsparse_binding::attention_softmax);
    m.def("attention_softmax_backward", &tcsparse_binding::attention_softmax_backward);
}
