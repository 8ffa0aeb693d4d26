// BatchNorm's CPU op kernels (cpu/batch_norm.cpp), declared for the family's autograd kernels and
// fast entry points (autograd/batch_norm.cpp), which call some of them directly.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace normlab::bn {

// The layout torch's batch_norm gives its output (Tensor.suggest_memory_format), and x in it.
at::MemoryFormat memory_format(const at::Tensor& x);
at::Tensor canonical(const at::Tensor& x);
// An empty tensor shaped as x in memory format fmt (huge pages for large ones).
at::Tensor empty_output(const at::Tensor& x, at::MemoryFormat fmt);

std::tuple<at::Tensor, at::Tensor> train_fwd_cpu(const at::Tensor& x, const std::optional<at::Tensor>& w,
                                                 const std::optional<at::Tensor>& b, double eps);
at::Tensor eval_fwd_cpu(const at::Tensor& x, const at::Tensor& rm, const at::Tensor& rv,
                        const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(const at::Tensor& dy, const at::Tensor& x,
                                                       const std::optional<at::Tensor>& w, const at::Tensor& stats,
                                                       bool training, bool need_dx, bool need_wb);
// running statistics blended with (C,) float64 mean and biased var, in place (no version bump)
void update_running_raw(const at::Tensor& rm, const at::Tensor& rv, const double* mean, const double* var, int64_t n,
                        double momentum);

}  // namespace normlab::bn
