// The scale_norm family's Autograd kernels and fast eager entry (scale_norm.h).
//
// One node (autograd/node.h, ScaleNorm2d) for scale_norm2d_fwd: saved x, the weight, rstd (s0)
// and, for SimpleNorm2d, the mean (s1). Forward: redispatched below autograd to the forward op;
// the node only when autograd records the call. Backward: the backward op; under
// create_graph=True the reference backward in differentiable ATen ops (ops/scale_norm/
// reference.py's formula, the statistics recomputed from x), so double backward works.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "args.h"
#include "autograd/node.h"
#include "scale_norm.h"

namespace normlab::scale_norm {
namespace {

using at::Tensor;
using autograd::Grad;
using autograd::Grads;
using autograd::Needs;
using autograd::Saved;

struct ScaleNorm2d {
  static constexpr bool kResidual = false;
  struct State {
    bool simple;
    double eps;
  };
  static std::string name(const State& s) { return s.simple ? "SimpleNorm2dBackward" : "RmsNorm2dBackward"; }

  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const OptTensor w = v.w.defined() ? OptTensor(v.w) : std::nullopt;
    const Tensor mean = v.s1.defined() ? v.s1 : at::empty({0}, v.s0.options());
    auto [dx, dw] = scale_norm2d_bwd(g.dy, v.x, w, v.s0, mean, s.simple, need.dx, need.dw);
    return {need.dx ? dx : Tensor(), need.dw ? dw : Tensor(), Tensor()};
  }

  // The differentiable reference backward (reference.py: scale_norm_backward_ref, over dim 1).
  static Grads reference(const State& s, const Grad& gr, const Saved& v, Needs need) {
    const at::ScalarType acc = acc_dtype(v.x.scalar_type());
    const Tensor xa = v.x.to(acc), dya = gr.dy.to(acc);
    const int64_t c = v.x.size(1);
    Tensor xc, st;
    if (s.simple) {
      xc = xa - xa.mean({1}, true);
      st = (xc * xc).sum({1}, true) / double(c - 1);
    } else {
      st = (xa * xa).mean({1}, true);
    }
    const Tensor r = at::rsqrt(st + s.eps), xh = xa * r;
    Grads out;
    if (need.dx) {
      const Tensor g = v.w.defined() ? dya * v.w.to(acc).reshape({1, c, 1, 1}) : dya;
      const Tensor dot = (g * xh).sum({1}, true);
      const Tensor dx = s.simple ? r * (g - xc * r * (dot / double(c - 1))) : r * (g - xh * (dot / double(c)));
      out.dx = dx.to(v.x.scalar_type());
    }
    if (need.dw) out.dw = (dya * xh).sum({0, 2, 3});
    return out;
  }
};

std::tuple<Tensor, Tensor, Tensor> scale_norm2d_fwd_ad(const Tensor& x, const OptTensor& w, bool simple, double eps) {
  Tensor y, rstd, mean;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, rstd, mean) = scale_norm2d_fwd(x, w, simple, eps);
  }
  if (autograd::requires_grad(x, w))
    autograd::attach<ScaleNorm2d>({simple, eps}, y, Tensor(), {x, std::nullopt, w, std::nullopt}, x, rstd,
                                  simple ? mean : Tensor());
  return {y, rstd, mean};
}

// The backward op is not differentiable (the node's double backward uses ATen ops instead).
std::tuple<Tensor, Tensor> scale_norm2d_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                               const Tensor& rstd, const Tensor& mean, bool simple, bool need_dx,
                                               bool need_dw) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return scale_norm2d_bwd(dy, x, w, rstd, mean, simple, need_dx, need_dw);
}

}  // namespace

// ---- the eager entry ----

std::optional<Tensor> scale_norm2d_fast(const Tensor& x, const OptTensor& w, double eps, bool simple) {
  if (!input_fits(x, 4, plain_cpu) || x.dim() != 4 || !plain_eps(eps)) return std::nullopt;
  if (!param_fits(w, {x.size(1)}, x.scalar_type(), true, plain_cpu)) return std::nullopt;
  return std::get<0>(scale_norm2d_fwd_ad(x, w, simple, eps));  // the Autograd kernel's work, without the dispatcher
}

}  // namespace normlab::scale_norm

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  using namespace normlab::scale_norm;
  m.impl("scale_norm2d_fwd", &scale_norm2d_fwd_ad);
  m.impl("scale_norm2d_bwd", &scale_norm2d_bwd_ad);
}
