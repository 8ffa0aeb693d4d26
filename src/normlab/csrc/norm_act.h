// The norm_act family's schemas and typed C++ API, in one file: `define` declares the ops (called
// from extension.cpp's one registration block), each typed function calls its op through a cached
// dispatcher handle, and the fast eager entries (autograd/norm_act.cpp) are declared for
// extension.cpp's bindings. Kernels: cpu/norm_act.cpp (CPU), meta/norm_act.cpp (Meta),
// autograd/norm_act.cpp (Autograd). Math: docs/derivations/norm_act.md.
//
// y = act(norm(x)) for BatchNorm, GroupNorm, LayerNorm over rows and LayerNorm2d over an NCHW x,
// the activation an id of numerics/activation.h (normlab.ops.activation: 0 identity, 1 relu,
// 2 leaky_relu with act_param its slope, 3 silu, 4 gelu, 5 gelu_tanh, 6 hardswish, 7 tanh)
// applied in the norm's output pass; each backward recomputes the pre-activation z from x and
// what the norm saves (plus the bias) and takes dz = dy * act'(z) as the norm's dy.
//
//   batch_norm_act_fwd -> (y, stats): y in x's suggested memory format; stats (3, C) float64
//     mean, var, rstd (the running ones in evaluation); in training the running statistics, when
//     given, are updated in place.
//   batch_norm_act_bwd -> (dx, dw, db): dx in x's suggested memory format, dw / db (C,) in the
//     weight's / bias' dtype (x's without one); each undefined unless asked for.
//   group_norm_act_fwd -> (y, mean, rstd): y in x's suggested memory format; mean, rstd (N, G) in
//     the accumulation dtype (float64 for float64, else float32).
//   group_norm_act_bwd -> (dx, dw, db): dx in x's layout (channels_last where x is and S > 1,
//     else contiguous; empty (0,) unless need_dx), dw, db (C,) in the accumulation dtype.
//   layer_norm_act_fwd -> (y, mean, rstd): LayerNorm over the rows of n_cols values of x's memory
//     (x contiguous, or channels_last with n_cols = C: LayerNormAct2d); y in x's layout; mean,
//     rstd (rows,) in the accumulation dtype.
//   layer_norm_act_bwd -> (dx, dw, db): dx in x's layout; dw, db (n_cols,) in the accumulation
//     dtype ((0,) where there is no weight / bias).
//   layer_norm_act2d_fwd -> (y, mean, rstd): LayerNormAct2d on a contiguous (N, C, *) x; y
//     contiguous; mean, rstd (N * S,) per pixel in the accumulation dtype.
//   layer_norm_act2d_bwd -> (dx, dw, db): dx contiguous; dw, db (C,) in the accumulation dtype,
//     (0,) unless need_dwb.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "args.h"

