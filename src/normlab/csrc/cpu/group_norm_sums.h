// The group_norm kernels' own helpers (both layouts): the backward's pair of sums, the output's
// affine run, torch's mean for a group holding infinities, and the in-order merge of dw/db partials.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "numerics/activation.h"
#include "numerics/chunks.h"
#include "numerics/relu_bound.h"
#include "numerics/stream.h"
#include "numerics/vec.h"

namespace normlab::group_norm {

// q / count rounded once to A: the quotient in float64 (for float, the same bits as a float division
// whenever the count is exact in float).
template <class A> inline A over_count(A q, int64_t count) { return A(double(q) / double(count)); }

// (sum dy, sum dy * (x - m)) over n values, in A; both from zero (not m - m: an infinite m must not
// turn the sum of dy NaN). Two vector chains each, lanes added by hsum, then the scalar tail.
template <class S> inline std::pair<acc_t<S>, acc_t<S>> grad_sums(const S* dy, const S* x, int64_t n, acc_t<S> m) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> a0 = vzero<A>(), a1 = vzero<A>(), b0 = vzero<A>(), b1 = vzero<A>(), vm = vset1<A>(m);
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    vec<A> g0 = vload(dy + j), g1 = vload(dy + j + L);
    a0 += g0;
    a1 += g1;
    b0 += g0 * (vload(x + j) - vm);
    b1 += g1 * (vload(x + j + L) - vm);
  }
  if (j + L <= n) {
    vec<A> g0 = vload(dy + j);
    a0 += g0;
    b0 += g0 * (vload(x + j) - vm);
    j += L;
  }
  A s1 = hsum<A>(a0 + a1), s2 = hsum<A>(b0 + b1);
  for (; j < n; ++j) {
    A g = to_acc(dy[j]);
    s1 += g;
    s2 += g * (to_acc(x[j]) - m);
  }
  return {s1, s2};
}

// grad_sums and, third, sum (x - m): with m the group's mean rounded to A, mean(x - m) over the
// group is what that rounding left out (up to ulp(m) / 2: 5e-4 at a mean of 1e4), which the
// backward adds back (group_norm_kernels.cpp, bwd_rows). The first two sums as grad_sums's.
// R (GroupNormAct, relu): dy read as relu's dz, +0 where x * sg <= tt (numerics/relu_bound.h,
// relu_masked; sg, tt the channel's relu_sign_bound).
template <class S> struct GradSums3 { acc_t<S> dy, dyx, x; };
template <class S, bool R = false>
inline GradSums3<S> grad_sums3(const S* dy, const S* x, int64_t n, acc_t<S> m, acc_t<S> sg = 0, acc_t<S> tt = 0) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> a0 = vzero<A>(), a1 = vzero<A>(), b0 = vzero<A>(), b1 = vzero<A>(), c0 = vzero<A>(), c1 = vzero<A>();
  const vec<A> vm = vset1<A>(m), vs = vset1<A>(sg), vt = vset1<A>(tt);
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    const vec<A> x0 = vload(x + j), x1 = vload(x + j + L);
    const vec<A> g0 = act::relu_masked<R>(vload(dy + j), x0, vs, vt), g1 = act::relu_masked<R>(vload(dy + j + L), x1, vs, vt);
    const vec<A> d0 = x0 - vm, d1 = x1 - vm;
    a0 += g0;
    a1 += g1;
    b0 += g0 * d0;
    b1 += g1 * d1;
    c0 += d0;
    c1 += d1;
  }
  if (j + L <= n) {
    const vec<A> x0 = vload(x + j), g0 = act::relu_masked<R>(vload(dy + j), x0, vs, vt);
    const vec<A> d0 = x0 - vm;
    a0 += g0;
    b0 += g0 * d0;
    c0 += d0;
    j += L;
  }
  A s1 = hsum<A>(a0 + a1), s2 = hsum<A>(b0 + b1), s3 = hsum<A>(c0 + c1);
  for (; j < n; ++j) {
    const A xs = to_acc(x[j]);
    A g = act::relu_masked<R>(to_acc(dy[j]), xs, sg, tt), d = xs - m;
    s1 += g;
    s2 += g * d;
    s3 += d;
  }
  return {s1, s2, s3};
}

