// BatchNorm's Autograd kernels (one hand-built autograd node, BatchNormBackward, for both
// forwards), the ADInplaceOrView kernel of the running-statistics update (version counters), and
// the fast eager entry points bound in csrc/batch_norm.h (batch_norm_fast, batch_norm_module:
// the arguments checked in C++, the kernels called directly, the same node). Backward: docs/derivations/batch_norm.md; under
// create_graph=True it is the reference formula in differentiable ATen ops (reference.py's
// batch_norm_train_backward_ref / batch_norm_eval_backward_ref), so double backward works.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "cpu/batch_norm.h"

#include <cmath>

namespace normlab::bn {

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

// A tensor the CPU kernels read directly: dense, on the CPU, no Python-dispatched subclass
// (FakeTensor, functional tensors) or other dispatch layer in front of it.
bool plain_cpu(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && !t.key_set().has(c10::DispatchKey::Python) &&
         !t.key_set().has(c10::DispatchKey::Functionalize) && !t.is_conj() && !t.is_neg();
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

// The backward node of both forwards (training: through the batch statistics; evaluation: the
// running ones are constants): dy in, the grads of (x, w, b) out, one per edge (an absent w or b
// has an empty edge). Built by hand, as torch's generated autograd code builds its nodes: the
// saved values are fields, not torch::autograd::Function's IValue dict and variable bookkeeping
// (several microseconds a call: most of a small BatchNorm's time). Saved: x (in its canonical
// layout), w, and the (3, C) float64 statistics mean, var, rstd.
struct BatchNormBackward : public torch::autograd::Node {
  torch::autograd::SavedVariable x_, w_, stats_;
  double eps_ = 0;
  bool train_ = true, has_w_ = false, has_b_ = false;
  at::ScalarType w_dtype_ = at::kFloat, b_dtype_ = at::kFloat;

  std::string name() const override { return train_ ? "BatchNormBackward" : "BatchNormEvalBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x_.reset_data();
    w_.reset_data();
    stats_.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const at::Tensor& dy = grads[0];
    const bool need_x = should_compute_output(0), need_w = has_w_ && should_compute_output(1),
               need_b = has_b_ && should_compute_output(2);
    variable_list out(3);
    if (!dy.defined() || !(need_x || need_w || need_b)) return out;
    const at::Tensor x = x_.unpack(getptr()), w = has_w_ ? w_.unpack() : at::Tensor(), stats = stats_.unpack();
    at::Tensor dx, dw, db;
    if (at::GradMode::is_enabled()) {  // create_graph=True: the differentiable reference
      auto r = backward_ref(dy, x, w, stats, eps_, train_, need_x, need_w, need_b);
      dx = r[0];
      if (need_w) dw = r[1].to(w_dtype_);
      if (need_b) db = r[2].to(b_dtype_);
    } else if (plain_cpu(x) && plain_cpu(dy)) {  // the kernel, dw and db straight in the parameters' dtypes
      std::tie(dx, dw, db) = bwd_typed(dy, x, has_w_ ? OptT(w) : OptT(), stats, train_, need_x, need_w, need_b,
                                       w_dtype_, b_dtype_);
    } else {  // another backend below (Meta, Python-dispatched tensors): the op
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(dx, dw, db) = bwd_op().call(dy, x, has_w_ ? OptT(w) : OptT(), stats, train_, need_x, need_w || need_b);
      if (need_w) dw = dw.to(w_dtype_);
      if (need_b) db = db.to(b_dtype_);
    }
    if (need_x) out[0] = dx;
    if (need_w) out[1] = dw;
    if (need_b) out[2] = db;
    return out;
  }
};

// y (and the saved statistics) recorded: a BatchNormBackward node on y with edges to x, w, b.
// x must be canonical already (the caller's recorded .contiguous keeps it in the graph).
void attach(const at::Tensor& y, const at::Tensor& x, const OptT& w, const OptT& b, const at::Tensor& stats,
            double eps, bool train) {
  auto node = c10::make_intrusive<BatchNormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
  node->train_ = train;
  node->eps_ = eps;
  node->has_w_ = defined(w);
  node->has_b_ = defined(b);
  if (node->has_w_) node->w_dtype_ = w->scalar_type();
  if (node->has_b_) node->b_dtype_ = b->scalar_type();
  torch::autograd::set_history(y, node);
  node->x_ = torch::autograd::SavedVariable(x, false);
  if (node->has_w_) node->w_ = torch::autograd::SavedVariable(*w, false);
  node->stats_ = torch::autograd::SavedVariable(stats, false);
}

std::tuple<at::Tensor, at::Tensor> train_fwd_autograd(const at::Tensor& x, const OptT& w, const OptT& b, double eps) {
  if (!needs_grad(x, w, b)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return train_op().call(x, w, b, eps);
  }
  // the layout is settled here, recorded (a copy inside the node would cut x from the double
  // backward's graph)
  const at::Tensor xc = x.contiguous(x.suggest_memory_format());
  at::Tensor y, stats;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, stats) = train_op().call(xc, w, b, eps);
  }
  attach(y, xc, w, b, stats, eps, true);
  return {y, stats};
}

