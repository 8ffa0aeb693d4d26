// The scale_norm family's C++ API: its ops (schemas in scale_norm.cpp) called through cached
// dispatcher handles, and the fast eager entry (autograd/scale_norm.cpp) that extension.cpp binds.
// RmsNorm2d / SimpleNorm2d: over the channels of an (N, C, H, W) x at every position,
// y = x / sqrt(s + eps) * weight, s the mean square (rms) or the unbiased variance (simple).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace normlab::scale_norm {

using OptTensor = std::optional<at::Tensor>;

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

std::tuple<at::Tensor, at::Tensor, at::Tensor> scale_norm2d_fwd(const at::Tensor& x, const OptTensor& weight,
                                                                bool simple, double eps);
std::tuple<at::Tensor, at::Tensor> scale_norm2d_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                    const OptTensor& weight, const at::Tensor& rstd,
                                                    const at::Tensor& mean, bool simple, bool need_dx, bool need_dw);

// ---- the eager entry (normlab._C) ----

// normlab.functional.rms_norm2d (simple false) / simple_norm2d (simple true) for arguments their
// checks accept without a word (a strided 4-D CPU tensor of a served dtype; weight None or of
// shape (C,), in x's dtype or float32 beside half precision; eps a float >= 0): y, recorded by
// autograd when it needs to. Anything else: None, and Python runs its checks and its path.
std::optional<at::Tensor> scale_norm2d_fast(const at::Tensor& x, const OptTensor& weight, double eps, bool simple);

}  // namespace normlab::scale_norm
