// The group_norm family's CPU kernels (schemas: csrc/group_norm.h): tensors in, checks, outputs
// allocated in torch's memory format, the raw-pointer kernels of group_norm_kernels.h called.
//
// Layout (as torch's CPU GroupNorm): the output takes x.suggest_memory_format(). A channels_last
// input with S > 1 runs the NHWC kernels on its own memory; every other input is made contiguous
// (one copy if it is not) and runs the row kernels -- with S == 1 the two layouts are the same
// memory, and the backward takes the NHWC kernel (per-chunk dw/db partials, not per (n, c)).
// InstanceNorm's outputs are contiguous (its entry point hands a contiguous x).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "args.h"
#include "cpu/group_norm_kernels.h"

namespace normlab::group_norm {

namespace {

using at::Tensor;


// t in memory format fmt: a channels_last t of at least 16 channels (a block of the transpose) made
// contiguous by the blocked transpose of group_norm_kernels.h (torch's copy of a (1, 64, 128, 128)
// grad_out took several times as long; with fewer channels its copy runs in runs and is faster);
// else t.contiguous(fmt).
Tensor contiguous_as(const Tensor& t, at::MemoryFormat fmt) {
  if (fmt == at::MemoryFormat::Contiguous && t.dim() >= 3 && t.size(1) >= 16 && !t.is_contiguous() && t.numel() > 0 &&
      t.is_contiguous(t.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d) &&
      (t.dim() == 4 || t.dim() == 5)) {
    Tensor out = at::empty(t.sizes(), t.options());
    const int64_t n = t.size(0), c = t.size(1);
    nhwc_to_nchw(t.data_ptr(), out.data_ptr(), n, c, t.numel() / (n * c), int64_t(t.element_size()));
    return out;
  }
  return t.contiguous(fmt);
}

struct Shape {
  int64_t n, c, s;
};

Shape shape_of(const Tensor& x, int64_t g, const char* op) {
  TORCH_CHECK(x.dim() >= 2, op, ": expected an input of shape (N, C, *), got shape ", x.sizes());
  const int64_t n = x.size(0), c = x.size(1);
  TORCH_CHECK(g > 0 && c % g == 0, op, ": expected the number of channels (", c, ") to be divisible by num_groups (",
              g, ")");
  const int64_t s = n * c == 0 ? 0 : x.numel() / (n * c);
  return {n, c, s};
}

// The memory format of the output, and whether the NHWC kernels read x.
std::pair<at::MemoryFormat, bool> layout(const Tensor& x, int64_t s) {
  const at::MemoryFormat fmt = x.suggest_memory_format();
  return {fmt, fmt != at::MemoryFormat::Contiguous && s > 1};
}

// GroupNorm forward: y, and the statistics when `with_stats`.
std::tuple<Tensor, Tensor, Tensor, Tensor> forward(const Tensor& x, const OptTensor& w, const OptTensor& b, int64_t g,
                                                   double eps, bool with_stats, const char* op) {
  const Shape sh = shape_of(x, g, op);
  const auto [fmt, nhwc] = layout(x, sh.s);
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  const Tensor xk = x.contiguous(fmt);
  Tensor y = empty_out(x, fmt);
  Tensor mean, var, rstd;
  if (with_stats) {
    auto o = x.options().dtype(acc);
    mean = at::empty({sh.n, g}, o);
    var = at::empty({sh.n, g}, o);
    rstd = at::empty({sh.n, g}, o);
  }
  if (x.numel() == 0) {  // no value: statistics of empty groups are NaN (0 / 0), as torch's
    if (with_stats)
      for (Tensor* t : {&mean, &var, &rstd}) t->fill_(std::numeric_limits<double>::quiet_NaN());
    return {y, mean, var, rstd};
  }
  visit_dtype(x.scalar_type(), op, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    auto wv = param_values<A>(w, sh.c, op, "weight (one value per channel)", A(1));
    auto bv = param_values<A>(b, sh.c, op, "bias (one value per channel)", A(0));
    A* pm = with_stats ? ptr<A>(mean) : nullptr;
    A* pv = with_stats ? ptr<A>(var) : nullptr;
    A* pr = with_stats ? ptr<A>(rstd) : nullptr;
    if (nhwc)
      fwd_nhwc<S>(ptr<S>(xk), wv.data(), bv.data(), ptr<S>(y), pm, pv, pr, sh.n, sh.c, g, sh.s, eps);
    else
      fwd_rows<S>(ptr<S>(xk), wv.data(), bv.data(), ptr<S>(y), pm, pv, pr, sh.n, sh.c, g, sh.s, eps, false);
  });
  return {y, mean, var, rstd};
}

Tensor group_norm_cpu(const Tensor& x, const OptTensor& w, const OptTensor& b, int64_t g, double eps) {
  return std::get<0>(forward(x, w, b, g, eps, false, "group_norm"));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> group_norm_fwd_cpu(const Tensor& x, const OptTensor& w,
                                                              const OptTensor& b, int64_t g, double eps) {
  return forward(x, w, b, g, eps, true, "group_norm");
}

// The backward of GroupNorm (`fixed`: of InstanceNorm with fixed statistics, g = C, x contiguous).
std::tuple<Tensor, Tensor, Tensor> backward(const Tensor& dy_in, const Tensor& x, const OptTensor& w,
                                            const Tensor& mean_in, const Tensor& rstd_in, int64_t g, bool need_dx,
                                            bool fixed, const char* op) {
  const Shape sh = shape_of(x, g, op);
  TORCH_CHECK(dy_in.sizes() == x.sizes(), op, ": expected dy of the input's shape ", x.sizes(), ", got ",
              dy_in.sizes());
  const auto [fmt0, nhwc0] = layout(x, sh.s);
  const at::MemoryFormat fmt = fixed ? at::MemoryFormat::Contiguous : fmt0;
  const bool nhwc = !fixed && (nhwc0 || sh.s == 1);
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  const Tensor xk = x.contiguous(fmt);
  const Tensor dyk = contiguous_as(dy_in.scalar_type() == x.scalar_type() ? dy_in : dy_in.to(x.scalar_type()), fmt);
  Tensor dx = need_dx ? empty_out(x, fmt) : at::empty({0}, x.options());
  Tensor dw = at::empty({sh.c}, x.options().dtype(acc)), db = at::empty({sh.c}, x.options().dtype(acc));
  if (x.numel() == 0) {
    dw.zero_();
    db.zero_();
    return {dx, dw, db};
  }
  const Tensor mean = contiguous_in(mean_in, acc), rstd = contiguous_in(rstd_in, acc);
  const int64_t n_stats = fixed ? sh.c : sh.n * g;
  TORCH_CHECK(mean.numel() == n_stats && rstd.numel() == n_stats, op, ": expected mean and rstd with ", n_stats,
              " values, got ", mean.numel(), " and ", rstd.numel());
  visit_dtype(x.scalar_type(), op, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    auto wv = param_values<A>(w, sh.c, op, "weight (one value per channel)", A(1));
    S* pdx = need_dx ? ptr<S>(dx) : nullptr;
    if (nhwc)
      bwd_nhwc<S>(ptr<S>(dyk), ptr<S>(xk), wv.data(), ptr<A>(mean), ptr<A>(rstd), pdx, ptr<A>(dw), ptr<A>(db), sh.n,
                  sh.c, g, sh.s);
    else
      bwd_rows<S>(ptr<S>(dyk), ptr<S>(xk), wv.data(), ptr<A>(mean), ptr<A>(rstd), pdx, ptr<A>(dw), ptr<A>(db), sh.n,
                  sh.c, g, sh.s, fixed);
  });
  return {dx, dw, db};
}

std::tuple<Tensor, Tensor, Tensor> group_norm_bwd_cpu(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                      const Tensor& mean, const Tensor& rstd, int64_t g,
                                                      bool need_dx) {
  return backward(dy, x, w, mean, rstd, g, need_dx, false, "group_norm backward");
}

Tensor instance_norm_eval_fwd_cpu(const Tensor& x_in, const OptTensor& w, const OptTensor& b, const Tensor& mean_in,
                                  const Tensor& rstd_in) {
  const char* op = "instance_norm";
  const Tensor x = x_in.contiguous();  // torch's instance_norm output is contiguous
  const Shape sh = shape_of(x, x.dim() >= 2 ? x.size(1) : 1, op);
  Tensor y = empty_out(x, at::MemoryFormat::Contiguous);
  if (x.numel() == 0) return y;
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  const Tensor mean = contiguous_in(mean_in, acc), rstd = contiguous_in(rstd_in, acc);
  TORCH_CHECK(mean.numel() == sh.c && rstd.numel() == sh.c, op, ": expected running statistics with ", sh.c,
              " values (one per channel), got ", mean.numel(), " and ", rstd.numel());
  visit_dtype(x.scalar_type(), op, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    auto wv = param_values<A>(w, sh.c, op, "weight (one value per channel)", A(1));
    auto bv = param_values<A>(b, sh.c, op, "bias (one value per channel)", A(0));
    fwd_rows<S>(ptr<S>(x), wv.data(), bv.data(), ptr<S>(y), ptr<A>(mean), nullptr, ptr<A>(rstd), sh.n, sh.c, sh.c,
                sh.s, 0.0, true);
  });
  return y;
}

