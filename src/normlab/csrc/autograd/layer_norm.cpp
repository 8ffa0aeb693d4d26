// Autograd of the layer_norm family's forward ops, and the fast eager entry (layer_norm.h).
//
// RowNormBackward: one hand-built autograd node for LayerNorm / RMSNorm and their fused adds. The
// forward runs the forward op below autograd (the CPU or Meta kernel) and attaches the node; its
// backward calls the backward op, or, when the backward is itself differentiated
// (create_graph=True: grad mode on inside it), the reference backward
// (ops/layer_norm/reference.py) in differentiable ATen ops with the statistics recomputed from
// x, so that double backward works. Saved: x (h for the fused add), the weight, and the
// (n_rows,) statistics -- never y or x_hat.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include "autograd/row_stats_node.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cfloat>
#include <cmath>

namespace normlab {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType acc_of(at::ScalarType s) { return s == at::kDouble ? at::kDouble : at::kFloat; }

// The typed handles of the registered ops (looked up once).
#define NORMLAB_OP(name, ...)                                                                        \
  static const auto& name##_op() {                                                                   \
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("normlab::" #name, "").typed<__VA_ARGS__>(); \
    return op;                                                                                       \
  }
NORMLAB_OP(layer_norm_fwd, std::tuple<Tensor, Tensor, Tensor>(const Tensor&, at::IntArrayRef, const OptTensor&,
                                                               const OptTensor&, double))
NORMLAB_OP(rms_norm_fwd, std::tuple<Tensor, Tensor>(const Tensor&, at::IntArrayRef, const OptTensor&, double, double, bool))
NORMLAB_OP(add_layer_norm_fwd, std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, at::IntArrayRef,
                                                                           const OptTensor&, const OptTensor&, double))
NORMLAB_OP(add_rms_norm_fwd, std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, at::IntArrayRef,
                                                                 const OptTensor&, double, double, bool))
NORMLAB_OP(layer_norm_bwd, std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, at::IntArrayRef,
                                                               const OptTensor&, const Tensor&, const Tensor&,
                                                               const OptTensor&, bool, std::optional<at::ScalarType>))
NORMLAB_OP(rms_norm_bwd, std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, at::IntArrayRef, const OptTensor&,
                                                     const Tensor&, const OptTensor&, bool, double, bool))
NORMLAB_OP(row_norm_infer, std::tuple<Tensor, Tensor>(const Tensor&, const OptTensor&, at::IntArrayRef,
                                                       const OptTensor&, const OptTensor&, double, bool, double, bool))
#undef NORMLAB_OP

// (y, h, mean, rstd) of the forward op that fits (center, residual); h / mean undefined where
// the op has none.
std::tuple<Tensor, Tensor, Tensor, Tensor> forward_op(const Tensor& x, const OptTensor& res, at::IntArrayRef shape,
                                                      const OptTensor& w, const OptTensor& b, double eps,
                                                      bool center, double offset, bool cast_x_hat) {
  if (center && !res.has_value()) {
    auto [y, mean, rstd] = layer_norm_fwd_op().call(x, shape, w, b, eps);
    return {y, Tensor(), mean, rstd};
  }
  if (center) return add_layer_norm_fwd_op().call(x, *res, shape, w, b, eps);
  if (!res.has_value()) {
    auto [y, rstd] = rms_norm_fwd_op().call(x, shape, w, eps, offset, cast_x_hat);
    return {y, Tensor(), Tensor(), rstd};
  }
  auto [y, h, rstd] = add_rms_norm_fwd_op().call(x, *res, shape, w, eps, offset, cast_x_hat);
  return {y, h, Tensor(), rstd};
}

