// The group_norm family's Autograd kernels and fast eager entries (group_norm.h).
//
// One node family (autograd/node.h, GroupNorm) for every differentiable op: GroupNorm,
// InstanceNorm (GroupNorm with G = C) and InstanceNorm with fixed statistics (`fixed`: a
// per-channel linear map); saved x, the weight, and mean, rstd. Forward: redispatched below
// autograd to the forward op (CPU / Meta kernels); only when autograd records the call --
// otherwise the op computes the output alone, with no statistics allocated. Backward: the
// backward op; under create_graph=True the reference backward in differentiable ATen ops
// (reference.py's formula, statistics recomputed from x), so double backward works. torch.func
// transforms take the Python Function of functional/group_norms.py (its vmap and jvp rules),
// which calls the same forward/backward ops.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "args.h"
#include "autograd/node.h"
#include "cpu/group_norm_kernels.h"
#include "group_norm.h"

namespace normlab::group_norm {
namespace {

using at::Tensor;
using autograd::Grad;
using autograd::Grads;
using autograd::Needs;
using autograd::Saved;
using torch::autograd::variable_list;

struct GroupNorm {
  static constexpr bool kResidual = false;
  struct State {
    int64_t g = 1;
    double eps = 0;
    bool fixed = false;
  };
  static std::string name(const State& s) { return s.fixed ? "InstanceNormEvalBackward" : "GroupNormBackward"; }

  // The backward op (saved: s0 mean, s1 rstd).
  static Grads backward(const State& s, const Grad& g, const Saved& v, Needs need) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const OptTensor w = v.w.defined() ? OptTensor(v.w) : std::nullopt;
    auto [dx, dw, db] = s.fixed ? instance_norm_eval_bwd(g.dy, v.x, w, v.s0, v.s1, need.dx)
                                : group_norm_bwd(g.dy, v.x, w, v.s0, v.s1, s.g, need.dx);
    return {need.dx ? dx : Tensor(), need.dw ? dw : Tensor(), need.db ? db : Tensor()};
  }

  // The differentiable reference backward (reference.py), the statistics recomputed from x
  // (fixed: the saved ones, constants).
  static Grads reference(const State& st, const Grad& gr, const Saved& v, Needs need) {
    const Tensor &x = v.x, &w = v.w;
    const at::ScalarType acc = acc_dtype(x.scalar_type());
    const int64_t n = x.size(0), c = x.size(1), g = st.g;
    const int64_t s = n * c == 0 ? 0 : x.numel() / (n * c);
    const std::vector<int64_t> grouped{n, g, c / g, s};
    const Tensor xa = x.to(acc).reshape(grouped), dya = gr.dy.to(acc).reshape(grouped);
    Tensor m, r;
    if (st.fixed) {
      m = v.s0.reshape({1, g, 1, 1});
      r = v.s1.reshape({1, g, 1, 1});
    } else {  // the statistics as functions of x (reference.py: group_norm_stats)
      const Tensor shift = xa.narrow(2, 0, 1).narrow(3, 0, 1);
      const Tensor d = xa - shift;
      const Tensor md = d.mean({2, 3}, true);
      const Tensor xc = d - md;
      r = ((xc * xc).mean({2, 3}, true) + st.eps).rsqrt();
      m = shift + md;
    }
    const Tensor x_hat = (xa - m) * r;
    Grads out;
    if (need.dx) {
      const Tensor gg = w.defined() ? dya * w.to(acc).reshape({g, c / g, 1}) : dya;
      Tensor dx;
      if (st.fixed) {
        dx = r * gg;  // term 1 only
      } else {
        const Tensor term2 = gg.mean({2, 3}, true);
        const Tensor term3 = x_hat * (gg * x_hat).mean({2, 3}, true);
        dx = r * (gg - term2 - term3);
      }
      out.dx = dx.to(x.scalar_type()).reshape(x.sizes());
    }
    if (need.dw) out.dw = (dya * x_hat).sum({0, 3}).reshape({c});
    if (need.db) out.db = dya.sum({0, 3}).reshape({c});
    return out;
  }
};

void attach(const Tensor& y, const Tensor& x, const OptTensor& w, const OptTensor& b, const Tensor& mean,
            const Tensor& rstd, int64_t g, double eps, bool fixed) {
  autograd::attach<GroupNorm>({g, eps, fixed}, y, Tensor(), {x, std::nullopt, w, b}, x, mean, rstd);
}

// GroupNorm recorded by autograd: the forward op below autograd, then the node on y; the
// statistics (N, G) are outputs without a gradient.
std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_recorded(const Tensor& x, const OptTensor& w,
                                                               const OptTensor& b, int64_t g, double eps) {
  Tensor y, mean, var, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(y, mean, var, rstd) = group_norm_fwd(x, w, b, g, eps);
  }
  attach(y, x, w, b, mean, rstd, g, eps, false);
  return {y, mean, var, rstd};
}

