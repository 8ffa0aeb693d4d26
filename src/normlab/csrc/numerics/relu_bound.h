// relu's derivative as a bound on x (BatchNormAct2d's and GroupNormAct's backward: relu's dz is dy
// where z > 0 or z is NaN, +0 where z <= 0, read where dy is read instead of written first).
// z = (x - h) * a + b, three operations each rounded once in the accumulation type A (no fused
// multiply-add: the kernels build with -ffp-contract=off), each monotone in x; so with h, a, b
// finite and a != 0, "z <= 0" holds exactly for x <= t (a > 0) or x >= t (a < 0), t one value of
// A. relu_kind finds t by a search over A's values in order, started from the float64 root
// h - b / a (a few evaluations of z) and returns 1 (zero where x <= t) or 2 (where x >= t); 3
// where the constants do not allow it (the caller then computes z). A NaN x (z NaN) fails both
// compares and keeps dy, as z's test does.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace normlab::act {

template <class A> int relu_kind(A h, A a, A b, A* t) {
  using U = std::conditional_t<sizeof(A) == 4, uint32_t, uint64_t>;
  constexpr U sign = U(1) << (8 * sizeof(A) - 1);
  if (!std::isfinite(h) || !std::isfinite(a) || !std::isfinite(b) || a == A(0)) return 3;
  auto key = [&](A v) { U u; std::memcpy(&u, &v, sizeof u); return (u & sign) ? U(~u) : U(u | sign); };
  auto val = [&](U k) { const U u = (k & sign) ? U(k & ~sign) : U(~k); A v; std::memcpy(&v, &u, sizeof v); return v; };
  auto nonpos = [&](U k) { volatile A v = val(k); return (v - h) * a + b <= A(0); };  // (volatile: as the vectors do)
  // a > 0: nonpos holds at -inf and fails at +inf, t the last value where it holds; a < 0: the
  // reverse. "in" = nonpos == up: true at lo, false at hi; the bracket grown from the root's key
  // by doubling steps, then halved
  const bool up = a > A(0);
  const U k_lo = key(-std::numeric_limits<A>::infinity()), k_hi = key(std::numeric_limits<A>::infinity());
  U lo = k_lo, hi = k_hi;
  const double root = double(h) - double(b) / double(a);
  if (std::isfinite(root) && std::fabs(root) <= double(std::numeric_limits<A>::max())) {
    const U k0 = key(A(root));
    if (nonpos(k0) == up) {
      lo = k0;
      for (U step = 1; ; step *= 2) {
        if (k_hi - lo <= step) break;
        if (nonpos(lo + step) != up) { hi = lo + step; break; }
        lo += step;
      }
    } else {
      hi = k0;
      for (U step = 1; ; step *= 2) {
        if (hi - k_lo <= step) break;
        if (nonpos(hi - step) == up) { lo = hi - step; break; }
        hi -= step;
      }
    }
  }
  while (hi - lo > 1) {
    const U mid = lo + (hi - lo) / 2;
    if (nonpos(mid) == up) lo = mid; else hi = mid;
  }
  *t = val(up ? lo : hi);
  return up ? 1 : 2;
}

// Kinds 1 and 2 as one form for per-column or per-channel constants: "z <= 0" is x * sg <= tt
// (sg = +1 or -1, tt = t or -t: the product exact). False where relu_kind says 3 (no bound).
template <class A> bool relu_sign_bound(A h, A a, A b, A* sg, A* tt) {
  A t;
  const int kind = relu_kind(h, a, b, &t);
  *sg = kind == 1 ? A(1) : A(-1);
  *tt = kind == 1 ? t : -t;
  return kind != 3;
}

// dy read as relu's dz in that form: +0 where x * sg <= tt, else dy (a NaN x keeps dy). V: a vector
// of the accumulation type (GCC's vector extension: the compare and select lane by lane) or A.
template <bool R, class V> [[gnu::always_inline]] inline V relu_masked(V g, V xv, V sg, V tt) {
  if constexpr (R) return xv * sg <= tt ? V{} : g;
  else return g;
}

}  // namespace normlab::act
