// The layer_norm2d family's Meta kernels: shapes, dtypes and strides of the outputs (the CPU
// kernels' rules, csrc/layer_norm2d_layout.h), for FakeTensor, torch.compile and torch.export.
#include <torch/library.h>

#include "layer_norm2d_layout.h"

namespace normlab::ln2d {
namespace {

using at::Tensor;

Tensor output_meta(const Tensor& x) {
  const Plan plan = plan_of(x);
  return output_like(dense_input(x, plan), plan);
}

Tensor layer_norm2d_meta(const Tensor& x, const std::optional<Tensor>&, const std::optional<Tensor>&, double) {
  return output_meta(x);
}

std::tuple<Tensor, Tensor, Tensor> forward_meta(const Tensor& x, const std::optional<Tensor>&,
                                                const std::optional<Tensor>&, double) {
  auto opts = x.options().dtype(acc_dtype(x.scalar_type()));
  c10::SymInt p = sym_pixels(x);
  return {output_meta(x), at::empty_symint({p}, opts), at::empty_symint({p}, opts)};
}

std::tuple<Tensor, Tensor, Tensor> backward_meta(const Tensor&, const Tensor& x, const std::optional<Tensor>&,
                                                 const Tensor&, const Tensor&, bool need_wb) {
  auto opts = x.options().dtype(acc_dtype(x.scalar_type()));
  c10::SymInt c = need_wb ? x.sym_size(1) : c10::SymInt(0);
  return {output_meta(x), at::empty_symint({c}, opts), at::empty_symint({c}, opts)};
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  m.impl("layer_norm2d", &layer_norm2d_meta);
  m.impl("layer_norm2d_forward", &forward_meta);
  m.impl("layer_norm2d_backward", &backward_meta);
}

}  // namespace normlab::ln2d
