// The layer_norm2d family's fast entry points for Python: declared here, defined with the family's
// autograd kernels (csrc/autograd/layer_norm2d.cpp), bound by bind_layer_norm2d. Included only by
// extension.cpp, the one translation unit that sees pybind11.
#pragma once

#include <torch/extension.h>

#include <optional>

namespace normlab {

// normlab::layer_norm2d through a cached dispatcher handle (Autograd kernel, then CPU).
at::Tensor layer_norm2d_call(const at::Tensor& x, const std::optional<at::Tensor>& w,
                             const std::optional<at::Tensor>& b, double eps);

// normlab.functional.layer_norm2d for arguments its checks accept without a word (a strided CPU
// tensor of a served dtype with a channel dim, parameters None or of shape (C,) in x's dtype or
// float32 beside half precision, eps finite and >= 0): y, recorded by autograd when it needs to.
// Anything else: None, and Python runs its checks and its backend choice.
std::optional<at::Tensor> layer_norm2d_fast(const at::Tensor& x, const std::optional<at::Tensor>& w,
                                            const std::optional<at::Tensor>& b, double eps);

inline void bind_layer_norm2d(pybind11::module_& m) {
  m.def("layer_norm2d", &layer_norm2d_call,
        "LayerNorm over dim 1 of an (N, C, *) tensor at every pixel: layer_norm2d(x, weight, bias, eps) -> y");
  m.def("layer_norm2d_fast", &layer_norm2d_fast, "LayerNorm2d of arguments the checks accept, else None",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps").noconvert());
}

}  // namespace normlab
