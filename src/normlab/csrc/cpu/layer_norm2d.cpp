// The layer_norm2d family's CPU kernels: argument checks, outputs allocated in the layout the
// kernels write (csrc/layer_norm2d_layout.h: contiguous for NCHW input, the input's own strides
// for channels-last input), then the raw-pointer kernels: cpu/layer_norm2d_kernels.cpp for NCHW
// planes, LayerNorm's row kernels (cpu/layer_norm_kernels.h) for channels-last rows.
#include "cpu/huge_pages.h"
#include <sys/mman.h>
#include <torch/library.h>

#include <cstdint>

#include "cpu/layer_norm2d_kernels.h"
#include "cpu/layer_norm_kernels.h"
#include "layer_norm2d_layout.h"

namespace normlab::ln2d {
namespace {

using at::Tensor;

// A fresh output, large ones advised onto transparent huge pages (cpu/huge_pages.h).
Tensor advised(Tensor t) {
  advise_huge_pages(t.data_ptr(), int64_t(t.nbytes()));
  return t;
}

void check_input(const char* fn, const Tensor& x) {
  TORCH_CHECK(x.dim() >= 2, fn, ": expected an input of shape (N, C, *) with at least 2 dims, got input of shape ",
              x.sizes());
  TORCH_CHECK(x.device().is_cpu(), fn, ": expected a CPU tensor, got one on ", x.device());
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf, fn,
              ": expected a float32, float64, bfloat16 or float16 input, got ", t);
}

void check_param(const char* fn, const char* name, const std::optional<Tensor>& p, const Tensor& x) {
  if (!p.has_value() || !p->defined()) return;
  TORCH_CHECK(p->dim() == 1 && p->size(0) == x.size(1), fn, ": expected ", name, " of shape [", x.size(1),
              "] (one value per channel, C = input.shape[1]), got ", name, " of shape ", p->sizes());
  TORCH_CHECK(p->device() == x.device(), fn, ": expected ", name, " on the input's device (", x.device(), "), got ",
              p->device());
  const bool low = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  TORCH_CHECK(p->scalar_type() == x.scalar_type() || (low && p->scalar_type() == at::kFloat), fn,
              ": mixed dtypes: expected ", name, " of dtype ", x.scalar_type(), low ? " or float32" : "",
              " to match the input, got ", p->scalar_type());
}

// A weight or bias as a contiguous tensor of the accumulation dtype (undefined for None).
Tensor as_acc(const std::optional<Tensor>& p, at::ScalarType acc) {
  if (!p.has_value() || !p->defined()) return Tensor();
  if (p->scalar_type() == acc && p->is_contiguous()) return *p;
  return p->to(acc).contiguous();
}

template <class F> void by_dtype(at::ScalarType t, const F& f) {
  switch (t) {
    case at::kFloat: f(float{}); break;
    case at::kDouble: f(double{}); break;
    case at::kBFloat16: f(bf16{}); break;
    case at::kHalf: f(f16{}); break;
    default: TORCH_CHECK(false, "layer_norm2d: unsupported dtype ", t);
  }
}

ln::Dtype ln_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return ln::Dtype::f64;
    case at::kBFloat16: return ln::Dtype::bf16;
    case at::kHalf: return ln::Dtype::f16;
    default: return ln::Dtype::f32;
  }
}

