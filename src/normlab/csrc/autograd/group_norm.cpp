// The group_norm family's autograd: one hand-built node (GroupNormBackward) for every differentiable
// op, the Autograd kernels that attach it, and the fast eager entry points (group_norm.h): those of
// normlab.functional (group_norm_fast / instance_norm_fast: the arguments checked here, the node
// attached here) and those of op.py (the registered ops through cached dispatcher handles).
//
// Forward: redispatched below autograd to the forward op (CPU / Meta kernels); only when autograd
// records the call (grad mode on and an input that requires grad) -- otherwise the op computes the
// output alone, with no statistics allocated. Backward: the backward op; under create_graph=True
// the reference backward in differentiable ATen ops (reference.py's formula, statistics recomputed
// from x), so double backward works. torch.func transforms take the Python Function of op.py
// (its vmap and jvp rules), which calls the same forward/backward ops.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include "autograd/row_stats_node.h"
#include "cpu/group_norm_kernels.h"

#include <cmath>


namespace normlab {

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
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

at::ScalarType acc_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// The backward node of GroupNorm (and of InstanceNorm, which is GroupNorm with G = C, and of
// InstanceNorm with fixed statistics: `fixed_`): the grad of y in, the grads of (x, weight, bias)
// out, one per edge (an absent parameter has an empty edge). Built by hand as torch's generated
// autograd code builds its nodes: the saved values are fields, not the IValue dict and variable
// bookkeeping of torch::autograd::Function (several microseconds a call).
struct GroupNormBackward : public RowStatsNode {  // saves x, w, mean, rstd
  int64_t g_ = 1;
  double eps_ = 0;
  bool fixed_ = false, has_w_ = false, has_b_ = false;
  at::ScalarType b_dtype_ = at::kFloat;

  std::string name() const override { return fixed_ ? "InstanceNormEvalBackward" : "GroupNormBackward"; }

  variable_list apply(variable_list&& grads_out) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list out(3);
    const Tensor& dy = grads_out[0];
    if (!dy.defined()) return out;
    const bool need_dx = should_compute_output(0);
    const bool need_dw = has_w_ && should_compute_output(1);
    const bool need_db = has_b_ && should_compute_output(2);
    if (!(need_dx || need_dw || need_db)) return out;
    const Tensor x = x_.unpack(getptr()), w = has_w_ ? w_.unpack() : Tensor();
    const Tensor mean = mean_.unpack(), rstd = rstd_.unpack();
    Tensor dx, dw, db;
    if (at::GradMode::is_enabled()) {  // create_graph=True: the differentiable reference backward
      const at::ScalarType acc = acc_dtype(x.scalar_type());
      const int64_t n = x.size(0), c = x.size(1), g = g_;
      const int64_t s = n * c == 0 ? 0 : x.numel() / (n * c);
      const std::vector<int64_t> grouped{n, g, c / g, s};
      const Tensor xa = x.to(acc).reshape(grouped), dya = dy.to(acc).reshape(grouped);
      Tensor m, r;
      if (fixed_) {
        m = mean.reshape({1, g, 1, 1});
        r = rstd.reshape({1, g, 1, 1});
      } else {  // the statistics as functions of x (reference.py: group_norm_stats)
        const Tensor shift = xa.narrow(2, 0, 1).narrow(3, 0, 1);
        const Tensor d = xa - shift;
        const Tensor md = d.mean({2, 3}, true);
        const Tensor xc = d - md;
        r = ((xc * xc).mean({2, 3}, true) + eps_).rsqrt();
        m = shift + md;
      }
      const Tensor x_hat = (xa - m) * r;
      if (need_dx) {
        const Tensor gg = w.defined() ? dya * w.to(acc).reshape({g, c / g, 1}) : dya;
        if (fixed_) {
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
      at::AutoDispatchBelowADInplaceOrView guard;
      auto [dx0, dw0, db0] = fixed_ ? op_eval_bwd().call(dy, x, opt(w), mean, rstd, need_dx)
                                    : op_bwd().call(dy, x, opt(w), mean, rstd, g_, need_dx);
      if (need_dx) dx = dx0;
      if (need_dw) dw = dw0;
      if (need_db) db = db0;
    }
    if (dw.defined() && dw.scalar_type() != w.scalar_type()) dw = dw.to(w.scalar_type());
    if (db.defined() && db.scalar_type() != b_dtype_) db = db.to(b_dtype_);
    out[0] = dx;
    out[1] = dw;
    out[2] = db;
    return out;
  }
};

// A GroupNormBackward node on y, saving x, w and the statistics (mean, rstd).
void attach(const Tensor& y, const Tensor& x, const OptTensor& w, const OptTensor& b, const Tensor& mean,
            const Tensor& rstd, int64_t g, double eps, bool fixed) {
  auto node = c10::make_intrusive<GroupNormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
  node->g_ = g;
  node->eps_ = eps;
  node->fixed_ = fixed;
  node->has_w_ = w.has_value() && w->defined();
  node->has_b_ = b.has_value() && b->defined();
  if (node->has_b_) node->b_dtype_ = b->scalar_type();
  torch::autograd::set_history(y, node);
  node->x_ = torch::autograd::SavedVariable(x, false);
  if (node->has_w_) node->w_ = torch::autograd::SavedVariable(*w, false);
  node->mean_ = torch::autograd::SavedVariable(mean, false);
  node->rstd_ = torch::autograd::SavedVariable(rstd, false);
}

// GroupNorm recorded by autograd: the forward op below autograd, then the node on y; the
// statistics (N, G) are outputs without a gradient.
std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_recorded(const Tensor& x, const OptTensor& w,
                                                               const OptTensor& b, int64_t g, double eps) {
  Tensor y, mean, var, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, mean, var, rstd) = op_fwd().call(x, w, b, g, eps);
  }
  attach(y, x, w, b, mean, rstd, g, eps, false);
  return {y, mean, var, rstd};
}