namespace normlab::norm_act {

inline void define(torch::Library& m) {
  m.def("batch_norm_act_fwd(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool training, float momentum, float eps, int act, float act_param) "
        "-> (Tensor, Tensor)");
  m.def("batch_norm_act_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor stats, bool training, "
        "int act, float act_param, bool need_dx, bool need_dw, bool need_db) -> (Tensor, Tensor, Tensor)");
  m.def("group_norm_act_fwd(Tensor x, Tensor? weight, Tensor? bias, int num_groups, float eps, int act, "
        "float act_param) -> (Tensor, Tensor, Tensor)");
  m.def("group_norm_act_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, "
        "int num_groups, int act, float act_param, bool need_dx) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_act_fwd(Tensor x, int n_cols, Tensor? weight, Tensor? bias, float eps, int act, "
        "float act_param) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_act_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, "
        "int n_cols, int act, float act_param, bool need_dwb) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_act2d_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps, int act, float act_param) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_act2d_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, "
        "int act, float act_param, bool need_dwb) -> (Tensor, Tensor, Tensor)");
}

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

using at::Tensor;

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor> batch_norm_act_fwd(
    const Tensor& x, const OptTensor& weight, const OptTensor& bias, const OptTensor& running_mean,
    const OptTensor& running_var, bool training, double momentum, double eps, int64_t act, double act_param) {
  static const auto op = op_handle<decltype(batch_norm_act_fwd)>("normlab::batch_norm_act_fwd");
  return op.call(x, weight, bias, running_mean, running_var, training, momentum, eps, act, act_param);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> batch_norm_act_bwd(
    const Tensor& dy, const Tensor& x, const OptTensor& weight, const OptTensor& bias, const Tensor& stats,
    bool training, int64_t act, double act_param, bool need_dx, bool need_dw, bool need_db) {
  static const auto op = op_handle<decltype(batch_norm_act_bwd)>("normlab::batch_norm_act_bwd");
  return op.call(dy, x, weight, bias, stats, training, act, act_param, need_dx, need_dw, need_db);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> group_norm_act_fwd(
    const Tensor& x, const OptTensor& weight, const OptTensor& bias, int64_t num_groups, double eps, int64_t act,
    double act_param) {
  static const auto op = op_handle<decltype(group_norm_act_fwd)>("normlab::group_norm_act_fwd");
  return op.call(x, weight, bias, num_groups, eps, act, act_param);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> group_norm_act_bwd(
    const Tensor& dy, const Tensor& x, const OptTensor& weight, const OptTensor& bias, const Tensor& mean,
    const Tensor& rstd, int64_t num_groups, int64_t act, double act_param, bool need_dx) {
  static const auto op = op_handle<decltype(group_norm_act_bwd)>("normlab::group_norm_act_bwd");
  return op.call(dy, x, weight, bias, mean, rstd, num_groups, act, act_param, need_dx);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> layer_norm_act_fwd(
    const Tensor& x, int64_t n_cols, const OptTensor& weight, const OptTensor& bias, double eps, int64_t act,
    double act_param) {
  static const auto op = op_handle<decltype(layer_norm_act_fwd)>("normlab::layer_norm_act_fwd");
  return op.call(x, n_cols, weight, bias, eps, act, act_param);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> layer_norm_act_bwd(
    const Tensor& dy, const Tensor& x, const OptTensor& weight, const OptTensor& bias, const Tensor& mean,
    const Tensor& rstd, int64_t n_cols, int64_t act, double act_param, bool need_dwb) {
  static const auto op = op_handle<decltype(layer_norm_act_bwd)>("normlab::layer_norm_act_bwd");
  return op.call(dy, x, weight, bias, mean, rstd, n_cols, act, act_param, need_dwb);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> layer_norm_act2d_fwd(
    const Tensor& x, const OptTensor& weight, const OptTensor& bias, double eps, int64_t act, double act_param) {
  static const auto op = op_handle<decltype(layer_norm_act2d_fwd)>("normlab::layer_norm_act2d_fwd");
  return op.call(x, weight, bias, eps, act, act_param);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> layer_norm_act2d_bwd(
    const Tensor& dy, const Tensor& x, const OptTensor& weight, const OptTensor& bias, const Tensor& mean,
    const Tensor& rstd, int64_t act, double act_param, bool need_dwb) {
  static const auto op = op_handle<decltype(layer_norm_act2d_bwd)>("normlab::layer_norm_act2d_bwd");
  return op.call(dy, x, weight, bias, mean, rstd, act, act_param, need_dwb);
}

// ---- the eager entries (normlab._C) ----

// normlab.functional's *_act functions on the eager path, for the arguments the fused kernels take
// (what extension.cpp's bindings pass on: tensors of torch's own classes, Python numbers already
// read): y, recorded by autograd when it needs to (one NormActBackward node). Anything else: None,
// and Python runs the unfused composition, whose checks word any error. act, act_param: the
// activation (normlab.ops.activation.act_id's pair).

// batch_norm_act: x a CPU tensor of a served dtype, (N, C, *) with more values than channels;
// each per-channel tensor None or a 1-D CPU tensor of C values of a served dtype; the running
// pair both or neither (both in evaluation), neither requiring grad; momentum in [0, 1], eps > 0.
std::optional<at::Tensor> batch_norm_act_fast(const at::Tensor& x, const OptTensor& running_mean,
                                              const OptTensor& running_var, const OptTensor& weight,
                                              const OptTensor& bias, bool training, double momentum, double eps,
                                              int64_t act, double act_param);

// group_norm_act: x a CPU tensor of a served dtype, (N, C, *), not empty; num_groups > 0 dividing
// C with at least two values a group; weight, bias None or 1-D CPU tensors of C values in x's
// dtype (or float32 beside half precision); eps >= 0.
std::optional<at::Tensor> group_norm_act_fast(const at::Tensor& x, int64_t num_groups, const OptTensor& weight,
                                              const OptTensor& bias, double eps, int64_t act, double act_param);

// layer_norm_act: x a CPU tensor of a served dtype, not empty, whose trailing dims are
// normalized_shape (made contiguous: rows of their product); weight of exactly normalized_shape
// and bias only beside a weight, of one dtype: x's (or float32 beside half precision); eps >= 0.
std::optional<at::Tensor> layer_norm_act_fast(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                              const OptTensor& weight, const OptTensor& bias, double eps, int64_t act,
                                              double act_param);

// layer_norm_act2d: x a 4-D CPU tensor of a served dtype, not empty, channels_last (its memory:
// rows of C values, layer_norm_act_fwd) or contiguous (layer_norm_act2d_fwd); weight and bias as
// layer_norm_act's with normalized_shape (C,); eps >= 0.
std::optional<at::Tensor> layer_norm_act2d_fast(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                                double eps, int64_t act, double act_param);

}  // namespace normlab::norm_act
