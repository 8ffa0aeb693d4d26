// The batch_norm family's CPU kernels (schemas: csrc/batch_norm.h): tensors in, checks,
// outputs allocated in torch's memory format, the torch-free kernels of batch_norm_kernels.cpp;
// and the kernels' geometry constants for tests (batch_norm.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "args.h"
#include "batch_norm.h"
#include "cpu/batch_norm.h"
#include "cpu/batch_norm_kernels.h"

namespace normlab::batch_norm {

using namespace normlab::bn;  // the kernels

namespace {

Dtype dtype_of(const at::Tensor& t, const char* what) {
  return kernel_dtype(t.scalar_type(), "normlab batch_norm", what);
}

void check_chan(const std::optional<at::Tensor>& t, int64_t c, const char* what) {
  if (!given(t)) return;
  TORCH_CHECK(t->device().is_cpu(), "normlab batch_norm: expected ", what, " on the CPU, got ", t->device());
  TORCH_CHECK(t->dim() == 1 && t->size(0) == c, "normlab batch_norm: expected ", what, " of shape (", c,
              ",) (one value per channel, C = input.shape[1]), got ", t->sizes());
  dtype_of(*t, what);
}

Chan chan(const std::optional<at::Tensor>& t) {
  if (!given(t)) return {};
  return {t->data_ptr(), dtype_of(*t, "a per-channel tensor"), t->stride(0)};
}

void check_input(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu(), "normlab batch_norm: expected a CPU input, got ", x.device());
  TORCH_CHECK(x.dim() >= 2, "normlab batch_norm: expected an input of at least 2 dims (N, C, *), got ", x.dim(),
              " dims");
  dtype_of(x, "the input");
}

// The kernels' 2-D view of a canonical x (contiguous in memory format fmt).
View view_of(const at::Tensor& x, at::MemoryFormat fmt) {
  const int64_t c = x.size(1), numel = x.numel();
  if (fmt == at::MemoryFormat::ChannelsLast || fmt == at::MemoryFormat::ChannelsLast3d)
    return {numel / c, c, 1, c};  // rows (N * spatial, C)
  const int64_t n = x.size(0);
  return {n, numel / n, numel / (n * c), c};  // planes (N, C * S)
}

}  // namespace

at::MemoryFormat memory_format(const at::Tensor& x) { return x.suggest_memory_format(); }

std::tuple<at::Tensor, at::Tensor> batch_norm_fwd_cpu(const at::Tensor& x_in, const std::optional<at::Tensor>& w,
                                                 const std::optional<at::Tensor>& b, double eps) {
  check_input(x_in);
  const int64_t c = x_in.size(1);
  check_chan(w, c, "weight");
  check_chan(b, c, "bias");
  TORCH_CHECK(x_in.numel() > c || x_in.numel() == 0,
              "Expected more than 1 value per channel when training, got input size ", x_in.sizes());
  const at::MemoryFormat fmt = memory_format(x_in);
  at::Tensor x = x_in.contiguous(fmt);
  at::Tensor y = empty_out(x, fmt);
  at::Tensor stats = at::empty({3, c}, x.options().dtype(at::kDouble));
  if (x.numel() == 0) return {y, stats.fill_(std::numeric_limits<double>::quiet_NaN())};
  forward(dtype_of(x, "the input"), x.const_data_ptr(), y.data_ptr(), chan(w), chan(b), {}, {},
          stats.data_ptr<double>(), view_of(x, fmt), eps, true);
  return {y, stats};
}

at::Tensor batch_norm_eval_fwd_cpu(const at::Tensor& x_in, const std::optional<at::Tensor>& w,
                                   const std::optional<at::Tensor>& b, const at::Tensor& rm,
                                   const at::Tensor& rv, double eps) {
  check_input(x_in);
  const int64_t c = x_in.size(1);
  check_chan(rm, c, "running_mean");
  check_chan(rv, c, "running_var");
  check_chan(w, c, "weight");
  check_chan(b, c, "bias");
  const at::MemoryFormat fmt = memory_format(x_in);
  at::Tensor x = x_in.contiguous(fmt);
  at::Tensor y = empty_out(x, fmt);
  if (x.numel() == 0) return y;
  StatsScratch buf(3 * c);  // the running statistics as float64, and rstd: not returned
  double* stats = buf.data();
  forward(dtype_of(x, "the input"), x.const_data_ptr(), y.data_ptr(), chan(w), chan(b), chan(rm), chan(rv), stats,
          view_of(x, fmt), eps, false);
  return y;
}

