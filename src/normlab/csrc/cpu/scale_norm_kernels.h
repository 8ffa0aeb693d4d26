// The scale-only channel norms' kernels on raw pointers (docs/derivations/scale_norm.md):
// RmsNorm2d and SimpleNorm2d over the C channels at each position of an (N, C, H, W) input,
//
//   s = mean_C(x^2) (rms)  or  sum_C((x - mean_C(x))^2) / (C - 1) (simple)
//   r = 1 / sqrt(s + eps),  y = x * r * w
//
// and the backward. Storage S is float, double, bf16 or f16; w and the products in acc_t<S>
// (float64 for double, float32 otherwise), the output rounded once to S; every sum in float64.
// No torch headers here but ATen/Parallel.h.
#pragma once

#include <cstdint>

#include "numerics/half.h"

namespace normlab::scale_norm {

struct Args {
  int64_t n, c, hw;     // x is (n, c, hw) logically: samples, channels, positions (H * W)
  bool channels_last;   // memory (n, hw, c) when true (NHWC), (n, c, hw) otherwise (NCHW)
  bool simple;          // s: the unbiased variance (SimpleNorm2d); else the mean square (RmsNorm2d)
  double eps;
};

// The tasks, from the shape alone: blocks of `block` positions of one sample; dw's partials are
// written per task and merged in task order (the same bits for any number of threads).
struct Geometry {
  int64_t block, blocks_per_sample, n_tasks;
};
Geometry geometry(const Args& a);

// Forward. w: (c,) in acc_t<S> or nullptr (ones); y: x's shape and layout; rstd: (n, hw) written;
// mean: (n, hw) written for `simple` -- the mean of x - x0, x0 the position's first channel (the
// shifted centre the backward needs) --, else nullptr.
template <class S>
void forward(const S* x, const acc_t<S>* w, S* y, acc_t<S>* rstd, acc_t<S>* mean, const Args& a, const Geometry& g);

// Backward from the forward's rstd (and mean). dx: x's shape and layout, or nullptr; dw_part:
// (n_tasks, c) float64 partials of sum(dy * xhat), or nullptr.
template <class S>
void backward(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* rstd, const acc_t<S>* mean, S* dx,
              double* dw_part, const Args& a, const Geometry& g);

}  // namespace normlab::scale_norm
