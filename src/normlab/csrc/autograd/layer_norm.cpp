// The layer_norm family's Autograd kernels and fast eager entries (layer_norm.h).
//
// Two node families (autograd/node.h): RowNorm for LayerNorm / RMSNorm and their fused adds
// (saved: x -- h for the fused add --, the weight, the (n_rows,) mean and rstd), LayerNorm2d
// (saved: x, the weight, the per-pixel mean and rstd). The forward runs the forward op below
// autograd and attaches the node when autograd records; otherwise the output-only op runs (no
// statistics that nobody reads). Double backward: the reference backward
// (ops/layer_norm/reference.py) in differentiable ATen ops, the statistics recomputed from x.
//
// torch.func transforms refuse C++ autograd nodes of this kind: under them Python takes the
// transform Functions of functional/row_norms.py instead.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cfloat>

#include "args.h"
#include "autograd/node.h"
#include "layer_norm.h"

namespace normlab::layer_norm {
namespace {

using at::Tensor;
using autograd::Grad;
using autograd::Grads;
using autograd::Needs;
using autograd::Saved;

// ---- LayerNorm / RMSNorm (rows) ----

struct RowNorm {
  static constexpr bool kResidual = true;
  struct State {
    std::vector<int64_t> shape, b_shape;
    std::optional<at::ScalarType> b_dtype;  // the bias' (none: no bias)
    double eps = 0, offset = 0;
    bool center = true, cast_x_hat = false;
  };
  static std::string name(const State&) { return "RowNormBackward"; }

  // The backward op (saved: s0 mean, s1 rstd).
  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const OptTensor w = v.w.defined() ? OptTensor(v.w) : std::nullopt;
    const OptTensor dh = g.dh.defined() ? OptTensor(g.dh) : std::nullopt;
    Grads r;
    if (s.center) {
      std::tie(r.dx, r.dw, r.db) = layer_norm_bwd(g.dy, dh, v.x, w, v.s0, v.s1, s.shape, need.dw || need.db,
                                                  s.b_dtype);
    } else {
      std::tie(r.dx, r.dw) = rms_norm_bwd(g.dy, dh, v.x, w, v.s1, s.shape, s.offset, s.cast_x_hat, need.dw);
    }
    if (need.db && r.db.sizes() != at::IntArrayRef(s.b_shape)) r.db = r.db.reshape(s.b_shape);
    return r;
  }

