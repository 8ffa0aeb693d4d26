// The norm_act family's Autograd kernels and fast eager entries (norm_act.h).
//
// One node family per norm (autograd/node.h), each saving what its norm saves plus the bias
// (kSaveBias: the backward recomputes z = norm(x) before act'(z)): BatchNormAct (x, the weight,
// the (3, C) float64 statistics -- the batch's in training, the running ones, constants, in
// evaluation), GroupNormAct (x, the weight, mean and rstd (N, G)), LayerNormAct (x's rows, the
// weight, mean and rstd per row) and LayerNormAct2d (an NCHW x, the weight, mean and rstd per
// pixel). Forward: the forward op below autograd, the node only when autograd records the call.
// Backward: the backward op; under create_graph=True (grad mode on inside the node) the
// reference: y = act(norm(x)) recomputed in differentiable ATen ops (torch's norm, then the
// activation of ops/activation.py's act_forward) and its gradient taken with create_graph, so
// double backward works.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <vector>

#include "args.h"
#include "autograd/node.h"
#include "norm_act.h"

namespace normlab::norm_act {
namespace {

using at::Tensor;
using autograd::Grad;
using autograd::Grads;
using autograd::Needs;
using autograd::Saved;

// act(z) in differentiable ATen ops (normlab.ops.activation.act_forward: torch's functions).
Tensor act_forward(const Tensor& z, int64_t act, double param) {
  switch (act) {
    case 0: return z;
    case 1: return at::relu(z);
    case 2: return at::leaky_relu(z, param);
    case 3: return at::silu(z);
    case 4: return at::gelu(z);
    case 5: return at::gelu(z, "tanh");
    case 6: return at::hardswish(z);
    case 7: return at::tanh(z);
    default: TORCH_CHECK(false, "normlab norm_act: expected an activation id in 0..7, got ", act);
  }
}

// The reference backward (grad mode on): z_of(xa, wa, ba, dya) -> (z, dy) recomputes the norm's
// output from x, the weight and the bias in the accumulation dtype (undefined where absent) and
// maps dy the way it mapped x; the gradients of act(z) . dy with respect to the saved inputs the
// node needs, themselves differentiable (create_graph).
template <class Z> Grads differentiate(const Saved& v, const Tensor& dy, Needs need, int64_t act, double param,
                                       const Z& z_of) {
  const at::ScalarType acc = acc_dtype(v.x.scalar_type());
  const Tensor wa = v.w.defined() ? v.w.to(acc) : Tensor(), ba = v.b.defined() ? v.b.to(acc) : Tensor();
  auto [z, dz] = z_of(v.x.to(acc), wa, ba, dy.to(acc));
  const Tensor y = act_forward(z, act, param);
  std::vector<Tensor> wrt;
  Tensor* slot[3];
  Grads out;
  auto want = [&](bool need_it, const Tensor& t, Tensor* o) {
    if (need_it && t.defined() && t.requires_grad()) {
      slot[wrt.size()] = o;
      wrt.push_back(t);
    }
  };
  want(need.dx, v.x, &out.dx);
  want(need.dw, v.w, &out.dw);
  want(need.db, v.b, &out.db);
  if (!wrt.empty()) {
    const auto g = torch::autograd::grad({y}, wrt, {dz}, /*retain_graph=*/true, /*create_graph=*/true,
                                         /*allow_unused=*/true);
    for (size_t i = 0; i < wrt.size(); ++i) *slot[i] = g[i].defined() ? g[i] : at::zeros_like(wrt[i]);
  }
  // (an input that needs a gradient but no longer requires grad: zeros)
  if (need.dx && !out.dx.defined()) out.dx = at::zeros_like(v.x);
  if (need.dw && !out.dw.defined()) out.dw = at::zeros_like(v.w);
  if (need.db && !out.db.defined()) out.db = at::zeros_like(v.b);
  return out;
}

// ---- BatchNorm + act ----

struct BatchNormAct {
  static constexpr bool kResidual = false;
  static constexpr bool kSaveBias = true;
  struct State {
    double eps = 0;
    bool train = true;
    int64_t act = 0;
    double param = 0;
  };
  static std::string name(const State& s) { return s.train ? "BatchNormActBackward" : "BatchNormActEvalBackward"; }

