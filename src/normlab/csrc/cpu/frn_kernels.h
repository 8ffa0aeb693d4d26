// Filter Response Normalization's kernels on raw pointers (docs/derivations/frn.md): per
// (sample, channel) of an (N, C, S) input, S = H * W,
//
//   r = 1 / sqrt(mean_S(x^2) + eps),  z = x * r * w + b,  y = max(z, tau)  (tau: optional)
//
// and the backward. Storage S is float, double, bf16 or f16; w, b, tau and the products in
// acc_t<S> (float64 for double, float32 otherwise), the output rounded once to S; every sum in
// float64. No torch headers here but ATen/Parallel.h.
#pragma once

#include <cstdint>

#include "numerics/half.h"

namespace normlab::frn {

// The shape and memory layout of x (and y, dy, dx: the same layout).
struct Args {
  int64_t n, c, s;      // x is (n, c, s) logically: samples, channels, values per channel (H * W)
  bool channels_last;   // memory (n, s, c) when true (NHWC), (n, c, s) otherwise (NCHW)
  double eps;
};

// Forward. w, b, tau: (c,) in acc_t<S> or nullptr (ones / zeros / no TLU); y: x's shape and
// layout; rstd: (n, c) written (r, in acc_t<S>).
template <class S>
void forward(const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* tau, S* y, acc_t<S>* rstd,
             const Args& a);

// Backward from the forward's rstd. dx: x's shape and layout, or nullptr. The per-(sample,
// channel) float64 partials, (n, c) each, or nullptr: dw_part = sum_S(dz * xhat),
// db_part = sum_S(dz), dtau_part = sum_S(dy - dz) (dz = dy * m, m the TLU's share). The caller
// sums them over samples in order.
template <class S>
void backward(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* tau,
              const acc_t<S>* rstd, S* dx, double* dw_part, double* db_part, double* dtau_part, const Args& a);

}  // namespace normlab::frn
