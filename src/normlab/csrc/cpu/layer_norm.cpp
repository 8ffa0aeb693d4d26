// The layer_norm family's CPU kernels (schemas: csrc/layer_norm.h): argument checks, outputs
// allocated in torch's layout, then the torch-free kernels: the row kernels
// (cpu/layer_norm_kernels.cpp) for LayerNorm / RMSNorm and for LayerNorm2d's channels-last
// pixels, the NCHW plane kernels (cpu/layer_norm2d_kernels.cpp) for LayerNorm2d's contiguous input.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "args.h"
#include "cpu/layer_norm2d_kernels.h"
#include "cpu/layer_norm_kernels.h"
#include "layer_norm2d_layout.h"

namespace normlab::layer_norm {
namespace {

using at::Tensor;

// (n_rows, n_cols) of x normalised over its trailing `shape` dims, with the checks.
std::pair<int64_t, int64_t> row_shape(const char* op, const Tensor& x, at::IntArrayRef shape) {
  const auto st = x.scalar_type();
  TORCH_CHECK(served_dtype(st), op, ": expected a float32, float64, bfloat16 or float16 input, got ", st);
  TORCH_CHECK(x.device().is_cpu(), op, ": expected a CPU tensor, got one on ", x.device());
  const int64_t k = int64_t(shape.size()), d = x.dim();
  TORCH_CHECK(k > 0 && d >= k && x.sizes().slice(d - k) == shape, op, ": expected an input of shape [*, ",
              shape, "], got ", x.sizes());
  int64_t n_cols = 1, n_rows = 1;
  for (int64_t s : shape) n_cols *= s;
  for (int64_t i = 0; i < d - k; ++i) n_rows *= x.size(i);
  return {n_rows, n_cols};
}

// A weight or bias as the kernel reads it: contiguous, G * n_cols values (G = 1, or grouped).
int64_t param_rows(const char* op, const char* name, const Tensor& p, int64_t n_rows, int64_t n_cols) {
  TORCH_CHECK(p.device().is_cpu(), op, ": expected ", name, " on the CPU, got ", p.device());
  const int64_t numel = p.numel();
  TORCH_CHECK(numel == n_cols || (n_cols > 0 && numel % n_cols == 0 && numel / n_cols > 0 &&
                                  n_rows % (numel / n_cols) == 0),
              op, ": expected ", name, " of ", n_cols, " values (or G * ", n_cols,
              " grouped values, G dividing the ", n_rows, " rows), got ", name, " of shape ", p.sizes());
  return n_cols > 0 ? std::max<int64_t>(1, numel / n_cols) : 1;
}

struct Params {
  Tensor w, b;  // contiguous, in `dt` (undefined: none)
  Dtype dt;
  int64_t n_w = 1, n_b = 1;
};

// The weight as applied (w + offset, in the accumulation dtype) and the bias, in x's dtype when
// both are (no copy), else both in the accumulation dtype.
Params params(const char* op, const Tensor& x, const OptTensor& w_, const OptTensor& b_, double offset,
              int64_t n_rows, int64_t n_cols) {
  Params p;
  const auto st = x.scalar_type(), acc = acc_dtype(st);
  p.w = w_.has_value() ? *w_ : Tensor();
  p.b = b_.has_value() ? *b_ : Tensor();
  if (p.w.defined()) p.n_w = param_rows(op, "weight", p.w, n_rows, n_cols);
  if (p.b.defined()) p.n_b = param_rows(op, "bias", p.b, n_rows, n_cols);
  if (p.w.defined() && offset != 0.0) p.w = p.w.to(acc) + offset;  // added in the accumulation dtype
  const bool own = (!p.w.defined() || p.w.scalar_type() == st) && (!p.b.defined() || p.b.scalar_type() == st);
  const auto pdt = own ? st : acc;
  for (Tensor* t : {&p.w, &p.b}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->is_floating_point(), op, ": expected a floating-point weight and bias, got ", t->scalar_type());
    if (t->scalar_type() != pdt) *t = t->to(pdt);
    if (!t->is_contiguous()) *t = t->contiguous();
  }
  p.dt = kernel_dtype(pdt);
  return p;
}

struct Fwd {
  Tensor y, h, mean, rstd;
};

// (Inlined into each CPU kernel: one frame fewer between a call and the row loop.)
[[gnu::always_inline]] inline Fwd forward(const char* op, const Tensor& x_, const OptTensor& res_,
                                          at::IntArrayRef shape, const OptTensor& w_, const OptTensor& b_, double eps,
                                          bool center, double offset, bool cast_x_hat, bool stats) {
  auto [n_rows, n_cols] = row_shape(op, x_, shape);
  Tensor x = x_.is_contiguous() ? x_ : x_.contiguous();
  Tensor res;
  if (res_.has_value()) {
    res = *res_;
    TORCH_CHECK(res.sizes() == x.sizes() && res.scalar_type() == x.scalar_type() && res.device() == x.device(), op,
                ": expected a residual of the input's shape ", x.sizes(), " and dtype ", x.scalar_type(),
                ", got ", res.sizes(), " ", res.scalar_type(), " on ", res.device());
    if (!res.is_contiguous()) res = res.contiguous();
  }
  Params p = params(op, x, w_, b_, offset, n_rows, n_cols);
  const auto acc = acc_dtype(x.scalar_type());
  Fwd out;
  out.y = empty_out(x);
  if (res.defined()) out.h = empty_out(x);
  if (stats) {
    if (center) out.mean = at::empty({n_rows}, x.options().dtype(acc));
    out.rstd = at::empty({n_rows}, x.options().dtype(acc));
  }
  if (n_rows * n_cols == 0) {  // nothing to normalise: empty rows, or rows of no value
    if (res.defined()) at::add_out(out.h, x, res);
    if (stats) {
      if (center) out.mean.fill_(std::numeric_limits<double>::quiet_NaN());
      out.rstd.fill_(std::numeric_limits<double>::quiet_NaN());
    }
    return out;
  }
  ln::FwdArgs a{};
  a.x = x.const_data_ptr();
  a.res = res.defined() ? res.const_data_ptr() : nullptr;
  a.h = res.defined() ? out.h.data_ptr() : nullptr;
  a.w = p.w.defined() ? p.w.const_data_ptr() : nullptr;
  a.b = p.b.defined() ? p.b.const_data_ptr() : nullptr;
  a.y = out.y.data_ptr();
  a.mean = out.mean.defined() ? out.mean.data_ptr() : nullptr;
  a.rstd = out.rstd.defined() ? out.rstd.data_ptr() : nullptr;
  a.n_rows = n_rows;
  a.n_cols = n_cols;
  a.n_w = p.n_w;
  a.n_b = p.n_b;
  a.eps = eps;
  a.center = center;
  a.cast_x_hat = cast_x_hat;
  ln::norm_fwd(kernel_dtype(x.scalar_type()), p.dt, a);
  if (!center) {  // torch's rms_norm gives its output the input's suggested memory format
    const auto fmt = x_.suggest_memory_format();
    if (fmt != at::MemoryFormat::Contiguous) out.y = out.y.contiguous(fmt);
  }
  return out;
}

std::tuple<Tensor, Tensor, Tensor> backward(const char* op, const Tensor& dy_, const Tensor& x_, at::IntArrayRef shape,
                                            const OptTensor& w_, const Tensor& mean, const Tensor& rstd,
                                            const OptTensor& dh_, bool need_wb, std::optional<at::ScalarType> db_dtype,
                                            bool center, double offset, bool cast_x_hat) {
  auto [n_rows, n_cols] = row_shape(op, x_, shape);
  Tensor x = x_.is_contiguous() ? x_ : x_.contiguous();
  const auto st = x.scalar_type(), acc = acc_dtype(st);
  TORCH_CHECK(dy_.sizes() == x.sizes(), op, ": expected dy of the input's shape ", x.sizes(), ", got ", dy_.sizes());
  Tensor dy = dy_.scalar_type() == st ? dy_ : dy_.to(st);
  if (!dy.is_contiguous()) dy = dy.contiguous();
  Tensor dh;
  if (given(dh_)) {
    dh = *dh_;
    TORCH_CHECK(dh.sizes() == x.sizes(), op, ": expected dh of the input's shape ", x.sizes(), ", got ", dh.sizes());
    if (dh.scalar_type() != st) dh = dh.to(st);
    if (!dh.is_contiguous()) dh = dh.contiguous();
  }
  Params p = params(op, x, w_, std::nullopt, offset, n_rows, n_cols);
  const int64_t n_w = p.w.defined() ? p.n_w : 1;
  TORCH_CHECK(rstd.numel() == n_rows && rstd.scalar_type() == acc && (!center || (mean.numel() == n_rows &&
              mean.scalar_type() == acc)), op, ": expected (", n_rows, ",) statistics in ", acc,
              ", got rstd ", rstd.sizes(), " ", rstd.scalar_type());
  Tensor dx = empty_out(x);
  // dw in the weight's dtype (the accumulation dtype without one), db in db_dtype (None: the
  // accumulation dtype). The kernel writes either the accumulation dtype or x's storage dtype
  // (half-precision parameters: no conversion op after it); any other dtype is converted after.
  const auto dw_dt = given(w_) ? w_->scalar_type() : acc;
  const auto db_dt = db_dtype.value_or(acc);
  auto kernel_dt = [&](at::ScalarType t) { return t == st ? st : acc; };
  Tensor dw, db;
  if (need_wb) {
    std::vector<int64_t> s = given(w_) ? w_->sizes().vec() : shape.vec();
    dw = at::empty(s, x.options().dtype(kernel_dt(dw_dt)));
    db = at::empty(center ? s : std::vector<int64_t>{0}, x.options().dtype(kernel_dt(db_dt)));
  } else {
    dw = at::empty({0}, x.options().dtype(dw_dt));
    db = at::empty({0}, x.options().dtype(db_dt));
  }
  auto finish = [&]() -> std::tuple<Tensor, Tensor, Tensor> {
    if (need_wb && dw.scalar_type() != dw_dt) dw = dw.to(dw_dt);
    if (need_wb && db.scalar_type() != db_dt) db = db.to(db_dt);
    return {dx, dw, db};
  };
  if (n_rows * n_cols == 0) {
    if (dh.defined()) dx.copy_(dh);
    if (need_wb) { dw.zero_(); db.zero_(); }
    return finish();
  }
  Tensor m = center ? mean.contiguous() : Tensor(), r = rstd.contiguous();
  ln::BwdArgs a{};
  a.dy = dy.const_data_ptr();
  a.x = x.const_data_ptr();
  a.w = p.w.defined() ? p.w.const_data_ptr() : nullptr;
  a.mean = center ? m.const_data_ptr() : nullptr;
  a.rstd = r.const_data_ptr();
  a.dh = dh.defined() ? dh.const_data_ptr() : nullptr;
  a.dx = dx.data_ptr();
  a.dw = need_wb ? dw.data_ptr() : nullptr;
  a.db = need_wb && center ? db.data_ptr() : nullptr;
  a.dw_storage = dw.scalar_type() == st && st != acc;
  a.db_storage = db.scalar_type() == st && st != acc;
  a.n_rows = n_rows;
  a.n_cols = n_cols;
  a.n_w = n_w;
  a.center = center;
  a.cast_x_hat = cast_x_hat;
  ln::norm_bwd(kernel_dtype(st), p.dt, a);
  return finish();
}

// ---- the ops ----

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd_cpu(const Tensor& x, const OptTensor& w, const OptTensor& b,
                                                      at::IntArrayRef shape, double eps) {
  Fwd o = forward("layer_norm", x, std::nullopt, shape, w, b, eps, true, 0.0, false, true);
  return {o.y, o.mean, o.rstd};
}

std::tuple<Tensor, Tensor> rms_norm_fwd_cpu(const Tensor& x, const OptTensor& w, at::IntArrayRef shape, double offset,
                                            bool cast_x_hat, double eps) {
  Fwd o = forward("rms_norm", x, std::nullopt, shape, w, std::nullopt, eps, false, offset, cast_x_hat, true);
  return {o.y, o.rstd};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> add_layer_norm_fwd_cpu(const Tensor& x, const Tensor& res,
                                                                  const OptTensor& w, const OptTensor& b,
                                                                  at::IntArrayRef shape, double eps) {
  Fwd o = forward("add_layer_norm", x, res, shape, w, b, eps, true, 0.0, false, true);
  return {o.y, o.h, o.mean, o.rstd};
}

std::tuple<Tensor, Tensor, Tensor> add_rms_norm_fwd_cpu(const Tensor& x, const Tensor& res, const OptTensor& w,
                                                        at::IntArrayRef shape, double offset, bool cast_x_hat,
                                                        double eps) {
  Fwd o = forward("add_rms_norm", x, res, shape, w, std::nullopt, eps, false, offset, cast_x_hat, true);
  return {o.y, o.h, o.rstd};
}

std::tuple<Tensor, Tensor> row_norm_infer_cpu(const Tensor& x, const OptTensor& res, const OptTensor& w,
                                              const OptTensor& b, at::IntArrayRef shape, bool center, double offset,
                                              bool cast_x_hat, double eps) {
  Fwd o = forward(center ? "layer_norm" : "rms_norm", x, res, shape, w, center ? b : std::nullopt, eps, center,
                  offset, cast_x_hat, false);
  return {o.y, o.h};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_bwd_cpu(const Tensor& dy, const OptTensor& dh, const Tensor& x,
                                                      const OptTensor& w, const Tensor& mean, const Tensor& rstd,
                                                      at::IntArrayRef shape, bool need_wb,
                                                      std::optional<at::ScalarType> db_dtype) {
  return backward("layer_norm_bwd", dy, x, shape, w, mean, rstd, dh, need_wb, db_dtype, true, 0.0, false);
}

std::tuple<Tensor, Tensor> rms_norm_bwd_cpu(const Tensor& dy, const OptTensor& dh, const Tensor& x, const OptTensor& w,
                                            const Tensor& rstd, at::IntArrayRef shape, double offset, bool cast_x_hat,
                                            bool need_dw) {
  auto [dx, dw, db] = backward("rms_norm_bwd", dy, x, shape, w, Tensor(), rstd, dh, need_dw, std::nullopt, false,
                               offset, cast_x_hat);
  return {dx, dw};
}


// ---- LayerNorm2d ----

void check_input(const char* fn, const Tensor& x) {
  TORCH_CHECK(x.dim() >= 2, fn, ": expected an input of shape (N, C, *) with at least 2 dims, got input of shape ",
              x.sizes());
  TORCH_CHECK(x.device().is_cpu(), fn, ": expected a CPU tensor, got one on ", x.device());
  TORCH_CHECK(served_dtype(x.scalar_type()), fn, ": expected a float32, float64, bfloat16 or float16 input, got ",
              x.scalar_type());
}

void check_param(const char* fn, const char* name, const OptTensor& p, const Tensor& x) {
  if (!given(p)) return;
  TORCH_CHECK(p->dim() == 1 && p->size(0) == x.size(1), fn, ": expected ", name, " of shape [", x.size(1),
              "] (one value per channel, C = input.shape[1]), got ", name, " of shape ", p->sizes());
  TORCH_CHECK(p->device() == x.device(), fn, ": expected ", name, " on the input's device (", x.device(), "), got ",
              p->device());
  const bool low = half_dtype(x.scalar_type());
  TORCH_CHECK(p->scalar_type() == x.scalar_type() || (low && p->scalar_type() == at::kFloat), fn,
              ": mixed dtypes: expected ", name, " of dtype ", x.scalar_type(), low ? " or float32" : "",
              " to match the input, got ", p->scalar_type());
}

// A weight or bias as a contiguous tensor of the accumulation dtype (undefined for None).
Tensor as_acc(const OptTensor& p, at::ScalarType acc) {
  return given(p) ? contiguous_in(*p, acc) : Tensor();
}

struct Shape2d {
  int64_t n, c, s;  // samples, channels, pixels per sample
};
Shape2d shape_of(const Tensor& x) {
  int64_t s = 1;
  for (int64_t k = 2; k < x.dim(); ++k) s *= x.size(k);
  return {x.size(0), x.size(1), s};
}

// (y, mean, rstd); mean and rstd undefined unless `stats`.
std::tuple<Tensor, Tensor, Tensor> forward_2d(const Tensor& x, const OptTensor& w, const OptTensor& b, double eps,
                                              bool stats) {
  const char* fn = "layer_norm2d";
  check_input(fn, x);
  check_param(fn, "weight", w, x);
  check_param(fn, "bias", b, x);
  const Plan plan = plan_of(x);
  const Tensor xd = dense_input(x, plan);
  Tensor y = advised(output_like(xd, plan));
  const Shape2d sh = shape_of(x);
  const auto acc = acc_dtype(x.scalar_type());
  Tensor mean, rstd;
  if (stats) {
    mean = at::empty({sh.n * sh.s}, x.options().dtype(acc));
    rstd = at::empty({sh.n * sh.s}, x.options().dtype(acc));
  }
  if (x.numel() == 0) {
    if (stats) {  // no channel to average over (C = 0): torch's NaN statistics
      mean.fill_(NAN);
      rstd.fill_(NAN);
    }
    return {y, mean, rstd};
  }
  const Tensor wa = as_acc(w, acc), ba = as_acc(b, acc);
  const bool far = x.numel() * x.element_size() >= ln2d::kFarBytes;
  if (plan.layout == Layout::kRows) {  // the pixels as rows of C values: LayerNorm's row kernel
    ln::FwdArgs a{};
    a.x = xd.data_ptr();
    a.w = ptr<void>(wa);
    a.b = ptr<void>(ba);
    a.y = y.data_ptr();
    a.mean = ptr<void>(mean);
    a.rstd = ptr<void>(rstd);
    a.n_rows = sh.n * sh.s;
    a.n_cols = sh.c;
    a.n_w = a.n_b = 1;
    a.eps = eps;
    a.center = true;
    ln::norm_fwd(kernel_dtype(x.scalar_type()), kernel_dtype(acc), a);
    return {y, mean, rstd};
  }
  visit_dtype(x.scalar_type(), fn, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    ln2d::fwd_nchw<S>(ptr<const S>(xd), ptr<const A>(wa), ptr<const A>(ba), ptr<S>(y), ptr<A>(mean), ptr<A>(rstd), sh.n, sh.c,
                sh.s, eps, far);
  });
  return {y, mean, rstd};
}

Tensor layer_norm2d_cpu(const Tensor& x, const OptTensor& w, const OptTensor& b, double eps) {
  return std::get<0>(forward_2d(x, w, b, eps, false));
}

std::tuple<Tensor, Tensor, Tensor> layer_norm2d_fwd_cpu(const Tensor& x, const OptTensor& w,
                                                            const OptTensor& b, double eps) {
  return forward_2d(x, w, b, eps, true);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm2d_bwd_cpu(const Tensor& dy, const Tensor& x,
                                                             const OptTensor& w, const Tensor& mean,
                                                             const Tensor& rstd, bool need_wb) {
  const char* fn = "layer_norm2d_bwd";
  check_input(fn, x);
  check_param(fn, "weight", w, x);
  TORCH_CHECK(dy.sizes() == x.sizes(), fn, ": expected dy of the input's shape ", x.sizes(), ", got ", dy.sizes());
  const Shape2d sh = shape_of(x);
  const auto acc = acc_dtype(x.scalar_type());
  TORCH_CHECK(mean.numel() == sh.n * sh.s && rstd.numel() == sh.n * sh.s && mean.scalar_type() == acc &&
                  rstd.scalar_type() == acc,
              fn, ": expected mean and rstd of ", sh.n * sh.s, " values of dtype ", acc, " (layer_norm2d_fwd's), got ",
              mean.sizes(), " ", mean.scalar_type(), " and ", rstd.sizes(), " ", rstd.scalar_type());
  const Plan plan = plan_of(x);
  const Tensor xd = dense_input(x, plan);
  Tensor dyd = dy.scalar_type() == x.scalar_type() ? dy : dy.to(x.scalar_type());
  if (plan.layout == Layout::kNchw) {
    dyd = dyd.contiguous();
  } else if (dyd.strides() != xd.strides()) {  // dy in x's rows
    dyd = at::empty_like(xd).copy_(dyd);
  }
  Tensor dx = advised(output_like(xd, plan));
  Tensor dw = at::empty({need_wb ? sh.c : 0}, x.options().dtype(acc));
  Tensor db = at::empty({need_wb ? sh.c : 0}, x.options().dtype(acc));
  if (x.numel() == 0) {
    dw.zero_();
    db.zero_();
    return {dx, dw, db};
  }
  const Tensor wa = as_acc(w, acc);
  const Tensor m = mean.contiguous(), r = rstd.contiguous();
  const bool far = x.numel() * x.element_size() >= ln2d::kFarBytes;
  if (plan.layout == Layout::kRows) {  // LayerNorm's row kernel
    ln::BwdArgs a{};
    a.dy = dyd.data_ptr();
    a.x = xd.data_ptr();
    a.w = ptr<void>(wa);
    a.mean = m.data_ptr();
    a.rstd = r.data_ptr();
    a.dx = dx.data_ptr();
    a.dw = need_wb ? dw.data_ptr() : nullptr;
    a.db = need_wb ? db.data_ptr() : nullptr;
    a.n_rows = sh.n * sh.s;
    a.n_cols = sh.c;
    a.n_w = 1;
    a.center = true;
    ln::norm_bwd(kernel_dtype(x.scalar_type()), kernel_dtype(acc), a);
    return {dx, dw, db};
  }
  visit_dtype(x.scalar_type(), fn, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    ln2d::bwd_nchw<S>(ptr<const S>(dyd), ptr<const S>(xd), ptr<const A>(wa), ptr<const A>(m), ptr<const A>(r), ptr<S>(dx),
                need_wb ? ptr<A>(dw) : nullptr, need_wb ? ptr<A>(db) : nullptr, sh.n, sh.c, sh.s, far);
  });
  return {dx, dw, db};
}

}  // namespace
}  // namespace normlab::layer_norm

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  using namespace normlab::layer_norm;
  m.impl("layer_norm_fwd", &layer_norm_fwd_cpu);
  m.impl("rms_norm_fwd", &rms_norm_fwd_cpu);
  m.impl("add_layer_norm_fwd", &add_layer_norm_fwd_cpu);
  m.impl("add_rms_norm_fwd", &add_rms_norm_fwd_cpu);
  m.impl("layer_norm_bwd", &layer_norm_bwd_cpu);
  m.impl("rms_norm_bwd", &rms_norm_bwd_cpu);
  m.impl("row_norm_infer", &row_norm_infer_cpu);
  m.impl("layer_norm2d", &layer_norm2d_cpu);
  m.impl("layer_norm2d_fwd", &layer_norm2d_fwd_cpu);
  m.impl("layer_norm2d_bwd", &layer_norm2d_bwd_cpu);
}
