// The frn family's op schemas and its typed C++ API (frn.h). Kernels: cpu/frn.cpp (CPU),
// meta/frn.cpp (Meta), autograd/frn.cpp (Autograd).
//
// x (N, C, H, W); weight, bias, tau (C,). The output is in x's memory format (channels_last for
// a channels-last x, else contiguous), x's dtype; rstd (N, C) and dw, db, dtau (C,) in the
// accumulation dtype (float64 for float64, else float32).
#include <torch/library.h>

#include "args.h"
#include "frn.h"

TORCH_LIBRARY_FRAGMENT(normlab, m) {
  // FRN's output (and the TLU's with tau) and rstd = 1 / sqrt(mean_HW(x^2) + eps), (N, C)
  m.def("frn_fwd(Tensor x, Tensor? weight, Tensor? bias, Tensor? tau, float eps) -> (Tensor y, Tensor rstd)");
  // FRN's gradients (dx, dw, db, dtau); each empty unless asked for
  m.def("frn_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor? tau, Tensor rstd, bool need_dx, "
        "bool need_dw, bool need_db, bool need_dtau) -> (Tensor dx, Tensor dw, Tensor db, Tensor dtau)");
}

namespace normlab::frn {

using at::Tensor;

std::tuple<Tensor, Tensor> frn_fwd(const Tensor& x, const OptTensor& weight, const OptTensor& bias,
                                   const OptTensor& tau, double eps) {
  static const auto op = op_handle<decltype(frn_fwd)>("normlab::frn_fwd");
  return op.call(x, weight, bias, tau, eps);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> frn_bwd(const Tensor& dy, const Tensor& x, const OptTensor& weight,
                                                   const OptTensor& bias, const OptTensor& tau, const Tensor& rstd,
                                                   bool need_dx, bool need_dw, bool need_db, bool need_dtau) {
  static const auto op = op_handle<decltype(frn_bwd)>("normlab::frn_bwd");
  return op.call(dy, x, weight, bias, tau, rstd, need_dx, need_dw, need_db, need_dtau);
}

}  // namespace normlab::frn
