// The group_norm family's autograd: a torch::autograd::Function per differentiable op, the Autograd
// kernels that use them, and the fast eager entry points (group_norm.h) that call the registered ops
// through cached dispatcher handles.
//
// Forward: redispatched below autograd to the forward op (CPU / Meta kernels); only when autograd
// records the call (grad mode on and an input that requires grad) -- otherwise the op computes the
// output alone, with no statistics allocated. Backward: the backward op; under create_graph=True
// the reference backward in differentiable ATen ops (reference.py's formula, statistics recomputed
// from x), so double backward works. torch.func transforms take the Python Function of op.py
// (a C++ Function refuses them), which calls the same forward/backward ops.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>


namespace normlab {

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The ops, as cached typed dispatcher handles.
const auto& op_group_norm() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::group_norm", "")
                       .typed<Tensor(const Tensor&, int64_t, const OptTensor&, const OptTensor&, double)>();
  return op;
}
const auto& op_fwd() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::group_norm_fwd", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const OptTensor&,
                                                                         const OptTensor&, int64_t, double)>();
  return op;
}
const auto& op_bwd() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::group_norm_bwd", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&,
                                                                 const Tensor&, const Tensor&, int64_t, bool)>();
  return op;
}
const auto& op_eval_fwd() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::instance_norm_eval_fwd", "")
                       .typed<Tensor(const Tensor&, const OptTensor&, const OptTensor&, const Tensor&, const Tensor&)>();
  return op;
}
const auto& op_eval_bwd() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::instance_norm_eval_bwd", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptTensor&,
                                                                 const Tensor&, const Tensor&, bool)>();
  return op;
}
const auto& op_update() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::instance_norm_update_stats", "")
                       .typed<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, int64_t)>();
  return op;
}

bool records(const Tensor& x, const OptTensor& w, const OptTensor& b) {
  if (!at::GradMode::is_enabled()) return false;
  return x.requires_grad() || (w.has_value() && w->defined() && w->requires_grad()) ||
         (b.has_value() && b->defined() && b->requires_grad());
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }
Tensor value(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }

at::ScalarType acc_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

struct Saved {
  int64_t g;
  double eps;
  bool fixed;
};

std::tuple<Tensor, Tensor, Tensor> grads(AutogradContext* ctx, const Tensor& dy, const Saved& sv) {
  const auto saved = ctx->get_saved_variables();
  const Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
  // edges: one per defined tensor argument (x, then w and b where given)
  const bool has_b = ctx->saved_data.find("b_dtype") != ctx->saved_data.end();
  const bool need_dx = ctx->needs_input_grad(0);
  const bool need_dw = w.defined() && ctx->needs_input_grad(1);
  const bool need_db = has_b && ctx->needs_input_grad(w.defined() ? 2 : 1);
  Tensor dx, dw, db;
  if (at::GradMode::is_enabled()) {  // create_graph=True: the differentiable reference backward
    const at::ScalarType acc = acc_dtype(x.scalar_type());
    const int64_t n = x.size(0), c = x.size(1), g = sv.g;
    const int64_t s = n * c == 0 ? 0 : x.numel() / (n * c);
    const std::vector<int64_t> grouped{n, g, c / g, s};
    const Tensor xa = x.to(acc).reshape(grouped), dya = dy.to(acc).reshape(grouped);
    Tensor m, r;
    if (sv.fixed) {
      m = mean.reshape({1, g, 1, 1});
      r = rstd.reshape({1, g, 1, 1});
    } else {  // the statistics as functions of x (reference.py: group_norm_stats)
      const Tensor shift = xa.narrow(2, 0, 1).narrow(3, 0, 1);
      const Tensor d = xa - shift;
      const Tensor md = d.mean({2, 3}, true);
      const Tensor xc = d - md;
      r = ((xc * xc).mean({2, 3}, true) + sv.eps).rsqrt();
      m = shift + md;
    }
    const Tensor x_hat = (xa - m) * r;
    if (need_dx) {
      const Tensor gg = w.defined() ? dya * w.to(acc).reshape({g, c / g, 1}) : dya;
      if (sv.fixed) {
        dx = r * gg;  // term 1 only
      } else {
        const Tensor term2 = gg.mean({2, 3}, true);
        const Tensor term3 = x_hat * (gg * x_hat).mean({2, 3}, true);
        dx = r * (gg - term2 - term3);
      }
      dx = dx.to(x.scalar_type()).reshape(x.sizes());
    }
    if (need_dw) dw = (dya * x_hat).sum({0, 3}).reshape({c});
    if (need_db) db = dya.sum({0, 3}).reshape({c});
  } else {
    auto [dx0, dw0, db0] = sv.fixed ? op_eval_bwd().call(dy, x, opt(w), mean, rstd, need_dx)
                                    : op_bwd().call(dy, x, opt(w), mean, rstd, sv.g, need_dx);
    if (need_dx) dx = dx0;
    if (need_dw) dw = dw0;
    if (need_db) db = db0;
  }
  if (dw.defined() && dw.scalar_type() != w.scalar_type()) dw = dw.to(w.scalar_type());
  if (db.defined()) {
    const auto bt = static_cast<at::ScalarType>(ctx->saved_data["b_dtype"].toInt());
    if (db.scalar_type() != bt) db = db.to(bt);
  }
  return {dx, dw, db};
}

