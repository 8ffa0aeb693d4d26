// The one autograd node every family attaches (NormBackward<Family>), built by hand as torch's
// generated autograd code builds its nodes: the saved values are fields, not the IValue dict and
// variable bookkeeping of torch::autograd::Function, which cost several microseconds a call --
// most of a small norm's time.
//
// The template holds what every family's node shares: the saved state (x -- or h, an output, for
// the fused residual add --, the weight, up to two statistics tensors, which inputs were given
// and the parameters' dtypes), the prologue of `apply` (the lock, which gradients are needed,
// the early returns), the choice between the family's backward op (below autograd) and, when the
// backward is itself differentiated (create_graph=True: grad mode on inside it), the family's
// reference backward in differentiable ATen ops (its ops/<family>/reference.py formula, the
// statistics recomputed from x), and the epilogue (dw, db in the parameters' dtypes). `attach`
// builds the node: edges, history, saved state.
//
// A family supplies a traits struct F:
//   static constexpr bool kResidual;   edges (x, residual, weight, bias) and grads in (dy, dh),
//                                      else edges (x, weight, bias) and grads in (dy)
//   struct State;                      its own fields (eps, groups, shape, ...)
//   static std::string name(const State&);
//   static Grads backward(const State&, const Grad&, const Saved&, Needs);   the backward op
//   static Grads reference(const State&, const Grad&, const Saved&, Needs);  differentiable ATen
// and, where the family has a parameter of its own besides the affine (DyT's alpha):
//   static constexpr bool kParam = true;  one more edge after the bias (Inputs::p), saved
//                                         (Saved::p), its gradient Grads::dp (cast to its dtype)
// and, where the backward reads the bias (norm+act: z = norm(x) recomputed before act'(z)):
//   static constexpr bool kSaveBias = true;  the bias saved too (Saved::b; undefined without one)
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <mutex>
#include <string>

#include "args.h"

namespace normlab::autograd {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

namespace detail {
inline bool wants(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool wants(const OptTensor& t) { return t.has_value() && t->defined() && t->requires_grad(); }

template <class F> constexpr bool has_param() {
  if constexpr (requires { F::kParam; }) return F::kParam;
  else return false;
}

template <class F> constexpr bool saves_bias() {
  if constexpr (requires { F::kSaveBias; }) return F::kSaveBias;
  else return false;
}
}  // namespace detail

// Whether autograd records a call: grad mode on and an input that requires grad.
template <class... T> inline bool requires_grad(const T&... inputs) {
  return at::GradMode::is_enabled() && (detail::wants(inputs) || ...);
}

// Which gradients a backward computes.
struct Needs {
  bool dx = false, dw = false, db = false, dp = false;
  bool any() const { return dx || dw || db || dp; }
};

// The gradients in: dy, and dh (the gradient of h = x + residual; undefined without one).
struct Grad {
  at::Tensor dy, dh;
};

// The saved tensors, unpacked: x (h for the fused add), the weight, the statistics (undefined
// where absent); and the parameters' dtypes, which the node casts dw and db to.
struct Saved {
  at::Tensor x, w, s0, s1;
  at::ScalarType w_dtype, b_dtype;
  at::Tensor p = {};  // the family's own parameter (F::kParam)
  at::Tensor b = {};  // the bias (F::kSaveBias)
};

// The gradients out (dw, db in any dtype: the node casts them to the parameters').
struct Grads {
  at::Tensor dx, dw, db, dp = {};
};

template <class F>
struct NormBackward final : public torch::autograd::Node {
  static constexpr bool kParam = detail::has_param<F>();
  static constexpr bool kSaveBias = detail::saves_bias<F>();
  static constexpr size_t kW = F::kResidual ? 2 : 1, kB = kW + 1, kP = kB + 1, kEdges = kParam ? kP + 1 : kB + 1;

  typename F::State state;
  SavedVariable x_, w_, s0_, s1_, p_, b_;
  bool has_res_ = false, has_w_ = false, has_b_ = false, has_p_ = false;
  at::ScalarType w_dtype_ = at::kFloat, b_dtype_ = at::kFloat, p_dtype_ = at::kFloat;

