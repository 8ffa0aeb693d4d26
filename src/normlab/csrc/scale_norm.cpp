// The scale_norm family's op schemas and its typed C++ API (scale_norm.h). Kernels:
// cpu/scale_norm.cpp (CPU), meta/scale_norm.cpp (Meta), autograd/scale_norm.cpp (Autograd).
//
// x (N, C, H, W); weight (C,). The output is in x's memory format (channels_last for a
// channels-last x, else contiguous), x's dtype; rstd and mean (N, H * W) and dw (C,) in the
// accumulation dtype (float64 for float64, else float32); mean (simple only, else empty) is the
// mean of x - x[:, 0] at each position: shifted by the first channel, as the kernels centre.
#include <torch/library.h>

#include "args.h"
#include "scale_norm.h"

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  // RmsNorm2d's (simple=False) or SimpleNorm2d's output, with rstd and (simple) the mean per position
  m.def("scale_norm2d_fwd(Tensor x, Tensor? weight, bool simple, float eps) -> (Tensor y, Tensor rstd, Tensor mean)");
  // their gradients (dx, dw); each empty unless asked for
  m.def("scale_norm2d_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor rstd, Tensor mean, bool simple, bool need_dx, "
        "bool need_dw) -> (Tensor dx, Tensor dw)");
}

namespace normlab::scale_norm {

using at::Tensor;

std::tuple<Tensor, Tensor, Tensor> scale_norm2d_fwd(const Tensor& x, const OptTensor& weight, bool simple,
                                                    double eps) {
  static const auto op = op_handle<decltype(scale_norm2d_fwd)>("normlab::scale_norm2d_fwd");
  return op.call(x, weight, simple, eps);
}

std::tuple<Tensor, Tensor> scale_norm2d_bwd(const Tensor& dy, const Tensor& x, const OptTensor& weight,
                                            const Tensor& rstd, const Tensor& mean, bool simple, bool need_dx,
                                            bool need_dw) {
  static const auto op = op_handle<decltype(scale_norm2d_bwd)>("normlab::scale_norm2d_bwd");
  return op.call(dy, x, weight, rstd, mean, simple, need_dx, need_dw);
}

}  // namespace normlab::scale_norm