void setup(AutogradContext* ctx, const Tensor& x, const OptTensor& w, const OptTensor& b, const Tensor& mean,
           const Tensor& rstd, int64_t g, double eps) {
  ctx->save_for_backward({x, value(w), mean, rstd});
  ctx->saved_data["g"] = g;
  ctx->saved_data["eps"] = eps;
  if (b.has_value() && b->defined()) ctx->saved_data["b_dtype"] = static_cast<int64_t>(b->scalar_type());
  ctx->set_materialize_grads(false);
}

// GroupNorm: (x, w, b, num_groups, eps) -> (y, mean, var, rstd) with kStats, else y alone (fewer
// outputs to wrap: the group_norm op's); the statistics are not differentiable.
template <bool kStats>
struct GroupNormFunction : public torch::autograd::Function<GroupNormFunction<kStats>> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const OptTensor& w, const OptTensor& b,
                               int64_t g, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, var, rstd] = op_fwd().call(x, w, b, g, eps);
    setup(ctx, x, w, b, mean, rstd, g, eps);
    if (!kStats) return {y};
    ctx->mark_non_differentiable({mean, var, rstd});
    return {y, mean, var, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const Tensor& dy = grads_out[0];
    if (!dy.defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    const Saved sv{ctx->saved_data["g"].toInt(), ctx->saved_data["eps"].toDouble(), false};
    auto [dx, dw, db] = grads(ctx, dy, sv);
    return {dx, dw, db, Tensor(), Tensor()};
  }
};

// InstanceNorm with fixed statistics: (x, w, b, mean, rstd) -> y; mean, rstd are constants.
struct InstanceNormEvalFunction : public torch::autograd::Function<InstanceNormEvalFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const OptTensor& w, const OptTensor& b,
                               const Tensor& mean, const Tensor& rstd) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Tensor y = op_eval_fwd().call(x, w, b, mean, rstd);
    setup(ctx, x, w, b, mean, rstd, x.size(1), 0.0);
    return {y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const Tensor& dy = grads_out[0];
    if (!dy.defined()) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
    const Saved sv{ctx->saved_data["g"].toInt(), 0.0, true};
    auto [dx, dw, db] = grads(ctx, dy, sv);
    return {dx, dw, db, Tensor(), Tensor()};
  }
};