// GroupNorm's output: recorded when autograd needs it, else the output-only op.
Tensor group_norm_ad(const Tensor& x, const OptTensor& w, const OptTensor& b, int64_t g, double eps) {
  if (autograd::requires_grad(x, w, b)) return std::get<0>(group_norm_recorded(x, w, b, g, eps));
  at::AutoDispatchBelowADInplaceOrView guard;
  return group_norm(x, w, b, g, eps);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_fwd_ad(const Tensor& x, const OptTensor& w, const OptTensor& b,
                                                             int64_t g, double eps) {
  if (autograd::requires_grad(x, w, b)) return group_norm_recorded(x, w, b, g, eps);
  at::AutoDispatchBelowADInplaceOrView guard;
  return group_norm_fwd(x, w, b, g, eps);
}

Tensor instance_norm_eval_fwd_ad(const Tensor& x, const OptTensor& w, const OptTensor& b, const Tensor& mean,
                                 const Tensor& rstd) {
  Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    y = instance_norm_eval_fwd(x, w, b, mean, rstd);
  }
  if (autograd::requires_grad(x, w, b)) attach(y, x, w, b, mean, rstd, x.size(1), 0.0, true);
  return y;
}

// The backward ops are not differentiable (the node's double backward uses ATen ops instead).
std::tuple<Tensor, Tensor, Tensor> group_norm_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                     const Tensor& mean, const Tensor& rstd, int64_t g, bool need_dx) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return group_norm_bwd(dy, x, w, mean, rstd, g, need_dx);
}

std::tuple<Tensor, Tensor, Tensor> instance_norm_eval_bwd_ad(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                             const Tensor& mean, const Tensor& rstd, bool need_dx) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return instance_norm_eval_bwd(dy, x, w, mean, rstd, need_dx);
}

// The running statistics change in place: their version counters move once, as for any in-place
// torch op (inference tensors have none).
void instance_norm_update_stats_ad(const Tensor& rm, const Tensor& rv, const Tensor& mean, const Tensor& var,
                                   double momentum, int64_t n_spatial) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    instance_norm_update_stats(rm, rv, mean, var, momentum, n_spatial);
  }
  for (const Tensor* t : {&rm, &rv})
    if (!t->is_inference()) torch::autograd::impl::bump_version(*t);
}

// Whether x is a strided CPU tensor of a served dtype with at least `min_dim` dims and each
// parameter None or a strided CPU tensor of shape (C,) in x's dtype (or float32 beside half
// precision): what normlab._checks.cpu_params_fit accepts.
bool fits_fast(const Tensor& x, int64_t min_dim, std::initializer_list<const OptTensor*> params) {
  if (!input_fits(x, min_dim)) return false;
  const int64_t c = x.size(1);
  for (const OptTensor* p : params)
    if (!param_fits(*p, c, x.scalar_type())) return false;
  return true;
}

// x_in.contiguous() for a channels_last x_in of at least 16 channels by the kernels' blocked transpose
// (as cpu/group_norm.cpp's contiguous_as: InstanceNorm2d(64) channels_last (1, 64, 128, 128) forward
// and backward 0.76x torch.nn with torch's copies, 1.45x with both transposes); differentiable as
// contiguous() is (the gradient passes through as it is).
struct ToContiguous : public torch::autograd::Function<ToContiguous> {
  static Tensor forward(torch::autograd::AutogradContext*, const Tensor& x) {
    Tensor out = at::empty(x.sizes(), x.options());
    const int64_t n = x.size(0), c = x.size(1);
    nhwc_to_nchw(x.data_ptr(), out.data_ptr(), n, c, x.numel() / (n * c), int64_t(x.element_size()));
    return out;
  }
  static variable_list backward(torch::autograd::AutogradContext*, variable_list g) { return {g[0]}; }
};

bool channels_last(const Tensor& x) {
  return !x.is_contiguous() && x.numel() > 0 && x.device().is_cpu() &&
         ((x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
          (x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d)));
}

