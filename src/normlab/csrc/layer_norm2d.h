// The layer_norm2d family's fast entry points for Python: declared here, defined with the family's
// autograd kernels (csrc/autograd/layer_norm2d.cpp), bound by bind_layer_norm2d. Included only by
// extension.cpp, the one translation unit that sees pybind11.
#pragma once

#include <torch/extension.h>

namespace normlab {

inline void bind_layer_norm2d(pybind11::module_& m) {
  (void)m;  // m.def("name", &function, "what it computes"); one line per entry point
}

}  // namespace normlab
