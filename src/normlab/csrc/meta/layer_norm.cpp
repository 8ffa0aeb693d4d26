// Meta kernels of the layer_norm family's ops: the outputs' shapes, dtypes and strides, as the
// CPU kernels (cpu/layer_norm.cpp) allocate them, for FakeTensor, torch.compile and torch.export.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace normlab::ln {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

at::ScalarType acc_of(at::ScalarType s) { return s == at::kDouble ? at::kDouble : at::kFloat; }

int64_t rows_of(const Tensor& x, at::IntArrayRef shape) {
  int64_t n = 1;
  for (int64_t i = 0; i < x.dim() - int64_t(shape.size()); ++i) n *= x.size(i);
  return n;
}

Tensor stat(const Tensor& x, at::IntArrayRef shape) {
  return at::empty({rows_of(x, shape)}, x.options().dtype(acc_of(x.scalar_type())));
}

Tensor rows_out(const Tensor& x) { return at::empty(x.sizes(), x.options()); }  // contiguous, as LayerNorm's

Tensor rms_out(const Tensor& x) {  // the input's suggested memory format, as torch's rms_norm
  return at::empty(x.sizes(), x.options().memory_format(x.suggest_memory_format()));
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& x, at::IntArrayRef shape, const OptTensor&,
                                                  const OptTensor&, double) {
  return {rows_out(x), stat(x, shape), stat(x, shape)};
}

std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x, at::IntArrayRef shape, const OptTensor&, double, double,
                                        bool) {
  return {rms_out(x), stat(x, shape)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_fwd(const Tensor& x, const Tensor&, at::IntArrayRef shape,
                                                              const OptTensor&, const OptTensor&, double) {
  return {rows_out(x), rows_out(x), stat(x, shape), stat(x, shape)};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd(const Tensor& x, const Tensor&, at::IntArrayRef shape,
                                                    const OptTensor&, double, double, bool) {
  return {rms_out(x), rows_out(x), stat(x, shape)};
}

std::tuple<Tensor, Tensor> row_norm_infer(const Tensor& x, const OptTensor& res, at::IntArrayRef, const OptTensor&,
                                          const OptTensor&, double, bool center, double, bool) {
  return {center ? rows_out(x) : rms_out(x), res.has_value() ? rows_out(x) : Tensor()};
}

// dw in the weight's dtype (the accumulation dtype without one), db in db_dtype (None: the
// accumulation dtype); (0,) where not needed, db also for RMSNorm.
std::pair<Tensor, Tensor> grads_wb(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, bool need, bool center,
                                   std::optional<at::ScalarType> db_dtype) {
  const auto acc = acc_of(x.scalar_type());
  const bool has_w = w.has_value() && w->defined();
  auto dw_opt = x.options().dtype(has_w ? w->scalar_type() : acc), db_opt = x.options().dtype(db_dtype.value_or(acc));
  if (!need) return {at::empty({0}, dw_opt), at::empty({0}, db_opt)};
  auto s = has_w ? w->sizes().vec() : shape.vec();
  return {at::empty(s, dw_opt), at::empty(center ? s : std::vector<int64_t>{0}, db_opt)};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd(const Tensor&, const Tensor& x, at::IntArrayRef shape,
                                                  const OptTensor& w, const Tensor&, const Tensor&, const OptTensor&,
                                                  bool need_wb, std::optional<at::ScalarType> db_dtype) {
  auto [dw, db] = grads_wb(x, shape, w, need_wb, true, db_dtype);
  return {rows_out(x), dw, db};
}

std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor&, const Tensor& x, at::IntArrayRef shape, const OptTensor& w,
                                        const Tensor&, const OptTensor&, bool need_dw, double, bool) {
  return {rows_out(x), grads_wb(x, shape, w, need_dw, false, std::nullopt).first};
}

}  // namespace
}  // namespace normlab::ln

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  using namespace normlab::ln;
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("rms_norm_fwd", &rms_norm_fwd);
  m.impl("add_layer_norm_fwd", &add_layer_norm_fwd);
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd);
  m.impl("layer_norm_bwd", &layer_norm_bwd);
  m.impl("rms_norm_bwd", &rms_norm_bwd);
  m.impl("row_norm_infer", &row_norm_infer);
}