// The reference backward in differentiable ATen ops (reference.py: layer_norm_backward_ref,
// rms_norm_backward_ref), the statistics recomputed from x as functions of it. Grouped weights
// (G * n_cols values): the rows as (G, rows per weight, n_cols).
std::tuple<Tensor, Tensor, Tensor> reference_grads(const Tensor& dy, const Tensor& x, const Tensor& w, int64_t n_cols,
                                                   double eps, bool center, double offset, bool cast_x_hat,
                                                   bool need_dx, bool need_dw, bool need_db) {
  const auto acc = acc_of(x.scalar_type());
  const bool grouped = w.defined() && w.numel() != n_cols;
  std::vector<int64_t> rows = {-1, n_cols};
  if (grouped) rows = {w.numel() / n_cols, -1, n_cols};
  Tensor xa = x.reshape(rows).to(acc), dya = dy.reshape(rows).to(acc);  // (n_rows, n_cols) or (G, R, n_cols)
  Tensor rstd, x_hat;
  if (center) {  // shifted two passes (ops/numerics.shifted_mean_var)
    Tensor shift = xa.narrow(-1, 0, 1), d = xa - shift, md = d.mean(-1, true), xc = d - md;
    rstd = at::rsqrt((xc * xc).mean(-1, true) + eps);  // (.., 1)
    x_hat = (xa - (shift + md)) * rstd;
  } else {
    rstd = at::rsqrt((xa * xa).mean(-1, true) + eps);
    x_hat = xa * rstd;
  }
  Tensor wa;
  if (w.defined()) {
    wa = w.reshape(grouped ? std::vector<int64_t>{w.numel() / n_cols, 1, n_cols} : std::vector<int64_t>{n_cols}).to(acc);
    if (offset != 0.0) wa = wa + offset;
  }
  Tensor dx, dw, db;
  if (need_dx) {
    Tensor g = wa.defined() ? dya * wa : dya;  // term 1
    Tensor t = center ? g - g.mean(-1, true) : g;  // term 2 (LayerNorm)
    t = t - x_hat * (g * x_hat).mean(-1, true);  // term 3
    dx = (rstd * t).to(x.scalar_type()).reshape(x.sizes());
  }
  if (need_dw && w.defined()) {
    Tensor seen = cast_x_hat ? x_hat.to(x.scalar_type()).to(acc) : x_hat;  // what the weight multiplied
    dw = (dya * seen).sum(-2).reshape(w.sizes());
  }
  if (need_db) db = dya.sum(-2);
  return {dx, dw, db};
}

// The backward node of every row-norm forward: the grads of y (and of h for the fused add) in,
// the grads of (x, residual, weight, bias) out, one per edge (an absent input has an empty
// edge). Built by hand, as torch's generated autograd code builds its nodes: the saved values
// are fields, not the IValue dict and variable bookkeeping of torch::autograd::Function, which
// cost several microseconds a call -- most of a small LayerNorm's time.
struct RowNormBackward : public RowStatsNode {  // saves x (h for the fused add), w, mean, rstd
  std::vector<int64_t> shape_, b_shape_;
  double eps_ = 0, offset_ = 0;
  bool center_ = true, cast_x_hat_ = false, has_res_ = false, has_w_ = false, has_b_ = false;
  at::ScalarType b_dtype_ = at::kFloat;

  std::string name() const override { return "RowNormBackward"; }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const Tensor dy = grads[0], dh = has_res_ ? grads[1] : Tensor();
    const bool need_x = should_compute_output(0) || (has_res_ && should_compute_output(1));
    const bool need_w = has_w_ && should_compute_output(2);
    const bool need_b = center_ && has_b_ && should_compute_output(3);
    variable_list out(4);
    if (!dy.defined()) {  // only h reached the loss
      if (should_compute_output(0)) out[0] = dh;
      if (has_res_ && should_compute_output(1)) out[1] = dh;
      return out;
    }
    const Tensor x = x_.unpack(getptr()), w = has_w_ ? w_.unpack() : Tensor();
    Tensor dx, dw, db;
    if (at::GradMode::is_enabled()) {  // create_graph=True: a backward that is itself differentiable
      int64_t n_cols = 1;
      for (int64_t s : shape_) n_cols *= s;
      std::tie(dx, dw, db) = reference_grads(dy, x, w, n_cols, eps_, center_, offset_, cast_x_hat_, need_x,
                                             need_w, need_b);
      if (dh.defined() && dx.defined()) dx = dx + dh;
    } else {
      at::AutoDispatchBelowADInplaceOrView guard;
      const OptTensor wo = has_w_ ? OptTensor(w) : std::nullopt, dho = dh.defined() ? OptTensor(dh) : std::nullopt;
      if (center_) {
        const std::optional<at::ScalarType> db_dt = has_b_ ? std::optional<at::ScalarType>(b_dtype_) : std::nullopt;
        std::tie(dx, dw, db) = layer_norm_bwd_op().call(dy, x, shape_, wo, mean_.unpack(), rstd_.unpack(), dho,
                                                        need_w || need_b, db_dt);
      } else {
        std::tie(dx, dw) = rms_norm_bwd_op().call(dy, x, shape_, wo, rstd_.unpack(), dho, need_w, offset_,
                                                  cast_x_hat_);
      }
    }
    if (should_compute_output(0)) out[0] = dx;
    if (has_res_ && should_compute_output(1)) out[1] = dx;  // h = x + residual: both get h's whole gradient
    // the ops give dw / db in the parameters' dtypes; the differentiable path, in the accumulation one
    if (need_w) out[2] = dw.scalar_type() == w.scalar_type() ? dw : dw.to(w.scalar_type());
    if (need_b) {
      if (db.sizes() != at::IntArrayRef(b_shape_)) db = db.reshape(b_shape_);
      out[3] = db.scalar_type() == b_dtype_ ? db : db.to(b_dtype_);
    }
    return out;
  }
};

