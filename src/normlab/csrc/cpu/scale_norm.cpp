// The scale_norm family's CPU kernels (schemas: csrc/scale_norm.h): tensors in, checks,
// outputs allocated, the raw-pointer kernels of cpu/scale_norm_kernels.h called.
//
// x is read in its suggested memory format (channels_last: the NHWC kernels; otherwise contiguous
// NCHW, a copy only if x is neither); y and dx are in that format. The weight is taken in the
// accumulation dtype (a copy of C values). dw's per-task float64 partials are summed here, in task
// order.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <vector>

#include "args.h"
#include "cpu/scale_norm_kernels.h"

namespace normlab::scale_norm {

namespace {

using at::Tensor;

Args args_of(const Tensor& x, at::MemoryFormat fmt, bool simple, double eps, const char* op) {
  TORCH_CHECK(x.dim() == 4, op, ": expected a 4-D input (N, C, H, W), got ", x.sizes());
  return {x.size(0), x.size(1), x.size(2) * x.size(3), fmt == at::MemoryFormat::ChannelsLast, simple, eps};
}

std::tuple<Tensor, Tensor, Tensor> scale_norm2d_fwd_cpu(const Tensor& x_in, const OptTensor& weight, bool simple,
                                                        double eps) {
  const char* op = "normlab::scale_norm2d_fwd";
  const at::MemoryFormat fmt = nchw_or_nhwc(x_in);
  const Args a = args_of(x_in, fmt, simple, eps, op);
  const Tensor x = x_in.contiguous(fmt);
  const auto acc = x.options().dtype(acc_dtype(x.scalar_type()));
  Tensor y = empty_out(x, fmt);
  Tensor rstd = at::empty({a.n, a.hw}, acc);
  Tensor mean = simple ? at::empty({a.n, a.hw}, acc) : at::empty({0}, acc);
  if (x.numel() == 0) return {y, rstd, mean};
  const Geometry g = geometry(a);
  visit_dtype(x.scalar_type(), op, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    const std::vector<A> w = param_values<A>(weight, a.c, op, "weight");
    forward<S>(ptr<S>(x), data_or_null(w), ptr<S>(y), ptr<A>(rstd), simple ? ptr<A>(mean) : nullptr,
               a, g);
  });
  return {y, rstd, mean};
}

std::tuple<Tensor, Tensor> scale_norm2d_bwd_cpu(const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight,
                                                const Tensor& rstd_in, const Tensor& mean_in, bool simple,
                                                bool need_dx, bool need_dw) {
  const char* op = "normlab::scale_norm2d_bwd";
  const at::MemoryFormat fmt = nchw_or_nhwc(x_in);
  const Args a = args_of(x_in, fmt, simple, 0.0, op);
  check_dy(dy_in, x_in, op);
  const at::ScalarType acc = acc_dtype(x_in.scalar_type());
  TORCH_CHECK(rstd_in.numel() == a.n * a.hw && rstd_in.scalar_type() == acc &&
                  (!simple || (mean_in.numel() == a.n * a.hw && mean_in.scalar_type() == acc)),
              op, ": expected rstd (and, simple, mean) of ", a.n * a.hw, " values of dtype ", acc);
  need_dw = need_dw && given(weight);
  const Tensor x = x_in.contiguous(fmt), dy = dy_in.contiguous(fmt), rstd = rstd_in.contiguous();
  const Tensor mean = simple ? mean_in.contiguous() : Tensor();
  const Geometry g = geometry(a);
  Tensor dx = need_dx ? empty_out(x, fmt) : at::empty({0}, x.options());
  Tensor part = need_dw ? at::zeros({g.n_tasks, a.c}, x.options().dtype(at::kDouble)) : Tensor();
  if (x.numel() > 0 && (need_dx || need_dw)) {
    visit_dtype(x.scalar_type(), op, [&](auto tag) {
      using S = decltype(tag);
      using A = acc_t<S>;
      const std::vector<A> w = param_values<A>(weight, a.c, op, "weight");
      backward<S>(ptr<S>(dy), ptr<S>(x), data_or_null(w), ptr<A>(rstd),
                  simple ? ptr<A>(mean) : nullptr, need_dx ? ptr<S>(dx) : nullptr,
                  need_dw ? ptr<double>(part) : nullptr, a, g);
    });
  }
  return {dx, need_dw ? rows_summed(part, acc) : at::empty({0}, x.options().dtype(acc))};  // in task order
}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("scale_norm2d_fwd", &scale_norm2d_fwd_cpu);
  m.impl("scale_norm2d_bwd", &scale_norm2d_bwd_cpu);
}

}  // namespace normlab::scale_norm
