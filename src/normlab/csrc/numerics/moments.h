// Statistics written once for every family: the two sums of the shifted two-pass moments of a row
// -- docs/derivations/layer_norm.md, "Statistics".
//
// Shifted two passes: with shift = x[0] and d = x - shift,
//   mean = shift + sum(d) / n,   M2 = sum((d - mean_d)^2),   var = M2 / n (biased).
// A row whose mean is large against its spread keeps its digits (no E[x^2] - E[x]^2), and a
// constant row has M2 = 0 exactly. Sums run in vectors of the accumulation type, lanes added
// by hsum in a fixed tree, then the scalar tail: one order for every run.
#pragma once

#include <cstdint>

#include "vec.h"

namespace normlab {

// sum_j (x[j] - shift) over n values of storage S, in the accumulation type.
template <class S> inline acc_t<S> shifted_sum(const S* x, int64_t n, acc_t<S> shift) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> s0 = vzero<A>(), s1 = vzero<A>(), vs = vset1<A>(shift);
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {  // two chains: the adds of one overlap the other's
    s0 += vload(x + j) - vs;
    s1 += vload(x + j + L) - vs;
  }
  if (j + L <= n) { s0 += vload(x + j) - vs; j += L; }
  A s = hsum<A>(s0 + s1);
  for (; j < n; ++j) s += to_acc(x[j]) - shift;
  return s;
}

// shifted_sum, and the differences themselves kept: d[j] = x[j] - shift (accumulation type) for
// the later passes to read instead of converting x again. The same additions in the same order.
template <class S> inline acc_t<S> shifted_sum_into(const S* x, acc_t<S>* d, int64_t n, acc_t<S> shift) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> s0 = vzero<A>(), s1 = vzero<A>(), vs = vset1<A>(shift);
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    const vec<A> a = vload(x + j) - vs, b = vload(x + j + L) - vs;
    vstore(d + j, a);
    vstore(d + j + L, b);
    s0 += a;
    s1 += b;
  }
  if (j + L <= n) {
    const vec<A> a = vload(x + j) - vs;
    vstore(d + j, a);
    s0 += a;
    j += L;
  }
  A s = hsum<A>(s0 + s1);
  for (; j < n; ++j) {
    const A a = to_acc(x[j]) - shift;
    d[j] = a;
    s += a;
  }
  return s;
}

// sum_j ((x[j] - shift) - m)^2 over n values: the second pass, m the mean of the differences.
template <class S> inline acc_t<S> shifted_sqdev(const S* x, int64_t n, acc_t<S> shift, acc_t<S> m) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> s0 = vzero<A>(), s1 = vzero<A>(), vs = vset1<A>(shift), vm = vset1<A>(m);
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    vec<A> e = (vload(x + j) - vs) - vm;
    vec<A> f = (vload(x + j + L) - vs) - vm;
    s0 += e * e;
    s1 += f * f;
  }
  if (j + L <= n) { vec<A> e = (vload(x + j) - vs) - vm; s0 += e * e; j += L; }
  A s = hsum<A>(s0 + s1);
  for (; j < n; ++j) { A e = (to_acc(x[j]) - shift) - m; s += e * e; }
  return s;
}

// A running (count, mean, M2) in float64, partials merged by Chan's formula in the order given
// (partial a, then b):  delta = mean_b - mean_a,  mean += delta * n_b / n,
// M2 += M2_b + delta^2 * n_a * n_b / n. Reductions that span many pieces or parts merge
// fixed-boundary partials with it, so the result does not depend on the thread count.
struct Moments {
  double n = 0.0, mean = 0.0, m2 = 0.0;
  void merge(double k, double m, double q) {
    if (n == 0.0) { n = k; mean = m; m2 = q; return; }
    const double t = n + k, delta = m - mean;
    mean += delta * (k / t);
    m2 += q + delta * delta * (n * k / t);
    n = t;
  }
};

}  // namespace normlab