at::Tensor eval_fwd_autograd(const at::Tensor& x, const at::Tensor& rm, const at::Tensor& rv, const OptT& w,
                             const OptT& b, double eps) {
  if (!needs_grad(x, w, b)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return eval_op().call(x, rm, rv, w, b, eps);
  }
  const at::Tensor xc = x.contiguous(x.suggest_memory_format());
  at::Tensor y, stats;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    y = eval_op().call(xc, rm, rv, w, b, eps);
    // the running statistics as the kernel reads them: mean, var, rstd = 1 / sqrt(var + eps) in float64
    const at::Tensor m = rm.detach().to(at::kDouble), v = rv.detach().to(at::kDouble);
    stats = at::stack({m, v, at::reciprocal(at::sqrt(v + eps))});
  }
  attach(y, xc, w, b, stats, eps, false);
  return y;
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

namespace {

bool served(at::ScalarType st) {
  return st == at::kFloat || st == at::kDouble || st == at::kBFloat16 || st == at::kHalf;
}

// A per-channel tensor normlab.functional's checks accept without a word: absent, or a plain CPU
// tensor of shape (C,) in x's dtype (or float32 beside a half-precision x).
bool chan_fits(const OptT& t, int64_t c, at::ScalarType xt) {
  if (!defined(t)) return true;
  if (!plain_cpu(*t) || t->dim() != 1 || t->size(0) != c) return false;
  const auto st = t->scalar_type();
  return st == xt || (st == at::kFloat && (xt == at::kBFloat16 || xt == at::kHalf));
}

// Whether the arguments are ones normlab.functional.batch_norm's checks accept without a word
// and the kernels serve (see batch_norm_fast).
bool fits_fast(const at::Tensor& x, const OptT& rm, const OptT& rv, const OptT& w, const OptT& b, bool training,
               double momentum, double eps) {
  if (!x.defined() || x.dim() < 2 || !plain_cpu(x) || !served(x.scalar_type())) return false;
  if (!(std::isfinite(eps) && (training ? eps > 0 : eps >= 0)) || !(momentum >= 0 && momentum <= 1)) return false;
  if (defined(rm) != defined(rv) || (!training && !defined(rm))) return false;
  const int64_t c = x.size(1), numel = x.numel();
  if (numel == 0 || (training && numel <= c)) return false;  // empty: the reference path; one value: the error
  const auto xt = x.scalar_type();
  return chan_fits(rm, c, xt) && chan_fits(rv, c, xt) && chan_fits(w, c, xt) && chan_fits(b, c, xt);
}

// The fast path's forward, arguments checked: the kernels called directly (no dispatcher), the
// running statistics updated in training, a BatchNormBackward node where autograd records. The
// (3, C) statistics are a tensor only when the node keeps them.
at::Tensor fast_forward(const at::Tensor& x, const OptT& rm, const OptT& rv, const OptT& w, const OptT& b,
                        bool training, double momentum, double eps) {
  const int64_t c = x.size(1);
  const bool record = needs_grad(x, w, b);
  at::Tensor xc = x, y, stats;
  StatsScratch scratch(record ? 0 : 3 * c);
  double* s;
  if (record) {
    xc = x.contiguous(x.suggest_memory_format());  // recorded: a copy stays in the graph
    stats = at::empty({3, c}, x.options().dtype(at::kDouble));
    s = stats.data_ptr<double>();
  } else {
    s = scratch.data();
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    y = forward_into(xc, w, b, rm, rv, eps, training, s);
  }
  if (training && defined(rm)) {
    update_running_raw(*rm, *rv, s, s + c, x.numel() / c, momentum);
    bump(*rm);
    bump(*rv);
  }
  if (record) attach(y, xc, w, b, stats, eps, training);
  return y;
}

bool inplace_ok(const at::Tensor& t) { return !t.is_inference() || c10::InferenceMode::is_enabled(); }

}  // namespace

