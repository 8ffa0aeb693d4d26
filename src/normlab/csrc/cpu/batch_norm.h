// The batch_norm family's CPU pieces (cpu/batch_norm.cpp) that its fast eager entries
// (autograd/batch_norm.cpp) call directly, below the dispatcher.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

namespace normlab::batch_norm {

// The fast path's kernels (autograd/batch_norm.cpp's batch_norm_fast), for arguments it checked:
// x a CPU tensor of a served dtype with numel > 0, every per-channel tensor (C,) of a served
// dtype. y; `stats` (3 * C float64, the caller's: a thread-local buffer or a tensor's storage)
// receives the rows mean, var, rstd (the batch's in training, the running ones in evaluation).
at::Tensor forward_into(const at::Tensor& x, const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b,
                        const std::optional<at::Tensor>& rm, const std::optional<at::Tensor>& rv, double eps,
                        bool training, double* stats);
// A call's float64 scratch of n values (the statistics nobody keeps): up to 1536 values (512
// channels' mean, var, rstd) inside the object, on the heap beyond; freed with the object (nothing
// is kept between calls).
class StatsScratch {
 public:
  explicit StatsScratch(int64_t n) : p_(local_) {
    if (n > kInline) { heap_.resize(size_t(n)); p_ = heap_.data(); }
  }
  double* data() { return p_; }

 private:
  static constexpr int64_t kInline = 1536;
  double local_[kInline];
  std::vector<double> heap_;
  double* p_;
};
// The backward with dw in dw_dtype and db in db_dtype (the parameters' dtypes: the float64
// sums rounded once, as .to() would), each undefined unless asked for; dx undefined unless need_dx.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_typed(const at::Tensor& dy, const at::Tensor& x,
                                                         const std::optional<at::Tensor>& w, const at::Tensor& stats,
                                                         bool training, bool need_dx, bool need_dw, bool need_db,
                                                         at::ScalarType dw_dtype, at::ScalarType db_dtype);
// running statistics blended with (C,) float64 mean and biased var, in place (no version bump)
void update_running_raw(const at::Tensor& rm, const at::Tensor& rv, const double* mean, const double* var, int64_t n,
                        double momentum);

}  // namespace normlab::batch_norm
