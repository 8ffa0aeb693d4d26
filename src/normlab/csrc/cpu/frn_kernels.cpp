// FRN's kernels (frn_kernels.h): docs/derivations/frn.md.
//
// Loop order and blocking, from the shape alone:
// - NCHW: one (sample, channel) is a contiguous run of S values; tasks are runs of whole
//   (sample, channel) rows, each row's sums taken by one thread in index order in 8 float64
//   lanes, added in a fixed tree.
// - NHWC: tasks are (sample, block of kChanBlock channels); each channel's sums run over the S
//   positions in order in float64, one lane per channel.
// Every sum is one thread's, in an order fixed by the shape, so the results are the same bits
// for any number of threads; the caller merges the (sample, channel) partials over samples in
// order.
//
// Backward, with the TLU's share m = [z > tau] + [z == tau] / 2 (1 without tau), dz = dy * m:
//   A = sum_S(dz * xhat),  B = sum_S(dz),  T = sum_S(dy - dz)
//   dx = r * (dz * w - xhat * (w * A / S))
#include "cpu/frn_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace normlab::frn {

namespace {

constexpr int64_t kLanes = 8;
constexpr int64_t kChanBlock = 256;
constexpr int64_t kGrainValues = 1 << 15;  // values per task, about

inline double tree(const double* v) {  // the 8 lanes, in a fixed tree
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

template <class A> inline A share(A z, A t) {  // torch.maximum's split of the gradient, without branches
  return A(z > t) + A(z == t) * A(0.5);
}

int64_t grain_rows(int64_t s) { return std::max<int64_t>(1, kGrainValues / std::max<int64_t>(s, 1)); }

// -- NCHW ------------------------------------------------------------------------------------------

template <class S>
void forward_nchw(const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* tau, S* y, acc_t<S>* rstd,
                  const Args& a) {
  using A = acc_t<S>;
  const int64_t s = a.s;
  at::parallel_for(0, a.n * a.c, grain_rows(s), [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const S* xr = x + row * s;
      S* yr = y + row * s;
      const int64_t ch = row % a.c;
      double lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t j = 0;
      for (; j + kLanes <= s; j += kLanes)
        for (int64_t k = 0; k < kLanes; ++k) {
          const double v = double(to_acc(xr[j + k]));
          lane[k] += v * v;
        }
      for (int64_t k = 0; j + k < s; ++k) {
        const double v = double(to_acc(xr[j + k]));
        lane[k] += v * v;
      }
      const A r = A(1.0 / std::sqrt(tree(lane) / double(s) + a.eps));
      rstd[row] = r;
      const A wc = w ? w[ch] : A(1);
      for (int64_t i = 0; i < s; ++i) {
        A z = to_acc(xr[i]) * r * wc;
        if (b) z = z + b[ch];  // no bias: nothing added (a -0 stays -0, as the reference)
        if (tau) z = z > tau[ch] || z != z ? z : tau[ch];  // torch.maximum: NaN propagates
        yr[i] = from_acc<S>(z);
      }
    }
  });
}

template <class S>
void backward_nchw(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* tau,
                   const acc_t<S>* rstd, S* dx, double* dw_part, double* db_part, double* dtau_part, const Args& a) {
  using A = acc_t<S>;
  const int64_t s = a.s;
  at::parallel_for(0, a.n * a.c, grain_rows(s), [&](int64_t r0, int64_t r1) {
    std::vector<A> dz(s);
    for (int64_t row = r0; row < r1; ++row) {
      const S* xr = x + row * s;
      const S* dyr = dy + row * s;
      const int64_t ch = row % a.c;
      const A r = rstd[row], wc = w ? w[ch] : A(1), bc = b ? b[ch] : A(0);
      double la[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0}, lb[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0},
             lt[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
      const A t = tau ? tau[ch] : A(0);
      auto term = [&](int64_t i, int64_t k) {
        const A xh = to_acc(xr[i]) * r, d = to_acc(dyr[i]);
        const A g = tau ? d * share<A>(xh * wc + bc, t) : d;
        dz[i] = g;
        la[k] += double(g) * double(xh);
        lb[k] += double(g);
        lt[k] += double(d) - double(g);
      };
      int64_t j = 0;
      for (; j + kLanes <= s; j += kLanes)
        for (int64_t k = 0; k < kLanes; ++k) term(j + k, k);
      for (int64_t k = 0; j + k < s; ++k) term(j + k, k);
      const double sa = tree(la);
      if (dw_part) dw_part[row] = sa;
      if (db_part) db_part[row] = tree(lb);
      if (dtau_part) dtau_part[row] = tree(lt);
      if (dx) {
        const A coef = A(double(wc) * sa / double(s));
        S* dxr = dx + row * s;
        for (int64_t i = 0; i < s; ++i) {
          const A xh = to_acc(xr[i]) * r;
          dxr[i] = from_acc<S>(r * (dz[i] * wc - xh * coef));
        }
      }
    }
  });
}

// -- NHWC ------------------------------------------------------------------------------------------

struct Blocks {
  int64_t width, per_sample;
};
Blocks blocks(int64_t c) {
  const int64_t width = std::min<int64_t>(c, kChanBlock);
  return {width, (c + width - 1) / width};
}

template <class S>
void forward_nhwc(const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* tau, S* y, acc_t<S>* rstd,
                  const Args& a) {
  using A = acc_t<S>;
  const Blocks bl = blocks(a.c);
  at::parallel_for(0, a.n * bl.per_sample, grain_rows(a.s * bl.width), [&](int64_t t0, int64_t t1) {
    std::vector<double> sq(bl.width);
    std::vector<A> rw(bl.width), bb(bl.width), tt(bl.width);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t n = task / bl.per_sample, c0 = (task % bl.per_sample) * bl.width;
      const int64_t cw = std::min(bl.width, a.c - c0);
      const S* xn = x + n * a.s * a.c + c0;
      S* yn = y + n * a.s * a.c + c0;
      std::fill(sq.begin(), sq.end(), 0.0);
      for (int64_t p = 0; p < a.s; ++p) {
        const S* xp = xn + p * a.c;
        for (int64_t k = 0; k < cw; ++k) {
          const double v = double(to_acc(xp[k]));
          sq[k] += v * v;
        }
      }
      for (int64_t k = 0; k < cw; ++k) {
        const A r = A(1.0 / std::sqrt(sq[k] / double(a.s) + a.eps));
        rstd[n * a.c + c0 + k] = r;
        rw[k] = r;
      }
      for (int64_t p = 0; p < a.s; ++p) {
        const S* xp = xn + p * a.c;
        S* yp = yn + p * a.c;
        for (int64_t k = 0; k < cw; ++k) {
          const int64_t ch = c0 + k;
          A z = to_acc(xp[k]) * rw[k] * (w ? w[ch] : A(1));
          if (b) z = z + b[ch];
          if (tau) z = z > tau[ch] || z != z ? z : tau[ch];
          yp[k] = from_acc<S>(z);
        }
      }
    }
  });
}

template <class S>
void backward_nhwc(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* tau,
                   const acc_t<S>* rstd, S* dx, double* dw_part, double* db_part, double* dtau_part, const Args& a) {
  using A = acc_t<S>;
  const Blocks bl = blocks(a.c);
  const bool has_tau = tau != nullptr;
  at::parallel_for(0, a.n * bl.per_sample, grain_rows(a.s * bl.width), [&](int64_t t0, int64_t t1) {
    std::vector<double> sa(bl.width), sb(bl.width), st(bl.width);
    std::vector<A> coef(bl.width), wv(bl.width), bv(bl.width), tv(bl.width), rv(bl.width);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t n = task / bl.per_sample, c0 = (task % bl.per_sample) * bl.width;
      const int64_t cw = std::min(bl.width, a.c - c0), base = n * a.s * a.c + c0;
      for (int64_t k = 0; k < cw; ++k) {  // this task's channels' parameters, hoisted
        wv[k] = w ? w[c0 + k] : A(1);
        bv[k] = b ? b[c0 + k] : A(0);
        tv[k] = has_tau ? tau[c0 + k] : A(0);
        rv[k] = rstd[n * a.c + c0 + k];
      }
      std::fill(sa.begin(), sa.end(), 0.0);
      std::fill(sb.begin(), sb.end(), 0.0);
      std::fill(st.begin(), st.end(), 0.0);
      for (int64_t p = 0; p < a.s; ++p) {
        const S* xp = x + base + p * a.c;
        const S* dyp = dy + base + p * a.c;
        for (int64_t k = 0; k < cw; ++k) {
          const A xh = to_acc(xp[k]) * rv[k], d = to_acc(dyp[k]);
          const A g = has_tau ? d * share<A>(xh * wv[k] + bv[k], tv[k]) : d;
          sa[k] += double(g) * double(xh);
          sb[k] += double(g);
          st[k] += double(d) - double(g);
        }
      }
      for (int64_t k = 0; k < cw; ++k) {
        const int64_t i = n * a.c + c0 + k;
        if (dw_part) dw_part[i] = sa[k];
        if (db_part) db_part[i] = sb[k];
        if (dtau_part) dtau_part[i] = st[k];
        coef[k] = A(double(wv[k]) * sa[k] / double(a.s));
      }
      if (!dx) continue;
      for (int64_t p = 0; p < a.s; ++p) {
        const S* xp = x + base + p * a.c;
        const S* dyp = dy + base + p * a.c;
        S* dxp = dx + base + p * a.c;
        for (int64_t k = 0; k < cw; ++k) {
          const A xh = to_acc(xp[k]) * rv[k], d = to_acc(dyp[k]);
          const A g = has_tau ? d * share<A>(xh * wv[k] + bv[k], tv[k]) : d;
          dxp[k] = from_acc<S>(rv[k] * (g * wv[k] - xh * coef[k]));
        }
      }
    }
  });
}

}  // namespace

