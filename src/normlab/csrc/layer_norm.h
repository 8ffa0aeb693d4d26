// The layer_norm family's fast entry points for Python: declared here, defined with the family's
// autograd kernels (csrc/autograd/layer_norm.cpp), bound by bind_layer_norm. Included only by
// extension.cpp, the one translation unit that sees pybind11.
#pragma once

#include <torch/extension.h>

namespace normlab {

inline void bind_layer_norm(pybind11::module_& m) {
  (void)m;  // m.def("name", &function, "what it computes"); one line per entry point
}

}  // namespace normlab
