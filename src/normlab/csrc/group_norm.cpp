// The group_norm family's ops (GroupNorm, InstanceNorm): schemas. Kernels: cpu/group_norm.cpp,
// meta/group_norm.cpp; autograd: autograd/group_norm.cpp.
//
// Tensors are the inputs as the user gives them, (N, C, *); statistics (N, G) or, for InstanceNorm
// with running statistics, (C,), in the accumulation dtype (float64 for float64, else float32);
// dw/db (C,) in the accumulation dtype.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  // GroupNorm's output alone (inference: no statistics allocated; with autograd: group_norm_fwd).
  m.def("group_norm(Tensor input, int num_groups, Tensor? weight, Tensor? bias, float eps) -> Tensor");
  // GroupNorm with its statistics: (y, mean, var, rstd); var is biased.
  m.def("group_norm_fwd(Tensor input, Tensor? weight, Tensor? bias, int num_groups, float eps) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  // GroupNorm's gradients (dx, dw, db); dx empty unless need_dx.
  m.def("group_norm_bwd(Tensor grad_out, Tensor input, Tensor? weight, Tensor mean, Tensor rstd, "
        "int num_groups, bool need_dx) -> (Tensor, Tensor, Tensor)");
  // InstanceNorm with fixed per-channel statistics mean, rstd (C,): a per-channel linear map.
  m.def("instance_norm_eval_fwd(Tensor input, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd) -> Tensor");
  m.def("instance_norm_eval_bwd(Tensor grad_out, Tensor input, Tensor? weight, Tensor mean, Tensor rstd, "
        "bool need_dx) -> (Tensor, Tensor, Tensor)");
  // InstanceNorm's running statistics, in place, from the per-instance mean and biased var (N, C).
  m.def("instance_norm_update_stats(Tensor(a!) running_mean, Tensor(b!) running_var, Tensor mean, "
        "Tensor var, float momentum, int n_spatial) -> ()");
}
