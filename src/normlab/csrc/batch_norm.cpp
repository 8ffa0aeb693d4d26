// The batch_norm family's op schemas (torch.ops.normlab.*): BatchNorm's training and evaluation
// forwards, its backward, the batch statistics alone (SyncBatchNorm's per-rank part) and the
// running-statistics update. Kernels: cpu/batch_norm.cpp (CPU), meta/batch_norm.cpp (Meta),
// autograd/batch_norm.cpp (Autograd, ADInplaceOrView). Math: docs/derivations/batch_norm.md.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  // (y, stats): stats (3, C) float64 rows batch mean, biased var, rstd
  m.def("batch_norm_train_fwd(Tensor x, Tensor? w, Tensor? b, float eps) -> (Tensor, Tensor)");
  // y with the running statistics
  m.def("batch_norm_eval_fwd(Tensor x, Tensor running_mean, Tensor running_var, Tensor? w, Tensor? b, "
        "float eps) -> Tensor");
  // (2, C) float64 rows batch mean, biased var (no output)
  m.def("batch_norm_stats(Tensor x) -> Tensor");
  // (dx, dw, db): dx empty (0,) unless need_dx; dw, db (C,) float64 sums, (0,) unless training or need_wb
  m.def("batch_norm_bwd(Tensor dy, Tensor x, Tensor? w, Tensor stats, bool training, bool need_dx, "
        "bool need_wb) -> (Tensor, Tensor, Tensor)");
  // running = (1 - momentum) * running + momentum * stat (unbiased var, n values per channel);
  // momentum a 0-dim tensor read when the op runs (momentum=None's factor depends on a buffer)
  m.def("batch_norm_update_stats(Tensor(a!) running_mean, Tensor(b!) running_var, Tensor stats, int n, "
        "Tensor momentum) -> ()");
}
