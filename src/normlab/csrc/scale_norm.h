// The scale_norm family's schemas and typed C++ API, in one file: `define` declares the ops
// (called from extension.cpp's one registration block), each typed function calls its op through
// a cached dispatcher handle, and the fast eager entry (autograd/scale_norm.cpp) is declared for
// extension.cpp's binding. Kernels: cpu/scale_norm.cpp (CPU), meta/scale_norm.cpp (Meta),
// autograd/scale_norm.cpp (Autograd).
//
// RmsNorm2d / SimpleNorm2d: over the channels of an (N, C, H, W) x at every position,
// y = x / sqrt(s + eps) * weight, s the mean square (rms) or the unbiased variance (simple).
// x (N, C, H, W); weight (C,). The output is in x's memory format (channels_last for a
// channels-last x, else contiguous), x's dtype; rstd and mean (N, H * W) and dw (C,) in the
// accumulation dtype (float64 for float64, else float32); mean (simple only, else empty) is the
// mean of x - x[:, 0] at each position: shifted by the first channel, as the kernels centre.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "args.h"

namespace normlab::scale_norm {

inline void define(torch::Library& m) {
  // RmsNorm2d's (simple=False) or SimpleNorm2d's output, with rstd and (simple) the mean per position
  m.def("scale_norm2d_fwd(Tensor x, Tensor? weight, bool simple, float eps) -> (Tensor y, Tensor rstd, Tensor mean)");
  // their gradients (dx, dw); each empty unless asked for
  m.def("scale_norm2d_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor rstd, Tensor mean, bool simple, bool need_dx, "
        "bool need_dw) -> (Tensor dx, Tensor dw)");
}

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

using at::Tensor;

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> scale_norm2d_fwd(const Tensor& x,
                                                                                  const OptTensor& weight, bool simple,
                                                                                  double eps) {
  static const auto op = op_handle<decltype(scale_norm2d_fwd)>("normlab::scale_norm2d_fwd");
  return op.call(x, weight, simple, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor> scale_norm2d_bwd(const Tensor& dy, const Tensor& x,
                                                                          const OptTensor& weight, const Tensor& rstd,
                                                                          const Tensor& mean, bool simple, bool need_dx,
                                                                          bool need_dw) {
  static const auto op = op_handle<decltype(scale_norm2d_bwd)>("normlab::scale_norm2d_bwd");
  return op.call(dy, x, weight, rstd, mean, simple, need_dx, need_dw);
}

// ---- the eager entry (normlab._C) ----

// normlab.functional.rms_norm2d (simple false) / simple_norm2d (simple true) for arguments their
// checks accept without a word (a strided 4-D CPU tensor of a served dtype; weight None or of
// shape (C,), in x's dtype or float32 beside half precision; eps a float >= 0): y, recorded by
// autograd when it needs to. Anything else: None, and Python runs its checks and its path.
std::optional<at::Tensor> scale_norm2d_fast(const at::Tensor& x, const OptTensor& weight, double eps, bool simple);

}  // namespace normlab::scale_norm