// The forward with autograd: the forward op below autograd, then, when grad mode is on and an
// input requires grad, a RowNormBackward node on y (and h); the statistics are outputs without
// a gradient. Returns (y, h, mean, rstd), h / mean undefined where the op has none.
std::tuple<Tensor, Tensor, Tensor, Tensor> row_norm_recorded(const Tensor& x, const OptTensor& res,
                                                             at::IntArrayRef shape, const OptTensor& w,
                                                             const OptTensor& b, double eps, bool center,
                                                             double offset, bool cast_x_hat) {
  Tensor y, h, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, h, mean, rstd) = forward_op(x, res, shape, w, b, eps, center, offset, cast_x_hat);
  }
  if (!torch::autograd::compute_requires_grad(x, res, w, b)) return {y, h, mean, rstd};
  auto node = c10::make_intrusive<RowNormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, res, w, b));
  const bool has_res = res.has_value() && res->defined();
  node->has_res_ = has_res;
  node->has_w_ = w.has_value() && w->defined();
  node->has_b_ = b.has_value() && b->defined();
  node->center_ = center;
  node->cast_x_hat_ = cast_x_hat;
  node->eps_ = eps;
  node->offset_ = offset;
  node->shape_ = shape.vec();
  if (node->has_b_) {
    node->b_dtype_ = b->scalar_type();
    node->b_shape_ = b->sizes().vec();
  }
  torch::autograd::set_history(y, node);
  if (has_res) torch::autograd::set_history(h, node);
  node->x_ = torch::autograd::SavedVariable(has_res ? h : x, /*is_output=*/has_res);
  if (node->has_w_) node->w_ = torch::autograd::SavedVariable(*w, false);
  if (center) node->mean_ = torch::autograd::SavedVariable(mean, false);
  node->rstd_ = torch::autograd::SavedVariable(rstd, false);
  return {y, h, mean, rstd};
}

