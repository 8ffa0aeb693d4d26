// The layer_norm family's schemas and typed C++ API, in one file: `define` declares the ops
// (called from extension.cpp's one registration block), each typed function calls its op through
// a cached dispatcher handle, and the fast eager entries (autograd/layer_norm.cpp) are declared
// for extension.cpp's bindings. Kernels: cpu/layer_norm.cpp (CPU), meta/layer_norm.cpp (Meta),
// autograd/layer_norm.cpp (Autograd).
//
// LayerNorm and RMSNorm over trailing dims (rows), their fused residual adds, and LayerNorm2d.
// Rows: x is normalised over its trailing `normalized_shape` dims, as rows of n_cols values; the
// statistics are (n_rows,) in the accumulation dtype (float32, float64 for float64). A weight
// or bias holds n_cols values, or G * n_cols (torch.func.vmap over stacked weights: G grouped
// weights, row i taking weight row i / (n_rows / G)); its gradient has its shape.
//
// LayerNorm2d: over the channel dim 1 of an (N, C, *) tensor at every pixel
// (docs/derivations/layer_norm.md), for both memory layouts (contiguous planes and channels_last
// rows, whose path is the row kernel: layer_norm2d_layout.h); statistics (N * prod(spatial),)
// per pixel.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "args.h"

