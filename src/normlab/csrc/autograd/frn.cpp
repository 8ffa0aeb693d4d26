// The frn family's Autograd kernels and fast eager entry (frn.h).
//
// One node (autograd/node.h, FRN) for frn_fwd: saved x, the weight, rstd (s0), the bias (s1: the
// TLU's share needs z) and tau (the family's own parameter, F::kParam; undefined without the
// TLU). Forward: redispatched below autograd to the forward op; the node only when autograd
// records the call. Backward: the backward op; under create_graph=True the reference backward in
// differentiable ATen ops (ops/frn/reference.py's formula, rstd recomputed from x), so double
// backward works.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "args.h"
#include "autograd/node.h"
#include "frn.h"

namespace normlab::frn {
namespace {

using at::Tensor;
using autograd::Grad;
using autograd::Grads;
using autograd::Needs;
using autograd::Saved;

struct FRN {
  static constexpr bool kResidual = false;
  static constexpr bool kParam = true;  // tau
  struct State {
    double eps;
  };
  static std::string name(const State&) { return "FilterResponseNormBackward"; }

  static Grads backward(const State&, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [dx, dw, db, dt] = frn_bwd(g.dy, v.x, opt(v.w), opt(v.s1), opt(v.p), v.s0, need.dx, need.dw, need.db,
                                    need.dp);
    return {need.dx ? dx : Tensor(), need.dw ? dw : Tensor(), need.db ? db : Tensor(), need.dp ? dt : Tensor()};
  }

  // The differentiable reference backward (reference.py: frn_backward_ref).
  static Grads reference(const State& s, const Grad& gr, const Saved& v, Needs need) {
    const at::ScalarType acc = acc_dtype(v.x.scalar_type());
    const int64_t n = v.x.size(0), c = v.x.size(1);
    const Tensor xa = v.x.to(acc).reshape({n, c, -1}), dya = gr.dy.to(acc).reshape({n, c, -1});
    auto col = [&](const Tensor& t) { return t.to(acc).reshape({c, 1}); };
    const Tensor r = at::rsqrt((xa * xa).mean({2}, true) + s.eps);
    const Tensor xh = xa * r;
    Tensor dz = dya;
    Grads out;
    if (v.p.defined()) {
      Tensor z = v.w.defined() ? xh * col(v.w) : xh;
      if (v.s1.defined()) z = z + col(v.s1);
      const Tensor t = col(v.p);
      const Tensor m = at::gt(z, t).to(acc) + at::eq(z, t).to(acc) * 0.5;
      dz = dya * m;
      if (need.dp) out.dp = (dya * (1 - m)).sum({0, 2});
    }
    if (need.dw) out.dw = (dz * xh).sum({0, 2});
    if (need.db) out.db = dz.sum({0, 2});
    if (need.dx) {
      const Tensor g = v.w.defined() ? dz * col(v.w) : dz;
      out.dx = (r * (g - xh * (g * xh).mean({2}, true))).reshape(v.x.sizes()).to(v.x.scalar_type());
    }
    return out;
  }
};

std::tuple<Tensor, Tensor> frn_fwd_ad(const Tensor& x, const OptTensor& w, const OptTensor& b, const OptTensor& tau,
                                      double eps) {
  Tensor y, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, rstd) = frn_fwd(x, w, b, tau, eps);
  }
  if (autograd::requires_grad(x, w, b, tau)) {
    const Tensor t = given(tau) ? *tau : Tensor();
    autograd::attach<FRN>({eps}, y, Tensor(), {x, std::nullopt, w, b, &t}, x, rstd,
                          given(tau) && given(b) ? *b : Tensor());
  }
  return {y, rstd};
}

// The backward op is not differentiable (the node's double backward uses ATen ops instead).
std::tuple<Tensor, Tensor, Tensor, Tensor> frn_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                      const OptTensor& b, const OptTensor& tau, const Tensor& rstd,
                                                      bool need_dx, bool need_dw, bool need_db, bool need_dtau) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return frn_bwd(dy, x, w, b, tau, rstd, need_dx, need_dw, need_db, need_dtau);
}

}  // namespace

// ---- the eager entry ----

std::optional<Tensor> frn_fast(const Tensor& x, const OptTensor& w, const OptTensor& b, const OptTensor& tau,
                               double eps) {
  if (!input_fits(x, 4, plain_cpu) || x.dim() != 4 || !plain_eps(eps)) return std::nullopt;
  const at::ScalarType t = x.scalar_type();
  const int64_t c = x.size(1);
  if (!param_fits(w, {c}, t, true, plain_cpu) || !param_fits(b, {c}, t, true, plain_cpu) ||
      !param_fits(tau, {c}, t, true, plain_cpu))
    return std::nullopt;
  return std::get<0>(frn_fwd_ad(x, w, b, tau, eps));  // the Autograd kernel's work, without the dispatcher
}

}  // namespace normlab::frn

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  using namespace normlab::frn;
  m.impl("frn_fwd", &frn_fwd_ad);
  m.impl("frn_bwd", &frn_bwd_ad);
}
