// The group_norm family's Meta kernels: shapes, dtypes and strides of the outputs, so that FakeTensor,
// torch.compile(fullgraph=True) and torch.export trace the ops. The same layout rules as the CPU
// kernels (cpu/group_norm.cpp): GroupNorm's outputs in x.suggest_memory_format(), InstanceNorm's
// contiguous; statistics and dw/db in the accumulation dtype.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "args.h"

namespace normlab::group_norm {

namespace {

using at::Tensor;

Tensor like(const Tensor& x, at::MemoryFormat fmt) {
  return at::empty_symint(x.sym_sizes(), x.options().memory_format(fmt));
}

Tensor stat(const Tensor& x, c10::SymInt rows, int64_t cols) {
  return at::empty_symint({std::move(rows), c10::SymInt(cols)}, x.options().dtype(acc_dtype(x.scalar_type())));
}

Tensor channels(const Tensor& x) {
  return at::empty_symint({x.sym_size(1)}, x.options().dtype(acc_dtype(x.scalar_type())));
}

Tensor group_norm_meta(const Tensor& x, const OptTensor&, const OptTensor&, int64_t, double) {
  return like(x, x.suggest_memory_format());
}

std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&,
                                                               int64_t g, double) {
  return {like(x, x.suggest_memory_format()), stat(x, x.sym_size(0), g), stat(x, x.sym_size(0), g),
          stat(x, x.sym_size(0), g)};
}

std::tuple<Tensor, Tensor, Tensor> group_norm_bwd_meta(const Tensor&, const Tensor& x, const OptTensor&, const Tensor&,
                                                       const Tensor&, int64_t, bool need_dx) {
  Tensor dx = need_dx ? like(x, x.suggest_memory_format()) : at::empty({0}, x.options());
  return {dx, channels(x), channels(x)};
}

Tensor instance_norm_eval_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&) {
  return like(x, at::MemoryFormat::Contiguous);
}

std::tuple<Tensor, Tensor, Tensor> instance_norm_eval_bwd_meta(const Tensor&, const Tensor& x, const OptTensor&,
                                                               const Tensor&, const Tensor&, bool need_dx) {
  Tensor dx = need_dx ? like(x, at::MemoryFormat::Contiguous) : at::empty({0}, x.options());
  return {dx, channels(x), channels(x)};
}

void instance_norm_update_stats_meta(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, int64_t) {}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  m.impl("group_norm", &group_norm_meta);
  m.impl("group_norm_fwd", &group_norm_fwd_meta);
  m.impl("group_norm_bwd", &group_norm_bwd_meta);
  m.impl("instance_norm_eval_fwd", &instance_norm_eval_fwd_meta);
  m.impl("instance_norm_eval_bwd", &instance_norm_eval_bwd_meta);
  m.impl("instance_norm_update_stats", &instance_norm_update_stats_meta);
}

}  // namespace normlab::group_norm
