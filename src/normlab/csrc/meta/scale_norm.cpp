// The scale_norm family's Meta kernels: shapes, dtypes and strides of the outputs (as
// cpu/scale_norm.cpp), so that FakeTensor, torch.compile(fullgraph=True) and torch.export trace the ops.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "args.h"

namespace normlab::scale_norm {

namespace {

using at::Tensor;

std::tuple<Tensor, Tensor, Tensor> scale_norm2d_fwd_meta(const Tensor& x, const OptTensor&, bool simple, double) {
  const auto acc = x.options().dtype(acc_dtype(x.scalar_type()));
  const c10::SymInt hw = x.sym_size(2) * x.sym_size(3);
  return {at::empty_symint(x.sym_sizes(), x.options().memory_format(nchw_or_nhwc(x))),
          at::empty_symint({x.sym_size(0), hw}, acc),
          simple ? at::empty_symint({x.sym_size(0), hw}, acc) : at::empty({0}, acc)};
}

std::tuple<Tensor, Tensor> scale_norm2d_bwd_meta(const Tensor&, const Tensor& x, const OptTensor& weight,
                                                 const Tensor&, const Tensor&, bool, bool need_dx, bool need_dw) {
  const auto acc = x.options().dtype(acc_dtype(x.scalar_type()));
  Tensor dx = need_dx ? at::empty_symint(x.sym_sizes(), x.options().memory_format(nchw_or_nhwc(x)))
                      : at::empty({0}, x.options());
  Tensor dw = need_dw && weight.has_value() ? at::empty_symint({x.sym_size(1)}, acc) : at::empty({0}, acc);
  return {dx, dw};
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  m.impl("scale_norm2d_fwd", &scale_norm2d_fwd_meta);
  m.impl("scale_norm2d_bwd", &scale_norm2d_bwd_meta);
}

}  // namespace normlab::scale_norm
