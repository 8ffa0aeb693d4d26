// The group_norm family's op schemas (GroupNorm, InstanceNorm) and its typed C++ API
// (group_norm.h). Kernels: cpu/group_norm.cpp (CPU), meta/group_norm.cpp (Meta),
// autograd/group_norm.cpp (Autograd, ADInplaceOrView).
//
// Tensors are the inputs as the user gives them, (N, C, *); statistics (N, G) or, for InstanceNorm
// with running statistics, (C,), in the accumulation dtype (float64 for float64, else float32);
// dw/db (C,) in the accumulation dtype.
#include <torch/library.h>

#include "args.h"
#include "group_norm.h"

TORCH_LIBRARY_FRAGMENT(normlab, m) {
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

namespace normlab::group_norm {

using at::Tensor;

Tensor group_norm(const Tensor& x, const OptTensor& weight, const OptTensor& bias, int64_t num_groups, double eps) {
  static const auto op = op_handle<decltype(group_norm)>("normlab::group_norm");
  return op.call(x, weight, bias, num_groups, eps);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_fwd(const Tensor& x, const OptTensor& weight,
                                                          const OptTensor& bias, int64_t num_groups, double eps) {
  static const auto op = op_handle<decltype(group_norm_fwd)>("normlab::group_norm_fwd");
  return op.call(x, weight, bias, num_groups, eps);
}

std::tuple<Tensor, Tensor, Tensor> group_norm_bwd(const Tensor& dy, const Tensor& x, const OptTensor& weight,
                                                  const Tensor& mean, const Tensor& rstd, int64_t num_groups,
                                                  bool need_dx) {
  static const auto op = op_handle<decltype(group_norm_bwd)>("normlab::group_norm_bwd");
  return op.call(dy, x, weight, mean, rstd, num_groups, need_dx);
}

Tensor instance_norm_eval_fwd(const Tensor& x, const OptTensor& weight, const OptTensor& bias, const Tensor& mean,
                              const Tensor& rstd) {
  static const auto op = op_handle<decltype(instance_norm_eval_fwd)>("normlab::instance_norm_eval_fwd");
  return op.call(x, weight, bias, mean, rstd);
}

std::tuple<Tensor, Tensor, Tensor> instance_norm_eval_bwd(const Tensor& dy, const Tensor& x, const OptTensor& weight,
                                                          const Tensor& mean, const Tensor& rstd, bool need_dx) {
  static const auto op = op_handle<decltype(instance_norm_eval_bwd)>("normlab::instance_norm_eval_bwd");
  return op.call(dy, x, weight, mean, rstd, need_dx);
}

void instance_norm_update_stats(const Tensor& running_mean, const Tensor& running_var, const Tensor& mean,
                                const Tensor& var, double momentum, int64_t n_spatial) {
  static const auto op = op_handle<decltype(instance_norm_update_stats)>("normlab::instance_norm_update_stats");
  op.call(running_mean, running_var, mean, var, momentum, n_spatial);
}

}  // namespace normlab::group_norm