Tensor contiguous_input(const Tensor& x) {
  if (!channels_last(x) || x.size(1) < 16) return x.contiguous();
  return ToContiguous::apply(x);
}

}  // namespace

// ---- the eager entries ----

std::optional<Tensor> group_norm_fast(const Tensor& x, int64_t g, const OptTensor& w, const OptTensor& b,
                                      double eps) {
  if (!plain_eps(eps) || g <= 0 || !fits_fast(x, 2, {&w, &b})) return std::nullopt;
  const int64_t c = x.size(1), numel = x.numel();
  if (c % g != 0 || numel == 0 || numel == g) return std::nullopt;  // not divisible, empty, one value a group
  return group_norm_ad(x, w, b, g, eps);  // the Autograd kernel's work, without the dispatcher
}

Tensor instance_norm_entry(const Tensor& x_in, const OptTensor& rm, const OptTensor& rv, const OptTensor& w,
                           const OptTensor& b, bool use_input_stats, double momentum, double eps) {
  const bool running = given(rm);
  // torch's instance_norm output is contiguous. With the input's statistics, a channels_last x is
  // normalised as it is (GroupNorm with G = C: the channels-last kernels, whose backward then reads
  // dy in its own layout and gives dx in x's), and the output made contiguous after -- not x made
  // contiguous first, which left the backward a transposed dy to read and a dx for autograd to
  // copy back into x's layout (InstanceNorm3d(4) on a channels_last 1x4x5x211x211 float16 input,
  // forward+backward: 0.85x torch.nn at 2 threads). functional/group_norms.py's compiled path
  // does the same.
  const bool own_layout = use_input_stats && channels_last(x_in);
  const Tensor x = own_layout ? x_in : contiguous_input(x_in);
  const int64_t n = x.size(0), c = x.size(1);
  if (use_input_stats) {
    Tensor y;
    if (!running) {
      y = group_norm_ad(x, w, b, c, eps);
    } else {
      Tensor mean, var;
      std::tie(y, mean, var, std::ignore) = group_norm_fwd_ad(x, w, b, c, eps);
      if (x.numel() > 0) instance_norm_update_stats_ad(*rm, *rv, mean, var, momentum, x.numel() / (n * c));
    }
    return own_layout ? contiguous_input(y) : y;
  }
  TORCH_CHECK(running, "instance_norm: expected running_mean and running_var when use_input_stats=False, got None");
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  const bool rec = autograd::requires_grad(x, w, b);
  Tensor mean, rstd;
  {
    at::NoGradGuard no_grad;  // constants of the map; a copy, safe from later updates of the buffers
    mean = rm->to(acc, /*non_blocking=*/false, /*copy=*/rec);
    rstd = (rv->to(acc) + eps).rsqrt();
  }
  return instance_norm_eval_fwd_ad(x, w, b, mean, rstd);
}

std::optional<Tensor> instance_norm_fast(const Tensor& x, const OptTensor& rm, const OptTensor& rv,
                                         const OptTensor& w, const OptTensor& b, bool use_input_stats,
                                         double momentum, double eps) {
  if (!plain_eps(eps) || !(momentum >= 0 && momentum <= 1)) return std::nullopt;
  if (!fits_fast(x, use_input_stats ? 3 : 2, {&rm, &rv, &w, &b}) || recorded_buffer(rm) || recorded_buffer(rv))
    return std::nullopt;
  const bool has_rm = given(rm), has_rv = given(rv);
  if (has_rm != has_rv || !(has_rm || use_input_stats)) return std::nullopt;
  const int64_t numel = x.numel();
  if (numel == 0 || (use_input_stats && numel == x.size(0) * x.size(1))) return std::nullopt;  // empty; S == 1
  return instance_norm_entry(x, rm, rv, w, b, use_input_stats, momentum, eps);
}

}  // namespace normlab::group_norm

TORCH_LIBRARY_IMPL(normlab, Autograd, m) {
  using namespace normlab::group_norm;
  m.impl("group_norm", &group_norm_ad);
  m.impl("group_norm_fwd", &group_norm_fwd_ad);
  m.impl("group_norm_bwd", &group_norm_bwd_ad);
  m.impl("instance_norm_eval_fwd", &instance_norm_eval_fwd_ad);
  m.impl("instance_norm_eval_bwd", &instance_norm_eval_bwd_ad);
  m.impl("instance_norm_update_stats", &instance_norm_update_stats_ad);
}