// The output's activation (GroupNormAct: cpu/norm_act_kernels.h): act::apply_stored -- z rounded
// to the storage type S first where act::kRoundsZ says, so that the fused output has the bits of
// GroupNorm followed by the activation on its output. Act = kIdentity: z.
// NoNaN: z cannot be NaN (the bfloat16 passes that skip the store's NaN test), so relu may take
// act::apply_nan_free's one max (relu and the identity are not rounded first: act::kRoundsZ).
template <class S, int Act, bool NoNaN = false> inline vacc<S> out_act(vacc<S> z, acc_t<S> p) {
  if constexpr (act::kRoundsZ<Act, S>) return act::apply_stored<Act, S>(z, p);
  else return act::apply_nan_free<Act, S, NoNaN>(z, p);
}
template <class S, int Act> inline S out_act1(acc_t<S> z, acc_t<S> p) {
  if constexpr (Act == act::kIdentity) return from_acc<S>(z);
  else if constexpr (act::kRoundsZ<Act, S>) return from_acc<S>(act::apply<Act, S>(vset1<acc_t<S>>(to_acc(from_acc<S>(z))), p)[0]);
  else return from_acc<S>(act::apply<Act, S>(vset1<acc_t<S>>(z), p)[0]);
}

// y = act(y) over n values in place, on the calling thread (a row in cache: one loop, the
// activation's constants set up once rather than once a short channel run).
template <class S, int Act> inline void act_row(S* y, int64_t n, acc_t<S> p) {
  constexpr int64_t L = vlanes<S>;
  int64_t j = 0;
  for (; j + L <= n; j += L) vstore(y + j, act::apply<Act, S>(vload(y + j), p));
  if (j < n) vstore_n(y + j, act::apply<Act, S>(vload_n(y + j, n - j), p), n - j);
}

// y = act(y) over n values in place (the output paths that write y before the activation can join).
template <class S, int Act> inline void act_in_place(S* y, int64_t n, acc_t<S> p) {
  constexpr int64_t L = vlanes<S>, kBlock = 4096;
  for_rows((n + kBlock - 1) / kBlock, kBlock, [&](int64_t b0, int64_t b1) {
    const int64_t e = std::min(n, b1 * kBlock);
    int64_t j = b0 * kBlock;
    for (; j + L <= e; j += L) vstore(y + j, act::apply<Act, S>(vload(y + j), p));
    for (; j < e; ++j) y[j] = out_act1<S, Act>(to_acc(y[j]), p);
  });
}

// y[j] = act(((x[j] - shift) - md) * a + bc) over a contiguous run of n values (one channel).
// Stream: y written around the caches (numerics/stream.h) in whole cache lines (whole_lines); the
// values before them stored plainly as partial vectors (vstore_n: the same arithmetic lane by
// lane, the same bits), those after them plainly as the tail of the unstreamed loop.
// bfloat16 goes two vectors at a time, even and odd values apart (vec.h vload_eo / vstore_eo), and
// leaves the store's NaN test out where no output can be NaN: stats_of_x (shift + md is the mean
// of a group holding the run's values), an activation that keeps NaN-free values NaN-free
// (act::keeps_nan_free: none, relu, leaky_relu), the constants nan_free_affine (vec.h).
// (Running statistics say nothing of x: a NaN of x would keep its own bits, where torch stores
// 0x7FC0.)
template <class S, bool Stream = false, int Act = act::kIdentity>
inline void affine_run(const S* x, S* y, int64_t n, acc_t<S> shift, acc_t<S> md, acc_t<S> a, acc_t<S> bc,
                       acc_t<S> p = acc_t<S>(0), bool stats_of_x = false) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> vs = vset1<A>(shift), vm = vset1<A>(md), va = vset1<A>(a), vb = vset1<A>(bc);
  auto f = [&](vec<A> v) { return out_act<S, Act>(((v - vs) - vm) * va + vb, p); };
  auto part = [&](int64_t j, int64_t m) { vstore_n(y + j, f(vload_n(x + j, m)), m); };
  int64_t j = 0;
  if constexpr (std::is_same_v<S, bf16>) {
    const bool no_nan = stats_of_x && act::keeps_nan_free<Act>(p) && nan_free_affine(a, shift, md, bc);
    auto pairs = [&]<bool NoNaN>() {  // (whole lines are whole pairs: 64 bytes is 2, 1 or 4 pairs)
      auto fp = [&](vec<A> v) { return out_act<S, Act, NoNaN>(((v - vs) - vm) * va + vb, p); };
      if constexpr (Stream) {
        const auto [k, e] = whole_lines(y, n);
        for (; j < k; j += L) part(j, std::min(L, k - j));
        for (j = k; j < e; j += 2 * L) {
          vec<A> ve, vo;
          vload_eo(x + j, ve, vo);
          vstream_eo<NoNaN>(y + j, fp(ve), fp(vo));
        }
      }
      j += eo_map<NoNaN>(x + j, y + j, n - j, fp);
    };
    if (no_nan) pairs.template operator()<true>();
    else pairs.template operator()<false>();
  } else if constexpr (Stream) {
    const auto [k, e] = whole_lines(y, n);
    for (; j < k; j += L) part(j, std::min(L, k - j));
    for (j = k; j < e; j += L) vstream(y + j, f(vload(x + j)));
  }
  for (; j + L <= n; j += L) vstore(y + j, f(vload(x + j)));
  if constexpr (Act == act::kIdentity) {  // value by value (measured: as a partial vector, half
                                          // InstanceNorm3d(384) 2x384x15x17x17 ran ~8 % slower)
    for (; j < n; ++j) y[j] = out_act1<S, Act>(((to_acc(x[j]) - shift) - md) * a + bc, p);
    return;
  }
  if (j < n) part(j, n - j);  // one partial vector (one activation, not one a value)
}

