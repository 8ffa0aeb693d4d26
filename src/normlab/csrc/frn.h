// The frn family's C++ API: its ops (schemas in frn.cpp) called through cached dispatcher
// handles, and the fast eager entry (autograd/frn.cpp) that extension.cpp binds for Python.
// Filter Response Normalization: per (sample, channel) of an (N, C, H, W) x,
// y = max(x / sqrt(mean_HW(x^2) + eps) * weight + bias, tau) (tau optional: no TLU).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace normlab::frn {

using OptTensor = std::optional<at::Tensor>;

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

std::tuple<at::Tensor, at::Tensor> frn_fwd(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                           const OptTensor& tau, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> frn_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                                   const OptTensor& weight, const OptTensor& bias,
                                                                   const OptTensor& tau, const at::Tensor& rstd,
                                                                   bool need_dx, bool need_dw, bool need_db,
                                                                   bool need_dtau);

// ---- the eager entry (normlab._C) ----

// normlab.functional.filter_response_norm for arguments its checks accept without a word (a
// strided 4-D CPU tensor of a served dtype; weight, bias, tau None or of shape (C,), each in x's
// dtype or float32 beside half precision; eps a float >= 0): y, recorded by autograd when it
// needs to. Anything else: None, and Python runs its checks and its path.
std::optional<at::Tensor> frn_fast(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                   const OptTensor& tau, double eps);

}  // namespace normlab::frn
