// BatchNorm's Autograd kernels (a torch::autograd::Function per differentiable op), the
// ADInplaceOrView kernel of the running-statistics update (version counters), and the fast eager
// entry points bound in csrc/batch_norm.h. Backward: docs/derivations/batch_norm.md; under
// create_graph=True it is the reference formula in differentiable ATen ops (reference.py's
// batch_norm_train_backward_ref / batch_norm_eval_backward_ref), so double backward works.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "cpu/batch_norm.h"

namespace normlab::bn {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;
using OptT = std::optional<at::Tensor>;

namespace {

// Cached dispatcher handles of the registered ops (cheaper than torch.ops from Python).
const auto& train_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::batch_norm_train_fwd", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const OptT&, const OptT&, double)>();
  return op;
}
const auto& eval_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::batch_norm_eval_fwd", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptT&,
                                         const OptT&, double)>();
  return op;
}
const auto& bwd_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::batch_norm_bwd", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const OptT&, const at::Tensor&, bool, bool, bool)>();
  return op;
}
const auto& update_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::batch_norm_update_stats", "")
                       .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&)>();
  return op;
}

bool defined(const OptT& t) { return t.has_value() && t->defined(); }

bool needs_grad(const at::Tensor& x, const OptT& w, const OptT& b) {
  if (!at::GradMode::is_enabled()) return false;
  return x.requires_grad() || (defined(w) && w->requires_grad()) || (defined(b) && b->requires_grad());
}

at::ScalarType acc_of(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

std::vector<int64_t> stat_shape(const at::Tensor& x) {
  std::vector<int64_t> s(x.dim(), 1);
  s[1] = x.size(1);
  return s;
}

// Sum over N and every spatial dim, kept as (1, C, 1, ...): the spatial dims first, then N
// (reference.py's _channel_sum).
at::Tensor channel_sum(const at::Tensor& t) {
  at::Tensor s = t;
  if (t.dim() > 2) {
    std::vector<int64_t> dims;
    for (int64_t d = 2; d < t.dim(); ++d) dims.push_back(d);
    s = s.sum(dims, true);
  }
  return s.sum(0, true);
}

at::Tensor channel_mean(const at::Tensor& t) { return channel_sum(t) / double(t.numel() / t.size(1)); }

at::Tensor per_channel(const at::Tensor& t, const at::Tensor& x, at::ScalarType acc) {
  return t.to(acc).reshape(stat_shape(x));
}

// (dx, dw, db) of BatchNorm in differentiable ATen ops (create_graph=True).
// train: the statistics recomputed as functions of x (the kernel's mean plus the residual mean);
//   dx = rstd * (g - mean_c(g) - x_hat * mean_c(g * x_hat)),  g = dy * w   (terms 1, 2, 3)
// eval:  dx = dy * w * rstd (term 1 only: the running statistics are constants)
// dw = sum(dy * x_hat), db = sum(dy) (dw, db in float64 -> the caller casts)
std::array<at::Tensor, 3> backward_ref(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                       const at::Tensor& stats, double eps, bool train, bool need_dx, bool need_dw,
                                       bool need_db) {
  const at::ScalarType acc = acc_of(x);
  const auto shape = stat_shape(x);
  const at::Tensor xa = x.to(acc), dya = dy.to(acc);
  at::Tensor mean = stats.select(0, 0).to(acc).reshape(shape);
  at::Tensor rstd;
  if (train) {
    mean = mean + channel_mean(xa - mean);
    rstd = (channel_mean((xa - mean).square()) + eps).rsqrt();
  } else {
    rstd = stats.select(0, 2).to(acc).reshape(shape);
  }
  const at::Tensor x_hat = (xa - mean) * rstd;
  at::Tensor dx, dw, db;
  if (need_dx) {
    const at::Tensor g = w.defined() ? dya * per_channel(w, x, acc) : dya;
    at::Tensor d = train ? rstd * (g - channel_mean(g) - x_hat * channel_mean(g * x_hat)) : g * rstd;
    dx = d.to(x.scalar_type()).contiguous(x.suggest_memory_format());
  }
  if (need_dw && w.defined()) dw = channel_sum(dya * x_hat).reshape(-1);
  if (need_db) db = channel_sum(dya).reshape(-1);
  return {dx, dw, db};
}

// The gradients for (x, w, b) from saved x, w, stats.
variable_list grads(AutogradContext* ctx, const at::Tensor& dy, bool train, bool need_x, bool need_w, bool need_b) {
  auto saved = ctx->get_saved_variables();
  const at::Tensor &x = saved[0], &w = saved[1], &stats = saved[2];
  const int64_t b_dtype = ctx->saved_data["b_dtype"].toInt();
  need_w = need_w && w.defined();
  need_b = need_b && b_dtype >= 0;
  if (!dy.defined() || !(need_x || need_w || need_b)) return {at::Tensor(), at::Tensor(), at::Tensor()};
  at::Tensor dx, dw, db;
  if (at::GradMode::is_enabled()) {  // create_graph=True: the differentiable reference
    auto r = backward_ref(dy, x, w, stats, ctx->saved_data["eps"].toDouble(), train, need_x, need_w, need_b);
    dx = r[0], dw = r[1], db = r[2];
  } else {
    std::tie(dx, dw, db) = bwd_op().call(dy, x, w.defined() ? OptT(w) : OptT(), stats, train, need_x, need_w || need_b);
  }
  return {need_x ? dx : at::Tensor(), need_w ? dw.to(w.scalar_type()) : at::Tensor(),
          need_b ? db.to(at::ScalarType(b_dtype)) : at::Tensor()};
}

void save(AutogradContext* ctx, const at::Tensor& x, const OptT& w, const OptT& b, const at::Tensor& stats,
          double eps) {
  ctx->save_for_backward({x, defined(w) ? *w : at::Tensor(), stats});
  ctx->saved_data["eps"] = eps;
  ctx->saved_data["has_w"] = defined(w);
  ctx->saved_data["b_dtype"] = defined(b) ? int64_t(b->scalar_type()) : int64_t(-1);
  ctx->set_materialize_grads(false);
}

// Whether x, w, b need gradients: the edges are the defined tensor inputs only (x, then the
// `first` - 1 other tensors before w, then w and b where given).
std::tuple<bool, bool, bool> needs(AutogradContext* ctx, size_t first) {
  const bool has_w = ctx->saved_data["has_w"].toBool(), has_b = ctx->saved_data["b_dtype"].toInt() >= 0;
  return {ctx->needs_input_grad(0), has_w && ctx->needs_input_grad(first),
          has_b && ctx->needs_input_grad(first + (has_w ? 1 : 0))};
}

struct TrainFn : public torch::autograd::Function<TrainFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const OptT& w, const OptT& b, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, stats] = train_op().call(x, w, b, eps);
    save(ctx, x, w, b, stats, eps);
    ctx->mark_non_differentiable({stats});
    return {y, stats};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto [nx, nw, nb] = needs(ctx, 1);
    auto r = grads(ctx, g[0], true, nx, nw, nb);
    return {r[0], r[1], r[2], at::Tensor()};
  }
};

