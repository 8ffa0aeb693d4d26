// The frn family's Meta kernels: shapes, dtypes and strides of the outputs (as cpu/frn.cpp), so
// that FakeTensor, torch.compile(fullgraph=True) and torch.export trace the ops.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "args.h"

namespace normlab::frn {

namespace {

using at::Tensor;

std::tuple<Tensor, Tensor> frn_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&, const OptTensor&,
                                        double) {
  const auto acc = x.options().dtype(acc_dtype(x.scalar_type()));
  return {at::empty_symint(x.sym_sizes(), x.options().memory_format(nchw_or_nhwc(x))),
          at::empty_symint({x.sym_size(0), x.sym_size(1)}, acc)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> frn_bwd_meta(const Tensor&, const Tensor& x, const OptTensor&,
                                                        const OptTensor&, const OptTensor& tau, const Tensor&,
                                                        bool need_dx, bool need_dw, bool need_db, bool need_dtau) {
  const auto acc = x.options().dtype(acc_dtype(x.scalar_type()));
  Tensor dx = need_dx ? at::empty_symint(x.sym_sizes(), x.options().memory_format(nchw_or_nhwc(x)))
                      : at::empty({0}, x.options());
  auto per_channel = [&](bool need) { return need ? at::empty_symint({x.sym_size(1)}, acc) : at::empty({0}, acc); };
  return {dx, per_channel(need_dw), per_channel(need_db), per_channel(need_dtau && tau.has_value())};
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  m.impl("frn_fwd", &frn_fwd_meta);
  m.impl("frn_bwd", &frn_bwd_meta);
}

}  // namespace normlab::frn
