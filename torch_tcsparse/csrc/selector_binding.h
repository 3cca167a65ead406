// The selector's first choice in C++ (selector_binding.cpp), added to the extension's Python module.
#pragma once

#include <pybind11/pybind11.h>

namespace tcsparse_binding {

void add_selector(pybind11::module_& m);

}  // namespace tcsparse_binding