  // The backward op (saved: s0 the statistics); dw, db in the parameters' dtypes.
  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Grads r;
    std::tie(r.dx, r.dw, r.db) =
        batch_norm_act_bwd(g.dy, v.x, opt(v.w), opt(v.b), v.s0, s.train, s.act, s.param, need.dx, need.dw, need.db);
    return r;
  }

  // Training: torch's batch_norm with the batch statistics (functions of x); evaluation: the
  // saved running statistics (rows mean and rstd of s0), constants.
  static Grads reference(const State& s, const Grad& g, const Saved& v, Needs need) {
    return differentiate(v, g.dy, need, s.act, s.param, [&](const Tensor& xa, const Tensor& wa, const Tensor& ba,
                                                            const Tensor& dya) {
      if (s.train) return std::make_pair(at::batch_norm(xa, opt(wa), opt(ba), {}, {}, true, 0.0, s.eps, false), dya);
      std::vector<int64_t> shape(xa.dim(), 1);
      shape[1] = xa.size(1);
      const Tensor mean = v.s0.select(0, 0).to(xa.scalar_type()).reshape(shape);
      const Tensor rstd = v.s0.select(0, 2).to(xa.scalar_type()).reshape(shape);
      Tensor z = (xa - mean) * rstd;
      if (wa.defined()) z = z * wa.reshape(shape);
      if (ba.defined()) z = z + ba.reshape(shape);
      return std::make_pair(z, dya);
    });
  }
};

// y and the statistics (in training the op updates the running statistics, when given, in place:
// their version counters stay, as torch's batch_norm leaves them); the node where autograd records.
std::tuple<Tensor, Tensor> batch_norm_act_fwd_ad(const Tensor& x, const OptTensor& w, const OptTensor& b,
                                                 const OptTensor& rm, const OptTensor& rv, bool training,
                                                 double momentum, double eps, int64_t act, double param) {
  Tensor y, stats;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, stats) = batch_norm_act_fwd(x, w, b, rm, rv, training, momentum, eps, act, param);
  }
  if (autograd::requires_grad(x, w, b))
    autograd::attach<BatchNormAct>({eps, training, act, param}, y, Tensor(), {x, std::nullopt, w, b}, x, stats);
  return {y, stats};
}

// ---- GroupNorm + act ----

struct GroupNormAct {
  static constexpr bool kResidual = false;
  static constexpr bool kSaveBias = true;
  struct State {
    int64_t g = 1;
    double eps = 0;
    int64_t act = 0;
    double param = 0;
  };
  static std::string name(const State&) { return "GroupNormActBackward"; }

  // The backward op (saved: s0 mean, s1 rstd).
  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [dx, dw, db] = group_norm_act_bwd(g.dy, v.x, opt(v.w), opt(v.b), v.s0, v.s1, s.g, s.act, s.param, need.dx);
    return {need.dx ? dx : Tensor(), need.dw ? dw : Tensor(), need.db ? db : Tensor()};
  }

  static Grads reference(const State& s, const Grad& g, const Saved& v, Needs need) {
    return differentiate(v, g.dy, need, s.act, s.param, [&](const Tensor& xa, const Tensor& wa, const Tensor& ba,
                                                            const Tensor& dya) {
      return std::make_pair(at::group_norm(xa, s.g, opt(wa), opt(ba), s.eps, false), dya);
    });
  }
};

std::tuple<Tensor, Tensor, Tensor> group_norm_act_fwd_ad(const Tensor& x, const OptTensor& w, const OptTensor& b,
                                                         int64_t g, double eps, int64_t act, double param) {
  Tensor y, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, mean, rstd) = group_norm_act_fwd(x, w, b, g, eps, act, param);
  }
  if (autograd::requires_grad(x, w, b))
    autograd::attach<GroupNormAct>({g, eps, act, param}, y, Tensor(), {x, std::nullopt, w, b}, x, mean, rstd);
  return {y, mean, rstd};
}