at::Tensor batch_norm_stats_cpu(const at::Tensor& x_in) {
  check_input(x_in);
  const int64_t c = x_in.size(1);
  const at::MemoryFormat fmt = memory_format(x_in);
  at::Tensor x = x_in.contiguous(fmt);
  at::Tensor stats = at::empty({2, c}, x.options().dtype(at::kDouble));
  if (x.numel() == 0) return stats.zero_();
  std::vector<double> s(3 * c);  // mean, var, rstd (with eps 0: not returned)
  forward(dtype_of(x, "the input"), x.const_data_ptr(), nullptr, {}, {}, {}, {}, s.data(), view_of(x, fmt), 0.0,
          true);
  std::copy(s.begin(), s.begin() + 2 * c, stats.data_ptr<double>());
  return stats;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_bwd_cpu(const at::Tensor& dy_in, const at::Tensor& x_in,
                                                       const std::optional<at::Tensor>& w, const at::Tensor& stats_in,
                                                       bool training, bool need_dx, bool need_wb) {
  check_input(x_in);
  const int64_t c = x_in.size(1);
  check_chan(w, c, "weight");
  TORCH_CHECK(dy_in.sizes() == x_in.sizes(), "normlab batch_norm backward: expected a gradient of shape ",
              x_in.sizes(), ", got ", dy_in.sizes());
  TORCH_CHECK(stats_in.dim() == 2 && stats_in.size(0) >= 3 && stats_in.size(1) == c,
              "normlab batch_norm backward: expected statistics of shape (3, ", c, "), got ", stats_in.sizes());
  const at::MemoryFormat fmt = memory_format(x_in);
  at::Tensor x = x_in.contiguous(fmt);
  at::Tensor dy = dy_in.to(x.scalar_type()).contiguous(fmt);
  at::Tensor stats = stats_in.to(at::kDouble).contiguous();
  const int64_t n_out = (training || need_wb) ? c : 0;
  at::Tensor dx = need_dx ? empty_out(x, fmt) : at::empty({0}, x.options());
  at::Tensor dw = at::empty({n_out}, x.options().dtype(at::kDouble));
  at::Tensor db = at::empty({n_out}, x.options().dtype(at::kDouble));
  if (x.numel() == 0) {
    dw.zero_();
    db.zero_();
    return {dx, dw, db};
  }
  backward(dtype_of(x, "the input"), dy.const_data_ptr(), x.const_data_ptr(), need_dx ? dx.data_ptr() : nullptr,
           chan(w), stats.const_data_ptr<double>(), dw.data_ptr<double>(), db.data_ptr<double>(), view_of(x, fmt),
           training, need_dx, need_wb);
  return {dx, dw, db};
}

at::Tensor forward_into(const at::Tensor& x_in, const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b,
                        const std::optional<at::Tensor>& rm, const std::optional<at::Tensor>& rv, double eps,
                        bool training, double* stats) {
  const at::MemoryFormat fmt = memory_format(x_in);
  const at::Tensor x = x_in.contiguous(fmt);
  at::Tensor y = empty_out(x, fmt);
  forward(dtype_of(x, "the input"), x.const_data_ptr(), y.data_ptr(), chan(w), chan(b), training ? Chan{} : chan(rm),
          training ? Chan{} : chan(rv), stats, view_of(x, fmt), eps, training);
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_typed(const at::Tensor& dy_in, const at::Tensor& x_in,
                                                         const std::optional<at::Tensor>& w, const at::Tensor& stats_in,
                                                         bool training, bool need_dx, bool need_dw, bool need_db,
                                                         at::ScalarType dw_dtype, at::ScalarType db_dtype) {
  const int64_t c = x_in.size(1);
  const at::MemoryFormat fmt = memory_format(x_in);
  const at::Tensor x = x_in.contiguous(fmt);
  const at::Tensor dy = dy_in.to(x.scalar_type()).contiguous(fmt);
  const at::Tensor stats = stats_in.scalar_type() == at::kDouble ? stats_in.contiguous() : stats_in.to(at::kDouble).contiguous();
  const bool need_wb = need_dw || need_db;
  at::Tensor dx = need_dx ? empty_out(x, fmt) : at::Tensor();
  StatsScratch scratch(2 * c);
  double* sums = scratch.data();  // dw, db as float64 sums
  if (x.numel() == 0) {
    std::fill(sums, sums + 2 * c, 0.0);
  } else {
    backward(dtype_of(x, "the input"), dy.const_data_ptr(), x.const_data_ptr(), need_dx ? dx.data_ptr() : nullptr,
             chan(w), stats.const_data_ptr<double>(), sums, sums + c, view_of(x, fmt), training, need_dx, need_wb);
  }
  auto cast = [&](const double* v, at::ScalarType st) {
    at::Tensor t = at::empty({c}, x.options().dtype(st));
    const MutChan m{t.data_ptr(), dtype_of(t, "a parameter's gradient"), 1};
    if (st == at::kDouble) std::copy(v, v + c, t.data_ptr<double>());
    else for (int64_t i = 0; i < c; ++i) m.set(i, v[i]);
    return t;
  };
  return {dx, need_dw ? cast(sums, dw_dtype) : at::Tensor(), need_db ? cast(sums + c, db_dtype) : at::Tensor()};
}

void update_running_raw(const at::Tensor& rm, const at::Tensor& rv, const double* mean, const double* var, int64_t n,
                        double momentum) {
  const int64_t c = rm.size(0);
  update_running({rm.data_ptr(), dtype_of(rm, "running_mean"), rm.stride(0)},
                 {rv.data_ptr(), dtype_of(rv, "running_var"), rv.stride(0)}, mean, var, c, n, momentum);
}

void batch_norm_update_stats_cpu(const at::Tensor& rm, const at::Tensor& rv, const at::Tensor& stats_in, int64_t n,
                      const at::Tensor& momentum) {
  const int64_t c = rm.numel();
  check_chan(rm, c, "running_mean");
  check_chan(rv, c, "running_var");
  TORCH_CHECK(stats_in.dim() == 2 && stats_in.size(0) >= 2 && stats_in.size(1) == c,
              "normlab batch_norm_update_stats: expected statistics of shape (2 or 3, ", c, "), got ",
              stats_in.sizes());
  at::Tensor stats = stats_in.to(at::kDouble).contiguous();
  const double* s = stats.const_data_ptr<double>();
  update_running_raw(rm, rv, s, s + c, n, momentum.item<double>());
}

// ---- the kernels' geometry constants (tests) ----

#define NORMLAB_BN_CONSTANTS(X) X(fold_below) X(fold_width) X(column_block) \
  X(chunk_elems) X(max_chunk_rows) X(task_elems) X(local_elems) X(min_local_run) X(plane_min) X(mid_plane_min) X(short_plane_min) X(plane_piece) \
  X(part_values) X(plane_local_bytes) X(max_partials) X(phase1_values)

std::map<std::string, int64_t> kernel_constants() {
  std::map<std::string, int64_t> r;
#define NORMLAB_GET(name) r[#name] = constants().name;
  NORMLAB_BN_CONSTANTS(NORMLAB_GET)
#undef NORMLAB_GET
  return r;
}

std::map<std::string, int64_t> set_kernel_constants(const std::map<std::string, int64_t>& values) {
  auto old = kernel_constants();
  for (const auto& [key, v] : values) {
    TORCH_CHECK(old.count(key), "batch_norm constants: unknown name ", key);
    TORCH_CHECK(v > 0, "batch_norm constants: expected a positive ", key, ", got ", v);
  }
#define NORMLAB_SET(name) if (values.count(#name)) constants().name = values.at(#name);
  NORMLAB_BN_CONSTANTS(NORMLAB_SET)
#undef NORMLAB_SET
  return old;
}

std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int64_t> kernel_geometry(int64_t n_rows, int64_t width,
                                                                              int64_t s_len, bool backward) {
  Geometry g = geometry(n_rows, width, s_len, constants().local_elems / (backward ? 2 : 1));
  return {g.fold, g.cw, g.sub, g.group, g.local, g.tail};
}

TORCH_LIBRARY_IMPL(normlab, CPU, m) {
  m.impl("batch_norm_fwd", &batch_norm_fwd_cpu);
  m.impl("batch_norm_eval_fwd", &batch_norm_eval_fwd_cpu);
  m.impl("batch_norm_stats", &batch_norm_stats_cpu);
  m.impl("batch_norm_bwd", &batch_norm_bwd_cpu);
  m.impl("batch_norm_update_stats", &batch_norm_update_stats_cpu);
}

}  // namespace normlab::batch_norm
