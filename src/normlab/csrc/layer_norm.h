// The layer_norm family's C++ API: its ops (schemas in layer_norm.cpp) called through cached
// dispatcher handles, and the fast eager entries (autograd/layer_norm.cpp) that extension.cpp
// binds for Python. LayerNorm and RMSNorm over trailing dims (rows), their fused residual adds,
// and LayerNorm2d (LayerNorm over the channel dim 1 at every pixel: its channels-last path is
// the row kernel, its Python side ops/layer_norm/op_2d.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace normlab::layer_norm {

using OptTensor = std::optional<at::Tensor>;

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_fwd(const at::Tensor& x, const OptTensor& weight,
                                                              const OptTensor& bias, at::IntArrayRef normalized_shape,
                                                              double eps);
std::tuple<at::Tensor, at::Tensor> rms_norm_fwd(const at::Tensor& x, const OptTensor& weight,
                                                at::IntArrayRef normalized_shape, double offset, bool cast_x_hat,
                                                double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_fwd(
    const at::Tensor& x, const at::Tensor& residual, const OptTensor& weight, const OptTensor& bias,
    at::IntArrayRef normalized_shape, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_fwd(const at::Tensor& x, const at::Tensor& residual,
                                                                const OptTensor& weight,
                                                                at::IntArrayRef normalized_shape, double offset,
                                                                bool cast_x_hat, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd(const at::Tensor& dy, const OptTensor& dh,
                                                              const at::Tensor& x, const OptTensor& weight,
                                                              const at::Tensor& mean, const at::Tensor& rstd,
                                                              at::IntArrayRef normalized_shape, bool need_wb,
                                                              std::optional<at::ScalarType> db_dtype);
std::tuple<at::Tensor, at::Tensor> rms_norm_bwd(const at::Tensor& dy, const OptTensor& dh, const at::Tensor& x,
                                                const OptTensor& weight, const at::Tensor& rstd,
                                                at::IntArrayRef normalized_shape, double offset, bool cast_x_hat,
                                                bool need_dw);
std::tuple<at::Tensor, at::Tensor> row_norm_infer(const at::Tensor& x, const OptTensor& residual,
                                                  const OptTensor& weight, const OptTensor& bias,
                                                  at::IntArrayRef normalized_shape, bool center, double offset,
                                                  bool cast_x_hat, double eps);
at::Tensor layer_norm2d(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm2d_fwd(const at::Tensor& x, const OptTensor& weight,
                                                                const OptTensor& bias, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm2d_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                                const OptTensor& weight, const at::Tensor& mean,
                                                                const at::Tensor& rstd, bool need_wb);

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