// ---- the Autograd kernels of the forward ops ----

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_ad(const Tensor& x, at::IntArrayRef shape, const OptTensor& w,
                                                     const OptTensor& b, double eps) {
  auto [y, h, mean, rstd] = row_norm_recorded(x, std::nullopt, shape, w, b, eps, true, 0.0, false);
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_fwd_ad(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, double eps,
                                           double offset, bool cast_x_hat) {
  auto [y, h, mean, rstd] = row_norm_recorded(x, std::nullopt, shape, w, std::nullopt, eps, false, offset, cast_x_hat);
  return {y, rstd};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_fwd_ad(const Tensor& x, const Tensor& res,
                                                                 at::IntArrayRef shape, const OptTensor& w,
                                                                 const OptTensor& b, double eps) {
  return row_norm_recorded(x, OptTensor(res), shape, w, b, eps, true, 0.0, false);
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd_ad(const Tensor& x, const Tensor& res, at::IntArrayRef shape,
                                                       const OptTensor& w, double eps, double offset,
                                                       bool cast_x_hat) {
  auto [y, h, mean, rstd] = row_norm_recorded(x, OptTensor(res), shape, w, std::nullopt, eps, false, offset, cast_x_hat);
  return {y, h, rstd};
}

bool wants_grad(const OptTensor& t) { return t.has_value() && t->defined() && t->requires_grad(); }

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> row_norm(const Tensor& x, at::IntArrayRef shape, const OptTensor& res,
                                                    const OptTensor& w, const OptTensor& b, std::optional<double> eps_,
                                                    bool center, double offset, bool cast_x_hat, bool stats) {
  const double eps = eps_.has_value() ? *eps_ : (x.scalar_type() == at::kDouble ? DBL_EPSILON : double(FLT_EPSILON));
  const OptTensor bias = center ? b : std::nullopt;
  const bool record = at::GradMode::is_enabled() &&
                      (x.requires_grad() || wants_grad(res) || wants_grad(w) || wants_grad(bias));
  if (record) return row_norm_recorded(x, res, shape, w, bias, eps, center, offset, cast_x_hat);
  at::AutoDispatchBelowADInplaceOrView guard;  // nothing to record: straight to the kernel
  if (stats) return forward_op(x, res, shape, w, bias, eps, center, offset, cast_x_hat);
  auto [y, h] = row_norm_infer_op().call(x, res, shape, w, bias, eps, center, offset, cast_x_hat);
  return {y, h, Tensor(), Tensor()};
}

namespace {

// Whether (x, normalized_shape, w, b) are arguments normlab.functional's checks accept without a
// word, and the kernels serve: x a strided CPU tensor of a served dtype whose trailing dims are
// normalized_shape (no empty row), each parameter None or a strided CPU tensor of exactly
// normalized_shape in x's dtype (or float32 beside half precision, where `half_params`).
bool fits_fast(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b, bool half_params) {
  if (!x.defined() || !x.device().is_cpu() || x.layout() != at::kStrided) return false;
  const auto st = x.scalar_type();
  const bool half = st == at::kBFloat16 || st == at::kHalf;
  if (!(half || st == at::kFloat || st == at::kDouble)) return false;
  const int64_t k = int64_t(shape.size()), d = x.dim();
  if (k == 0 || k > d) return false;
  for (int64_t i = 0; i < k; ++i)
    if (shape[i] <= 0 || x.size(d - k + i) != shape[i]) return false;
  for (const OptTensor* p : {&w, &b}) {
    if (!p->has_value() || !(*p)->defined()) continue;
    const Tensor& t = **p;
    if (!t.device().is_cpu() || t.layout() != at::kStrided || t.sizes() != shape) return false;
    if (!(t.scalar_type() == st || (half && half_params && t.scalar_type() == at::kFloat))) return false;
  }
  return true;
}

bool plain_eps(double eps) { return std::isfinite(eps) && eps >= 0; }

}  // namespace

std::optional<Tensor> layer_norm_fast(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                                      double eps) {
  if (!plain_eps(eps) || !fits_fast(x, shape, w, b, true)) return std::nullopt;
  return std::get<0>(row_norm(x, shape, std::nullopt, w, b, eps, true, 0.0, false, false));
}

std::optional<Tensor> rms_norm_fast(const Tensor& x, at::IntArrayRef shape, const OptTensor& w,
                                    std::optional<double> eps) {
  if ((eps.has_value() && !plain_eps(*eps)) || !fits_fast(x, shape, w, std::nullopt, false)) return std::nullopt;
  return std::get<0>(row_norm(x, shape, std::nullopt, w, std::nullopt, eps, false, 0.0, false, false));
}

std::optional<std::tuple<Tensor, Tensor>> add_norm_fast(const Tensor& x, const Tensor& residual, at::IntArrayRef shape,
                                                        const OptTensor& w, const OptTensor& b,
                                                        std::optional<double> eps, bool center) {
  if (eps.has_value() && !plain_eps(*eps)) return std::nullopt;
  if (!fits_fast(x, shape, w, center ? b : std::nullopt, center)) return std::nullopt;
  if (!residual.defined() || !residual.device().is_cpu() || residual.layout() != at::kStrided ||
      residual.scalar_type() != x.scalar_type() || residual.sizes() != x.sizes())
    return std::nullopt;
  auto [y, h, mean, rstd] = row_norm(x, shape, OptTensor(residual), w, center ? b : std::nullopt, eps, center, 0.0,
                                     false, false);
  return std::make_tuple(y, h);
}

}  // namespace normlab

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  using namespace normlab;
  m.impl("layer_norm_fwd", &layer_norm_fwd_ad);
  m.impl("rms_norm_fwd", &rms_norm_fwd_ad);
  m.impl("add_layer_norm_fwd", &add_layer_norm_fwd_ad);
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd_ad);
}