// affine_run over a group row of n values, channels of ns >= the lanes values back to back,
// channel j's constants a[j], bc[j], streamed as one run (stream.h, streamed_runs): where each
// channel's run alone is not worth streaming (streams_runs: runs off whole lines, the 196 values
// of a 14x14 plane) or is, the row is. Each value's arithmetic is affine_run's: the same bits.
template <class S, int Act>
inline void affine_row_streamed(const S* x, S* y, int64_t n, int64_t ns, acc_t<S> shift, acc_t<S> md, const acc_t<S>* a,
                                const acc_t<S>* bc, acc_t<S> p) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const vec<A> vs = vset1<A>(shift), vm = vset1<A>(md);
  streamed_runs(y, n, ns, [&](int64_t j) {
    return [x, p, vs, vm, va = vset1<A>(a[j]), vb = vset1<A>(bc[j])](int64_t i, int64_t m) {
      const vec<A> d = ((m == L ? vload(x + i) : vload_n(x + i, m)) - vs) - vm;
      return out_act<S, Act>(d * va + vb, p);
    };
  });
}

// GroupNormAct's relu backward: the bound (sg[q], tt[q]) of each of nc (sample, channel) pairs of
// z's constants hi, a, b (float64, each rounded once to A as nact's passes round them;
// numerics/relu_bound.h), the searches (a few evaluations of z each) over the threads. False where
// one has no bound (the caller then writes dz first).
template <class A>
inline bool relu_bounds(const double* hi, const double* a, const double* b, int64_t nc, A* sg, A* tt) {
  std::atomic<bool> bounds{true};
  for_rows(nc, 64, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1 && bounds.load(std::memory_order_relaxed); ++q)
      if (!act::relu_sign_bound(A(hi[q]), A(a[q]), A(b[q]), sg + q, tt + q)) bounds.store(false, std::memory_order_relaxed);
  });
  return bounds.load();
}

// The NaNs and infinities among `runs` runs of `len` values `stride` apart, as a mask.
constexpr int kHasNan = 1, kHasPosInf = 2, kHasNegInf = 4;
template <class S> inline int inf_mask(const S* x, int64_t runs, int64_t stride, int64_t len) {
  int mask = 0;
  for (int64_t r = 0; r < runs; ++r)
    for (int64_t j = 0; j < len; ++j) {
      acc_t<S> v = to_acc(x[r * stride + j]);
      if (v != v) mask |= kHasNan;
      else if (v == std::numeric_limits<acc_t<S>>::infinity()) mask |= kHasPosInf;
      else if (v == -std::numeric_limits<acc_t<S>>::infinity()) mask |= kHasNegInf;
    }
  return mask;
}

// The (NaN) shifted mean as torch's sum / count gives it: +-inf for infinities of one sign, no NaN.
template <class A> inline A torch_mean(A m, int mask) {
  if (mask == kHasPosInf) return std::numeric_limits<A>::infinity();
  if (mask == kHasNegInf) return -std::numeric_limits<A>::infinity();
  return m;
}

// dw[c], db[c]: the columns of the partials pw, pb (rows, C) summed over the rows in row order, in
// float64, rounded once to A -- the same order whatever task merges a column.
template <class A>
inline void merge_partials(const A* pw, const A* pb, int64_t rows, int64_t c, A* dw, A* db) {
  for_rows(c, 2 * rows, [&](int64_t c0, int64_t c1) {
    std::vector<double> sw(c1 - c0, 0.0), sb(c1 - c0, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const A* qw = pw + r * c + c0;
      const A* qb = pb + r * c + c0;
      for (int64_t j = 0; j < c1 - c0; ++j) {
        sw[j] += double(qw[j]);
        sb[j] += double(qb[j]);
      }
    }
    for (int64_t j = 0; j < c1 - c0; ++j) {
      dw[c0 + j] = A(sw[j]);
      db[c0 + j] = A(sb[j]);
    }
  });
}

}  // namespace normlab::group_norm