Tensor group_norm_autograd(const Tensor& x, int64_t g, const OptTensor& w, const OptTensor& b, double eps) {
  if (records(x, w, b)) return GroupNormFunction<false>::apply(x, w, b, g, eps)[0];
  at::AutoDispatchBelowADInplaceOrView guard;
  return op_group_norm().call(x, g, w, b, eps);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_fwd_autograd(const Tensor& x, const OptTensor& w,
                                                                   const OptTensor& b, int64_t g, double eps) {
  if (records(x, w, b)) {
    auto out = GroupNormFunction<true>::apply(x, w, b, g, eps);
    return {out[0], out[1], out[2], out[3]};
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return op_fwd().call(x, w, b, g, eps);
}

Tensor instance_norm_eval_fwd_autograd(const Tensor& x, const OptTensor& w, const OptTensor& b, const Tensor& mean,
                                       const Tensor& rstd) {
  if (records(x, w, b)) return InstanceNormEvalFunction::apply(x, w, b, mean, rstd)[0];
  at::AutoDispatchBelowADInplaceOrView guard;
  return op_eval_fwd().call(x, w, b, mean, rstd);
}

// The backward ops are not differentiable (the Functions' double backward uses ATen ops instead).
std::tuple<Tensor, Tensor, Tensor> group_norm_bwd_autograd(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                           const Tensor& mean, const Tensor& rstd, int64_t g,
                                                           bool need_dx) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return op_bwd().call(dy, x, w, mean, rstd, g, need_dx);
}

std::tuple<Tensor, Tensor, Tensor> instance_norm_eval_bwd_autograd(const Tensor& dy, const Tensor& x,
                                                                   const OptTensor& w, const Tensor& mean,
                                                                   const Tensor& rstd, bool need_dx) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return op_eval_bwd().call(dy, x, w, mean, rstd, need_dx);
}

// The running statistics change in place: their version counters move once, as for any in-place
// torch op (inference tensors have none).
void instance_norm_update_stats_autograd(const Tensor& rm, const Tensor& rv, const Tensor& mean, const Tensor& var,
                                         double momentum, int64_t n_spatial) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op_update().call(rm, rv, mean, var, momentum, n_spatial);
  }
  for (const Tensor* t : {&rm, &rv})
    if (!t->is_inference()) torch::autograd::impl::bump_version(*t);
}

}  // namespace

Tensor group_norm_entry(const Tensor& x, int64_t num_groups, const OptTensor& w, const OptTensor& b, double eps) {
  return op_group_norm().call(x, num_groups, w, b, eps);
}

Tensor instance_norm_entry(const Tensor& x_in, const OptTensor& rm, const OptTensor& rv, const OptTensor& w,
                           const OptTensor& b, bool use_input_stats, double momentum, double eps) {
  const Tensor x = x_in.contiguous();  // torch's instance_norm output is contiguous
  const int64_t n = x.size(0), c = x.size(1);
  const bool running = rm.has_value() && rm->defined();
  if (use_input_stats) {
    if (!running) return op_group_norm().call(x, c, w, b, eps);
    auto [y, mean, var, rstd] = op_fwd().call(x, w, b, c, eps);
    if (x.numel() > 0) op_update().call(*rm, *rv, mean, var, momentum, x.numel() / (n * c));
    return y;
  }
  TORCH_CHECK(running, "instance_norm: expected running_mean and running_var when use_input_stats=False, got None");
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  Tensor mean, rstd;
  {
    at::NoGradGuard no_grad;  // constants of the map; a copy, safe from later updates of the buffers
    mean = rm->to(acc, /*non_blocking=*/false, /*copy=*/records(x, w, b));
    rstd = (rv->to(acc) + eps).rsqrt();
  }
  return op_eval_fwd().call(x, w, b, mean, rstd);
}

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  m.impl("group_norm", &group_norm_autograd);
  m.impl("group_norm_fwd", &group_norm_fwd_autograd);
  m.impl("group_norm_bwd", &group_norm_bwd_autograd);
  m.impl("instance_norm_eval_fwd", &instance_norm_eval_fwd_autograd);
  m.impl("instance_norm_eval_bwd", &instance_norm_eval_bwd_autograd);
  m.impl("instance_norm_update_stats", &instance_norm_update_stats_autograd);
}

}  // namespace normlab
