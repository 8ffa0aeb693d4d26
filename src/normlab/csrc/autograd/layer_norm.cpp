// Autograd of the layer_norm family's forward ops, and the fast eager entry (layer_norm.h).
//
// RowNormFn: one torch::autograd::Function for LayerNorm / RMSNorm and their fused adds. Its
// forward redispatches below autograd to the forward op (the CPU or Meta kernel); its backward
// calls the backward op, or, when the backward is itself differentiated (create_graph=True:
// grad mode on inside it), the reference backward (ops/layer_norm/reference.py) in
// differentiable ATen ops with the statistics recomputed from x, so that double backward works.
// Saved: x (h for the fused add), the weight, and the (n_rows,) statistics -- never y or x_hat.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <cfloat>

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
                                                               const OptTensor&, bool))
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
  if (center) {  // shifted two passes (ops/_common.shifted_mean_var)
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

struct RowNormFn : public torch::autograd::Function<RowNormFn> {
  // outputs in the op's order: y, (h), (mean), rstd
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const OptTensor& res, const OptTensor& w,
                               const OptTensor& b, at::IntArrayRef shape, double eps, bool center, double offset,
                               bool cast_x_hat) {
    Tensor y, h, mean, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(y, h, mean, rstd) = forward_op(x, res, shape, w, b, eps, center, offset, cast_x_hat);
    }
    const bool has_res = res.has_value(), has_w = w.has_value() && w->defined(), has_b = b.has_value() && b->defined();
    ctx->save_for_backward({has_res ? h : x, has_w ? *w : Tensor(), mean, rstd});
    ctx->saved_data["shape"] = shape.vec();
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["flags"] = int64_t(center) | int64_t(cast_x_hat) << 1 | int64_t(has_res) << 2 |
                               int64_t(has_w) << 3 | int64_t(has_b) << 4;
    if (has_b) {
      ctx->saved_data["b_dtype"] = int64_t(b->scalar_type());
      ctx->saved_data["b_shape"] = b->sizes().vec();
    }
    ctx->set_materialize_grads(false);
    variable_list out{y};
    if (has_res) out.push_back(h);
    if (center) {
      ctx->mark_non_differentiable({mean, rstd});
      out.push_back(mean);
    } else {
      ctx->mark_non_differentiable({rstd});
    }
    out.push_back(rstd);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t flags = ctx->saved_data["flags"].toInt();
    const bool center = flags & 1, cast_x_hat = flags & 2, has_res = flags & 4, has_w = flags & 8, has_b = flags & 16;
    auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const Tensor dy = grads[0], dh = has_res ? grads[1] : Tensor();
    // the input edges: x, residual, weight, bias -- those present, in that order
    const size_t iw = 1 + has_res, ib = iw + has_w;
    const bool need_x = ctx->needs_input_grad(0) || (has_res && ctx->needs_input_grad(1));
    const bool need_w = has_w && ctx->needs_input_grad(iw);
    const bool need_b = center && has_b && ctx->needs_input_grad(ib);
    variable_list out(9);
    if (!dy.defined()) {  // only h reached the loss
      out[0] = dh;
      if (has_res) out[1] = dh;
      return out;
    }
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const double eps = ctx->saved_data["eps"].toDouble(), offset = ctx->saved_data["offset"].toDouble();
    Tensor dx, dw, db;
    if (at::GradMode::is_enabled()) {  // create_graph=True: a backward that is itself differentiable
      int64_t n_cols = 1;
      for (int64_t s : shape) n_cols *= s;
      std::tie(dx, dw, db) = reference_grads(dy, x, w, n_cols, eps, center, offset, cast_x_hat, need_x, need_w, need_b);
      if (dh.defined() && dx.defined()) dx = dx + dh;
    } else {
      at::AutoDispatchBelowADInplaceOrView guard;
      const OptTensor wo = has_w ? OptTensor(w) : std::nullopt, dho = dh.defined() ? OptTensor(dh) : std::nullopt;
      if (center) {
        std::tie(dx, dw, db) = layer_norm_bwd_op().call(dy, x, shape, wo, mean, rstd, dho, need_w || need_b);
      } else {
        std::tie(dx, dw) = rms_norm_bwd_op().call(dy, x, shape, wo, rstd, dho, need_w, offset, cast_x_hat);
      }
    }
    out[0] = dx;
    if (has_res) out[1] = dx;  // h = x + residual: both get h's whole gradient
    if (need_w) out[2] = dw.scalar_type() == w.scalar_type() ? dw : dw.to(w.scalar_type());
    if (need_b) {
      auto bt = static_cast<at::ScalarType>(ctx->saved_data["b_dtype"].toInt());
      db = db.reshape(ctx->saved_data["b_shape"].toIntVector());
      out[3] = db.scalar_type() == bt ? db : db.to(bt);
    }
    return out;
  }
};

// ---- the Autograd kernels of the forward ops ----

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_ad(const Tensor& x, at::IntArrayRef shape, const OptTensor& w,
                                                     const OptTensor& b, double eps) {
  auto o = RowNormFn::apply(x, OptTensor(), w, b, shape, eps, true, 0.0, false);
  return {o[0], o[1], o[2]};
}

std::tuple<Tensor, Tensor> rms_norm_fwd_ad(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, double eps,
                                           double offset, bool cast_x_hat) {
  auto o = RowNormFn::apply(x, OptTensor(), w, OptTensor(), shape, eps, false, offset, cast_x_hat);
  return {o[0], o[1]};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_fwd_ad(const Tensor& x, const Tensor& res,
                                                                 at::IntArrayRef shape, const OptTensor& w,
                                                                 const OptTensor& b, double eps) {
  auto o = RowNormFn::apply(x, OptTensor(res), w, b, shape, eps, true, 0.0, false);
  return {o[0], o[1], o[2], o[3]};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd_ad(const Tensor& x, const Tensor& res, at::IntArrayRef shape,
                                                       const OptTensor& w, double eps, double offset,
                                                       bool cast_x_hat) {
  auto o = RowNormFn::apply(x, OptTensor(res), w, OptTensor(), shape, eps, false, offset, cast_x_hat);
  return {o[0], o[1], o[2]};
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
  if (record) return forward_op(x, res, shape, w, bias, eps, center, offset, cast_x_hat);
  at::AutoDispatchBelowADInplaceOrView guard;  // nothing to record: straight to the kernel
  if (stats) return forward_op(x, res, shape, w, bias, eps, center, offset, cast_x_hat);
  auto [y, h] = row_norm_infer_op().call(x, res, shape, w, bias, eps, center, offset, cast_x_hat);
  return {y, h, Tensor(), Tensor()};
}

}  // namespace normlab

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  using namespace normlab;
  m.impl("layer_norm_fwd", &layer_norm_fwd_ad);
  m.impl("rms_norm_fwd", &rms_norm_fwd_ad);
  m.impl("add_layer_norm_fwd", &add_layer_norm_fwd_ad);
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd_ad);
}
