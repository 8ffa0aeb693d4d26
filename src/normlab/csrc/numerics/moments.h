// Statistics written once for every family: the shifted two-pass moments of a row, and Chan's
// merge of partial (count, mean, M2) -- docs/derivations/layer_norm.md, "Statistics".
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

template <class A> struct Moments {
  A mean;  // of the values
  A m2;    // sum of squared deviations from the mean
};

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

// The moments of one contiguous row of n > 0 values by the shifted two passes.
template <class S> inline Moments<acc_t<S>> row_moments(const S* x, int64_t n) {
  using A = acc_t<S>;
  A shift = to_acc(x[0]);
  A md = shifted_sum(x, n, shift) / A(n);  // mean of the differences
  return {shift + md, shifted_sqdev(x, n, shift, md)};
}

// Chan et al.'s merge of two partial moments with counts na, nb: exact in exact arithmetic,
// and stable (no difference of large sums). Counts of zero pass the other side through.
template <class A> inline Moments<A> chan_merge(Moments<A> a, A na, Moments<A> b, A nb) {
  if (na == 0) return b;
  if (nb == 0) return a;
  A n = na + nb;
  A delta = b.mean - a.mean;
  return {a.mean + delta * (nb / n), a.m2 + b.m2 + delta * delta * (na * nb / n)};
}

}  // namespace normlab