Tensor group_norm_autograd(const Tensor& x, int64_t g, const OptTensor& w, const OptTensor& b, double eps) {
  if (records(x, w, b)) return std::get<0>(group_norm_recorded(x, w, b, g, eps));
  at::AutoDispatchBelowADInplaceOrView guard;
  return op_group_norm().call(x, g, w, b, eps);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_fwd_autograd(const Tensor& x, const OptTensor& w,
                                                                   const OptTensor& b, int64_t g, double eps) {
  if (records(x, w, b)) return group_norm_recorded(x, w, b, g, eps);
  at::AutoDispatchBelowADInplaceOrView guard;
  return op_fwd().call(x, w, b, g, eps);
}

Tensor instance_norm_eval_fwd_autograd(const Tensor& x, const OptTensor& w, const OptTensor& b, const Tensor& mean,
                                       const Tensor& rstd) {
  Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    y = op_eval_fwd().call(x, w, b, mean, rstd);
  }
  if (records(x, w, b)) attach(y, x, w, b, mean, rstd, x.size(1), 0.0, true);
  return y;
}

// The backward ops are not differentiable (the node's double backward uses ATen ops instead).
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

// Whether t is a strided CPU tensor.
bool cpu_strided(const Tensor& t) { return t.device().is_cpu() && t.layout() == at::kStrided; }

// Whether x is a strided CPU tensor of a served dtype with at least `min_dim` dims and each
// parameter None or a strided CPU tensor of shape (C,) in x's dtype (or float32 beside half
// precision): what normlab._checks.cpu_params_fit accepts.
bool fits_fast(const Tensor& x, int64_t min_dim, std::initializer_list<const OptTensor*> params) {
  if (!x.defined() || !cpu_strided(x) || x.dim() < min_dim) return false;
  const auto st = x.scalar_type();
  const bool half = st == at::kBFloat16 || st == at::kHalf;
  if (!(half || st == at::kFloat || st == at::kDouble)) return false;
  const int64_t c = x.size(1);
  for (const OptTensor* p : params) {
    if (!p->has_value() || !(*p)->defined()) continue;
    const Tensor& t = **p;
    if (!cpu_strided(t) || t.dim() != 1 || t.size(0) != c) return false;
    if (!(t.scalar_type() == st || (half && t.scalar_type() == at::kFloat))) return false;
  }
  return true;
}

bool plain_eps(double eps) { return std::isfinite(eps) && eps >= 0; }

// GroupNorm without the dispatcher's Autograd step: the node attached here when autograd records.
Tensor group_norm_direct(const Tensor& x, int64_t num_groups, const OptTensor& w, const OptTensor& b, double eps) {
  if (records(x, w, b)) return std::get<0>(group_norm_recorded(x, w, b, num_groups, eps));
  at::AutoDispatchBelowADInplaceOrView guard;
  return op_group_norm().call(x, num_groups, w, b, eps);
}

}  // namespace

