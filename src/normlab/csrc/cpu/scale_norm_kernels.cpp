// RmsNorm2d's and SimpleNorm2d's kernels (scale_norm_kernels.h): docs/derivations/scale_norm.md.
//
// Loop order and blocking, from the shape alone: a task is a block of `block` positions of one
// sample (block = min(hw, max(256, ceil(n * hw / 512))): at most 512 + n tasks).
// - NCHW: the channels of a position are hw apart; a task walks the channels in order, its
//   positions the inner (contiguous) loop, each position's sums in its own float64 lane.
// - NHWC: a position's channels are contiguous: each position's sums in 8 float64 lanes added in
//   a fixed tree.
// SimpleNorm2d's variance by the shifted two passes: each position's values shifted by its first
// channel x0, the mean of x - x0 first (the `mean` the backward reads), then the squares of
// (x - x0) - mean; the backward centres the same way. Every sum belongs to one task and runs in
// an order fixed by the shape; dw's partials (one row of c per task) are merged by the caller in
// task order: the same bits for any number of threads.
//
// Backward, g = dy * w, xhat = x * r:
//   rms:    dx = r * (g - xhat * sum_C(g * xhat) / C)
//   simple: dx = r * (g - (x - mean) * r * sum_C(g * xhat) / (C - 1))
//   dw = sum over positions of dy * xhat
#include "cpu/scale_norm_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace normlab::scale_norm {

namespace {

constexpr int64_t kLanes = 8;
constexpr int64_t kMinBlock = 256;
constexpr int64_t kMaxTasks = 512;

inline double tree(const double* v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

int64_t grain(const Args& a, const Geometry& g) {
  return std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, g.block * a.c));
}

// The statistic's divisor: C (rms) or C - 1 (simple; 0 for one channel: 0 / 0, NaN, as torch.var)
inline double divisor(const Args& a) { return a.simple ? double(a.c - 1) : double(a.c); }

// -- NCHW ------------------------------------------------------------------------------------------

template <class S>
void forward_nchw(const S* x, const acc_t<S>* w, S* y, acc_t<S>* rstd, acc_t<S>* mean, const Args& a,
                  const Geometry& g) {
  using A = acc_t<S>;
  at::parallel_for(0, g.n_tasks, grain(a, g), [&](int64_t t0, int64_t t1) {
    std::vector<double> mu(g.block), sq(g.block);
    std::vector<A> r(g.block), m(g.block);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t n = task / g.blocks_per_sample, p0 = (task % g.blocks_per_sample) * g.block;
      const int64_t pw = std::min(g.block, a.hw - p0);
      const S* xn = x + n * a.c * a.hw + p0;
      std::fill(mu.begin(), mu.end(), 0.0);
      std::fill(sq.begin(), sq.end(), 0.0);
      if (a.simple) {  // the mean of x - x0 (x0: the position's first channel), then the squares about it
        for (int64_t c = 1; c < a.c; ++c)
          for (int64_t p = 0; p < pw; ++p) mu[p] += double(to_acc(xn[c * a.hw + p])) - double(to_acc(xn[p]));
        for (int64_t p = 0; p < pw; ++p) mu[p] /= double(a.c);
        for (int64_t c = 0; c < a.c; ++c)
          for (int64_t p = 0; p < pw; ++p) {
            const double d = (double(to_acc(xn[c * a.hw + p])) - double(to_acc(xn[p]))) - mu[p];
            sq[p] += d * d;
          }
      } else {
        for (int64_t c = 0; c < a.c; ++c)
          for (int64_t p = 0; p < pw; ++p) {
            const double d = double(to_acc(xn[c * a.hw + p]));
            sq[p] += d * d;
          }
      }
      for (int64_t p = 0; p < pw; ++p) {
        r[p] = A(1.0 / std::sqrt(sq[p] / divisor(a) + a.eps));
        rstd[n * a.hw + p0 + p] = r[p];
        if (mean) mean[n * a.hw + p0 + p] = A(mu[p]);
      }
      S* yn = y + n * a.c * a.hw + p0;
      for (int64_t c = 0; c < a.c; ++c) {
        const A wc = w ? w[c] : A(1);
        for (int64_t p = 0; p < pw; ++p) yn[c * a.hw + p] = from_acc<S>(to_acc(xn[c * a.hw + p]) * r[p] * wc);
      }
    }
  });
}

