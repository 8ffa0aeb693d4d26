// The layer_norm family's fast entry points for Python: declared here, defined with the family's
// autograd kernels (csrc/autograd/layer_norm.cpp), bound by bind_layer_norm. Included only by
// extension.cpp, the one translation unit that sees pybind11.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>

namespace normlab {

// LayerNorm (center) / RMSNorm of x over its trailing normalized_shape dims, of h = x + residual
// first when a residual is given: (y, h, mean, rstd), through the registered ops. Autograd
// records it when grad mode is on and an input requires grad; otherwise only y (and h) are
// allocated, unless `stats` asks for the (n_rows,) statistics too (undefined -> None otherwise;
// mean also for RMSNorm). eps None: the machine epsilon of the accumulation dtype.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> row_norm(
    const at::Tensor& x, at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& residual,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, std::optional<double> eps,
    bool center, double offset, bool cast_x_hat, bool stats);

// normlab.functional.layer_norm / rms_norm (torch's defaults: casting "torch", offset 0) for
// arguments that its checks accept without a word (a CPU tensor of a served dtype, its trailing
// dims normalized_shape, parameters of exactly that shape, eps finite and >= 0): y. Anything
// else: None, and Python runs its checks (which raise with the message) and its backend choice.
std::optional<at::Tensor> layer_norm_fast(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                          const std::optional<at::Tensor>& weight,
                                          const std::optional<at::Tensor>& bias, double eps);
std::optional<at::Tensor> rms_norm_fast(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                        const std::optional<at::Tensor>& weight, std::optional<double> eps);

// add_layer_norm (center) / add_rms_norm (torch's casting) for arguments the checks accept without
// a word, the residual of x's shape, dtype and device: (y, h = x + residual). Else None.
std::optional<std::tuple<at::Tensor, at::Tensor>> add_norm_fast(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, std::optional<double> eps,
    bool center);

inline void bind_layer_norm(pybind11::module_& m) {
  m.def("add_norm_fast", &add_norm_fast, "add_layer_norm / add_rms_norm of arguments the checks accept, else None",
        pybind11::arg("x"), pybind11::arg("residual"), pybind11::arg("normalized_shape"), pybind11::arg("weight"),
        pybind11::arg("bias"), pybind11::arg("eps").noconvert(), pybind11::arg("center"));
  // eps not converted: an int or a bool is declined (TypeError), and Python's checks word it
  m.def("layer_norm_fast", &layer_norm_fast, "LayerNorm of arguments the checks accept, else None",
        pybind11::arg("x"), pybind11::arg("normalized_shape"), pybind11::arg("weight"), pybind11::arg("bias"),
        pybind11::arg("eps").noconvert());
  m.def("rms_norm_fast", &rms_norm_fast, "RMSNorm (torch's casting) of arguments the checks accept, else None",
        pybind11::arg("x"), pybind11::arg("normalized_shape"), pybind11::arg("weight"),
        pybind11::arg("eps").noconvert());
  m.def("row_norm", &row_norm, "LayerNorm / RMSNorm (and the fused residual add) -> (y, h, mean, rstd)",
        pybind11::arg("x"), pybind11::arg("normalized_shape"), pybind11::arg("residual"), pybind11::arg("weight"),
        pybind11::arg("bias"), pybind11::arg("eps"), pybind11::arg("center"), pybind11::arg("offset"),
        pybind11::arg("cast_x_hat"), pybind11::arg("stats"));
}

}  // namespace normlab
