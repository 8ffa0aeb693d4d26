// The dyt family's C++ API: its ops (schemas in dyt.cpp) called through cached dispatcher
// handles, and the fast eager entry (autograd/dyt.cpp) that extension.cpp binds for Python.
// DyT (Dynamic Tanh): y = tanh(alpha * x) * weight + bias, the affine along x's trailing dims.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace normlab::dyt {

using OptTensor = std::optional<at::Tensor>;

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

at::Tensor dyt_fwd(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                   at::IntArrayRef normalized_shape, const at::Tensor& alpha);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dyt_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                                   const OptTensor& weight, const at::Tensor& alpha,
                                                                   at::IntArrayRef normalized_shape, bool need_dx,
                                                                   bool need_dalpha, bool need_wb);

// ---- the eager entry (normlab._C) ----

// normlab.functional.dyt for arguments its checks accept without a word (a strided CPU tensor of a
// served dtype whose trailing dims are normalized_shape; weight, bias None or of exactly that shape
// and alpha of shape (1,), each in x's dtype or float32 beside half precision): y, recorded by
// autograd when it needs to. Anything else: None, and Python runs its checks and its path.
std::optional<at::Tensor> dyt_fast(const at::Tensor& x, at::IntArrayRef normalized_shape, const at::Tensor& alpha,
                                   const OptTensor& weight, const OptTensor& bias);

}  // namespace normlab::dyt
