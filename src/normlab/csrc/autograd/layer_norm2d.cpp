// The layer_norm2d family's Autograd kernel and fast eager entry point.
//
// normlab::layer_norm2d records a LayerNorm2dFunction when autograd needs it (grad mode on and an
// input that requires grad): its forward runs layer_norm2d_forward below autograd and saves x,
// w, mean and rstd; its backward runs layer_norm2d_backward -- or, when the backward must itself
// be differentiable (create_graph=True), the reference backward in differentiable ATen ops
// (ops/layer_norm/reference.py: layer_norm_stats, layer_norm_backward_ref on the pixels as rows).
// Otherwise the call goes straight to the CPU kernel of layer_norm2d: the output and nothing else
// (no statistics that nobody reads).
//
// torch.func transforms refuse a C++ autograd::Function: under them Python takes the row
// LayerNorm's transform Function instead (ops/layer_norm/op_2d.py).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "layer_norm2d_layout.h"

namespace normlab {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptT = std::optional<Tensor>;

const auto& plain_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::layer_norm2d", "")
                       .typed<Tensor(const Tensor&, const OptT&, const OptT&, double)>();
  return op;
}
const auto& forward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("normlab::layer_norm2d_forward", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const OptT&, const OptT&, double)>();
  return op;
}
const auto& backward_op() {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("normlab::layer_norm2d_backward", "")
          .typed<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptT&, const Tensor&,
                                                    const Tensor&, bool)>();
  return op;
}

bool given(const OptT& p) { return p.has_value() && p->defined(); }

// LayerNorm2d's gradients in differentiable ATen ops, on the pixels as rows (N * S, C): the
// statistics recomputed from x by the shifted two passes, then the three terms of dx.
std::tuple<Tensor, Tensor, Tensor> reference_backward(const Tensor& dy, const Tensor& x, const Tensor& w, double eps,
                                                      bool need_dx, bool need_dw, bool need_db) {
  const int64_t c = x.size(1);
  const auto acc = ln2d::acc_dtype(x.scalar_type());
  const Tensor xr = x.movedim(1, -1);                      // (N, *, C)
  const Tensor rows = xr.reshape({-1, c}).to(acc);         // (N * S, C)
  const Tensor dya = dy.movedim(1, -1).reshape({-1, c}).to(acc);
  const Tensor shift = rows.narrow(1, 0, 1);               // (N * S, 1)
  const Tensor d = rows - shift;
  const Tensor mean_d = d.mean(-1, true);
  const Tensor xc = d - mean_d;
  const Tensor var = (xc * xc).mean(-1, true);             // biased
  const Tensor mean = shift + mean_d;
  const Tensor rstd = at::rsqrt(var + eps);
  const Tensor x_hat = (rows - mean) * rstd;
  Tensor dx, dw, db;
  if (need_dx) {
    const Tensor g = w.defined() ? dya * w.to(acc) : dya;
    const Tensor term1 = g;
    const Tensor term2 = g.mean(-1, true);
    const Tensor term3 = x_hat * (g * x_hat).mean(-1, true);
    dx = (rstd * (term1 - term2 - term3)).to(x.scalar_type()).reshape(xr.sizes()).movedim(-1, 1);
  }
  if (need_dw) dw = (dya * x_hat).sum(0);
  if (need_db) db = dya.sum(0);
  return {dx, dw, db};
}

struct LayerNorm2dFunction : public torch::autograd::Function<LayerNorm2dFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const OptT& w, const OptT& b, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = forward_op().call(x, w, b, eps);
    ctx->save_for_backward({x, given(w) ? *w : Tensor(), mean, rstd});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["has_w"] = given(w);
    ctx->saved_data["b_dtype"] = given(b) ? int64_t(b->scalar_type()) : int64_t(-1);
    ctx->set_materialize_grads(false);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor& dy = grads[0];
    if (!dy.defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool has_w = ctx->saved_data["has_w"].toBool();
    const int64_t b_dtype = ctx->saved_data["b_dtype"].toInt();
    const bool has_b = b_dtype >= 0;
    // needs_input_grad counts the tensors given: x, then w, then b
    const bool need_dx = ctx->needs_input_grad(0);
    const bool need_dw = has_w && ctx->needs_input_grad(1);
    const bool need_db = has_b && ctx->needs_input_grad(has_w ? 2 : 1);
    Tensor dx, dw, db;
    if (at::GradMode::is_enabled() && x.numel() > 0) {  // create_graph: a backward with a backward
      std::tie(dx, dw, db) =
          reference_backward(dy, x, w, ctx->saved_data["eps"].toDouble(), need_dx, need_dw, need_db);
    } else {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(dx, dw, db) = backward_op().call(dy, x, has_w ? OptT(w) : OptT(), mean, rstd, need_dw || need_db);
    }
    dw = need_dw ? (dw.scalar_type() == w.scalar_type() ? dw : dw.to(w.scalar_type())) : Tensor();
    const auto bt = static_cast<at::ScalarType>(has_b ? b_dtype : 0);
    db = need_db ? (db.scalar_type() == bt ? db : db.to(bt)) : Tensor();
    return {need_dx ? dx : Tensor(), dw, db, Tensor()};
  }
};

Tensor layer_norm2d_autograd(const Tensor& x, const OptT& w, const OptT& b, double eps) {
  const bool record = at::GradMode::is_enabled() &&
                      (x.requires_grad() || (given(w) && w->requires_grad()) || (given(b) && b->requires_grad()));
  if (record) return LayerNorm2dFunction::apply(x, w, b, eps);
  at::AutoDispatchBelowADInplaceOrView guard;  // nothing records: the output alone
  return plain_op().call(x, w, b, eps);
}

}  // namespace

// The eager entry of normlab._C (csrc/layer_norm2d.h): the registered op through a cached handle.
Tensor layer_norm2d_call(const Tensor& x, const OptT& w, const OptT& b, double eps) {
  return plain_op().call(x, w, b, eps);
}

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  m.impl("layer_norm2d", &layer_norm2d_autograd);
}

}  // namespace normlab