// ---- LayerNorm + act over rows ----

// x's memory as (rows, n_cols): a contiguous x's trailing values, a channels_last x's channels.
Tensor as_rows(const Tensor& t, bool contiguous, int64_t n_cols) {
  return contiguous ? t.reshape({-1, n_cols}) : t.movedim(1, -1).reshape({-1, n_cols});
}

struct LayerNormAct {
  static constexpr bool kResidual = false;
  static constexpr bool kSaveBias = true;
  struct State {
    int64_t n_cols = 1;
    double eps = 0;
    int64_t act = 0;
    double param = 0;
    std::vector<int64_t> w_shape, b_shape;  // the parameters' shapes (the op takes them flat)
  };
  static std::string name(const State&) { return "LayerNormActBackward"; }

  // The backward op (saved: s0 mean, s1 rstd), the parameters flat; dw, db in their shapes.
  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const OptTensor w = v.w.defined() ? OptTensor(v.w.reshape(-1)) : std::nullopt;
    const OptTensor b = v.b.defined() ? OptTensor(v.b.reshape(-1)) : std::nullopt;
    auto [dx, dw, db] =
        layer_norm_act_bwd(g.dy, v.x, w, b, v.s0, v.s1, s.n_cols, s.act, s.param, need.dw || need.db);
    return {dx, need.dw ? dw.reshape(s.w_shape) : Tensor(), need.db ? db.reshape(s.b_shape) : Tensor()};
  }

  static Grads reference(const State& s, const Grad& g, const Saved& v, Needs need) {
    const bool contiguous = v.x.is_contiguous();
    return differentiate(v, g.dy, need, s.act, s.param, [&](const Tensor& xa, const Tensor& wa, const Tensor& ba,
                                                            const Tensor& dya) {
      const OptTensor wf = wa.defined() ? OptTensor(wa.reshape(-1)) : std::nullopt;
      const OptTensor bf = ba.defined() ? OptTensor(ba.reshape(-1)) : std::nullopt;
      return std::make_pair(at::layer_norm(as_rows(xa, contiguous, s.n_cols), {s.n_cols}, wf, bf, s.eps),
                            as_rows(dya, contiguous, s.n_cols));
    });
  }
};

// LayerNormAct over x's rows of n_cols values (x contiguous or channels_last with n_cols = C),
// weight and bias of n_cols values in any shape: the op takes them flat, the node's edges and
// gradients keep their shapes.
std::tuple<Tensor, Tensor, Tensor> layer_norm_act_rows(const Tensor& x, int64_t n_cols, const OptTensor& w,
                                                       const OptTensor& b, double eps, int64_t act, double param) {
  Tensor y, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    const OptTensor wf = given(w) ? OptTensor(w->reshape(-1)) : std::nullopt;
    const OptTensor bf = given(b) ? OptTensor(b->reshape(-1)) : std::nullopt;
    std::tie(y, mean, rstd) = layer_norm_act_fwd(x, n_cols, wf, bf, eps, act, param);
  }
  if (autograd::requires_grad(x, w, b)) {
    LayerNormAct::State s{n_cols, eps, act, param, {}, {}};
    if (given(w)) s.w_shape = w->sizes().vec();
    if (given(b)) s.b_shape = b->sizes().vec();
    autograd::attach<LayerNormAct>(std::move(s), y, Tensor(), {x, std::nullopt, w, b}, x, mean, rstd);
  }
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_act_fwd_ad(const Tensor& x, int64_t n_cols, const OptTensor& w,
                                                         const OptTensor& b, double eps, int64_t act, double param) {
  return layer_norm_act_rows(x, n_cols, w, b, eps, act, param);
}

// ---- LayerNorm2d + act, NCHW ----

struct LayerNormAct2d {
  static constexpr bool kResidual = false;
  static constexpr bool kSaveBias = true;
  struct State {
    double eps = 0;
    int64_t act = 0;
    double param = 0;
  };
  static std::string name(const State&) { return "LayerNormAct2dBackward"; }

