// The dyt family's Meta kernels: shapes, dtypes and strides of the outputs (as cpu/dyt.cpp), so
// that FakeTensor, torch.compile(fullgraph=True) and torch.export trace the ops.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "args.h"

namespace normlab::dyt {

namespace {

using at::Tensor;

Tensor dyt_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&, at::IntArrayRef, const Tensor&) {
  return at::empty_symint(x.sym_sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> dyt_bwd_meta(const Tensor&, const Tensor& x, const OptTensor&,
                                                        const Tensor& alpha, at::IntArrayRef shape, bool need_dx,
                                                        bool need_dalpha, bool need_wb) {
  const auto acc = x.options().dtype(acc_dtype(x.scalar_type()));
  Tensor dx = need_dx ? at::empty_symint(x.sym_sizes(), x.options()) : at::empty({0}, x.options());
  Tensor da = need_dalpha ? at::empty(alpha.sizes(), acc) : at::empty({0}, acc);
  Tensor dw = need_wb ? at::empty(shape, acc) : at::empty({0}, acc);
  Tensor db = need_wb ? at::empty(shape, acc) : at::empty({0}, acc);
  return {dx, da, dw, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  m.impl("dyt_fwd", &dyt_fwd_meta);
  m.impl("dyt_bwd", &dyt_bwd_meta);
}

}  // namespace normlab::dyt
