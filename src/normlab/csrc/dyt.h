// The dyt family's schemas and typed C++ API, in one file: `define` declares the ops (called from
// the one registration block, extension.cpp), each typed function calls its op through a cached
// dispatcher handle, and the fast eager entry (autograd/dyt.cpp) is declared for extension.cpp's
// binding. Kernels: cpu/dyt.cpp (CPU), meta/dyt.cpp (Meta), autograd/dyt.cpp (Autograd).
//
// DyT (Dynamic Tanh): y = tanh(alpha * x) * weight + bias, the affine along x's trailing dims.
// x as the user gives it, (*, *normalized_shape); weight and bias of normalized_shape (the
// columns of x's rows); alpha (1,). The output is contiguous, x's dtype; dalpha (1,), dw, db
// (normalized_shape) in the accumulation dtype (float64 for float64, else float32).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "args.h"

namespace normlab::dyt {

inline void define(torch::Library& m) {
  // DyT's output (differentiable; saves x)
  m.def("dyt_fwd(Tensor x, Tensor? weight, Tensor? bias, int[] normalized_shape, Tensor alpha) -> Tensor y");
  // DyT's gradients (dx, dalpha, dw, db); each empty unless asked for
  m.def("dyt_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor alpha, int[] normalized_shape, bool need_dx, "
        "bool need_dalpha, bool need_wb) -> (Tensor dx, Tensor dalpha, Tensor dw, Tensor db)");
}

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

[[gnu::always_inline]] inline at::Tensor dyt_fwd(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                                 at::IntArrayRef normalized_shape, const at::Tensor& alpha) {
  static const auto op = op_handle<decltype(dyt_fwd)>("normlab::dyt_fwd");
  return op.call(x, weight, bias, normalized_shape, alpha);
}

[[gnu::always_inline]] inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dyt_bwd(
    const at::Tensor& dy, const at::Tensor& x, const OptTensor& weight, const at::Tensor& alpha,
    at::IntArrayRef normalized_shape, bool need_dx, bool need_dalpha, bool need_wb) {
  static const auto op = op_handle<decltype(dyt_bwd)>("normlab::dyt_bwd");
  return op.call(dy, x, weight, alpha, normalized_shape, need_dx, need_dalpha, need_wb);
}

// The CPU kernel of dyt_fwd (cpu/dyt.cpp), for dyt_fast to call where autograd records nothing (the
// dispatcher's round trip was a third of a small call: (1, 768) float32 3.7 us, LayerNorm's 2.8).
at::Tensor dyt_fwd_cpu(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                       at::IntArrayRef normalized_shape, const at::Tensor& alpha);

// ---- the eager entry (normlab._C) ----

// normlab.functional.dyt for arguments its checks accept without a word (a strided CPU tensor of a
// served dtype whose trailing dims are normalized_shape; weight, bias None or of exactly that shape
// and alpha of shape (1,), each in x's dtype or float32 beside half precision): y, recorded by
// autograd when it needs to. Anything else: None, and Python runs its checks and its path.
std::optional<at::Tensor> dyt_fast(const at::Tensor& x, at::IntArrayRef normalized_shape, const at::Tensor& alpha,
                                   const OptTensor& weight, const OptTensor& bias);

}  // namespace normlab::dyt
