// The norm_act family's Meta kernels: shapes, dtypes and strides of the outputs, as the CPU
// kernels (cpu/norm_act.cpp) allocate them, so that FakeTensor, torch.compile(fullgraph=True)
// and torch.export trace the ops. BatchNorm's and GroupNorm's outputs in x's suggested memory
// format, LayerNorm's rows in x's own layout, LayerNorm2d's NCHW contiguous; statistics and
// GroupNorm's and LayerNorm's dw, db in the accumulation dtype; BatchNorm's dw, db in the
// parameters' dtypes.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "args.h"

namespace normlab::norm_act {

namespace {

using at::Tensor;

Tensor like(const Tensor& x, at::MemoryFormat fmt) {
  return at::empty_symint(x.sym_sizes(), x.options().memory_format(fmt));
}

at::TensorOptions acc_of(const Tensor& x) { return x.options().dtype(acc_dtype(x.scalar_type())); }

// ---- BatchNorm + act ----

std::tuple<Tensor, Tensor> batch_norm_act_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&,
                                                   const OptTensor&, const OptTensor&, bool, double, double, int64_t,
                                                   double) {
  TORCH_CHECK(x.dim() >= 2, "normlab batch_norm_act: expected an input of at least 2 dims, got ", x.dim(), " dims");
  return {like(x, x.suggest_memory_format()),
          at::empty_symint({c10::SymInt(3), x.sym_size(1)}, x.options().dtype(at::kDouble))};
}

std::tuple<Tensor, Tensor, Tensor> batch_norm_act_bwd_meta(const Tensor&, const Tensor& x, const OptTensor& w,
                                                           const OptTensor& b, const Tensor&, bool, int64_t, double,
                                                           bool need_dx, bool need_dw, bool need_db) {
  // dw, db in the parameter's dtype (x's without one)
  auto grad = [&](bool need, const OptTensor& p) {
    if (!need) return Tensor();
    const at::ScalarType t = given(p) ? p->scalar_type() : x.scalar_type();
    return at::empty_symint({x.sym_size(1)}, x.options().dtype(t));
  };
  return {need_dx ? like(x, x.suggest_memory_format()) : Tensor(), grad(need_dw, w), grad(need_db, b)};
}

// ---- GroupNorm + act ----

std::tuple<Tensor, Tensor, Tensor> group_norm_act_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&,
                                                           int64_t g, double, int64_t, double) {
  TORCH_CHECK(x.dim() >= 2, "normlab group_norm_act: expected an input of shape (N, C, *), got ", x.sizes());
  auto stat = [&] { return at::empty_symint({x.sym_size(0), c10::SymInt(g)}, acc_of(x)); };
  return {like(x, x.suggest_memory_format()), stat(), stat()};
}

std::tuple<Tensor, Tensor, Tensor> group_norm_act_bwd_meta(const Tensor&, const Tensor& x, const OptTensor&,
                                                           const OptTensor&, const Tensor&, const Tensor&, int64_t,
                                                           int64_t, double, bool need_dx) {
  TORCH_CHECK(x.dim() >= 2, "normlab group_norm_act: expected an input of shape (N, C, *), got ", x.sizes());
  // the channels-last kernels (and a dx in x's format) where x is channels_last with S > 1
  const bool spatial = x.sym_numel() > x.sym_size(0) * x.sym_size(1);  // S > 1
  const at::MemoryFormat fmt = x.suggest_memory_format();
  const bool nhwc = fmt != at::MemoryFormat::Contiguous && spatial;
  Tensor dx = need_dx ? like(x, nhwc ? fmt : at::MemoryFormat::Contiguous) : at::empty({0}, x.options());
  return {dx, at::empty_symint({x.sym_size(1)}, acc_of(x)), at::empty_symint({x.sym_size(1)}, acc_of(x))};
}

// ---- LayerNorm + act (rows) ----

c10::SymInt rows_of(const Tensor& x, int64_t n_cols) {
  TORCH_CHECK(n_cols > 0, "normlab layer_norm_act: expected n_cols > 0, got ", n_cols);
  return x.sym_numel() / n_cols;
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_act_fwd_meta(const Tensor& x, int64_t n_cols, const OptTensor&,
                                                           const OptTensor&, double, int64_t, double) {
  const c10::SymInt rows = rows_of(x, n_cols);
  return {at::empty_like(x), at::empty_symint({rows}, acc_of(x)), at::empty_symint({rows}, acc_of(x))};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_act_bwd_meta(const Tensor&, const Tensor& x, const OptTensor& w,
                                                           const OptTensor& b, const Tensor&, const Tensor&,
                                                           int64_t n_cols, int64_t, double, bool) {
  (void)rows_of(x, n_cols);
  return {at::empty_like(x), at::empty({given(w) ? n_cols : 0}, acc_of(x)),
          at::empty({given(b) ? n_cols : 0}, acc_of(x))};
}

// ---- LayerNorm2d + act, NCHW ----

std::tuple<Tensor, Tensor, Tensor> layer_norm_act2d_fwd_meta(const Tensor& x, const OptTensor&, const OptTensor&,
                                                             double, int64_t, double) {
  TORCH_CHECK(x.dim() >= 2, "normlab layer_norm_act2d: expected an input of shape (N, C, *), got ", x.sizes());
  c10::SymInt pixels = x.sym_size(0);  // N * S
  for (int64_t k = 2; k < x.dim(); ++k) pixels = pixels * x.sym_size(k);
  return {like(x, at::MemoryFormat::Contiguous), at::empty_symint({pixels}, acc_of(x)),
          at::empty_symint({pixels}, acc_of(x))};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_act2d_bwd_meta(const Tensor&, const Tensor& x, const OptTensor&,
                                                             const OptTensor&, const Tensor&, const Tensor&, int64_t,
                                                             double, bool need_dwb) {
  TORCH_CHECK(x.dim() >= 2, "normlab layer_norm_act2d: expected an input of shape (N, C, *), got ", x.sizes());
  const c10::SymInt c = need_dwb ? x.sym_size(1) : c10::SymInt(0);
  return {like(x, at::MemoryFormat::Contiguous), at::empty_symint({c}, acc_of(x)), at::empty_symint({c}, acc_of(x))};
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  m.impl("batch_norm_act_fwd", &batch_norm_act_fwd_meta);
  m.impl("batch_norm_act_bwd", &batch_norm_act_bwd_meta);
  m.impl("group_norm_act_fwd", &group_norm_act_fwd_meta);
  m.impl("group_norm_act_bwd", &group_norm_act_bwd_meta);
  m.impl("layer_norm_act_fwd", &layer_norm_act_fwd_meta);
  m.impl("layer_norm_act_bwd", &layer_norm_act_bwd_meta);
  m.impl("layer_norm_act2d_fwd", &layer_norm_act2d_fwd_meta);
  m.impl("layer_norm_act2d_bwd", &layer_norm_act2d_bwd_meta);
}

}  // namespace normlab::norm_act
