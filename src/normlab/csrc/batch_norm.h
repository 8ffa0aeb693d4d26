// The batch_norm family's fast entry points for Python: declared here, defined with the family's
// autograd kernels (csrc/autograd/batch_norm.cpp), bound by bind_batch_norm. Included only by
// extension.cpp, the one translation unit that sees pybind11.
#pragma once

#include <torch/extension.h>

#include <optional>

namespace normlab::bn {

// BatchNorm of an (N, C, *) x through the registered ops (autograd included): training, the
// batch's statistics and, with running statistics, their update in place (version counters
// moved); evaluation, the running statistics. The eager path of ops/batch_norm/op.py.
at::Tensor batch_norm_entry(const at::Tensor& x, const std::optional<at::Tensor>& w,
                            const std::optional<at::Tensor>& b, const std::optional<at::Tensor>& running_mean,
                            const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps);

// running = (1 - momentum) * running + momentum * stat, stats (2 or 3, C) float64 rows mean,
// biased var; n values per channel (unbiased var); version counters moved.
void batch_norm_update_entry(const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& stats,
                             int64_t n, double momentum);

}  // namespace normlab::bn

namespace normlab {

inline void bind_batch_norm(pybind11::module_& m) {
  m.def("batch_norm", &bn::batch_norm_entry, "BatchNorm forward (eager): normlab::batch_norm_train_fwd / _eval_fwd "
        "and the running-statistics update");
  m.def("batch_norm_update", &bn::batch_norm_update_entry, "running statistics blended in place (eager)");
}

}  // namespace normlab