  // The backward op (saved: s0 mean, s1 rstd per pixel).
  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [dx, dw, db] =
        layer_norm_act2d_bwd(g.dy, v.x, opt(v.w), opt(v.b), v.s0, v.s1, s.act, s.param, need.dw || need.db);
    return {dx, need.dw ? dw : Tensor(), need.db ? db : Tensor()};
  }

  // torch's layer_norm over the channels of each pixel (channels moved last).
  static Grads reference(const State& s, const Grad& g, const Saved& v, Needs need) {
    return differentiate(v, g.dy, need, s.act, s.param, [&](const Tensor& xa, const Tensor& wa, const Tensor& ba,
                                                            const Tensor& dya) {
      const OptTensor wf = wa.defined() ? OptTensor(wa.reshape(-1)) : std::nullopt;
      const OptTensor bf = ba.defined() ? OptTensor(ba.reshape(-1)) : std::nullopt;
      return std::make_pair(at::layer_norm(xa.movedim(1, -1), {xa.size(1)}, wf, bf, s.eps), dya.movedim(1, -1));
    });
  }
};

std::tuple<Tensor, Tensor, Tensor> layer_norm_act2d_fwd_ad(const Tensor& x, const OptTensor& w, const OptTensor& b,
                                                           double eps, int64_t act, double param) {
  Tensor y, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, mean, rstd) = layer_norm_act2d_fwd(x, w, b, eps, act, param);
  }
  if (autograd::requires_grad(x, w, b))
    autograd::attach<LayerNormAct2d>({eps, act, param}, y, Tensor(), {x, std::nullopt, w, b}, x, mean, rstd);
  return {y, mean, rstd};
}

// ---- the backward ops: not differentiable (the nodes' double backward uses ATen ops instead) ----

std::tuple<Tensor, Tensor, Tensor> batch_norm_act_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                         const OptTensor& b, const Tensor& stats, bool training,
                                                         int64_t act, double param, bool need_dx, bool need_dw,
                                                         bool need_db) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return batch_norm_act_bwd(dy, x, w, b, stats, training, act, param, need_dx, need_dw, need_db);
}

std::tuple<Tensor, Tensor, Tensor> group_norm_act_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                         const OptTensor& b, const Tensor& mean, const Tensor& rstd,
                                                         int64_t g, int64_t act, double param, bool need_dx) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return group_norm_act_bwd(dy, x, w, b, mean, rstd, g, act, param, need_dx);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_act_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                         const OptTensor& b, const Tensor& mean, const Tensor& rstd,
                                                         int64_t n_cols, int64_t act, double param, bool need_dwb) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return layer_norm_act_bwd(dy, x, w, b, mean, rstd, n_cols, act, param, need_dwb);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_act2d_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                           const OptTensor& b, const Tensor& mean, const Tensor& rstd,
                                                           int64_t act, double param, bool need_dwb) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return layer_norm_act2d_bwd(dy, x, w, b, mean, rstd, act, param, need_dwb);
}

// ---- the fast entries' argument tests ----

// A CPU tensor of a served dtype (x; the Python types were judged by the binding).
bool served_cpu(const Tensor& x) { return x.device().is_cpu() && served_dtype(x.scalar_type()); }

// A per-channel tensor BatchNorm's and GroupNorm's kernels read: absent, or a 1-D CPU tensor of
// c values of a served dtype.
bool channel_fits(const OptTensor& t, int64_t c) {
  return !given(t) || (t->device().is_cpu() && t->dim() == 1 && t->size(0) == c && served_dtype(t->scalar_type()));
}

// LayerNorm's weight and bias: a weight alone, both, or neither; each of exactly `shape` in a
// dtype that fits x's (args.h's param_fits); both of one dtype.
bool row_params_fit(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b) {
  if (!given(w) && given(b)) return false;
  if (!param_fits(w, shape, x.scalar_type()) || !param_fits(b, shape, x.scalar_type())) return false;
  return !given(w) || !given(b) || w->scalar_type() == b->scalar_type();
}

}  // namespace

// ---- the eager entries ----