  // reference.py's layer_norm_backward_ref / rms_norm_backward_ref in differentiable ATen ops, the
  // statistics recomputed from x as functions of it. Grouped weights (G * n_cols values): the
  // rows as (G, rows per weight, n_cols).
  static Grads reference(const State& s, const Grad& g, const Saved& v, Needs need) {
    int64_t n_cols = 1;
    for (int64_t d : s.shape) n_cols *= d;
    const Tensor &x = v.x, &w = v.w;
    const auto acc = acc_dtype(x.scalar_type());
    const bool grouped = w.defined() && w.numel() != n_cols;
    std::vector<int64_t> rows = {-1, n_cols};
    if (grouped) rows = {w.numel() / n_cols, -1, n_cols};
    Tensor xa = x.reshape(rows).to(acc), dya = g.dy.reshape(rows).to(acc);  // (n_rows, n_cols) or (G, R, n_cols)
    Tensor rstd, x_hat;
    if (s.center) {  // shifted two passes (ops/numerics.shifted_mean_var)
      Tensor shift = xa.narrow(-1, 0, 1), d = xa - shift, md = d.mean(-1, true), xc = d - md;
      rstd = at::rsqrt((xc * xc).mean(-1, true) + s.eps);  // (.., 1)
      x_hat = (xa - (shift + md)) * rstd;
    } else {
      rstd = at::rsqrt((xa * xa).mean(-1, true) + s.eps);
      x_hat = xa * rstd;
    }
    Tensor wa;
    if (w.defined()) {
      wa = w.reshape(grouped ? std::vector<int64_t>{w.numel() / n_cols, 1, n_cols} : std::vector<int64_t>{n_cols})
               .to(acc);
      if (s.offset != 0.0) wa = wa + s.offset;
    }
    Grads r;
    if (need.dx) {
      Tensor gw = wa.defined() ? dya * wa : dya;       // term 1
      Tensor t = s.center ? gw - gw.mean(-1, true) : gw;  // term 2 (LayerNorm)
      t = t - x_hat * (gw * x_hat).mean(-1, true);     // term 3
      r.dx = (rstd * t).to(x.scalar_type()).reshape(x.sizes());
      if (g.dh.defined()) r.dx = r.dx + g.dh;
    }
    if (need.dw) {
      Tensor seen = s.cast_x_hat ? x_hat.to(x.scalar_type()).to(acc) : x_hat;  // what the weight multiplied
      r.dw = (dya * seen).sum(-2).reshape(w.sizes());
    }
    if (need.db) {
      r.db = dya.sum(-2);
      if (r.db.sizes() != at::IntArrayRef(s.b_shape)) r.db = r.db.reshape(s.b_shape);
    }
    return r;
  }
};

// (y, h, mean, rstd) of the forward op that fits (center, residual); h / mean undefined where
// the op has none. Inlined: no frame of its own between a Python call and the row loop.
[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor, Tensor> forward_op(
    const Tensor& x, const OptTensor& res, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b, double eps,
    bool center, double offset, bool cast_x_hat) {
  if (center && !res.has_value()) {
    auto [y, mean, rstd] = layer_norm_fwd(x, w, b, shape, eps);
    return {y, Tensor(), mean, rstd};
  }
  if (center) return add_layer_norm_fwd(x, *res, w, b, shape, eps);
  if (!res.has_value()) {
    auto [y, rstd] = rms_norm_fwd(x, w, shape, offset, cast_x_hat, eps);
    return {y, Tensor(), Tensor(), rstd};
  }
  auto [y, h, rstd] = add_rms_norm_fwd(x, *res, w, shape, offset, cast_x_hat, eps);
  return {y, h, Tensor(), rstd};
}

// The forward, recorded: the forward op below autograd, then a RowNorm node on y (and h); the
// statistics are outputs without a gradient. (y, h, mean, rstd), h / mean undefined where the
// op has none.
std::tuple<Tensor, Tensor, Tensor, Tensor> row_norm_recorded(const Tensor& x, const OptTensor& res,
                                                             at::IntArrayRef shape, const OptTensor& w,
                                                             const OptTensor& b, double eps, bool center,
                                                             double offset, bool cast_x_hat) {
  Tensor y, h, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, h, mean, rstd) = forward_op(x, res, shape, w, b, eps, center, offset, cast_x_hat);
  }
  if (!autograd::requires_grad(x, res, w, b)) return {y, h, mean, rstd};
  RowNorm::State s;
  s.shape = shape.vec();
  if (given(b)) {
    s.b_shape = b->sizes().vec();
    s.b_dtype = b->scalar_type();
  }
  s.eps = eps;
  s.offset = offset;
  s.center = center;
  s.cast_x_hat = cast_x_hat;
  const bool has_res = given(res);
  autograd::attach<RowNorm>(std::move(s), y, has_res ? h : Tensor(), {x, res, w, b}, has_res ? h : x, mean, rstd);
  return {y, h, mean, rstd};
}

