// The layer_norm family's Meta kernels: the outputs' shapes, dtypes and strides, as the CPU
// kernels (cpu/layer_norm.cpp) allocate them, for FakeTensor, torch.compile and torch.export.
// LayerNorm2d's follow layer_norm2d_layout.h, the rules its CPU kernels share.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "args.h"
#include "layer_norm2d_layout.h"

namespace normlab::layer_norm {
namespace {

using at::Tensor;

int64_t rows_of(const Tensor& x, at::IntArrayRef shape) {
  int64_t n = 1;
  for (int64_t i = 0; i < x.dim() - int64_t(shape.size()); ++i) n *= x.size(i);
  return n;
}

Tensor stat(const Tensor& x, at::IntArrayRef shape) {
  return at::empty({rows_of(x, shape)}, x.options().dtype(acc_dtype(x.scalar_type())));
}

Tensor rows_out(const Tensor& x) { return at::empty(x.sizes(), x.options()); }  // contiguous, as LayerNorm's

Tensor rms_out(const Tensor& x) {  // the input's suggested memory format, as torch's rms_norm
  return at::empty(x.sizes(), x.options().memory_format(x.suggest_memory_format()));
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&,
                                                       at::IntArrayRef shape, double) {
  return {rows_out(x), stat(x, shape), stat(x, shape)};
}

std::tuple<Tensor, Tensor> rms_norm_fwd_meta(const Tensor& x, const OptTensor&, at::IntArrayRef shape, double, bool,
                                             double) {
  return {rms_out(x), stat(x, shape)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_fwd_meta(const Tensor& x, const Tensor&, const OptTensor&,
                                                                   const OptTensor&, at::IntArrayRef shape, double) {
  return {rows_out(x), rows_out(x), stat(x, shape), stat(x, shape)};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd_meta(const Tensor& x, const Tensor&, const OptTensor&,
                                                         at::IntArrayRef shape, double, bool, double) {
  return {rms_out(x), rows_out(x), stat(x, shape)};
}

std::tuple<Tensor, Tensor> row_norm_infer_meta(const Tensor& x, const OptTensor& res, const OptTensor&,
                                               const OptTensor&, at::IntArrayRef, bool center, double, bool, double) {
  return {center ? rows_out(x) : rms_out(x), res.has_value() ? rows_out(x) : Tensor()};
}

// dw in the weight's dtype (the accumulation dtype without one), db in db_dtype (None: the
// accumulation dtype); (0,) where not needed, db also for RMSNorm.
std::pair<Tensor, Tensor> grads_wb(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, bool need, bool center,
                                   std::optional<at::ScalarType> db_dtype) {
  const auto acc = acc_dtype(x.scalar_type());
  const bool has_w = given(w);
  auto dw_opt = x.options().dtype(has_w ? w->scalar_type() : acc), db_opt = x.options().dtype(db_dtype.value_or(acc));
  if (!need) return {at::empty({0}, dw_opt), at::empty({0}, db_opt)};
  auto s = has_w ? w->sizes().vec() : shape.vec();
  return {at::empty(s, dw_opt), at::empty(center ? s : std::vector<int64_t>{0}, db_opt)};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd_meta(const Tensor&, const OptTensor&, const Tensor& x,
                                                       const OptTensor& w, const Tensor&, const Tensor&,
                                                       at::IntArrayRef shape, bool need_wb,
                                                       std::optional<at::ScalarType> db_dtype) {
  auto [dw, db] = grads_wb(x, shape, w, need_wb, true, db_dtype);
  return {rows_out(x), dw, db};
}

std::tuple<Tensor, Tensor> rms_norm_bwd_meta(const Tensor&, const OptTensor&, const Tensor& x, const OptTensor& w,
                                             const Tensor&, at::IntArrayRef shape, double, bool, bool need_dw) {
  return {rows_out(x), grads_wb(x, shape, w, need_dw, false, std::nullopt).first};
}

// ---- LayerNorm2d ----

Tensor output_2d(const Tensor& x) {
  const Plan plan = plan_of(x);
  return output_like(dense_input(x, plan), plan);
}

Tensor layer_norm2d_meta(const Tensor& x, const OptTensor&, const OptTensor&, double) { return output_2d(x); }

std::tuple<Tensor, Tensor, Tensor> layer_norm2d_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&, double) {
  auto opts = x.options().dtype(acc_dtype(x.scalar_type()));
  c10::SymInt p = sym_pixels(x);
  return {output_2d(x), at::empty_symint({p}, opts), at::empty_symint({p}, opts)};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm2d_bwd_meta(const Tensor&, const Tensor& x, const OptTensor&,
                                                         const Tensor&, const Tensor&, bool need_wb) {
  auto opts = x.options().dtype(acc_dtype(x.scalar_type()));
  c10::SymInt c = need_wb ? x.sym_size(1) : c10::SymInt(0);
  return {output_2d(x), at::empty_symint({c}, opts), at::empty_symint({c}, opts)};
}

}  // namespace
}  // namespace normlab::layer_norm

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  using namespace normlab::layer_norm;
  m.impl("layer_norm_fwd", &layer_norm_fwd_meta);
  m.impl("rms_norm_fwd", &rms_norm_fwd_meta);
  m.impl("add_layer_norm_fwd", &add_layer_norm_fwd_meta);
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd_meta);
  m.impl("layer_norm_bwd", &layer_norm_bwd_meta);
  m.impl("rms_norm_bwd", &rms_norm_bwd_meta);
  m.impl("row_norm_infer", &row_norm_infer_meta);
  m.impl("layer_norm2d", &layer_norm2d_meta);
  m.impl("layer_norm2d_fwd", &layer_norm2d_fwd_meta);
  m.impl("layer_norm2d_bwd", &layer_norm2d_bwd_meta);
}