std::optional<at::Tensor> batch_norm_fast(const at::Tensor& x, const OptT& rm, const OptT& rv, const OptT& w,
                                          const OptT& b, bool training, double momentum, double eps) {
  if (!fits_fast(x, rm, rv, w, b, training, momentum, eps)) return std::nullopt;
  if (training && defined(rm) && !(inplace_ok(*rm) && inplace_ok(*rv))) return std::nullopt;
  return fast_forward(x, rm, rv, w, b, training, momentum, eps);
}

std::optional<at::Tensor> batch_norm_module(const at::Tensor& x, const OptT& w, const OptT& b, const OptT& rm,
                                            const OptT& rv, const OptT& nbt, bool training, bool track,
                                            std::optional<double> momentum, double eps, int64_t num_features,
                                            int64_t dims) {
  if (!x.defined() || x.dim() >= 63 || !((dims >> x.dim()) & 1)) return std::nullopt;  // _check_input_dim
  if ((defined(w) || defined(rm)) && x.size(1) != num_features) return std::nullopt;  // _check_num_channels
  // num_batches_tracked counts this batch (training, tracking): a plain CPU int64 scalar
  const bool count = training && track && defined(nbt);
  if (count && !(plain_cpu(*nbt) && nbt->scalar_type() == at::kLong && nbt->numel() == 1 && inplace_ok(*nbt)))
    return std::nullopt;
  const bool use_batch = training || (!defined(rm) && !defined(rv));
  const bool pass_running = !training || track;
  const OptT rm_p = pass_running ? rm : OptT(), rv_p = pass_running ? rv : OptT();
  int64_t* n = count ? nbt->data_ptr<int64_t>() : nullptr;
  // _NormBase._momentum_factor: momentum, or the cumulative average's 1 / (count + 1)
  const double factor = momentum.has_value() ? *momentum : (n ? 1.0 / double(*n + 1) : 0.0);
  if (!fits_fast(x, rm_p, rv_p, w, b, use_batch, factor, eps)) return std::nullopt;
  if (use_batch && defined(rm_p) && !(inplace_ok(*rm_p) && inplace_ok(*rv_p))) return std::nullopt;
  at::Tensor y = fast_forward(x, rm_p, rv_p, w, b, use_batch, factor, eps);
  if (n) {  // counted after the call succeeded, as the Python forward does
    *n += 1;
    bump(*nbt);
  }
  return y;
}

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  m.impl("batch_norm_train_fwd", &train_fwd_autograd);
  m.impl("batch_norm_eval_fwd", &eval_fwd_autograd);
}

TORCH_LIBRARY_IMPL(normlab, ADInplaceOrView, m) { m.impl("batch_norm_update_stats", &update_stats_inplace); }

}  // namespace normlab::bn
