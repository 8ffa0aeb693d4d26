// The norm+act ops (docs/derivations/norm_act.md): their schemas and CPU kernels in one file
// (no Meta or Autograd kernels: the Python entry, normlab/ops/norm_act/op.py, holds the autograd
// Function and takes these ops on the eager path only).
//
//   batch_norm_act_fwd(x, weight, bias, running_mean, running_var, training, momentum, eps, act,
//                      act_param) -> (y, stats)
//     the BatchNorm statistics pass (cpu/batch_norm_kernels: statistics only), the running
//     statistics updated in training, then ONE output pass y = act((x - mean) * rstd * w + b)
//     (cpu/norm_act_kernels). stats: (3, C) float64 mean, var, rstd (the running ones in eval).
//   batch_norm_act_bwd(dy, x, weight, bias, stats, training, act, act_param, need_dx, need_dw,
//                      need_db) -> (dx, dw, db)
//     dz = dy * act'(z), z recomputed from x and stats (nothing saved but what BatchNorm saves),
//     into a scratch of x's size, then BatchNorm's backward of dz.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "args.h"
#include "cpu/batch_norm.h"
#include "cpu/batch_norm_kernels.h"
#include "cpu/norm_act_kernels.h"

namespace normlab::norm_act {

namespace {

constexpr const char* kWho = "normlab batch_norm_act";

Dtype dt_of(const at::Tensor& t, const char* what) { return kernel_dtype(t.scalar_type(), kWho, what); }

bn::Chan chan(const std::optional<at::Tensor>& t, int64_t c, const char* what) {
  if (!t.has_value() || !t->defined()) return {};
  TORCH_CHECK(t->device().is_cpu() && t->dim() == 1 && t->size(0) == c, kWho, ": expected ", what,
              " of shape (", c, ",) on the CPU, got ", t->sizes(), " on ", t->device());
  return {t->data_ptr(), dt_of(*t, what), t->stride(0)};
}

at::MemoryFormat fmt_of(const at::Tensor& x) { return x.suggest_memory_format(); }

bool rows_form(const at::Tensor& x, at::MemoryFormat fmt) {
  return fmt == at::MemoryFormat::ChannelsLast || fmt == at::MemoryFormat::ChannelsLast3d ||
         x.numel() == x.size(0) * x.size(1);
}

// The per-channel constants of z = (x - hi) * a + b2 (BatchNorm's output pass: hi the mean
// rounded to the accumulation type, b2 the bias less what that rounding moved)
void consts(const at::Tensor& x, const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b,
            const double* stats, std::vector<double>& hi, std::vector<double>& a, std::vector<double>& b2) {
  const int64_t c = x.size(1);
  const bn::Chan wc = chan(w, c, "weight"), bc = chan(b, c, "bias");
  const bool f64 = x.scalar_type() == at::kDouble;
  hi.resize(c); a.resize(c); b2.resize(c);
  for (int64_t i = 0; i < c; ++i) {
    const double mean = stats[i], rstd = stats[2 * c + i];
    const double h = f64 ? mean : double(float(mean));
    const double f = rstd * (wc.p ? wc.at(i) : 1.0);
    hi[i] = h;
    a[i] = f;
    b2[i] = (bc.p ? bc.at(i) : 0.0) - (mean - h) * f;
  }
}

nact::Layout layout_of(const at::Tensor& x, at::MemoryFormat fmt) {
  const int64_t c = x.size(1), numel = x.numel();
  if (rows_form(x, fmt)) return {false, numel / c, c, c, numel / c};
  const int64_t n = x.size(0);
  return {true, n * c, numel / (n * c), c, 0};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> batch_norm_act_fwd_cpu(const at::Tensor& x_in, const std::optional<at::Tensor>& w,
                                                          const std::optional<at::Tensor>& b,
                                                          const std::optional<at::Tensor>& rm,
                                                          const std::optional<at::Tensor>& rv, bool training,
                                                          double momentum, double eps, int64_t act, double act_param) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.dim() >= 2, kWho, ": expected a CPU input of at least 2 dims, got ",
              x_in.dim(), " dims on ", x_in.device());
  TORCH_CHECK(act >= 0 && act < 8, kWho, ": expected an activation id in 0..7, got ", act);
  const int64_t c = x_in.size(1);
  TORCH_CHECK(x_in.numel() > c, kWho, ": expected more than 1 value per channel, got input size ", x_in.sizes());
  TORCH_CHECK(training || (rm.has_value() && rv.has_value()), kWho,
              ": expected running_mean and running_var in evaluation mode");
  const at::MemoryFormat fmt = fmt_of(x_in);
  const at::Tensor x = x_in.contiguous(fmt);
  const Dtype dt = dt_of(x, "the input");
  at::Tensor stats = at::empty({3, c}, x.options().dtype(at::kDouble));
  double* s = stats.data_ptr<double>();
  const bn::Chan rmc = training ? bn::Chan{} : chan(rm, c, "running_mean");
  const bn::Chan rvc = training ? bn::Chan{} : chan(rv, c, "running_var");
  const int64_t n = x.size(0);
  const bn::View v = rows_form(x, fmt) ? bn::View{x.numel() / c, c, 1, c}
                                        : bn::View{n, x.numel() / n, x.numel() / (n * c), c};
  bn::forward(dt, x.const_data_ptr(), nullptr, chan(w, c, "weight"), chan(b, c, "bias"), rmc, rvc, s, v, eps,
              training);
  if (training && rm.has_value() && rv.has_value() && rm->defined() && rv->defined())
    batch_norm::update_running_raw(*rm, *rv, s, s + c, x.numel() / c, momentum);
  std::vector<double> hi, a, b2;
  consts(x, w, b, s, hi, a, b2);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(fmt));
  nact::forward_out(dt, x.const_data_ptr(), y.data_ptr(), hi.data(), a.data(), b2.data(), c, layout_of(x, fmt),
                    int(act), act_param);
  return {y, stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_bwd_cpu(
    const at::Tensor& dy_in, const at::Tensor& x_in, const std::optional<at::Tensor>& w,
    const std::optional<at::Tensor>& b, const at::Tensor& stats, bool training, int64_t act, double act_param,
    bool need_dx, bool need_dw, bool need_db) {
  TORCH_CHECK(act >= 0 && act < 8, kWho, ": expected an activation id in 0..7, got ", act);
  const int64_t c = x_in.size(1);
  TORCH_CHECK(stats.scalar_type() == at::kDouble && stats.dim() == 2 && stats.size(0) == 3 && stats.size(1) == c,
              kWho, ": expected stats of shape (3, ", c, ") float64, got ", stats.sizes(), " ", stats.scalar_type());
  const at::MemoryFormat fmt = fmt_of(x_in);
  const at::Tensor x = x_in.contiguous(fmt);
  const at::Tensor dy = dy_in.to(x.scalar_type()).contiguous(fmt);
  const at::Tensor st = stats.contiguous();
  std::vector<double> hi, a, b2;
  consts(x, w, b, st.const_data_ptr<double>(), hi, a, b2);
  at::Tensor dz = at::empty(x.sizes(), x.options().memory_format(fmt));  // the scratch of x's size
  nact::grad_z(dt_of(x, "the input"), dy.const_data_ptr(), x.const_data_ptr(), dz.data_ptr(), hi.data(), a.data(),
               b2.data(), c, layout_of(x, fmt), int(act), act_param);
  const at::ScalarType wt = w.has_value() && w->defined() ? w->scalar_type() : x.scalar_type();
  const at::ScalarType bt = b.has_value() && b->defined() ? b->scalar_type() : x.scalar_type();
  return batch_norm::bwd_typed(dz, x, w, st, training, need_dx, need_dw, need_db, wt, bt);
}

}  // namespace normlab::norm_act

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  m.def("batch_norm_act_fwd(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool training, float momentum, float eps, int act, float act_param) "
        "-> (Tensor, Tensor)");
  m.def("batch_norm_act_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor stats, bool training, "
        "int act, float act_param, bool need_dx, bool need_dw, bool need_db) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("batch_norm_act_fwd", &normlab::norm_act::batch_norm_act_fwd_cpu);
  m.impl("batch_norm_act_bwd", &normlab::norm_act::batch_norm_act_bwd_cpu);
}