namespace normlab::layer_norm {

inline void define(torch::Library& m) {
  // forward with statistics (differentiable: the Autograd kernel saves them for the backward)
  m.def("layer_norm_fwd(Tensor x, Tensor? weight, Tensor? bias, int[] normalized_shape, float eps)"
        " -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def("rms_norm_fwd(Tensor x, Tensor? weight, int[] normalized_shape, float offset, bool cast_x_hat,"
        " float eps) -> (Tensor y, Tensor rstd)");
  m.def("add_layer_norm_fwd(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, int[] normalized_shape,"
        " float eps) -> (Tensor y, Tensor h, Tensor mean, Tensor rstd)");
  m.def("add_rms_norm_fwd(Tensor x, Tensor residual, Tensor? weight, int[] normalized_shape, float offset,"
        " bool cast_x_hat, float eps) -> (Tensor y, Tensor h, Tensor rstd)");
  // backward: dx (plus dh), dw in the weight's dtype (the accumulation dtype without a weight)
  // and db in db_dtype (the bias' dtype; None: the accumulation dtype); (0,) unless need_wb /
  // need_dw
  m.def("layer_norm_bwd(Tensor dy, Tensor? dh, Tensor x, Tensor? weight, Tensor mean, Tensor rstd,"
        " int[] normalized_shape, bool need_wb, ScalarType? db_dtype=None) -> (Tensor dx, Tensor dw, Tensor db)");
  m.def("rms_norm_bwd(Tensor dy, Tensor? dh, Tensor x, Tensor? weight, Tensor rstd, int[] normalized_shape,"
        " float offset, bool cast_x_hat, bool need_dw) -> (Tensor dx, Tensor dw)");
  // inference: the output alone (h undefined without a residual), no statistics allocated;
  // not differentiable (the fast eager entry calls it when autograd records nothing)
  m.def("row_norm_infer(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, int[] normalized_shape,"
        " bool center, float offset, bool cast_x_hat, float eps) -> (Tensor y, Tensor h)");
  // LayerNorm2d: y (differentiable; without autograd its CPU kernel computes no statistics),
  // (y, mean, rstd), and (dx, dw, db): dx in x's layout, dw and db (C,) in the accumulation
  // dtype, (0,) unless need_wb
  m.def("layer_norm2d(Tensor x, Tensor? weight, Tensor? bias, float eps) -> Tensor y");
  m.def("layer_norm2d_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor y, Tensor mean, Tensor rstd)");
  m.def("layer_norm2d_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool need_wb)"
        " -> (Tensor dx, Tensor dw, Tensor db)");
}

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

using at::Tensor;

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(
    const Tensor& x, const OptTensor& weight, const OptTensor& bias, at::IntArrayRef normalized_shape, double eps) {
  static const auto op = op_handle<decltype(layer_norm_fwd)>("normlab::layer_norm_fwd");
  return op.call(x, weight, bias, normalized_shape, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x, const OptTensor& weight,
                                                                      at::IntArrayRef normalized_shape, double offset,
                                                                      bool cast_x_hat, double eps) {
  static const auto op = op_handle<decltype(rms_norm_fwd)>("normlab::rms_norm_fwd");
  return op.call(x, weight, normalized_shape, offset, cast_x_hat, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_fwd(
    const Tensor& x, const Tensor& residual, const OptTensor& weight, const OptTensor& bias,
    at::IntArrayRef normalized_shape, double eps) {
  static const auto op = op_handle<decltype(add_layer_norm_fwd)>("normlab::add_layer_norm_fwd");
  return op.call(x, residual, weight, bias, normalized_shape, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd(
    const Tensor& x, const Tensor& residual, const OptTensor& weight, at::IntArrayRef normalized_shape, double offset,
    bool cast_x_hat, double eps) {
  static const auto op = op_handle<decltype(add_rms_norm_fwd)>("normlab::add_rms_norm_fwd");
  return op.call(x, residual, weight, normalized_shape, offset, cast_x_hat, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd(
    const Tensor& dy, const OptTensor& dh, const Tensor& x, const OptTensor& weight, const Tensor& mean,
    const Tensor& rstd, at::IntArrayRef normalized_shape, bool need_wb, std::optional<at::ScalarType> db_dtype) {
  static const auto op = op_handle<decltype(layer_norm_bwd)>("normlab::layer_norm_bwd");
  return op.call(dy, dh, x, weight, mean, rstd, normalized_shape, need_wb, db_dtype);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& dy, const OptTensor& dh,
                                                                      const Tensor& x, const OptTensor& weight,
                                                                      const Tensor& rstd,
                                                                      at::IntArrayRef normalized_shape, double offset,
                                                                      bool cast_x_hat, bool need_dw) {
  static const auto op = op_handle<decltype(rms_norm_bwd)>("normlab::rms_norm_bwd");
  return op.call(dy, dh, x, weight, rstd, normalized_shape, offset, cast_x_hat, need_dw);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor> row_norm_infer(const Tensor& x, const OptTensor& residual,
                                                                        const OptTensor& weight, const OptTensor& bias,
                                                                        at::IntArrayRef normalized_shape, bool center,
                                                                        double offset, bool cast_x_hat, double eps) {
  static const auto op = op_handle<decltype(row_norm_infer)>("normlab::row_norm_infer");
  return op.call(x, residual, weight, bias, normalized_shape, center, offset, cast_x_hat, eps);
}

[[gnu::always_inline]] inline Tensor layer_norm2d(const Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                                  double eps) {
  static const auto op = op_handle<decltype(layer_norm2d)>("normlab::layer_norm2d");
  return op.call(x, weight, bias, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> layer_norm2d_fwd(const Tensor& x,
                                                                                  const OptTensor& weight,
                                                                                  const OptTensor& bias, double eps) {
  static const auto op = op_handle<decltype(layer_norm2d_fwd)>("normlab::layer_norm2d_fwd");
  return op.call(x, weight, bias, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> layer_norm2d_bwd(const Tensor& dy, const Tensor& x,
                                                                                  const OptTensor& weight,
                                                                                  const Tensor& mean,
                                                                                  const Tensor& rstd, bool need_wb) {
  static const auto op = op_handle<decltype(layer_norm2d_bwd)>("normlab::layer_norm2d_bwd");
  return op.call(dy, x, weight, mean, rstd, need_wb);
}

// ---- the eager entries (normlab._C) ----

// LayerNorm (center) / RMSNorm of x over its trailing normalized_shape dims, of h = x + residual
// first when a residual is given: (y, h, mean, rstd), through the registered ops. Autograd
// records it when grad mode is on and an input requires grad; otherwise only y (and h) are
// allocated, unless `stats` asks for the (n_rows,) statistics too (undefined -> None otherwise;
// mean also for RMSNorm). eps None: the machine epsilon of the accumulation dtype.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> row_norm(
    const at::Tensor& x, at::IntArrayRef normalized_shape, const OptTensor& residual, const OptTensor& weight,
    const OptTensor& bias, std::optional<double> eps, bool center, double offset, bool cast_x_hat, bool stats);

// normlab.functional.layer_norm / rms_norm (torch's defaults: casting "torch", offset 0) for
// arguments that its checks accept without a word (a CPU tensor of a served dtype, its trailing
// dims normalized_shape, parameters of exactly that shape, eps a float >= 0): y. Anything else:
// None, and Python runs its checks (which raise with the message) and its backend choice.
std::optional<at::Tensor> layer_norm_fast(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                          const OptTensor& weight, const OptTensor& bias, double eps);
std::optional<at::Tensor> rms_norm_fast(const at::Tensor& x, at::IntArrayRef normalized_shape,
                                        const OptTensor& weight, std::optional<double> eps);

// add_layer_norm (center) / add_rms_norm (torch's casting) for arguments the checks accept without
// a word, the residual of x's shape, dtype and device: (y, h = x + residual). Else None.
std::optional<std::tuple<at::Tensor, at::Tensor>> add_norm_fast(const at::Tensor& x, const at::Tensor& residual,
                                                                at::IntArrayRef normalized_shape,
                                                                const OptTensor& weight, const OptTensor& bias,
                                                                std::optional<double> eps, bool center);

// normlab.functional.layer_norm2d for arguments its checks accept without a word (a strided CPU
// tensor of a served dtype with a channel dim, parameters None or of shape (C,) in x's dtype or
// float32 beside half precision, eps a float >= 0): y, recorded by autograd when it needs to.
// Anything else: None, and Python runs its checks and its backend choice.
std::optional<at::Tensor> layer_norm2d_fast(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                            double eps);

}  // namespace normlab::layer_norm
