// The batch_norm family's op schemas (torch.ops.normlab.*) and its typed C++ API (batch_norm.h):
// BatchNorm's training and evaluation forwards, its backward, the batch statistics alone
// (SyncBatchNorm's per-rank part) and the running-statistics update. Kernels: cpu/batch_norm.cpp
// (CPU), meta/batch_norm.cpp (Meta), autograd/batch_norm.cpp (Autograd, ADInplaceOrView). Math:
// docs/derivations/batch_norm.md.
#include <torch/library.h>

#include "args.h"
#include "batch_norm.h"

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  // training: (y, stats), stats (3, C) float64 rows batch mean, biased var, rstd
  m.def("batch_norm_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor y, Tensor stats)");
  // evaluation: y with the running statistics
  m.def("batch_norm_eval_fwd(Tensor x, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, "
        "float eps) -> Tensor y");
  // (2, C) float64 rows batch mean, biased var (no output)
  m.def("batch_norm_stats(Tensor x) -> Tensor stats");
  // (dx, dw, db): dx empty (0,) unless need_dx; dw, db (C,) float64 sums, (0,) unless training or need_wb
  m.def("batch_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor stats, bool training, bool need_dx, "
        "bool need_wb) -> (Tensor dx, Tensor dw, Tensor db)");
  // running = (1 - momentum) * running + momentum * stat (unbiased var, n values per channel);
  // momentum a 0-dim tensor read when the op runs (momentum=None's factor depends on a buffer)
  m.def("batch_norm_update_stats(Tensor(a!) running_mean, Tensor(b!) running_var, Tensor stats, int n, "
        "Tensor momentum) -> ()");
}

namespace normlab::batch_norm {

using at::Tensor;

std::tuple<Tensor, Tensor> batch_norm_fwd(const Tensor& x, const OptTensor& weight, const OptTensor& bias, double eps) {
  static const auto op = op_handle<decltype(batch_norm_fwd)>("normlab::batch_norm_fwd");
  return op.call(x, weight, bias, eps);
}

Tensor batch_norm_eval_fwd(const Tensor& x, const OptTensor& weight, const OptTensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, double eps) {
  static const auto op = op_handle<decltype(batch_norm_eval_fwd)>("normlab::batch_norm_eval_fwd");
  return op.call(x, weight, bias, running_mean, running_var, eps);
}

Tensor batch_norm_stats(const Tensor& x) {
  static const auto op = op_handle<decltype(batch_norm_stats)>("normlab::batch_norm_stats");
  return op.call(x);
}

std::tuple<Tensor, Tensor, Tensor> batch_norm_bwd(const Tensor& dy, const Tensor& x, const OptTensor& weight,
                                                  const Tensor& stats, bool training, bool need_dx, bool need_wb) {
  static const auto op = op_handle<decltype(batch_norm_bwd)>("normlab::batch_norm_bwd");
  return op.call(dy, x, weight, stats, training, need_dx, need_wb);
}

void batch_norm_update_stats(const Tensor& running_mean, const Tensor& running_var, const Tensor& stats, int64_t n,
                             const Tensor& momentum) {
  static const auto op = op_handle<decltype(batch_norm_update_stats)>("normlab::batch_norm_update_stats");
  op.call(running_mean, running_var, stats, n, momentum);
}

}  // namespace normlab::batch_norm
