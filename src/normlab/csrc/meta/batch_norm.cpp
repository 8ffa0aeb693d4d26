// The batch_norm family's Meta kernels: shapes, dtypes and strides of the ops' outputs (torch.compile,
// torch.export, FakeTensor). Outputs in torch's memory format for the input, as on the CPU.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace normlab::batch_norm {
namespace {

at::Tensor like(const at::Tensor& x) {
  return at::empty(x.sizes(), x.options().memory_format(x.suggest_memory_format()));
}

std::tuple<at::Tensor, at::Tensor> batch_norm_fwd_meta(const at::Tensor& x, const std::optional<at::Tensor>&,
                                                  const std::optional<at::Tensor>&, double) {
  return {like(x), at::empty({3, x.size(1)}, x.options().dtype(at::kDouble))};
}

at::Tensor batch_norm_eval_fwd_meta(const at::Tensor& x, const std::optional<at::Tensor>&,
                                    const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&, double) {
  return like(x);
}

at::Tensor batch_norm_stats_meta(const at::Tensor& x) {
  return at::empty({2, x.size(1)}, x.options().dtype(at::kDouble));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_bwd_meta(const at::Tensor&, const at::Tensor& x,
                                                        const std::optional<at::Tensor>&, const at::Tensor&,
                                                        bool training, bool need_dx, bool need_wb) {
  const int64_t c = (training || need_wb) ? x.size(1) : 0;
  at::Tensor dx = need_dx ? like(x) : at::empty({0}, x.options());
  return {dx, at::empty({c}, x.options().dtype(at::kDouble)), at::empty({c}, x.options().dtype(at::kDouble))};
}

void batch_norm_update_stats_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                  const at::Tensor&) {}

}  // namespace

TORCH_LIBRARY_IMPL(normlab, Meta, m) {
  m.impl("batch_norm_fwd", &batch_norm_fwd_meta);
  m.impl("batch_norm_eval_fwd", &batch_norm_eval_fwd_meta);
  m.impl("batch_norm_stats", &batch_norm_stats_meta);
  m.impl("batch_norm_bwd", &batch_norm_bwd_meta);
  m.impl("batch_norm_update_stats", &batch_norm_update_stats_meta);
}

}  // namespace normlab::batch_norm
