// The dyt family's Autograd kernels and fast eager entry (dyt.h).
//
// One node (autograd/node.h, DyT) for dyt_fwd: saved x, the weight and alpha (the family's own
// parameter, F::kParam). Forward: redispatched below autograd to the forward op; the node only
// when autograd records the call. Backward: the backward op; under create_graph=True the
// reference backward in differentiable ATen ops (ops/dyt/reference.py's formula), so double
// backward works.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <vector>

#include "args.h"
#include "autograd/node.h"
#include "dyt.h"

namespace normlab::dyt {
namespace {

using at::Tensor;
using autograd::Grad;
using autograd::Grads;
using autograd::Needs;
using autograd::Saved;

std::vector<int64_t> leading_dims(const Tensor& x, size_t k) {
  std::vector<int64_t> dims(x.dim() - int64_t(k));
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = int64_t(i);
  return dims;
}

struct DyT {
  static constexpr bool kResidual = false;
  static constexpr bool kParam = true;  // alpha
  struct State {
    std::vector<int64_t> shape;  // normalized_shape
  };
  static std::string name(const State&) { return "DyTBackward"; }

  // The backward op (saved: p = alpha).
  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const OptTensor w = v.w.defined() ? OptTensor(v.w) : std::nullopt;
    auto [dx, da, dw, db] = dyt_bwd(g.dy, v.x, w, v.p, s.shape, need.dx, need.dp, need.dw || need.db);
    return {need.dx ? dx : Tensor(), need.dw ? dw : Tensor(), need.db ? db : Tensor(), need.dp ? da : Tensor()};
  }

  // The differentiable reference backward (reference.py: dyt_backward_ref).
  static Grads reference(const State& s, const Grad& gr, const Saved& v, Needs need) {
    const at::ScalarType acc = acc_dtype(v.x.scalar_type());
    const Tensor xa = v.x.to(acc), a = v.p.to(acc), dya = gr.dy.to(acc);
    const Tensor t = at::tanh(a * xa);
    const std::vector<int64_t> rows = leading_dims(v.x, s.shape.size());
    auto sum_rows = [&](const Tensor& u) { return rows.empty() ? u : u.sum(rows); };
    Grads out;
    if (need.dx || need.dp) {
      const Tensor g = v.w.defined() ? dya * v.w.to(acc) : dya;
      const Tensor du = at::tanh_backward(g, t);
      if (need.dx) out.dx = (du * a).to(v.x.scalar_type());
      if (need.dp) out.dp = (du * xa).sum().reshape(v.p.sizes());
    }
    if (need.dw) out.dw = sum_rows(dya * t);
    if (need.db) out.db = sum_rows(dya);
    return out;
  }
};

Tensor dyt_fwd_ad(const Tensor& x, const OptTensor& w, const OptTensor& b, at::IntArrayRef shape, const Tensor& alpha) {
  Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    y = dyt_fwd(x, w, b, shape, alpha);
  }
  if (autograd::requires_grad(x, w, b, alpha))
    autograd::attach<DyT>({shape.vec()}, y, Tensor(), {x, std::nullopt, w, b, &alpha}, x, Tensor());
  return y;
}

// The backward op is not differentiable (the node's double backward uses ATen ops instead).
std::tuple<Tensor, Tensor, Tensor, Tensor> dyt_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                      const Tensor& alpha, at::IntArrayRef shape, bool need_dx,
                                                      bool need_dalpha, bool need_wb) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return dyt_bwd(dy, x, w, alpha, shape, need_dx, need_dalpha, need_wb);
}

}  // namespace

// ---- the eager entry ----

std::optional<Tensor> dyt_fast(const Tensor& x, at::IntArrayRef shape, const Tensor& alpha, const OptTensor& w,
                               const OptTensor& b) {
  const int64_t k = int64_t(shape.size());
  if (k == 0 || !input_fits(x, k, plain_cpu) || !x.sizes().slice(x.dim() - k).equals(shape)) return std::nullopt;
  const at::ScalarType t = x.scalar_type();
  if (!param_fits(w, shape, t, true, plain_cpu) || !param_fits(b, shape, t, true, plain_cpu) ||
      !alpha.defined() || !param_fits(alpha, {1}, t, true, plain_cpu))
    return std::nullopt;
  if (!autograd::requires_grad(x, w, b, alpha)) {  // nothing to record: straight to the CPU kernel
    at::AutoDispatchBelowADInplaceOrView guard;
    return dyt_fwd_cpu(x, w, b, shape, alpha);
  }
  return dyt_fwd_ad(x, w, b, shape, alpha);  // the Autograd kernel's work, without the dispatcher
}

}  // namespace normlab::dyt

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  using namespace normlab::dyt;
  m.impl("dyt_fwd", &dyt_fwd_ad);
  m.impl("dyt_bwd", &dyt_bwd_ad);
}
