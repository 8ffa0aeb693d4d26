// The dyt family's op schemas and its typed C++ API (dyt.h). Kernels: cpu/dyt.cpp (CPU),
// meta/dyt.cpp (Meta), autograd/dyt.cpp (Autograd, ADInplaceOrView).
//
// x as the user gives it, (*, *normalized_shape); weight and bias of normalized_shape (the
// columns of x's rows); alpha (1,). The output is contiguous, x's dtype; dalpha (1,), dw, db
// (normalized_shape) in the accumulation dtype (float64 for float64, else float32).
#include <torch/library.h>

#include "args.h"
#include "dyt.h"

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  // DyT's output (differentiable; saves x)
  m.def("dyt_fwd(Tensor x, Tensor? weight, Tensor? bias, int[] normalized_shape, Tensor alpha) -> Tensor y");
  // DyT's gradients (dx, dalpha, dw, db); each empty unless asked for
  m.def("dyt_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor alpha, int[] normalized_shape, bool need_dx, "
        "bool need_dalpha, bool need_wb) -> (Tensor dx, Tensor dalpha, Tensor dw, Tensor db)");
}

namespace normlab::dyt {

using at::Tensor;

Tensor dyt_fwd(const Tensor& x, const OptTensor& weight, const OptTensor& bias, at::IntArrayRef normalized_shape,
               const Tensor& alpha) {
  static const auto op = op_handle<decltype(dyt_fwd)>("normlab::dyt_fwd");
  return op.call(x, weight, bias, normalized_shape, alpha);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> dyt_bwd(const Tensor& dy, const Tensor& x, const OptTensor& weight,
                                                   const Tensor& alpha, at::IntArrayRef normalized_shape, bool need_dx,
                                                   bool need_dalpha, bool need_wb) {
  static const auto op = op_handle<decltype(dyt_bwd)>("normlab::dyt_bwd");
  return op.call(dy, x, weight, alpha, normalized_shape, need_dx, need_dalpha, need_wb);
}

}  // namespace normlab::dyt
