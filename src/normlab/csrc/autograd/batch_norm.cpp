// The batch_norm family's Autograd kernels, the ADInplaceOrView kernel of the running-statistics
// update (version counters), and the fast eager entry (batch_norm.h: batch_norm_fast, the
// arguments checked in C++, the CPU pieces called directly, the same node).
//
// The node (autograd/node.h, family BatchNorm): saved x (in its canonical layout), the weight,
// and the (3, C) float64 statistics mean, var, rstd; training differentiates through the batch
// statistics, evaluation takes the running ones as constants. Backward:
// docs/derivations/batch_norm.md; under create_graph=True the reference formula in
// differentiable ATen ops (reference.py's batch_norm_train_backward_ref /
// batch_norm_eval_backward_ref), so double backward works.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <array>

#include "args.h"
#include "autograd/node.h"
#include "batch_norm.h"
#include "cpu/batch_norm.h"

namespace normlab::batch_norm {

using autograd::Grad;
using autograd::Grads;
using autograd::Needs;
using autograd::Saved;

namespace {

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

std::array<at::Tensor, 3> backward_ref(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                       const at::Tensor& stats, double eps, bool train, bool need_dx, bool need_dw,
                                       bool need_db) {
  const at::ScalarType acc = acc_dtype(x.scalar_type());
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


struct BatchNorm {
  static constexpr bool kResidual = false;
  struct State {
    double eps = 0;
    bool train = true;
  };
  static std::string name(const State& s) { return s.train ? "BatchNormBackward" : "BatchNormEvalBackward"; }

  // The kernel (dw, db straight in the parameters' dtypes) for plain CPU tensors; the op for
  // another backend below (Meta, Python-dispatched tensors). Saved: s0 the statistics.
  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    const OptTensor w = v.w.defined() ? OptTensor(v.w) : std::nullopt;
    Grads r;
    if (plain_cpu(v.x) && plain_cpu(g.dy)) {
      std::tie(r.dx, r.dw, r.db) =
          bwd_typed(g.dy, v.x, w, v.s0, s.train, need.dx, need.dw, need.db, v.w_dtype, v.b_dtype);
    } else {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(r.dx, r.dw, r.db) = batch_norm_bwd(g.dy, v.x, w, v.s0, s.train, need.dx, need.dw || need.db);
    }
    return r;
  }

  static Grads reference(const State& s, const Grad& g, const Saved& v, Needs need) {
    auto r = backward_ref(g.dy, v.x, v.w, v.s0, s.eps, s.train, need.dx, need.dw, need.db);
    return {r[0], r[1], r[2]};
  }
};

// y (and the saved statistics) recorded: a BatchNorm node on y with edges to x, w, b. x must be
// canonical already (the caller's recorded .contiguous keeps it in the graph).
void attach(const at::Tensor& y, const at::Tensor& x, const OptTensor& w, const OptTensor& b, const at::Tensor& stats,
            double eps, bool train) {
  autograd::attach<BatchNorm>({eps, train}, y, at::Tensor(), {x, std::nullopt, w, b}, x, stats);
}

std::tuple<at::Tensor, at::Tensor> batch_norm_fwd_ad(const at::Tensor& x, const OptTensor& w, const OptTensor& b,
                                                double eps) {
  if (!autograd::requires_grad(x, w, b)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return batch_norm_fwd(x, w, b, eps);
  }
  // the layout is settled here, recorded (a copy inside the node would cut x from the double
  // backward's graph)
  const at::Tensor xc = x.contiguous(x.suggest_memory_format());
  at::Tensor y, stats;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, stats) = batch_norm_fwd(xc, w, b, eps);
  }
  attach(y, xc, w, b, stats, eps, true);
  return {y, stats};
}

