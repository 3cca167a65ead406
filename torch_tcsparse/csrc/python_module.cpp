// The extension's Python module: the per-call bindings (eager_calls.h) as plain functions, and the
// selector's first choice (selector_binding.h). Errors raised by TCS_CHECK reach Python as
// RuntimeError, as through the dispatcher.
#include <torch/extension.h>

#include "eager_calls.h"
#include "selector_binding.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("spmm", &tcsparse_binding::spmm);
    m.def("csr_rows_spmm", &tcsparse_binding::csr_rows_spmm);
    m.def("grouped_spmm", &tcsparse_binding::grouped_spmm);
    tcsparse_binding::add_selector(m);
}
