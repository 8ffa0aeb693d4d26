// The batch_norm family's schemas and typed C++ API, in one file: `define` declares the ops
// (torch.ops.normlab.*; called from extension.cpp's one registration block), each typed function
// calls its op through a cached dispatcher handle, and the fast eager entries
// (autograd/batch_norm.cpp) and the kernels' geometry constants (cpu/batch_norm.cpp, for tests)
// are declared for extension.cpp's bindings. Kernels: cpu/batch_norm.cpp (CPU),
// meta/batch_norm.cpp (Meta), autograd/batch_norm.cpp (Autograd, ADInplaceOrView). Math:
// docs/derivations/batch_norm.md.
//
// BatchNorm's training and evaluation forwards, its backward, the batch statistics alone
// (SyncBatchNorm's per-rank part) and the running-statistics update.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "args.h"

namespace normlab::batch_norm {

inline void define(torch::Library& m) {
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

// ---- the ops (torch.ops.normlab.<name>; the arguments as in the schemas) ----

using at::Tensor;

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor> batch_norm_fwd(const Tensor& x, const OptTensor& weight,
                                                                        const OptTensor& bias, double eps) {
  static const auto op = op_handle<decltype(batch_norm_fwd)>("normlab::batch_norm_fwd");
  return op.call(x, weight, bias, eps);
}

[[gnu::always_inline]] inline Tensor batch_norm_eval_fwd(const Tensor& x, const OptTensor& weight,
                                                         const OptTensor& bias, const Tensor& running_mean,
                                                         const Tensor& running_var, double eps) {
  static const auto op = op_handle<decltype(batch_norm_eval_fwd)>("normlab::batch_norm_eval_fwd");
  return op.call(x, weight, bias, running_mean, running_var, eps);
}

[[gnu::always_inline]] inline Tensor batch_norm_stats(const Tensor& x) {
  static const auto op = op_handle<decltype(batch_norm_stats)>("normlab::batch_norm_stats");
  return op.call(x);
}

[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor> batch_norm_bwd(const Tensor& dy, const Tensor& x,
                                                                                const OptTensor& weight,
                                                                                const Tensor& stats, bool training,
                                                                                bool need_dx, bool need_wb) {
  static const auto op = op_handle<decltype(batch_norm_bwd)>("normlab::batch_norm_bwd");
  return op.call(dy, x, weight, stats, training, need_dx, need_wb);
}

[[gnu::always_inline]] inline void batch_norm_update_stats(const Tensor& running_mean, const Tensor& running_var,
                                                           const Tensor& stats, int64_t n, const Tensor& momentum) {
  static const auto op = op_handle<decltype(batch_norm_update_stats)>("normlab::batch_norm_update_stats");
  op.call(running_mean, running_var, stats, n, momentum);
}

// ---- the eager entries (normlab._C) ----

// BatchNorm of an (N, C, *) x through the registered ops (autograd included): training, the
// batch's statistics and, with running statistics, their update in place (version counters
// moved); evaluation, the running statistics. The eager path of normlab.functional.batch_norm.
at::Tensor batch_norm_entry(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                            const OptTensor& running_mean, const OptTensor& running_var, bool training,
                            double momentum, double eps);

// normlab.functional.batch_norm for arguments that its checks accept without a word (x a CPU
// tensor of a served dtype, (N, C, *) with N * prod(*) > 1 in training and numel > 0, each
// per-channel tensor absent or (C,) in x's dtype (float32 beside half precision), the running
// pair both or neither (both in evaluation), momentum in [0, 1], eps a float, > 0 in training,
// >= 0 otherwise): y, the running statistics updated in training. Anything else: None, and
// Python runs its checks (which raise with the message) and its backend choice.
std::optional<at::Tensor> batch_norm_fast(const at::Tensor& x, const OptTensor& running_mean,
                                          const OptTensor& running_var, const OptTensor& weight,
                                          const OptTensor& bias, bool training, double momentum, double eps);

// running = (1 - momentum) * running + momentum * stat, stats (2 or 3, C) float64 rows mean,
// biased var; n values per channel (unbiased var); version counters moved.
void batch_norm_update_entry(const at::Tensor& running_mean, const at::Tensor& running_var, const at::Tensor& stats,
                             int64_t n, double momentum);

// ---- the kernels' geometry constants (cpu/batch_norm.cpp) ----

// The constants by name (tests set tiny ones to put chunk, task and column-block boundaries
// everywhere); set returns the previous values.
std::map<std::string, int64_t> kernel_constants();
std::map<std::string, int64_t> set_kernel_constants(const std::map<std::string, int64_t>& values);
// (fold, cw, sub, group, local, tail) of the kernels' view (n_rows, width) with S = s_len;
// backward: the backward's (half the local size: it reads x and dy).
std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int64_t> kernel_geometry(int64_t n_rows, int64_t width,
                                                                              int64_t s_len, bool backward);

}  // namespace normlab::batch_norm