std::tuple<Tensor, Tensor, Tensor> instance_norm_eval_bwd_cpu(const Tensor& dy, const Tensor& x, const OptTensor& w,
                                                              const Tensor& mean, const Tensor& rstd, bool need_dx) {
  TORCH_CHECK(x.dim() >= 2, "instance_norm backward: expected an input of shape (N, C, *), got shape ", x.sizes());
  return backward(dy, x, w, mean, rstd, x.size(1), need_dx, true, "instance_norm backward");
}

void instance_norm_update_stats_cpu(const Tensor& rm, const Tensor& rv, const Tensor& mean_in, const Tensor& var_in,
                                    double momentum, int64_t n_spatial) {
  const char* op = "instance_norm";
  TORCH_CHECK(rm.dim() == 1 && rv.dim() == 1 && rm.numel() == rv.numel(), op,
              ": expected running_mean and running_var of shape (C,), got ", rm.sizes(), " and ", rv.sizes());
  TORCH_CHECK(rm.scalar_type() == rv.scalar_type(), op, ": expected running_mean and running_var of one dtype, got ",
              rm.scalar_type(), " and ", rv.scalar_type());
  const int64_t c = rm.numel();
  if (c == 0 || mean_in.numel() == 0) return;  // an empty batch leaves them as they are, as in torch
  TORCH_CHECK(mean_in.numel() % c == 0 && var_in.numel() == mean_in.numel(), op,
              ": expected per-instance statistics (N, C) for C = ", c, ", got ", mean_in.sizes(), " and ",
              var_in.sizes());
  const at::ScalarType acc = acc_dtype(mean_in.scalar_type());
  const Tensor mean = contiguous_in(mean_in, acc), var = contiguous_in(var_in, acc);
  const int64_t n = mean.numel() / c;
  visit_dtype(rm.scalar_type(), op, [&](auto rtag) {
    using R = decltype(rtag);
    if (acc == at::kDouble)
      update_running<R, double>(ptr<R>(rm), rm.stride(0), ptr<R>(rv), rv.stride(0), ptr<double>(mean),
                                ptr<double>(var), n, c, momentum, n_spatial);
    else
      update_running<R, float>(ptr<R>(rm), rm.stride(0), ptr<R>(rv), rv.stride(0), ptr<float>(mean), ptr<float>(var),
                               n, c, momentum, n_spatial);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("group_norm", &group_norm_cpu);
  m.impl("group_norm_fwd", &group_norm_fwd_cpu);
  m.impl("group_norm_bwd", &group_norm_bwd_cpu);
  m.impl("instance_norm_eval_fwd", &instance_norm_eval_fwd_cpu);
  m.impl("instance_norm_eval_bwd", &instance_norm_eval_bwd_cpu);
  m.impl("instance_norm_update_stats", &instance_norm_update_stats_cpu);
}

}  // namespace normlab::group_norm
