// The group_norm family's schemas and typed C++ API, in one file: `define` declares the ops
// (called from extension.cpp's one registration block), each typed function calls its op through
// a cached dispatcher handle, and the fast eager entries (autograd/group_norm.cpp) are declared
// for extension.cpp's bindings. Kernels: cpu/group_norm.cpp (CPU), meta/group_norm.cpp (Meta),
// autograd/group_norm.cpp (Autograd, ADInplaceOrView).
//
// GroupNorm, and InstanceNorm (GroupNorm with G = C; with running statistics, a per-channel
// linear map). Tensors are the inputs as the user gives them, (N, C, *); statistics (N, G) or,
// for InstanceNorm with running statistics, (C,), in the accumulation dtype (float64 for float64,
// else float32); dw/db (C,) in the accumulation dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "args.h"

namespace normlab::group_norm {

inline void define(torch::Library& m) {
  // GroupNorm's output alone (differentiable; without autograd no statistics are allocated)
  m.def("group_norm(Tensor x, Tensor? weight, Tensor? bias, int num_groups, float eps) -> Tensor y");
  // GroupNorm with its statistics: (y, mean, var, rstd); var is biased
  m.def("group_norm_fwd(Tensor x, Tensor? weight, Tensor? bias, int num_groups, float eps) "
        "-> (Tensor y, Tensor mean, Tensor var, Tensor rstd)");
  // GroupNorm's gradients (dx, dw, db); dx empty unless need_dx
  m.def("group_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, int num_groups, "
        "bool need_dx) -> (Tensor dx, Tensor dw, Tensor db)");
  // InstanceNorm with fixed per-channel statistics mean, rstd (C,): a per-channel linear map
  m.def("instance_norm_eval_fwd(Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd) -> Tensor y");
  m.def("instance_norm_eval_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool need_dx) "
        "-> (Tensor dx, Tensor dw, Tensor db)");
  // InstanceNorm's running statistics, in place, from the per-instance mean and biased var (N, C)
  m.def("instance_norm_update_stats(Tensor(a!) running_mean, Tensor(b!) running_var, Tensor mean, "
        "Tensor var, float momentum, int n_spatial) -> ()");
}

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

using at::Tensor;

[[gnu::always_inline]] inline Tensor group_norm(const Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                                int64_t num_groups, double eps) {
  static const auto op = op_handle<decltype(group_norm)>("normlab::group_norm");
  return op.call(x, weight, bias, num_groups, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_fwd(
    const Tensor& x, const OptTensor& weight, const OptTensor& bias, int64_t num_groups, double eps) {
  static const auto op = op_handle<decltype(group_norm_fwd)>("normlab::group_norm_fwd");
  return op.call(x, weight, bias, num_groups, eps);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> group_norm_bwd(const Tensor& dy, const Tensor& x,
                                                                                const OptTensor& weight,
                                                                                const Tensor& mean, const Tensor& rstd,
                                                                                int64_t num_groups, bool need_dx) {
  static const auto op = op_handle<decltype(group_norm_bwd)>("normlab::group_norm_bwd");
  return op.call(dy, x, weight, mean, rstd, num_groups, need_dx);
}

[[gnu::always_inline]] inline Tensor instance_norm_eval_fwd(const Tensor& x, const OptTensor& weight,
                                                            const OptTensor& bias, const Tensor& mean,
                                                            const Tensor& rstd) {
  static const auto op = op_handle<decltype(instance_norm_eval_fwd)>("normlab::instance_norm_eval_fwd");
  return op.call(x, weight, bias, mean, rstd);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> instance_norm_eval_bwd(
    const Tensor& dy, const Tensor& x, const OptTensor& weight, const Tensor& mean, const Tensor& rstd, bool need_dx) {
  static const auto op = op_handle<decltype(instance_norm_eval_bwd)>("normlab::instance_norm_eval_bwd");
  return op.call(dy, x, weight, mean, rstd, need_dx);
}

[[gnu::always_inline]] inline void instance_norm_update_stats(const Tensor& running_mean, const Tensor& running_var,
                                                              const Tensor& mean, const Tensor& var, double momentum,
                                                              int64_t n_spatial) {
  static const auto op = op_handle<decltype(instance_norm_update_stats)>("normlab::instance_norm_update_stats");
  op.call(running_mean, running_var, mean, var, momentum, n_spatial);
}

// ---- the eager entries (normlab._C) ----

// InstanceNorm: training statistics (and the running-statistics update) or fixed running statistics.
at::Tensor instance_norm_entry(const at::Tensor& x, const OptTensor& running_mean, const OptTensor& running_var,
                               const OptTensor& weight, const OptTensor& bias, bool use_input_stats, double momentum,
                               double eps);

// normlab.functional.group_norm / instance_norm for arguments that its checks accept without a
// word (x a CPU tensor of a served dtype, not empty; parameters and running statistics None or
// (C,) CPU tensors in x's dtype or float32 beside half precision; num_groups dividing C; eps a
// float >= 0; momentum in [0, 1]; more than one value a group): y. Anything else: None, and
// Python runs its checks (which raise with the message) and its backend choice.
std::optional<at::Tensor> group_norm_fast(const at::Tensor& x, int64_t num_groups, const OptTensor& weight,
                                          const OptTensor& bias, double eps);
std::optional<at::Tensor> instance_norm_fast(const at::Tensor& x, const OptTensor& running_mean,
                                             const OptTensor& running_var, const OptTensor& weight,
                                             const OptTensor& bias, bool use_input_stats, double momentum, double eps);

}  // namespace normlab::group_norm
