// The norm_act family's CPU kernels (schemas: norm_act.h): tensors in, checks, outputs allocated,
// the norms' raw-pointer kernels called with the activation in their passes
// (docs/derivations/norm_act.md).
//
//   batch_norm_act_fwd: the BatchNorm statistics pass (cpu/batch_norm_kernels: statistics only),
//     the running statistics updated in training, then ONE output pass y = act((x - mean) * rstd
//     * w + b) (cpu/norm_act_kernels).
//   batch_norm_act_bwd: dz = dy * act'(z), z recomputed from x and stats (nothing saved but what
//     BatchNorm saves, and the bias), into dx's buffer, then BatchNorm's backward kernels read it
//     as their dy and write dx over it (NCHW planes: each run's dz written inside their sums task).
//   group_norm_act_fwd: GroupNorm's kernels (cpu/group_norm_kernels.h) over the whole batch, the
//     activation applied in their output pass (to each value as rounded to storage).
//   group_norm_act_bwd: dz = dy * act'(z) (z recomputed) into dx's buffer, then GroupNorm's
//     backward kernels read it as their dy and write dx over it.
//   layer_norm_act_fwd: LayerNorm over rows of n_cols values (x contiguous, or channels_last with
//     n_cols = C: LayerNormAct2d) by LayerNorm's row kernel a block of rows at a time, each block
//     passed through the activation while in cache.
//   layer_norm_act_bwd: dz = dy * act'(z) into dx's buffer, then LayerNorm's row backward over it.
//   layer_norm_act2d_fwd: LayerNormAct2d on a contiguous (NCHW) x (N, C, *): LayerNorm2d's NCHW
//     kernel (cpu/layer_norm2d_kernels.h) with the activation in its output pass (to each value as
//     rounded to storage).
//   layer_norm_act2d_bwd: LayerNorm2d's NCHW backward with dz = dy * act'(z) written into dx's
//     buffer by its first pass and read back by its second.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "args.h"
#include "cpu/batch_norm.h"
#include "cpu/batch_norm_kernels.h"
#include "cpu/group_norm_kernels.h"
#include "cpu/layer_norm2d_kernels.h"
#include "cpu/layer_norm_kernels.h"
#include "cpu/norm_act_kernels.h"