at::Tensor batch_norm_eval_fwd_ad(const at::Tensor& x, const OptTensor& w, const OptTensor& b, const at::Tensor& rm,
                             const at::Tensor& rv, double eps) {
  if (!autograd::requires_grad(x, w, b)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return batch_norm_eval_fwd(x, w, b, rm, rv, eps);
  }
  const at::Tensor xc = x.contiguous(x.suggest_memory_format());
  at::Tensor y, stats;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    y = batch_norm_eval_fwd(xc, w, b, rm, rv, eps);
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
void batch_norm_update_stats_ad(const at::Tensor& rm, const at::Tensor& rv, const at::Tensor& stats, int64_t n,
                          const at::Tensor& momentum) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    batch_norm_update_stats(rm, rv, stats, n, momentum);
  }
  bump(rm);
  bump(rv);
}

}  // namespace

at::Tensor batch_norm_entry(const at::Tensor& x, const OptTensor& w, const OptTensor& b, const OptTensor& rm,
                            const OptTensor& rv, bool training, double momentum, double eps) {
  if (!training) {
    TORCH_CHECK(given(rm) && given(rv), "normlab batch_norm: running_mean and running_var must be defined in "
                "evaluation mode (training=False)");
    return batch_norm_eval_fwd(x, w, b, *rm, *rv, eps);
  }
  auto [y, stats] = batch_norm_fwd(x, w, b, eps);
  if (given(rm)) {
    TORCH_CHECK(given(rv), "normlab batch_norm: running_mean given without running_var");
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

// Whether the arguments are ones normlab.functional.batch_norm's checks accept without a word
// and the kernels serve (see batch_norm_fast).
bool fits_fast(const at::Tensor& x, const OptTensor& rm, const OptTensor& rv, const OptTensor& w, const OptTensor& b,
               bool training, double momentum, double eps) {
  if (!input_fits(x, 2, plain_cpu)) return false;
  if (!(plain_eps(eps) && (!training || eps > 0)) || !(momentum >= 0 && momentum <= 1)) return false;
  if (given(rm) != given(rv) || (!training && !given(rm))) return false;
  if (recorded_buffer(rm) || recorded_buffer(rv)) return false;
  const int64_t c = x.size(1), numel = x.numel();
  if (numel == 0 || (training && numel <= c)) return false;  // empty: the reference path; one value: the error
  const auto xt = x.scalar_type();
  return param_fits(rm, c, xt, true, plain_cpu) && param_fits(rv, c, xt, true, plain_cpu) &&
         param_fits(w, c, xt, true, plain_cpu) && param_fits(b, c, xt, true, plain_cpu);
}

// The fast path's forward, arguments checked: the kernels called directly (no dispatcher), the
// running statistics updated in training, a BatchNormBackward node where autograd records. The
// (3, C) statistics are a tensor only when the node keeps them.
at::Tensor fast_forward(const at::Tensor& x, const OptTensor& rm, const OptTensor& rv, const OptTensor& w,
                        const OptTensor& b, bool training, double momentum, double eps) {
  const int64_t c = x.size(1);
  const bool record = autograd::requires_grad(x, w, b);
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
  if (training && given(rm)) {
    update_running_raw(*rm, *rv, s, s + c, x.numel() / c, momentum);
    bump(*rm);
    bump(*rv);
  }
  if (record) attach(y, xc, w, b, stats, eps, training);
  return y;
}

bool inplace_ok(const at::Tensor& t) { return !t.is_inference() || c10::InferenceMode::is_enabled(); }

}  // namespace

std::optional<at::Tensor> batch_norm_fast(const at::Tensor& x, const OptTensor& rm, const OptTensor& rv,
                                          const OptTensor& w, const OptTensor& b, bool training, double momentum,
                                          double eps) {
  if (!fits_fast(x, rm, rv, w, b, training, momentum, eps)) return std::nullopt;
  if (training && given(rm) && !(inplace_ok(*rm) && inplace_ok(*rv))) return std::nullopt;
  return fast_forward(x, rm, rv, w, b, training, momentum, eps);
}

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  m.impl("batch_norm_fwd", &batch_norm_fwd_ad);
  m.impl("batch_norm_eval_fwd", &batch_norm_eval_fwd_ad);
}

TORCH_LIBRARY_IMPL(normlab, ADInplaceOrView, m) {
  m.impl("batch_norm_update_stats", &batch_norm_update_stats_ad);
}

}  // namespace normlab::batch_norm
