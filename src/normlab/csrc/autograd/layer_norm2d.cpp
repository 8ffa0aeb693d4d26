// The layer_norm2d family's Autograd kernel and fast eager entry points.
//
// normlab::layer_norm2d attaches a LayerNorm2dBackward node when autograd needs it (grad mode on
// and an input that requires grad): the forward runs layer_norm2d_forward below autograd and the
// node saves x, w, mean and rstd as fields; its backward runs layer_norm2d_backward -- or, when
// the backward must itself be differentiable (create_graph=True), the reference backward in
// differentiable ATen ops (ops/layer_norm/reference.py: layer_norm_stats, layer_norm_backward_ref
// on the pixels as rows). The node is built by hand, as torch's generated autograd code and
// LayerNorm's RowNormBackward (autograd/layer_norm.cpp) are: torch::autograd::Function's IValue
// dict and variable bookkeeping cost several microseconds a call. Otherwise the call goes
// straight to the CPU kernel of layer_norm2d: the output and nothing else (no statistics that
// nobody reads).
//
// torch.func transforms refuse C++ autograd nodes of this kind: under them Python takes the row
// LayerNorm's transform Function instead (ops/layer_norm/op_2d.py).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include "autograd/row_stats_node.h"

#include <cmath>

#include "layer_norm2d_layout.h"

namespace normlab {
namespace {

using at::Tensor;
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

// The backward node of layer_norm2d: the grad of y in, the grads of (x, weight, bias) out, one
// per edge (an absent parameter has an empty edge).
struct LayerNorm2dBackward : public RowStatsNode {  // saves x, w, mean, rstd
  double eps_ = 0;
  bool has_w_ = false, has_b_ = false;
  at::ScalarType b_dtype_ = at::kFloat;

  std::string name() const override { return "LayerNorm2dBackward"; }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list out(3);
    const Tensor& dy = grads[0];
    if (!dy.defined()) return out;
    const bool need_dx = should_compute_output(0);
    const bool need_dw = has_w_ && should_compute_output(1);
    const bool need_db = has_b_ && should_compute_output(2);
    const Tensor x = x_.unpack(getptr()), w = has_w_ ? w_.unpack() : Tensor();
    Tensor dx, dw, db;
    if (at::GradMode::is_enabled() && x.numel() > 0) {  // create_graph: a backward with a backward
      std::tie(dx, dw, db) = reference_backward(dy, x, w, eps_, need_dx, need_dw, need_db);
    } else {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(dx, dw, db) =
          backward_op().call(dy, x, has_w_ ? OptT(w) : OptT(), mean_.unpack(), rstd_.unpack(), need_dw || need_db);
    }
    if (need_dx) out[0] = dx;
    if (need_dw) out[1] = dw.scalar_type() == w.scalar_type() ? dw : dw.to(w.scalar_type());
    if (need_db) out[2] = db.scalar_type() == b_dtype_ ? db : db.to(b_dtype_);
    return out;
  }
};

// The forward with autograd: layer_norm2d_forward below autograd, then a LayerNorm2dBackward
// node on y.
Tensor layer_norm2d_recorded(const Tensor& x, const OptT& w, const OptT& b, double eps) {
  Tensor y, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, mean, rstd) = forward_op().call(x, w, b, eps);
  }
  auto node = c10::make_intrusive<LayerNorm2dBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
  node->has_w_ = given(w);
  node->has_b_ = given(b);
  node->eps_ = eps;
  if (node->has_b_) node->b_dtype_ = b->scalar_type();
  torch::autograd::set_history(y, node);
  node->x_ = torch::autograd::SavedVariable(x, false);
  if (node->has_w_) node->w_ = torch::autograd::SavedVariable(*w, false);
  node->mean_ = torch::autograd::SavedVariable(mean, false);
  node->rstd_ = torch::autograd::SavedVariable(rstd, false);
  return y;
}

bool wants_grad(const Tensor& x, const OptT& w, const OptT& b) {
  return at::GradMode::is_enabled() &&
         (x.requires_grad() || (given(w) && w->requires_grad()) || (given(b) && b->requires_grad()));
}

Tensor layer_norm2d_autograd(const Tensor& x, const OptT& w, const OptT& b, double eps) {
  if (wants_grad(x, w, b)) return layer_norm2d_recorded(x, w, b, eps);
  at::AutoDispatchBelowADInplaceOrView guard;  // nothing records: the output alone
  return plain_op().call(x, w, b, eps);
}

// Whether (x, w, b) are arguments normlab.functional.layer_norm2d's checks accept without a word
// and the kernels serve: x a strided CPU tensor of a served dtype with a channel dim, each
// parameter None or a strided CPU tensor of shape (C,) in x's dtype (float32 also beside half
// precision).
bool fits_fast(const Tensor& x, const OptT& w, const OptT& b) {
  if (!x.defined() || !x.device().is_cpu() || x.layout() != at::kStrided || x.dim() < 2) return false;
  const auto st = x.scalar_type();
  const bool half = st == at::kBFloat16 || st == at::kHalf;
  if (!(half || st == at::kFloat || st == at::kDouble)) return false;
  const int64_t c = x.size(1);
  for (const OptT* p : {&w, &b}) {
    if (!p->has_value() || !(*p)->defined()) continue;
    const Tensor& t = **p;
    if (!t.device().is_cpu() || t.layout() != at::kStrided || t.dim() != 1 || t.size(0) != c) return false;
    if (!(t.scalar_type() == st || (half && t.scalar_type() == at::kFloat))) return false;
  }
  return true;
}

}  // namespace

// The eager entries of normlab._C (csrc/layer_norm2d.h). layer_norm2d_call: the registered op
// through a cached handle. layer_norm2d_fast: the Autograd kernel's work without the dispatcher
// for arguments that fit (fits_fast), else None.
Tensor layer_norm2d_call(const Tensor& x, const OptT& w, const OptT& b, double eps) {
  return plain_op().call(x, w, b, eps);
}

std::optional<Tensor> layer_norm2d_fast(const Tensor& x, const OptT& w, const OptT& b, double eps) {
  if (!(std::isfinite(eps) && eps >= 0) || !fits_fast(x, w, b)) return std::nullopt;
  if (wants_grad(x, w, b)) return layer_norm2d_recorded(x, w, b, eps);
  at::AutoDispatchBelowADInplaceOrView guard;
  return plain_op().call(x, w, b, eps);
}

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  m.impl("layer_norm2d", &layer_norm2d_autograd);
}

}  // namespace normlab