// ---- the Autograd kernels of the row forward ops ----

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_ad(const Tensor& x, const OptTensor& w, const OptTensor& b,
                                                     at::IntArrayRef shape, double eps) {
  auto [y, h, mean, rstd] = row_norm_recorded(x, std::nullopt, shape, w, b, eps, true, 0.0, false);
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_fwd_ad(const Tensor& x, const OptTensor& w, at::IntArrayRef shape, double offset,
                                           bool cast_x_hat, double eps) {
  auto [y, h, mean, rstd] = row_norm_recorded(x, std::nullopt, shape, w, std::nullopt, eps, false, offset, cast_x_hat);
  return {y, rstd};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_fwd_ad(const Tensor& x, const Tensor& res,
                                                                 const OptTensor& w, const OptTensor& b,
                                                                 at::IntArrayRef shape, double eps) {
  return row_norm_recorded(x, OptTensor(res), shape, w, b, eps, true, 0.0, false);
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd_ad(const Tensor& x, const Tensor& res, const OptTensor& w,
                                                       at::IntArrayRef shape, double offset, bool cast_x_hat,
                                                       double eps) {
  auto [y, h, mean, rstd] =
      row_norm_recorded(x, OptTensor(res), shape, w, std::nullopt, eps, false, offset, cast_x_hat);
  return {y, h, rstd};
}

// Whether (x, normalized_shape, w, b) are arguments normlab.functional's checks accept without a
// word, and the kernels serve: x a strided CPU tensor of a served dtype whose trailing dims are
// normalized_shape (no empty row), each parameter None or a strided CPU tensor of exactly
// normalized_shape in x's dtype (or float32 beside half precision, where `half_params`).
bool fits_fast(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b, bool half_params) {
  if (!input_fits(x, 0)) return false;
  const int64_t k = int64_t(shape.size()), d = x.dim();
  if (k == 0 || k > d) return false;
  for (int64_t i = 0; i < k; ++i)
    if (shape[i] <= 0 || x.size(d - k + i) != shape[i]) return false;
  const auto st = x.scalar_type();
  return param_fits(w, shape, st, half_params) && param_fits(b, shape, st, half_params);
}

// ---- LayerNorm2d ----

struct LayerNorm2d {
  static constexpr bool kResidual = false;
  struct State {
    double eps = 0;
  };
  static std::string name(const State&) { return "LayerNorm2dBackward"; }

  // The backward op (saved: s0 mean, s1 rstd).
  static Grads backward(const State&, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Grads r;
    std::tie(r.dx, r.dw, r.db) = layer_norm2d_bwd(g.dy, v.x, v.w.defined() ? OptTensor(v.w) : std::nullopt, v.s0,
                                                  v.s1, need.dw || need.db);
    return r;
  }

  // LayerNorm2d's gradients in differentiable ATen ops, on the pixels as rows (N * S, C): the
  // statistics recomputed from x by the shifted two passes, then the three terms of dx.
  static Grads reference(const State& s, const Grad& g, const Saved& v, Needs need) {
    const Tensor &x = v.x, &w = v.w;
    if (x.numel() == 0) return backward(s, g, v, need);
    const int64_t c = x.size(1);
    const auto acc = acc_dtype(x.scalar_type());
    const Tensor xr = x.movedim(1, -1);               // (N, *, C)
    const Tensor rows = xr.reshape({-1, c}).to(acc);  // (N * S, C)
    const Tensor dya = g.dy.movedim(1, -1).reshape({-1, c}).to(acc);
    const Tensor shift = rows.narrow(1, 0, 1);  // (N * S, 1)
    const Tensor d = rows - shift;
    const Tensor mean_d = d.mean(-1, true);
    const Tensor xc = d - mean_d;
    const Tensor var = (xc * xc).mean(-1, true);  // biased
    const Tensor mean = shift + mean_d;
    const Tensor rstd = at::rsqrt(var + s.eps);
    const Tensor x_hat = (rows - mean) * rstd;
    Grads r;
    if (need.dx) {
      const Tensor gw = w.defined() ? dya * w.to(acc) : dya;
      const Tensor term1 = gw;
      const Tensor term2 = gw.mean(-1, true);
      const Tensor term3 = x_hat * (gw * x_hat).mean(-1, true);
      r.dx = (rstd * (term1 - term2 - term3)).to(x.scalar_type()).reshape(xr.sizes()).movedim(-1, 1);
    }
    if (need.dw) r.dw = (dya * x_hat).sum(0);
    if (need.db) r.db = dya.sum(0);
    return r;
  }
};

// The forward, recorded: layer_norm2d_fwd below autograd, then a LayerNorm2d node on y.
Tensor layer_norm2d_recorded(const Tensor& x, const OptTensor& w, const OptTensor& b, double eps) {
  Tensor y, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, mean, rstd) = layer_norm2d_fwd(x, w, b, eps);
  }
  autograd::attach<LayerNorm2d>({eps}, y, Tensor(), {x, std::nullopt, w, b}, x, mean, rstd);
  return y;
}

Tensor layer_norm2d_ad(const Tensor& x, const OptTensor& w, const OptTensor& b, double eps) {
  if (autograd::requires_grad(x, w, b)) return layer_norm2d_recorded(x, w, b, eps);
  at::AutoDispatchBelowADInplaceOrView guard;  // nothing records: the output alone
  return layer_norm2d(x, w, b, eps);
}

}  // namespace

// ---- the eager entries ----