std::optional<Tensor> batch_norm_act_fast(const Tensor& x, const OptTensor& rm, const OptTensor& rv,
                                          const OptTensor& w, const OptTensor& b, bool training, double momentum,
                                          double eps, int64_t act, double param) {
  if (!served_cpu(x) || x.dim() < 2) return std::nullopt;
  const int64_t c = x.size(1);
  if (x.numel() <= c || !(channel_fits(rm, c) && channel_fits(rv, c) && channel_fits(w, c) && channel_fits(b, c)))
    return std::nullopt;
  if (given(rm) != given(rv) || (!training && !given(rm))) return std::nullopt;
  if ((given(rm) && rm->requires_grad()) || (given(rv) && rv->requires_grad())) return std::nullopt;
  if (!(momentum >= 0 && momentum <= 1) || !(eps > 0)) return std::nullopt;
  return std::get<0>(batch_norm_act_fwd_ad(x, w, b, rm, rv, training, momentum, eps, act, param));
}

std::optional<Tensor> group_norm_act_fast(const Tensor& x, int64_t g, const OptTensor& w, const OptTensor& b,
                                          double eps, int64_t act, double param) {
  if (!served_cpu(x) || x.dim() < 2) return std::nullopt;
  const int64_t c = x.size(1), numel = x.numel();
  if (g <= 0 || c % g != 0 || numel == 0 || numel / (x.size(0) * g) < 2) return std::nullopt;
  if (!(param_fits(w, {c}, x.scalar_type()) && param_fits(b, {c}, x.scalar_type()))) return std::nullopt;
  if (!(eps >= 0)) return std::nullopt;
  return std::get<0>(group_norm_act_fwd_ad(x, w, b, g, eps, act, param));
}

std::optional<Tensor> layer_norm_act_fast(const Tensor& x, at::IntArrayRef shape, const OptTensor& w,
                                          const OptTensor& b, double eps, int64_t act, double param) {
  if (!served_cpu(x) || x.numel() == 0) return std::nullopt;
  const int64_t k = int64_t(shape.size());
  if (k == 0 || x.dim() < k || !x.sizes().slice(x.dim() - k).equals(shape)) return std::nullopt;
  int64_t n_cols = 1;
  for (int64_t d : shape) n_cols *= d;
  if (n_cols <= 0 || !(eps >= 0) || !row_params_fit(x, shape, w, b)) return std::nullopt;
  return std::get<0>(layer_norm_act_rows(x.contiguous(), n_cols, w, b, eps, act, param));
}

std::optional<Tensor> layer_norm_act2d_fast(const Tensor& x, const OptTensor& w, const OptTensor& b, double eps,
                                            int64_t act, double param) {
  if (!served_cpu(x) || x.dim() != 4) return std::nullopt;
  const int64_t c = x.size(1);
  if (x.numel() == 0 || c <= 0 || !(eps >= 0) || !row_params_fit(x, {c}, w, b)) return std::nullopt;
  // channels_last (or one pixel): the memory is rows of C values, LayerNorm's row op
  const bool rows_of_c =
      x.is_contiguous(at::MemoryFormat::ChannelsLast) && (!x.is_contiguous() || x.size(2) * x.size(3) == 1);
  if (rows_of_c) return std::get<0>(layer_norm_act_rows(x, c, w, b, eps, act, param));
  if (x.is_contiguous()) return std::get<0>(layer_norm_act2d_fwd_ad(x, w, b, eps, act, param));
  return std::nullopt;
}

}  // namespace normlab::norm_act

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  using namespace normlab::norm_act;
  m.impl("batch_norm_act_fwd", &batch_norm_act_fwd_ad);
  m.impl("batch_norm_act_bwd", &batch_norm_act_bwd_ad);
  m.impl("group_norm_act_fwd", &group_norm_act_fwd_ad);
  m.impl("group_norm_act_bwd", &group_norm_act_bwd_ad);
  m.impl("layer_norm_act_fwd", &layer_norm_act_fwd_ad);
  m.impl("layer_norm_act_bwd", &layer_norm_act_bwd_ad);
  m.impl("layer_norm_act2d_fwd", &layer_norm_act2d_fwd_ad);
  m.impl("layer_norm_act2d_bwd", &layer_norm_act2d_bwd_ad);
}
