// The frn family's schemas and typed C++ API, in one file: `define` declares the ops (called from
// extension.cpp's one registration block), each typed function calls its op through a cached
// dispatcher handle, and the fast eager entry (autograd/frn.cpp) is declared for extension.cpp's
// binding. Kernels: cpu/frn.cpp (CPU), meta/frn.cpp (Meta), autograd/frn.cpp (Autograd).
//
// Filter Response Normalization: per (sample, channel) of an (N, C, H, W) x,
// y = max(x / sqrt(mean_HW(x^2) + eps) * weight + bias, tau) (tau optional: no TLU).
// x (N, C, H, W); weight, bias, tau (C,). The output is in x's memory format (channels_last for
// a channels-last x, else contiguous), x's dtype; rstd (N, C) and dw, db, dtau (C,) in the
// accumulation dtype (float64 for float64, else float32).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "args.h"

namespace normlab::frn {

inline void define(torch::Library& m) {
  // FRN's output (and the TLU's with tau) and rstd = 1 / sqrt(mean_HW(x^2) + eps), (N, C)
  m.def("frn_fwd(Tensor x, Tensor? weight, Tensor? bias, Tensor? tau, float eps) -> (Tensor y, Tensor rstd)");
  // FRN's gradients (dx, dw, db, dtau); each empty unless asked for
  m.def("frn_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor? tau, Tensor rstd, bool need_dx, "
        "bool need_dw, bool need_db, bool need_dtau) -> (Tensor dx, Tensor dw, Tensor db, Tensor dtau)");
}

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

using at::Tensor;

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor> frn_fwd(const Tensor& x, const OptTensor& weight,
                                                                 const OptTensor& bias, const OptTensor& tau,
                                                                 double eps) {
  static const auto op = op_handle<decltype(frn_fwd)>("normlab::frn_fwd");
  return op.call(x, weight, bias, tau, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor, Tensor> frn_bwd(
    const Tensor& dy, const Tensor& x, const OptTensor& weight, const OptTensor& bias, const OptTensor& tau,
    const Tensor& rstd, bool need_dx, bool need_dw, bool need_db, bool need_dtau) {
  static const auto op = op_handle<decltype(frn_bwd)>("normlab::frn_bwd");
  return op.call(dy, x, weight, bias, tau, rstd, need_dx, need_dw, need_db, need_dtau);
}

// ---- the eager entry (normlab._C) ----

// normlab.functional.filter_response_norm for arguments its checks accept without a word (a
// strided 4-D CPU tensor of a served dtype; weight, bias, tau None or of shape (C,), each in x's
// dtype or float32 beside half precision; eps a float >= 0): y, recorded by autograd when it
// needs to. Anything else: None, and Python runs its checks and its path.
std::optional<at::Tensor> frn_fast(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                   const OptTensor& tau, double eps);

}  // namespace normlab::frn