Tensor group_norm_entry(const Tensor& x, int64_t num_groups, const OptTensor& w, const OptTensor& b, double eps) {
  return op_group_norm().call(x, num_groups, w, b, eps);
}

std::optional<Tensor> group_norm_fast(const Tensor& x, int64_t g, const OptTensor& w, const OptTensor& b,
                                      double eps) {
  if (!plain_eps(eps) || g <= 0 || !fits_fast(x, 2, {&w, &b})) return std::nullopt;
  const int64_t c = x.size(1), numel = x.numel();
  if (c % g != 0 || numel == 0 || numel == g) return std::nullopt;  // not divisible, empty, one value a group
  return group_norm_direct(x, g, w, b, eps);
}

// x_in.contiguous() for a channels_last x_in of at least 16 channels by the kernels' blocked transpose
// (as cpu/group_norm.cpp's contiguous_as: InstanceNorm2d(64) channels_last (1, 64, 128, 128) forward
// and backward 0.76x torch.nn with torch's copies, 1.45x with both transposes); differentiable as
// contiguous() is (the gradient passes through as it is).
struct ToContiguous : public torch::autograd::Function<ToContiguous> {
  static Tensor forward(torch::autograd::AutogradContext*, const Tensor& x) {
    Tensor out = at::empty(x.sizes(), x.options());
    const int64_t n = x.size(0), c = x.size(1);
    group_norm::nhwc_to_nchw(x.data_ptr(), out.data_ptr(), n, c, x.numel() / (n * c), int64_t(x.element_size()));
    return out;
  }
  static variable_list backward(torch::autograd::AutogradContext*, variable_list g) { return {g[0]}; }
};

Tensor contiguous_input(const Tensor& x) {
  const bool cl = (x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
                  (x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d));
  if (x.is_contiguous() || !cl || x.numel() == 0 || !x.device().is_cpu() || x.size(1) < 16) return x.contiguous();
  return ToContiguous::apply(x);
}

Tensor instance_norm_entry(const Tensor& x_in, const OptTensor& rm, const OptTensor& rv, const OptTensor& w,
                           const OptTensor& b, bool use_input_stats, double momentum, double eps) {
  const Tensor x = contiguous_input(x_in);  // torch's instance_norm output is contiguous
  const int64_t n = x.size(0), c = x.size(1);
  const bool running = rm.has_value() && rm->defined();
  if (use_input_stats) {
    if (!running) return group_norm_direct(x, c, w, b, eps);
    Tensor y, mean, var, rstd;
    if (records(x, w, b)) {
      std::tie(y, mean, var, rstd) = group_norm_recorded(x, w, b, c, eps);
    } else {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(y, mean, var, rstd) = op_fwd().call(x, w, b, c, eps);
    }
    if (x.numel() > 0) instance_norm_update_stats_autograd(*rm, *rv, mean, var, momentum, x.numel() / (n * c));
    return y;
  }
  TORCH_CHECK(running, "instance_norm: expected running_mean and running_var when use_input_stats=False, got None");
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  const bool rec = records(x, w, b);
  Tensor mean, rstd;
  {
    at::NoGradGuard no_grad;  // constants of the map; a copy, safe from later updates of the buffers
    mean = rm->to(acc, /*non_blocking=*/false, /*copy=*/rec);
    rstd = (rv->to(acc) + eps).rsqrt();
  }
  return instance_norm_eval_fwd_autograd(x, w, b, mean, rstd);
}

std::optional<Tensor> instance_norm_fast(const Tensor& x, const OptTensor& rm, const OptTensor& rv,
                                         const OptTensor& w, const OptTensor& b, bool use_input_stats,
                                         double momentum, double eps) {
  if (!plain_eps(eps) || !(momentum >= 0 && momentum <= 1)) return std::nullopt;
  if (!fits_fast(x, use_input_stats ? 3 : 2, {&rm, &rv, &w, &b})) return std::nullopt;
  const bool has_rm = rm.has_value() && rm->defined(), has_rv = rv.has_value() && rv->defined();
  if (has_rm != has_rv || !(has_rm || use_input_stats)) return std::nullopt;
  const int64_t numel = x.numel();
  if (numel == 0 || (use_input_stats && numel == x.size(0) * x.size(1))) return std::nullopt;  // empty; S == 1
  return instance_norm_entry(x, rm, rv, w, b, use_input_stats, momentum, eps);
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
