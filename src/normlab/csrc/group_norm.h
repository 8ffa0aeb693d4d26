// The group_norm family's fast entry points for Python: declared here, defined with the family's
// autograd kernels (csrc/autograd/group_norm.cpp), bound by bind_group_norm. Included only by
// extension.cpp, the one translation unit that sees pybind11.
#pragma once

#include <torch/extension.h>

namespace normlab {

// normlab::group_norm through a cached dispatcher handle (autograd, then the CPU kernel).
at::Tensor group_norm_entry(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& w,
                            const std::optional<at::Tensor>& b, double eps);
// InstanceNorm: training statistics (and the running-statistics update) or fixed running statistics.
at::Tensor instance_norm_entry(const at::Tensor& x, const std::optional<at::Tensor>& running_mean,
                               const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& w,
                               const std::optional<at::Tensor>& b, bool use_input_stats, double momentum, double eps);

inline void bind_group_norm(pybind11::module_& m) {
  m.def("group_norm", &group_norm_entry, "GroupNorm of (N, C, *) x: group_norm(x, num_groups, w, b, eps) -> y");
  m.def("instance_norm", &instance_norm_entry,
        "InstanceNorm of (N, C, *) x: instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, "
        "eps) -> y (contiguous); running statistics updated in place when given and use_input_stats");
}

}  // namespace normlab