struct EvalFn : public torch::autograd::Function<EvalFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& rm, const at::Tensor& rv,
                               const OptT& w, const OptT& b, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor y = eval_op().call(x, rm, rv, w, b, eps);
    // the running statistics as the kernel reads them: mean, var, rstd = 1 / sqrt(var + eps) in float64
    const at::Tensor m = rm.to(at::kDouble), v = rv.to(at::kDouble);
    save(ctx, x, w, b, at::stack({m, v, at::reciprocal(at::sqrt(v + eps))}), eps);
    return {y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto [nx, nw, nb] = needs(ctx, 3);
    auto r = grads(ctx, g[0], false, nx, nw, nb);
    return {r[0], at::Tensor(), at::Tensor(), r[1], r[2], at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> train_fwd_autograd(const at::Tensor& x, const OptT& w, const OptT& b, double eps) {
  if (!needs_grad(x, w, b)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return train_op().call(x, w, b, eps);
  }
  // the layout is settled here, recorded (a copy inside the Function would cut x from the
  // double backward's graph)
  auto r = TrainFn::apply(x.contiguous(x.suggest_memory_format()), w, b, eps);
  return {r[0], r[1]};
}

at::Tensor eval_fwd_autograd(const at::Tensor& x, const at::Tensor& rm, const at::Tensor& rv, const OptT& w,
                             const OptT& b, double eps) {
  if (!needs_grad(x, w, b)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return eval_op().call(x, rm, rv, w, b, eps);
  }
  return EvalFn::apply(x.contiguous(x.suggest_memory_format()), rm, rv, w, b, eps)[0];
}

void bump(const at::Tensor& t) {
  if (!t.is_inference()) torch::autograd::impl::bump_version(t);
}

// The update writes the buffers in place: their version counters move, as for an in-place torch op.
void update_stats_inplace(const at::Tensor& rm, const at::Tensor& rv, const at::Tensor& stats, int64_t n,
                          const at::Tensor& momentum) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    update_op().call(rm, rv, stats, n, momentum);
  }
  bump(rm);
  bump(rv);
}

}  // namespace

at::Tensor batch_norm_entry(const at::Tensor& x, const OptT& w, const OptT& b, const OptT& rm, const OptT& rv,
                            bool training, double momentum, double eps) {
  if (!training) {
    TORCH_CHECK(defined(rm) && defined(rv), "normlab batch_norm: running_mean and running_var must be defined in "
                "evaluation mode (training=False)");
    return eval_op().call(x, *rm, *rv, w, b, eps);
  }
  auto [y, stats] = train_op().call(x, w, b, eps);
  if (defined(rm)) {
    TORCH_CHECK(defined(rv), "normlab batch_norm: running_mean given without running_var");
    const int64_t c = x.size(1);
    const double* s = stats.const_data_ptr<double>();
    update_running_raw(*rm, *rv, s, s + c, x.numel() / c, momentum);
    bump(*rm);
    bump(*rv);
  }
  return y;
}

void batch_norm_update_entry(const at::Tensor& rm, const at::Tensor& rv, const at::Tensor& stats, int64_t n,
                             double momentum) {
  TORCH_CHECK(rm.dim() == 1 && rv.sizes() == rm.sizes() && stats.dim() == 2 && stats.size(0) >= 2 &&
                  stats.size(1) == rm.size(0) && stats.scalar_type() == at::kDouble && stats.is_contiguous(),
              "normlab batch_norm update: expected (C,) running statistics and (2 or 3, C) contiguous float64 "
              "statistics, got ", rm.sizes(), ", ", rv.sizes(), ", ", stats.sizes(), " ", stats.scalar_type());
  const double* s = stats.const_data_ptr<double>();
  update_running_raw(rm, rv, s, s + rm.size(0), n, momentum);
  bump(rm);
  bump(rv);
}

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  m.impl("batch_norm_train_fwd", &train_fwd_autograd);
  m.impl("batch_norm_eval_fwd", &eval_fwd_autograd);
}

TORCH_LIBRARY_IMPL(normlab, ADInplaceOrView, m) { m.impl("batch_norm_update_stats", &update_stats_inplace); }

}  // namespace normlab::bn