namespace normlab::norm_act {

namespace {

constexpr const char* kWho = "normlab batch_norm_act";

// BatchNormAct2d's backward takes dz inside BatchNorm's sums task where a plane is at least this
// many bytes: a channel's planes lie C * S apart, so its runs read from memory are only as fast as
// they are long, while a pass of its own reads dy and x in order, leaving dz and x in the last-level
// cache for the sums; one thread, relu, the fused backward inside vs before: float32 planes of 3136
// bytes 0.96 vs 1.40-1.53 ms (16x128x28x28), 2304 bytes 2.04-2.07 vs 2.52-2.64 ms (32x128x24x24),
// 1764 bytes 2.21-2.24 vs 1.93-1.95 (32x128x21x21); bfloat16 from 1 KiB to 4.5 KiB within 5 % either
// way, 392-512 bytes 3-8 % slower inside.
constexpr int64_t kDzRunBytes = 2048;
// relu's id (act::kRelu, numerics/activation.h): its dz is dy masked by z > 0, which BatchNorm's
// planes backward reads in place of dy (bn::ReluZ) -- no dz written anywhere
constexpr int64_t kActRelu = 1;

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

bn::View bn_view(const at::Tensor& x, at::MemoryFormat fmt) {
  const int64_t c = x.size(1), n = x.size(0);
  return rows_form(x, fmt) ? bn::View{x.numel() / c, c, 1, c} : bn::View{n, x.numel() / n, x.numel() / (n * c), c};
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
  bn::forward(dt, x.const_data_ptr(), nullptr, chan(w, c, "weight"), chan(b, c, "bias"), rmc, rvc, s,
              bn_view(x, fmt), eps, training);
  if (training && rm.has_value() && rv.has_value() && rm->defined() && rv->defined())
    batch_norm::update_running_raw(*rm, *rv, s, s + c, x.numel() / c, momentum);
  std::vector<double> hi, a, b2;
  consts(x, w, b, s, hi, a, b2);
  at::Tensor y = empty_out(x, fmt);  // (advised onto huge pages, as the plain norms' outputs)
  nact::forward_out(dt, x.const_data_ptr(), y.data_ptr(), hi.data(), a.data(), b2.data(), c, layout_of(x, fmt),
                    int(act), act_param, training);
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
  const Dtype dt = dt_of(x, "the input");
  // dz = dy * act'(z) written into dx's buffer; BatchNorm's backward then reads it as its dy and
  // writes dx in its place (each value of dy is read before dx is written there, in every path of
  // cpu/batch_norm_kernels): no scratch of x's size. The planes view with planes of at least
  // kDzRunBytes: each run of a channel's dz written by the backward's own task just before its sums
  // (bn::backward's dy_runs, into the task's scratch where only it reads them again: dy and x read
  // from memory once, not a pass of their own); shorter planes and the rows view: a pass first.
  at::Tensor dx = empty_out(x, fmt);
  const bn::View v = bn_view(x, fmt);
  const bool need_wb = need_dw || need_db;
  std::vector<double> sums(2 * c);  // dw, db as float64 sums
  const bool planes = bn::backward_takes_planes(dt, v, training, need_wb);
  const bn::ReluZ rz{hi.data(), a.data(), b2.data()};
  // relu: its mask read beside dy and x (bn::ReluZ), where BatchNorm's backward can (it says)
  const bool relu_done = act == kActRelu &&
                         bn::backward(dt, dy.const_data_ptr(), x.const_data_ptr(), need_dx ? dx.data_ptr() : nullptr,
                                      chan(w, c, "weight"), st.const_data_ptr<double>(), sums.data(), sums.data() + c,
                                      v, training, need_dx, need_wb, nullptr, &rz);
  if (!relu_done) {
    const bn::DyRuns dz_runs = planes && v.s_len * x.element_size() >= kDzRunBytes
        ? nact::grad_z_runs(dt, dy.const_data_ptr(), x.const_data_ptr(), dx.data_ptr(), hi.data(), a.data(), b2.data(), c,
                            int(act), act_param)
        : bn::DyRuns{};
    if (!dz_runs)
      nact::grad_z(dt, dy.const_data_ptr(), x.const_data_ptr(), dx.data_ptr(), hi.data(), a.data(), b2.data(), c,
                   layout_of(x, fmt), int(act), act_param);
    bn::backward(dt, dx.const_data_ptr(), x.const_data_ptr(), need_dx ? dx.data_ptr() : nullptr, chan(w, c, "weight"),
                 st.const_data_ptr<double>(), sums.data(), sums.data() + c, v, training, need_dx, need_wb,
                 dz_runs ? &dz_runs : nullptr);
  }
  auto cast = [&](const double* v, const std::optional<at::Tensor>& p) {
    const at::ScalarType t = p.has_value() && p->defined() ? p->scalar_type() : x.scalar_type();
    at::Tensor out = at::empty({c}, x.options().dtype(t));
    if (t == at::kDouble) {
      std::copy(v, v + c, out.data_ptr<double>());
    } else {
      const bn::MutChan m{out.data_ptr(), dt_of(out, "a parameter's gradient"), 1};
      for (int64_t i = 0; i < c; ++i) m.set(i, v[i]);
    }
    return out;
  };
  return {need_dx ? dx : at::Tensor(), need_dw ? cast(sums.data(), w) : at::Tensor(),
          need_db ? cast(sums.data() + c, b) : at::Tensor()};
}

// ---- GroupNorm + act ----

namespace {

constexpr const char* kWhoGn = "normlab group_norm_act";

struct GnShape {
  int64_t n, c, s;
  at::MemoryFormat fmt;
  bool nhwc;
};

GnShape gn_shape(const at::Tensor& x, int64_t g) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() >= 2, kWhoGn, ": expected a CPU input of shape (N, C, *), got ",
              x.sizes(), " on ", x.device());
  const int64_t n = x.size(0), c = x.size(1);
  TORCH_CHECK(g > 0 && c % g == 0, kWhoGn, ": expected num_groups (", g, ") to divide the channels (", c, ")");
  const int64_t s = n * c == 0 ? 0 : x.numel() / (n * c);
  const at::MemoryFormat fmt = x.suggest_memory_format();
  return {n, c, s, fmt, fmt != at::MemoryFormat::Contiguous && s > 1};
}

template <class A> std::vector<A> values(const std::optional<at::Tensor>& t, int64_t c, A absent) {
  std::vector<A> v(c, absent);
  if (t.has_value() && t->defined()) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == c, kWhoGn, ": expected a per-channel tensor of shape (", c, ",), got ",
                t->sizes());
    const at::Tensor d = t->to(at::kDouble).contiguous();
    const double* pd = d.const_data_ptr<double>();
    for (int64_t i = 0; i < c; ++i) v[i] = A(pd[i]);
  }
  return v;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_act_fwd_cpu(const at::Tensor& x_in,
                                                                      const std::optional<at::Tensor>& w,
                                                                      const std::optional<at::Tensor>& b, int64_t g,
                                                                      double eps, int64_t act, double act_param) {
  const GnShape sh = gn_shape(x_in, g);
  TORCH_CHECK(act >= 0 && act < 8, kWhoGn, ": expected an activation id in 0..7, got ", act);
  TORCH_CHECK(x_in.numel() > 0 && x_in.numel() / (sh.n * g) > 1, kWhoGn,
              ": expected more than one value per group, got input size ", x_in.sizes());
  const at::Tensor x = x_in.contiguous(sh.fmt);
  at::Tensor y = empty_out(x, sh.fmt);
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  at::Tensor mean = at::empty({sh.n, g}, x.options().dtype(acc)), var = at::empty({sh.n, g}, x.options().dtype(acc)),
             rstd = at::empty({sh.n, g}, x.options().dtype(acc));
  visit_dtype(x.scalar_type(), kWhoGn, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    const auto wv = values<A>(w, sh.c, A(1)), bv = values<A>(b, sh.c, A(0));
    const S* px = static_cast<const S*>(x.const_data_ptr());
    S* py = static_cast<S*>(y.data_ptr());
    A *pm = mean.data_ptr<A>(), *pv = var.data_ptr<A>(), *pr = rstd.data_ptr<A>();
    // GroupNorm's kernels over the whole batch (their own split across threads), the activation
    // in their output pass
    if (sh.nhwc)
      group_norm::fwd_nhwc<S>(px, wv.data(), bv.data(), py, pm, pv, pr, sh.n, sh.c, g, sh.s, eps, int(act), act_param);
    else
      group_norm::fwd_rows<S>(px, wv.data(), bv.data(), py, pm, pv, pr, sh.n, sh.c, g, sh.s, eps, false, int(act),
                              act_param);
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> group_norm_act_bwd_cpu(
    const at::Tensor& dy_in, const at::Tensor& x_in, const std::optional<at::Tensor>& w,
    const std::optional<at::Tensor>& b, const at::Tensor& mean_in, const at::Tensor& rstd_in, int64_t g, int64_t act,
    double act_param, bool need_dx) {
  const GnShape sh = gn_shape(x_in, g);
  TORCH_CHECK(act >= 0 && act < 8, kWhoGn, ": expected an activation id in 0..7, got ", act);
  TORCH_CHECK(mean_in.numel() == sh.n * g && rstd_in.numel() == sh.n * g, kWhoGn, ": expected mean and rstd of ",
              sh.n * g, " values, got ", mean_in.numel(), " and ", rstd_in.numel());
  TORCH_CHECK(dy_in.sizes() == x_in.sizes(), kWhoGn, ": expected dy of the input's shape ", x_in.sizes(), ", got ",
              dy_in.sizes());
  const bool nhwc = sh.nhwc || sh.s == 1;  // (GroupNorm's backward: S == 1 takes the NHWC kernel)
  const at::MemoryFormat fmt = sh.nhwc ? sh.fmt : at::MemoryFormat::Contiguous;
  const at::Tensor x = x_in.contiguous(fmt);
  const at::Tensor dy = dy_in.to(x.scalar_type()).contiguous(fmt);
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  const at::Tensor mean = mean_in.to(acc).contiguous(), rstd = rstd_in.to(acc).contiguous();
  const at::Tensor m64 = mean.to(at::kDouble), r64 = rstd.to(at::kDouble);
  const auto wd = values<double>(w, sh.c, 1.0), bd = values<double>(b, sh.c, 0.0);
  const int64_t cg = sh.c / g;
  std::vector<double> hi(sh.n * sh.c), a(sh.n * sh.c), b2(sh.n * sh.c);
  // (the pointers taken once: two tensor calls for each value were 6 % of a step)
  const double *pm = m64.const_data_ptr<double>(), *pr = r64.const_data_ptr<double>();
  for (int64_t i = 0; i < sh.n; ++i)
    for (int64_t c = 0; c < sh.c; ++c) {
      const int64_t k = i * g + c / cg;
      hi[i * sh.c + c] = pm[k];
      a[i * sh.c + c] = pr[k] * wd[c];
      b2[i * sh.c + c] = bd[c];
    }
  // dz = dy * act'(z) written into dx's buffer; GroupNorm's backward then reads it as its dy and
  // writes dx in its place (group_norm_kernels.h: dx may alias dy): no scratch of x's size. NCHW:
  // a block of group rows' dz written by the backward's own task just before their sums (bwd_rows'
  // dy_rows: the row still in cache for its sums and dx, not a pass of its own over the tensor).
  at::Tensor dx = empty_out(x, fmt);
  const Dtype dtn = dt_of(x, "the input");
  const int64_t es = x.element_size(), row_bytes = cg * sh.s * es;
  const char* pdy = static_cast<const char*>(dy.const_data_ptr());
  const char* pxb = static_cast<const char*>(x.const_data_ptr());
  char* pdz = static_cast<char*>(dx.data_ptr());
  const std::function<void(int64_t, int64_t)> dz_rows = [&](int64_t r0, int64_t r1) {  // planes r0 * cg .. r1 * cg
    nact::grad_z(dtn, pdy + r0 * row_bytes, pxb + r0 * row_bytes, pdz + r0 * row_bytes, hi.data() + r0 * cg,
                 a.data() + r0 * cg, b2.data() + r0 * cg, (r1 - r0) * cg,
                 nact::Layout{true, (r1 - r0) * cg, sh.s, (r1 - r0) * cg, 0}, int(act), act_param, false);
  };
  const group_norm::ReluDy relu{dy.const_data_ptr(), hi.data(), a.data(), b2.data()};
  const auto nhwc_dz = [&] {  // (rows of C channels, one row of constants a sample)
    nact::grad_z(dtn, dy.const_data_ptr(), x.const_data_ptr(), dx.data_ptr(), hi.data(), a.data(), b2.data(),
                 sh.n * sh.c, nact::Layout{false, sh.n * sh.s, sh.c, 0, sh.s}, int(act), act_param);
  };
  at::Tensor dw = at::empty({sh.c}, x.options().dtype(acc)), db = at::empty({sh.c}, x.options().dtype(acc));
  visit_dtype(x.scalar_type(), kWhoGn, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    const auto wv = values<A>(w, sh.c, A(1));
    S* dz = static_cast<S*>(dx.data_ptr());
    const S* px = static_cast<const S*>(x.const_data_ptr());
    const A *pm = mean.const_data_ptr<A>(), *pr = rstd.const_data_ptr<A>();
    if (nhwc) {
      // relu: its mask read beside dy and x where bwd_nhwc can (it says, before any work); else dz first
      if (act == kActRelu && group_norm::bwd_nhwc<S>(nullptr, px, wv.data(), pm, pr, need_dx ? dz : nullptr,
                                                      dw.data_ptr<A>(), db.data_ptr<A>(), sh.n, sh.c, g, sh.s, &relu))
        return;
      nhwc_dz();
      group_norm::bwd_nhwc<S>(dz, px, wv.data(), pm, pr, need_dx ? dz : nullptr, dw.data_ptr<A>(), db.data_ptr<A>(),
                              sh.n, sh.c, g, sh.s);
    } else  // (relu: its mask read beside dy where bwd_rows can, group_norm::ReluDy; else dz_rows)
      group_norm::bwd_rows<S>(dz, px, wv.data(), pm, pr, need_dx ? dz : nullptr, dw.data_ptr<A>(), db.data_ptr<A>(),
                              sh.n, sh.c, g, sh.s, false, &dz_rows, act == kActRelu ? &relu : nullptr);
  });
  return {need_dx ? dx : at::empty({0}, x.options()), dw, db};
}

// ---- LayerNorm + act (rows) ----

namespace {

constexpr const char* kWhoLn = "normlab layer_norm_act";

// Rows of x's memory: a contiguous x (n_cols its trailing values) or a channels_last one (n_cols = C).
int64_t ln_rows(const at::Tensor& x, int64_t n_cols) {
  TORCH_CHECK(x.device().is_cpu() && n_cols > 0 && x.numel() % n_cols == 0 &&
                  (x.is_contiguous() || (x.dim() == 4 && x.size(1) == n_cols &&
                                         x.is_contiguous(at::MemoryFormat::ChannelsLast))),
              kWhoLn, ": expected a contiguous CPU input of rows of ", n_cols,
              " values (or channels_last with ", n_cols, " channels), got ", x.sizes(), " strides ", x.strides());
  return x.numel() / n_cols;
}

Dtype ln_wdt(const at::Tensor& x, const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b,
             int64_t n_cols) {
  Dtype wdt = dt_of(x, "the input");
  for (const auto* t : {&w, &b})
    if (t->has_value() && (*t)->defined()) {
      TORCH_CHECK((*t)->is_contiguous() && (*t)->numel() == n_cols, kWhoLn, ": expected weight and bias of ", n_cols,
                  " contiguous values, got ", (*t)->sizes());
      wdt = dt_of(**t, "the weight");
    }
  return wdt;
}

std::vector<double> doubles(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return {};
  const at::Tensor d = t->to(at::kDouble).contiguous();
  return std::vector<double>(d.const_data_ptr<double>(), d.const_data_ptr<double>() + d.numel());
}

const void* ptr_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->const_data_ptr() : nullptr;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_act_fwd_cpu(const at::Tensor& x, int64_t n_cols,
                                                                      const std::optional<at::Tensor>& w,
                                                                      const std::optional<at::Tensor>& b, double eps,
                                                                      int64_t act, double act_param) {
  TORCH_CHECK(act >= 0 && act < 8, kWhoLn, ": expected an activation id in 0..7, got ", act);
  const int64_t n_rows = ln_rows(x, n_cols);
  const Dtype dt = dt_of(x, "the input"), wdt = ln_wdt(x, w, b, n_cols);
  at::Tensor y = advised(at::empty_like(x));  // (x's memory format: the same rows)
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  at::Tensor mean = at::empty({n_rows}, x.options().dtype(acc)), rstd = at::empty({n_rows}, x.options().dtype(acc));
  if (n_rows == 0) return {y, mean, rstd};
  // Blocks of whole rows of about 64 KiB of float32 (a multiple of 16 rows: the row kernel's
  // blocks), each normalised by LayerNorm's row kernel and passed through the activation while in
  // cache; a row's values do not depend on its block (the same bits as one call over all rows).
  const int64_t per = std::max<int64_t>(16, (16384 / n_cols) / 16 * 16);
  const int64_t n_blocks = (n_rows + per - 1) / per;
  const int64_t bytes = int64_t(x.element_size()), abytes = int64_t(mean.element_size());
  const char* px = static_cast<const char*>(x.const_data_ptr());
  char* py = static_cast<char*>(y.data_ptr());
  char *pm = static_cast<char*>(mean.data_ptr()), *pr = static_cast<char*>(rstd.data_ptr());
  at::parallel_for(0, n_blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t k = b0; k < b1; ++k) {
      const int64_t r0 = k * per, rows = std::min(per, n_rows - r0);
      ln::FwdArgs a{};
      a.x = px + r0 * n_cols * bytes;
      a.y = py + r0 * n_cols * bytes;
      a.w = ptr_or_null(w);
      a.b = ptr_or_null(b);
      a.mean = pm + r0 * abytes;
      a.rstd = pr + r0 * abytes;
      a.n_rows = rows;
      a.n_cols = n_cols;
      a.n_w = 1;
      a.n_b = 1;
      a.eps = eps;
      a.center = true;
      a.cast_x_hat = false;
      ln::norm_fwd(dt, wdt, a);
      nact::apply_inplace(dt, a.y, rows * n_cols, int(act), act_param);
    }
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_act_bwd_cpu(
    const at::Tensor& dy_in, const at::Tensor& x, const std::optional<at::Tensor>& w,
    const std::optional<at::Tensor>& b, const at::Tensor& mean, const at::Tensor& rstd, int64_t n_cols, int64_t act,
    double act_param, bool need_dwb) {
  TORCH_CHECK(act >= 0 && act < 8, kWhoLn, ": expected an activation id in 0..7, got ", act);
  const int64_t n_rows = ln_rows(x, n_cols);
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  TORCH_CHECK(mean.numel() == n_rows && rstd.numel() == n_rows && mean.scalar_type() == acc &&
                  rstd.scalar_type() == acc && mean.is_contiguous() && rstd.is_contiguous(),
              kWhoLn, ": expected mean and rstd of ", n_rows, " values of ", acc);
  const Dtype dt = dt_of(x, "the input"), wdt = ln_wdt(x, w, b, n_cols);
  TORCH_CHECK(dy_in.sizes() == x.sizes(), kWhoLn, ": expected dy of the input's shape ", x.sizes(), ", got ",
              dy_in.sizes());
  const at::Tensor dy = dy_in.to(x.scalar_type()).contiguous(x.is_contiguous() ? at::MemoryFormat::Contiguous
                                                                                 : at::MemoryFormat::ChannelsLast);
  at::Tensor dx = advised(at::empty_like(x));
  const bool has_w = w.has_value() && w->defined(), has_b = b.has_value() && b->defined();
  TORCH_CHECK(has_w || !has_b, kWhoLn, ": expected no bias without a weight (LayerNorm's backward sums db with dw)");
  at::Tensor dw = at::zeros({has_w ? n_cols : 0}, x.options().dtype(acc)),
             db = at::zeros({has_b ? n_cols : 0}, x.options().dtype(acc));
  if (n_rows == 0) return {dx, dw, db};
  const std::vector<double> m64 = doubles(mean), r64 = doubles(rstd), w64 = doubles(w), b64 = doubles(b);
  // dz = dy * act'(z) into dx's buffer, then LayerNorm's backward reads it as its dy and writes dx
  // in its place (each row's dy is read before its dx is written): no scratch of x's size
  nact::grad_z_rows(dt, dy.const_data_ptr(), x.const_data_ptr(), dx.data_ptr(), m64.data(), r64.data(),
                    has_w ? w64.data() : nullptr, has_b ? b64.data() : nullptr, n_rows, n_cols, int(act), act_param);
  ln::BwdArgs a{};
  a.dy = dx.const_data_ptr();
  a.x = x.const_data_ptr();
  a.w = ptr_or_null(w);
  a.mean = mean.const_data_ptr();
  a.rstd = rstd.const_data_ptr();
  a.dh = nullptr;
  a.dx = dx.data_ptr();
  a.dw = need_dwb && has_w ? dw.data_ptr() : nullptr;
  a.db = need_dwb && has_w && has_b ? db.data_ptr() : nullptr;
  a.n_rows = n_rows;
  a.n_cols = n_cols;
  a.n_w = 1;
  a.center = true;
  a.cast_x_hat = false;
  a.dw_storage = a.db_storage = false;
  ln::norm_bwd(dt, wdt, a);
  return {dx, dw, db};
}

// ---- LayerNorm2d + act, NCHW ----

namespace {

constexpr const char* kWhoLn2d = "normlab layer_norm_act2d";

struct Nchw {
  int64_t n, c, s;
};
Nchw nchw_of(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() >= 2 && x.is_contiguous() && x.size(1) > 0, kWhoLn2d,
              ": expected a contiguous (N, C, *) CPU input with C > 0, got ", x.sizes(), " strides ", x.strides(),
              " on ", x.device(), " (a channels_last input takes layer_norm_act_fwd: rows of C values)");
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, n == 0 ? 0 : x.numel() / (n * c)};
}

// weight / bias as (C,) contiguous tensors of the accumulation dtype (undefined: ones / zeros)
at::Tensor param_acc(const std::optional<at::Tensor>& t, int64_t c, at::ScalarType acc, const char* what) {
  if (!t.has_value() || !t->defined()) return {};
  TORCH_CHECK(t->device().is_cpu() && t->numel() == c, kWhoLn2d, ": expected a ", what, " of ", c,
              " values (the channels) on the CPU, got ", t->sizes(), " on ", t->device());
  (void)kernel_dtype(t->scalar_type(), kWhoLn2d, what);
  return t->reshape({c}).to(acc).contiguous();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_act2d_fwd_cpu(const at::Tensor& x,
                                                                        const std::optional<at::Tensor>& w,
                                                                        const std::optional<at::Tensor>& b, double eps,
                                                                        int64_t act, double act_param) {
  TORCH_CHECK(act >= 0 && act < 8, kWhoLn2d, ": expected an activation id in 0..7, got ", act);
  TORCH_CHECK(eps >= 0, kWhoLn2d, ": expected eps >= 0, got ", eps);
  const Nchw sh = nchw_of(x);
  (void)kernel_dtype(x.scalar_type(), kWhoLn2d, "the input");
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  const at::Tensor wa = param_acc(w, sh.c, acc, "weight"), ba = param_acc(b, sh.c, acc, "bias");
  at::Tensor y = empty_out(x);
  at::Tensor mean = at::empty({sh.n * sh.s}, x.options().dtype(acc)), rstd = at::empty({sh.n * sh.s}, x.options().dtype(acc));
  if (x.numel() == 0) return {y, mean, rstd};
  const bool far = x.numel() * x.element_size() >= ln2d::kFarBytes;
  visit_dtype(x.scalar_type(), kWhoLn2d, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    ln2d::fwd_nchw<S>(static_cast<const S*>(x.const_data_ptr()), ptr<const A>(wa), ptr<const A>(ba),
                      static_cast<S*>(y.data_ptr()), ptr<A>(mean), ptr<A>(rstd), sh.n, sh.c, sh.s, eps, far,
                      int(act), act_param);
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_act2d_bwd_cpu(
    const at::Tensor& dy_in, const at::Tensor& x, const std::optional<at::Tensor>& w,
    const std::optional<at::Tensor>& b, const at::Tensor& mean, const at::Tensor& rstd, int64_t act, double act_param,
    bool need_dwb) {
  TORCH_CHECK(act >= 0 && act < 8, kWhoLn2d, ": expected an activation id in 0..7, got ", act);
  const Nchw sh = nchw_of(x);
  (void)kernel_dtype(x.scalar_type(), kWhoLn2d, "the input");
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  TORCH_CHECK(mean.numel() == sh.n * sh.s && rstd.numel() == sh.n * sh.s && mean.scalar_type() == acc &&
                  rstd.scalar_type() == acc,
              kWhoLn2d, ": expected mean and rstd of ", sh.n * sh.s, " values of ", acc,
              " (layer_norm_act2d_fwd's), got ", mean.sizes(), " ", mean.scalar_type(), " and ", rstd.sizes(), " ",
              rstd.scalar_type());
  TORCH_CHECK(dy_in.sizes() == x.sizes(), kWhoLn2d, ": expected dy of the input's shape ", x.sizes(), ", got ",
              dy_in.sizes());
  const at::Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  const at::Tensor wa = param_acc(w, sh.c, acc, "weight"), ba = param_acc(b, sh.c, acc, "bias");
  const at::Tensor m = mean.contiguous(), r = rstd.contiguous();
  at::Tensor dx = empty_out(x);
  at::Tensor dw = at::zeros({need_dwb ? sh.c : 0}, x.options().dtype(acc)),
             db = at::zeros({need_dwb ? sh.c : 0}, x.options().dtype(acc));
  if (x.numel() == 0) return {dx, dw, db};
  const bool far = x.numel() * x.element_size() >= ln2d::kFarBytes;
  visit_dtype(x.scalar_type(), kWhoLn2d, [&](auto tag) {
    using S = decltype(tag);
    using A = acc_t<S>;
    ln2d::bwd_nchw<S>(static_cast<const S*>(dy.const_data_ptr()), static_cast<const S*>(x.const_data_ptr()),
                      ptr<const A>(wa), ptr<const A>(m), ptr<const A>(r), static_cast<S*>(dx.data_ptr()),
                      need_dwb ? ptr<A>(dw) : nullptr, need_dwb ? ptr<A>(db) : nullptr, sh.n, sh.c, sh.s, far,
                      ptr<const A>(ba), int(act), act_param);
  });
  return {dx, dw, db};
}


TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("batch_norm_act_fwd", &batch_norm_act_fwd_cpu);
  m.impl("batch_norm_act_bwd", &batch_norm_act_bwd_cpu);
  m.impl("group_norm_act_fwd", &group_norm_act_fwd_cpu);
  m.impl("group_norm_act_bwd", &group_norm_act_bwd_cpu);
  m.impl("layer_norm_act_fwd", &layer_norm_act_fwd_cpu);
  m.impl("layer_norm_act_bwd", &layer_norm_act_bwd_cpu);
  m.impl("layer_norm_act2d_fwd", &layer_norm_act2d_fwd_cpu);
  m.impl("layer_norm_act2d_bwd", &layer_norm_act2d_bwd_cpu);
}

}  // namespace normlab::norm_act