void* raw(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

template <class T> T* ptr(const Tensor& t) { return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr; }

struct Shape {
  int64_t n, c, s;  // samples, channels, pixels per sample
};
Shape shape_of(const Tensor& x) {
  int64_t s = 1;
  for (int64_t k = 2; k < x.dim(); ++k) s *= x.size(k);
  return {x.size(0), x.size(1), s};
}

// (y, mean, rstd); mean and rstd undefined unless `stats`.
std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& x, const std::optional<Tensor>& w,
                                           const std::optional<Tensor>& b, double eps, bool stats) {
  const char* fn = "layer_norm2d";
  check_input(fn, x);
  check_param(fn, "weight", w, x);
  check_param(fn, "bias", b, x);
  const Plan plan = plan_of(x);
  const Tensor xd = dense_input(x, plan);
  Tensor y = advised(output_like(xd, plan));
  const Shape sh = shape_of(x);
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
  const bool far = x.numel() * x.element_size() >= kFarBytes;
  if (plan.layout == Layout::kRows) {  // the pixels as rows of C values: LayerNorm's row kernel
    ln::FwdArgs a{};
    a.x = xd.data_ptr();
    a.w = raw(wa);
    a.b = raw(ba);
    a.y = y.data_ptr();
    a.mean = raw(mean);
    a.rstd = raw(rstd);
    a.n_rows = sh.n * sh.s;
    a.n_cols = sh.c;
    a.n_w = a.n_b = 1;
    a.eps = eps;
    a.center = true;
    ln::norm_fwd(ln_dtype(x.scalar_type()), ln_dtype(acc), a);
    return {y, mean, rstd};
  }
  by_dtype(x.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    fwd_nchw<S>(ptr<const S>(xd), ptr<const A>(wa), ptr<const A>(ba), ptr<S>(y), ptr<A>(mean), ptr<A>(rstd), sh.n, sh.c,
                sh.s, eps, far);
  });
  return {y, mean, rstd};
}

Tensor layer_norm2d_cpu(const Tensor& x, const std::optional<Tensor>& w, const std::optional<Tensor>& b, double eps) {
  return std::get<0>(forward(x, w, b, eps, false));
}

std::tuple<Tensor, Tensor, Tensor> layer_norm2d_forward_cpu(const Tensor& x, const std::optional<Tensor>& w,
                                                            const std::optional<Tensor>& b, double eps) {
  return forward(x, w, b, eps, true);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm2d_backward_cpu(const Tensor& dy, const Tensor& x,
                                                             const std::optional<Tensor>& w, const Tensor& mean,
                                                             const Tensor& rstd, bool need_wb) {
  const char* fn = "layer_norm2d_backward";
  check_input(fn, x);
  check_param(fn, "weight", w, x);
  TORCH_CHECK(dy.sizes() == x.sizes(), fn, ": expected dy of the input's shape ", x.sizes(), ", got ", dy.sizes());
  const Shape sh = shape_of(x);
  const auto acc = acc_dtype(x.scalar_type());
  TORCH_CHECK(mean.numel() == sh.n * sh.s && rstd.numel() == sh.n * sh.s && mean.scalar_type() == acc &&
                  rstd.scalar_type() == acc,
              fn, ": expected mean and rstd of ", sh.n * sh.s, " values of dtype ", acc, " (layer_norm2d_forward's), got ",
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
  const bool far = x.numel() * x.element_size() >= kFarBytes;
  if (plan.layout == Layout::kRows) {  // LayerNorm's row kernel
    ln::BwdArgs a{};
    a.dy = dyd.data_ptr();
    a.x = xd.data_ptr();
    a.w = raw(wa);
    a.mean = m.data_ptr();
    a.rstd = r.data_ptr();
    a.dx = dx.data_ptr();
    a.dw = need_wb ? dw.data_ptr() : nullptr;
    a.db = need_wb ? db.data_ptr() : nullptr;
    a.n_rows = sh.n * sh.s;
    a.n_cols = sh.c;
    a.n_w = 1;
    a.center = true;
    ln::norm_bwd(ln_dtype(x.scalar_type()), ln_dtype(acc), a);
    return {dx, dw, db};
  }
  by_dtype(x.scalar_type(), [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    bwd_nchw<S>(ptr<const S>(dyd), ptr<const S>(xd), ptr<const A>(wa), ptr<const A>(m), ptr<const A>(r), ptr<S>(dx),
                need_wb ? ptr<A>(dw) : nullptr, need_wb ? ptr<A>(db) : nullptr, sh.n, sh.c, sh.s, far);
  });
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("layer_norm2d", &layer_norm2d_cpu);
  m.impl("layer_norm2d_forward", &layer_norm2d_forward_cpu);
  m.impl("layer_norm2d_backward", &layer_norm2d_backward_cpu);
}

}  // namespace normlab::ln2d
