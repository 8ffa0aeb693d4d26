// The frn family's CPU kernels (schemas: csrc/frn.h): tensors in, checks, outputs allocated,
// the raw-pointer kernels of cpu/frn_kernels.h called.
//
// x is read in its suggested memory format (channels_last: the NHWC kernels; otherwise
// contiguous NCHW, a copy only if x is neither); y and dx are in that format. weight, bias and tau
// are taken in the accumulation dtype (a copy of C values). The (sample, channel) float64 partials
// of dw, db, dtau are summed over samples here, in order.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <vector>

#include "args.h"
#include "cpu/frn_kernels.h"

namespace normlab::frn {

namespace {

using at::Tensor;

Args args_of(const Tensor& x, at::MemoryFormat fmt, double eps, const char* op) {
  TORCH_CHECK(x.dim() == 4, op, ": expected a 4-D input (N, C, H, W), got ", x.sizes());
  return {x.size(0), x.size(1), x.size(2) * x.size(3), fmt == at::MemoryFormat::ChannelsLast, eps};
}

std::tuple<Tensor, Tensor> frn_fwd_cpu(const Tensor& x_in, const OptTensor& weight, const OptTensor& bias,
                                       const OptTensor& tau, double eps) {
  const char* op = "normlab::frn_fwd";
  const at::MemoryFormat fmt = nchw_or_nhwc(x_in);
  const Args a = args_of(x_in, fmt, eps, op);
  const Tensor x = x_in.contiguous(fmt);
  Tensor y = empty_out(x, fmt);
  Tensor rstd = at::empty({a.n, a.c}, x.options().dtype(acc_dtype(x.scalar_type())));
  if (x.numel() == 0) return {y, rstd.fill_(0)};
  visit_dtype(x.scalar_type(), op, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    const std::vector<A> w = param_values<A>(weight, a.c, op, "weight");
    const std::vector<A> b = param_values<A>(bias, a.c, op, "bias");
    const std::vector<A> t = param_values<A>(tau, a.c, op, "tau");
    forward<S>(ptr<S>(x), data_or_null(w), data_or_null(b), data_or_null(t), ptr<S>(y), ptr<A>(rstd), a);
  });
  return {y, rstd};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> frn_bwd_cpu(const Tensor& dy_in, const Tensor& x_in,
                                                       const OptTensor& weight, const OptTensor& bias,
                                                       const OptTensor& tau, const Tensor& rstd_in, bool need_dx,
                                                       bool need_dw, bool need_db, bool need_dtau) {
  const char* op = "normlab::frn_bwd";
  const at::MemoryFormat fmt = nchw_or_nhwc(x_in);
  const Args a = args_of(x_in, fmt, 0.0, op);
  check_dy(dy_in, x_in, op);
  const at::ScalarType acc = acc_dtype(x_in.scalar_type());
  TORCH_CHECK(rstd_in.numel() == a.n * a.c && rstd_in.scalar_type() == acc, op, ": expected rstd of ", a.n * a.c,
              " values of dtype ", acc, ", got ", rstd_in.sizes(), " ", rstd_in.scalar_type());
  need_dtau = need_dtau && given(tau);
  const Tensor x = x_in.contiguous(fmt), dy = dy_in.contiguous(fmt), rstd = rstd_in.contiguous();
  const auto f64 = x.options().dtype(at::kDouble);
  Tensor dx = need_dx ? empty_out(x, fmt) : at::empty({0}, x.options());
  Tensor dw_part = need_dw ? at::zeros({a.n, a.c}, f64) : Tensor();
  Tensor db_part = need_db ? at::zeros({a.n, a.c}, f64) : Tensor();
  Tensor dt_part = need_dtau ? at::zeros({a.n, a.c}, f64) : Tensor();
  if (x.numel() > 0 && (need_dx || need_dw || need_db || need_dtau)) {
    visit_dtype(x.scalar_type(), op, [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      const std::vector<A> w = param_values<A>(weight, a.c, op, "weight");
      const std::vector<A> b = param_values<A>(bias, a.c, op, "bias");
      const std::vector<A> t = param_values<A>(tau, a.c, op, "tau");
      backward<S>(ptr<S>(dy), ptr<S>(x), data_or_null(w), data_or_null(b), data_or_null(t), ptr<A>(rstd),
                  need_dx ? ptr<S>(dx) : nullptr, need_dw ? ptr<double>(dw_part) : nullptr,
                  need_db ? ptr<double>(db_part) : nullptr, need_dtau ? ptr<double>(dt_part) : nullptr, a);
    });
  }
  const auto empty = at::empty({0}, x.options().dtype(acc));
  return {dx, need_dw ? rows_summed(dw_part, acc) : empty, need_db ? rows_summed(db_part, acc) : empty,
          need_dtau ? rows_summed(dt_part, acc) : empty};  // in sample order
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("frn_fwd", &frn_fwd_cpu);
  m.impl("frn_bwd", &frn_bwd_cpu);
}

}  // namespace normlab::frn