namespace {
// row_norm's work, inlined into it and into the fast entries below (one frame fewer between a
// Python call and the row loop).
[[gnu::always_inline]] inline std::tuple<Tensor, Tensor, Tensor, Tensor> row_norm_impl(
    const Tensor& x, at::IntArrayRef shape, const OptTensor& res, const OptTensor& w, const OptTensor& b,
    std::optional<double> eps_, bool center, double offset, bool cast_x_hat, bool stats) {
  const double eps = eps_.has_value() ? *eps_ : (x.scalar_type() == at::kDouble ? DBL_EPSILON : double(FLT_EPSILON));
  const OptTensor bias = center ? b : std::nullopt;
  if (autograd::requires_grad(x, res, w, bias))
    return row_norm_recorded(x, res, shape, w, bias, eps, center, offset, cast_x_hat);
  at::AutoDispatchBelowADInplaceOrView guard;  // nothing to record: straight to the kernel
  if (stats) return forward_op(x, res, shape, w, bias, eps, center, offset, cast_x_hat);
  auto [y, h] = row_norm_infer(x, res, w, bias, shape, center, offset, cast_x_hat, eps);
  return {y, h, Tensor(), Tensor()};
}
}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> row_norm(const Tensor& x, at::IntArrayRef shape, const OptTensor& res,
                                                    const OptTensor& w, const OptTensor& b, std::optional<double> eps_,
                                                    bool center, double offset, bool cast_x_hat, bool stats) {
  return row_norm_impl(x, shape, res, w, b, eps_, center, offset, cast_x_hat, stats);
}

std::optional<Tensor> layer_norm_fast(const Tensor& x, at::IntArrayRef shape, const OptTensor& w, const OptTensor& b,
                                      double eps) {
  if (!plain_eps(eps) || !fits_fast(x, shape, w, b, true)) return std::nullopt;
  return std::get<0>(row_norm_impl(x, shape, std::nullopt, w, b, eps, true, 0.0, false, false));
}

std::optional<Tensor> rms_norm_fast(const Tensor& x, at::IntArrayRef shape, const OptTensor& w,
                                    std::optional<double> eps) {
  if ((eps.has_value() && !plain_eps(*eps)) || !fits_fast(x, shape, w, std::nullopt, false)) return std::nullopt;
  return std::get<0>(row_norm_impl(x, shape, std::nullopt, w, std::nullopt, eps, false, 0.0, false, false));
}

std::optional<std::tuple<Tensor, Tensor>> add_norm_fast(const Tensor& x, const Tensor& residual, at::IntArrayRef shape,
                                                        const OptTensor& w, const OptTensor& b,
                                                        std::optional<double> eps, bool center) {
  if (eps.has_value() && !plain_eps(*eps)) return std::nullopt;
  if (!fits_fast(x, shape, w, center ? b : std::nullopt, center)) return std::nullopt;
  if (!residual.defined() || !cpu_strided(residual) || residual.scalar_type() != x.scalar_type() ||
      residual.sizes() != x.sizes())
    return std::nullopt;
  auto [y, h, mean, rstd] = row_norm_impl(x, shape, OptTensor(residual), w, center ? b : std::nullopt, eps, center, 0.0,
                                     false, false);
  return std::make_tuple(y, h);
}

std::optional<Tensor> layer_norm2d_fast(const Tensor& x, const OptTensor& w, const OptTensor& b, double eps) {
  if (!plain_eps(eps) || !input_fits(x, 2)) return std::nullopt;
  const int64_t c = x.size(1);
  const auto st = x.scalar_type();
  if (!param_fits(w, c, st) || !param_fits(b, c, st)) return std::nullopt;
  if (autograd::requires_grad(x, w, b)) return layer_norm2d_recorded(x, w, b, eps);
  at::AutoDispatchBelowADInplaceOrView guard;
  return layer_norm2d(x, w, b, eps);
}

}  // namespace normlab::layer_norm

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  using namespace normlab::layer_norm;
  m.impl("layer_norm_fwd", &layer_norm_fwd_ad);
  m.impl("rms_norm_fwd", &rms_norm_fwd_ad);
  m.impl("add_layer_norm_fwd", &add_layer_norm_fwd_ad);
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd_ad);
  m.impl("layer_norm2d", &layer_norm2d_ad);
}