template <class S>
void backward_nchw(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* rstd, const acc_t<S>* mean, S* dx,
                   double* dw_part, const Args& a, const Geometry& g) {
  using A = acc_t<S>;
  at::parallel_for(0, g.n_tasks, grain(a, g), [&](int64_t t0, int64_t t1) {
    std::vector<double> dot(g.block);
    std::vector<A> coef(g.block);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t n = task / g.blocks_per_sample, p0 = (task % g.blocks_per_sample) * g.block;
      const int64_t pw = std::min(g.block, a.hw - p0), base = n * a.c * a.hw + p0;
      const A* r = rstd + n * a.hw + p0;
      std::fill(dot.begin(), dot.end(), 0.0);
      for (int64_t c = 0; c < a.c; ++c) {
        const A wc = w ? w[c] : A(1);
        const S* xc = x + base + c * a.hw;
        const S* dyc = dy + base + c * a.hw;
        double lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
        auto term = [&](int64_t p, int64_t k) {
          const A xh = to_acc(xc[p]) * r[p], d = to_acc(dyc[p]);
          dot[p] += double(d * wc) * double(xh);
          lane[k] += double(d) * double(xh);
        };
        int64_t j = 0;
        for (; j + kLanes <= pw; j += kLanes)
          for (int64_t k = 0; k < kLanes; ++k) term(j + k, k);
        for (int64_t k = 0; j + k < pw; ++k) term(j + k, k);
        if (dw_part) dw_part[task * a.c + c] = tree(lane);
      }
      if (!dx) continue;
      for (int64_t p = 0; p < pw; ++p) coef[p] = A(dot[p] / divisor(a));
      for (int64_t c = 0; c < a.c; ++c) {
        const A wc = w ? w[c] : A(1);
        const S* xc = x + base + c * a.hw;
        const S* dyc = dy + base + c * a.hw;
        S* dxc = dx + base + c * a.hw;
        for (int64_t p = 0; p < pw; ++p) {
          const A xv = to_acc(xc[p]), gv = to_acc(dyc[p]) * wc;
          const A centre = a.simple ? ((xv - to_acc(x[base + p])) - mean[n * a.hw + p0 + p]) * r[p] : xv * r[p];
          dxc[p] = from_acc<S>(r[p] * (gv - centre * coef[p]));
        }
      }
    }
  });
}

// -- NHWC ------------------------------------------------------------------------------------------

template <class S>
void forward_nhwc(const S* x, const acc_t<S>* w, S* y, acc_t<S>* rstd, acc_t<S>* mean, const Args& a,
                  const Geometry& g) {
  using A = acc_t<S>;
  at::parallel_for(0, g.n_tasks, grain(a, g), [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t n = task / g.blocks_per_sample, p0 = (task % g.blocks_per_sample) * g.block;
      const int64_t pw = std::min(g.block, a.hw - p0);
      for (int64_t p = 0; p < pw; ++p) {
        const int64_t pos = n * a.hw + p0 + p;
        const S* xr = x + pos * a.c;
        S* yr = y + pos * a.c;
        double mu = 0.0;
        const double x0 = a.simple ? double(to_acc(xr[0])) : 0.0;  // the shift: the first channel
        if (a.simple) {
          double lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int64_t c = 0; c < a.c; ++c) lane[c % kLanes] += double(to_acc(xr[c])) - x0;
          mu = tree(lane) / double(a.c);
        }
        double lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t c = 0; c < a.c; ++c) {
          const double d = (double(to_acc(xr[c])) - x0) - mu;
          lane[c % kLanes] += d * d;
        }
        const A r = A(1.0 / std::sqrt(tree(lane) / divisor(a) + a.eps));
        rstd[pos] = r;
        if (mean) mean[pos] = A(mu);
        for (int64_t c = 0; c < a.c; ++c) yr[c] = from_acc<S>(to_acc(xr[c]) * r * (w ? w[c] : A(1)));
      }
    }
  });
}

