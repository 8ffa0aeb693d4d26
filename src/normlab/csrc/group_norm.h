// The group_norm family's C++ API: its ops (schemas in group_norm.cpp) called through cached
// dispatcher handles, and the fast eager entries (autograd/group_norm.cpp) that extension.cpp
// binds for Python. GroupNorm, and InstanceNorm (GroupNorm with G = C; with running statistics,
// a per-channel linear map).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace normlab::group_norm {

using OptTensor = std::optional<at::Tensor>;

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

at::Tensor group_norm(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias, int64_t num_groups,
                      double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> group_norm_fwd(const at::Tensor& x, const OptTensor& weight,
                                                                          const OptTensor& bias, int64_t num_groups,
                                                                          double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                              const OptTensor& weight, const at::Tensor& mean,
                                                              const at::Tensor& rstd, int64_t num_groups,
                                                              bool need_dx);
at::Tensor instance_norm_eval_fwd(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                  const at::Tensor& mean, const at::Tensor& rstd);
std::tuple<at::Tensor, at::Tensor, at::Tensor> instance_norm_eval_bwd(const at::Tensor& dy, const at::Tensor& x,
                                                                      const OptTensor& weight, const at::Tensor& mean,
                                                                      const at::Tensor& rstd, bool need_dx);
void instance_norm_update_stats(const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& mean,
                                const at::Tensor& var, double momentum, int64_t n_spatial);

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