  std::string name() const override { return F::name(state); }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x_.reset_data();
    w_.reset_data();
    s0_.reset_data();
    s1_.reset_data();
    p_.reset_data();
    b_.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list out(kEdges);
    const bool res = F::kResidual && has_res_;
    const Grad g{grads[0], res ? grads[1] : at::Tensor()};
    const bool out_x = should_compute_output(0), out_res = res && should_compute_output(1);
    const Needs need{out_x || out_res, has_w_ && should_compute_output(kW), has_b_ && should_compute_output(kB),
                     kParam && has_p_ && should_compute_output(kP)};
    if (!g.dy.defined()) {  // only h reached the loss: both x and the residual get its gradient
      if (out_x) out[0] = g.dh;
      if (out_res) out[1] = g.dh;
      return out;
    }
    if (!need.any()) return out;
    const Saved saved{x_.unpack(getptr()), has_w_ ? w_.unpack() : at::Tensor(), s0_.unpack(), s1_.unpack(), w_dtype_,
                      b_dtype_, has_p_ ? p_.unpack() : at::Tensor(),
                      kSaveBias && has_b_ ? b_.unpack() : at::Tensor()};
    const Grads r =
        at::GradMode::is_enabled() ? F::reference(state, g, saved, need) : F::backward(state, g, saved, need);
    if (out_x) out[0] = r.dx;
    if (out_res) out[1] = r.dx;  // h = x + residual: both get h's whole gradient
    if (need.dw) out[kW] = r.dw.scalar_type() == w_dtype_ ? r.dw : r.dw.to(w_dtype_);
    if (need.db) out[kB] = r.db.scalar_type() == b_dtype_ ? r.db : r.db.to(b_dtype_);
    if (need.dp) out[kP] = r.dp.scalar_type() == p_dtype_ ? r.dp : r.dp.to(p_dtype_);
    return out;
  }
};

// The inputs a node's edges point to: x, the residual (F::kResidual), the weight, the bias, the
// family's own parameter (F::kParam).
struct Inputs {
  const at::Tensor& x;
  const OptTensor& res;
  const OptTensor& w;
  const OptTensor& b;
  const at::Tensor* p = nullptr;
};

// A NormBackward<F> node on y (and on h, when defined: the fused add's sum), with edges to the
// inputs, saving x_saved (h, an output, when h is defined), the weight, and s0, s1.
template <class F>
void attach(typename F::State state, const at::Tensor& y, const at::Tensor& h, const Inputs& in,
            const at::Tensor& x_saved, const at::Tensor& s0, const at::Tensor& s1 = at::Tensor()) {
  auto node = c10::make_intrusive<NormBackward<F>>();
  if constexpr (F::kResidual) {
    node->set_next_edges(torch::autograd::collect_next_edges(in.x, in.res, in.w, in.b));
    node->has_res_ = given(in.res);
  } else if constexpr (NormBackward<F>::kParam) {
    node->set_next_edges(torch::autograd::collect_next_edges(in.x, in.w, in.b, *in.p));
  } else {
    node->set_next_edges(torch::autograd::collect_next_edges(in.x, in.w, in.b));
  }
  node->state = std::move(state);
  node->has_w_ = given(in.w);
  node->has_b_ = given(in.b);
  if (node->has_w_) node->w_dtype_ = in.w->scalar_type();
  if (node->has_b_) node->b_dtype_ = in.b->scalar_type();
  torch::autograd::set_history(y, node);
  if (h.defined()) torch::autograd::set_history(h, node);
  node->x_ = SavedVariable(x_saved, /*is_output=*/h.defined());
  if (node->has_w_) node->w_ = SavedVariable(*in.w, false);
  if constexpr (NormBackward<F>::kSaveBias)
    if (node->has_b_) node->b_ = SavedVariable(*in.b, false);
  if constexpr (NormBackward<F>::kParam) {
    node->has_p_ = in.p->defined();
    node->p_dtype_ = in.p->scalar_type();
    node->p_ = SavedVariable(*in.p, false);
  }
  if (s0.defined()) node->s0_ = SavedVariable(s0, false);
  if (s1.defined()) node->s1_ = SavedVariable(s1, false);
}

}  // namespace normlab::autograd
