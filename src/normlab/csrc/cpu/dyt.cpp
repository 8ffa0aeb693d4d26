// The dyt family's CPU kernels (schemas: csrc/dyt.h): tensors in, checks, outputs allocated,
// the raw-pointer kernels of cpu/dyt_kernels.h called.
//
// x is read as (n_rows, n_cols) rows, n_cols the product of normalized_shape (a copy only if x is
// not contiguous); the output is contiguous, as the reference's. weight, bias and alpha are taken
// in the accumulation dtype (a copy of n_cols values).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "args.h"
#include "cpu/dyt_kernels.h"
#include "dyt.h"

namespace normlab::dyt {

namespace {

using at::Tensor;

int64_t columns(const Tensor& x, at::IntArrayRef shape, const char* op) {
  const int64_t k = int64_t(shape.size());
  TORCH_CHECK(k >= 1 && x.dim() >= k && x.sizes().slice(x.dim() - k).equals(shape), op,
              ": expected x of shape [*, ", shape, "] (normalized_shape), got ", x.sizes());
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> dyt_bwd_cpu(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight,
                                                       const Tensor& alpha, at::IntArrayRef shape, bool need_dx,
                                                       bool need_dalpha, bool need_wb) {
  const char* op = "normlab::dyt_bwd";
  const int64_t n_cols = columns(x_in, shape, op);
  check_dy(dy_in, x_in, op);
  const Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  const auto acc = x.options().dtype(acc_dtype(x.scalar_type()));
  const auto f64 = x.options().dtype(at::kDouble);
  Tensor dx = need_dx ? empty_out(x) : at::empty({0}, x.options());
  const int64_t n_rows = n_cols == 0 ? 0 : x.numel() / n_cols;
  const Geometry g = geometry(n_rows, n_cols);
  Tensor dw_part = need_wb ? at::empty({g.n_chunks, n_cols}, f64) : Tensor();
  Tensor db_part = need_wb ? at::empty({g.n_chunks, n_cols}, f64) : Tensor();
  Tensor da_part = need_dalpha ? at::empty({g.n_chunks * g.n_col_blocks}, f64) : Tensor();
  if (x.numel() > 0 && (need_dx || need_dalpha || need_wb)) {
    visit_dtype(x.scalar_type(), op, [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      const std::vector<A> w = param_values<A>(weight, n_cols, op, "weight");
      const A a = param_values<A>(alpha, 1, op, "alpha").at(0);
      backward<S>(ptr<S>(dy), ptr<S>(x), a, data_or_null(w), need_dx ? ptr<S>(dx) : nullptr,
                  need_wb ? ptr<double>(dw_part) : nullptr, need_wb ? ptr<double>(db_part) : nullptr,
                  need_dalpha ? ptr<double>(da_part) : nullptr, n_rows, n_cols, g);
    });
  } else {  // nothing to sum: zeros
    if (need_wb) { dw_part.zero_(); db_part.zero_(); }
    if (need_dalpha) da_part.zero_();
  }
  Tensor dalpha = at::empty({0}, acc), dw = at::empty({0}, acc), db = at::empty({0}, acc);
  if (need_dalpha) {
    double s = 0.0;
    const double* p = ptr<double>(da_part);
    for (int64_t t = 0; t < da_part.numel(); ++t) s += p[t];  // in task order (chunk-major)
    dalpha = at::empty(alpha.sizes(), acc).fill_(s);
  }
  if (need_wb) {
    Tensor dw64 = at::empty({n_cols}, f64), db64 = at::empty({n_cols}, f64);
    merge(ptr<double>(dw_part), g.n_chunks, n_cols, ptr<double>(dw64));
    merge(ptr<double>(db_part), g.n_chunks, n_cols, ptr<double>(db64));
    dw = dw64.to(acc).reshape(shape);
    db = db64.to(acc).reshape(shape);
  }
  return {dx, dalpha, dw, db};
}

}  // namespace

at::Tensor dyt_fwd_cpu(const at::Tensor& x_in, const OptTensor& weight, const OptTensor& bias, at::IntArrayRef shape,
                       const at::Tensor& alpha) {
  const char* op = "normlab::dyt_fwd";
  const int64_t n_cols = columns(x_in, shape, op);
  const Tensor x = x_in.contiguous();
  Tensor y = empty_out(x);
  if (x.numel() == 0) return y;
  const int64_t n_rows = x.numel() / n_cols;
  visit_dtype(x.scalar_type(), op, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    std::vector<A> kw, kb, ka;  // (copies only where a parameter is not already contiguous A)
    const A* w = param_ptr<A>(weight, n_cols, op, "weight", kw);
    const A* b = param_ptr<A>(bias, n_cols, op, "bias", kb);
    const A* pa = param_ptr<A>(alpha, 1, op, "alpha", ka);
    TORCH_CHECK(pa != nullptr, op, ": expected alpha, a tensor of 1 value, got an undefined tensor");
    forward<S>(ptr<S>(x), *pa, w, b, ptr<S>(y), n_rows, n_cols);
  });
  return y;
}

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("dyt_fwd", &dyt_fwd_cpu);
  m.impl("dyt_bwd", &dyt_bwd_cpu);
}

}  // namespace normlab::dyt