template <class S>
void backward_nhwc(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* rstd, const acc_t<S>* mean, S* dx,
                   double* dw_part, const Args& a, const Geometry& g) {
  using A = acc_t<S>;
  std::vector<A> wv(a.c, A(1));  // the weight (ones without one), read by every task
  if (w) std::copy(w, w + a.c, wv.begin());
  at::parallel_for(0, g.n_tasks, grain(a, g), [&](int64_t t0, int64_t t1) {
    std::vector<double> dwp(a.c);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t n = task / g.blocks_per_sample, p0 = (task % g.blocks_per_sample) * g.block;
      const int64_t pw = std::min(g.block, a.hw - p0);
      std::fill(dwp.begin(), dwp.end(), 0.0);
      for (int64_t p = 0; p < pw; ++p) {
        const int64_t pos = n * a.hw + p0 + p;
        const S* xr = x + pos * a.c;
        const S* dyr = dy + pos * a.c;
        const A r = rstd[pos];
        double lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
        auto term = [&](int64_t c, int64_t k) {
          const A xh = to_acc(xr[c]) * r, d = to_acc(dyr[c]);
          lane[k] += double(d * wv[c]) * double(xh);
          dwp[c] += double(d) * double(xh);
        };
        int64_t j = 0;
        for (; j + kLanes <= a.c; j += kLanes)
          for (int64_t k = 0; k < kLanes; ++k) term(j + k, k);
        for (int64_t k = 0; j + k < a.c; ++k) term(j + k, k);
        if (!dx) continue;
        const A coef = A(tree(lane) / divisor(a)), mu = a.simple ? mean[pos] : A(0), x0 = to_acc(xr[0]);
        S* dxr = dx + pos * a.c;
        for (int64_t c = 0; c < a.c; ++c) {
          const A xv = to_acc(xr[c]), gv = to_acc(dyr[c]) * wv[c];
          const A centre = a.simple ? ((xv - x0) - mu) * r : xv * r;
          dxr[c] = from_acc<S>(r * (gv - centre * coef));
        }
      }
      if (dw_part) std::copy(dwp.begin(), dwp.end(), dw_part + task * a.c);
    }
  });
}

}  // namespace

Geometry geometry(const Args& a) {
  if (a.n == 0 || a.hw == 0) return {1, 0, 0};
  const int64_t want = std::max(kMinBlock, (a.n * a.hw + kMaxTasks - 1) / kMaxTasks);
  const int64_t block = std::min(a.hw, want);
  const int64_t per = (a.hw + block - 1) / block;
  return {block, per, a.n * per};
}

template <class S>
void forward(const S* x, const acc_t<S>* w, S* y, acc_t<S>* rstd, acc_t<S>* mean, const Args& a, const Geometry& g) {
  if (a.channels_last) forward_nhwc<S>(x, w, y, rstd, mean, a, g);
  else forward_nchw<S>(x, w, y, rstd, mean, a, g);
}

template <class S>
void backward(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* rstd, const acc_t<S>* mean, S* dx,
              double* dw_part, const Args& a, const Geometry& g) {
  if (a.channels_last) backward_nhwc<S>(dy, x, w, rstd, mean, dx, dw_part, a, g);
  else backward_nchw<S>(dy, x, w, rstd, mean, dx, dw_part, a, g);
}

#define NORMLAB_SCALE_NORM_INSTANTIATE(S)                                                                    \
  template void forward<S>(const S*, const acc_t<S>*, S*, acc_t<S>*, acc_t<S>*, const Args&, const Geometry&); \
  template void backward<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*, double*, \
                            const Args&, const Geometry&);
NORMLAB_SCALE_NORM_INSTANTIATE(float)
NORMLAB_SCALE_NORM_INSTANTIATE(double)
NORMLAB_SCALE_NORM_INSTANTIATE(bf16)
NORMLAB_SCALE_NORM_INSTANTIATE(f16)
#undef NORMLAB_SCALE_NORM_INSTANTIATE

}  // namespace normlab::scale_norm