template <class S>
void forward(const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* tau, S* y, acc_t<S>* rstd,
             const Args& a) {
  if (a.channels_last) forward_nhwc<S>(x, w, b, tau, y, rstd, a);
  else forward_nchw<S>(x, w, b, tau, y, rstd, a);
}

template <class S>
void backward(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* tau,
              const acc_t<S>* rstd, S* dx, double* dw_part, double* db_part, double* dtau_part, const Args& a) {
  if (a.channels_last) backward_nhwc<S>(dy, x, w, b, tau, rstd, dx, dw_part, db_part, dtau_part, a);
  else backward_nchw<S>(dy, x, w, b, tau, rstd, dx, dw_part, db_part, dtau_part, a);
}

#define NORMLAB_FRN_INSTANTIATE(S)                                                                           \
  template void forward<S>(const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*, acc_t<S>*,        \
                           const Args&);                                                                     \
  template void backward<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*,            \
                            const acc_t<S>*, S*, double*, double*, double*, const Args&);
NORMLAB_FRN_INSTANTIATE(float)
NORMLAB_FRN_INSTANTIATE(double)
NORMLAB_FRN_INSTANTIATE(bf16)
NORMLAB_FRN_INSTANTIATE(f16)
#undef NORMLAB_FRN_INSTANTIATE

}  // namespace normlab::frn
