// The activations of the norm+act kernels (cpu/norm_act_kernels.cpp), on vectors of the
// accumulation type: act(z) and act'(z) (docs/derivations/norm_act.md; the Python twin and the
// table of formulas: normlab/ops/activation.py). The ids are ops/activation.py's.
//
// Formulas, as torch's CPU kernels write them where the bits can follow:
//   relu       z <= 0 ? 0 : z (NaN stays NaN)          act' = z > 0
//   leaky_relu z > 0 ? z : z * slope                    act' = z > 0 ? 1 : slope
//   hardswish  z * min(max(z + 3, 0), 6) / 6            act' = 0 (z < -3), z / 3 + 0.5 (z <= 3), 1
//   silu       z / (1 + exp(-z))                        act' = s * (1 + z * (1 - s)), s = 1 / (1 + exp(-z))
//   tanh       tanh(z)                                  act' = 1 - tanh(z)^2
//   gelu       z * 0.5 * (1 + erf(z / sqrt 2))          act' = Phi(z) + z * exp(-z^2 / 2) / sqrt(2 pi)
//   gelu_tanh  0.5 z (1 + tanh(k (z + 0.044715 z^3)))   act' as ops/activation.py
// The first three are exact (the same bits as torch's). The float32 transcendental functions are
// numerics/vmath.h's (one copy, shared with DyT): exp (silu, gelu's derivative: vexp_table, a table
// of 2^(j/16) on AVX-512, vexp elsewhere), tanh (tanh,
// gelu_tanh; tanh's derivative as vmath's 1 - tanh^2, without the cancellation near |t| = 1),
// erf (gelu); the float64 ones are the C library's, lane by lane. apply<Act, S> and grad<Act, S>
// take the stored element type S: silu, whose result is stored as bf16 or f16, is computed on
// AVX-512 only to that type's precision (a degree-1 or -2 exp by the same table, vrcp14ps without
// a Newton step: detail::sigmoid_low); float32 and float64 results are unchanged.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "numerics/vec.h"
#include "numerics/vmath.h"

namespace normlab::act {

enum Id : int { kIdentity = 0, kRelu, kLeakyRelu, kSilu, kGelu, kGeluTanh, kHardswish, kTanh, kCount };

namespace detail {
using vmath::vexp;
inline vec<float> vtanh(vec<float> u) { return vmath::vtanh<false>(u); }

template <class A, class F> inline vec<A> lanewise(vec<A> z, const F& f) {
  vec<A> r;
  for (int64_t i = 0; i < lanes<A>; ++i) r[i] = f(z[i]);
  return r;
}

// silu at the stored type's precision: S = bf16 or f16 on AVX-512 (vmath::vexp_neg_abs_low).
template <class S> inline constexpr bool kLow = NORMLAB_VMATH_LOW_EXP && sizeof(S) == 2;
#if NORMLAB_VMATH_LOW_EXP
// sigma(z) = 1 / (1 + exp(-z)) without overflow: e = exp(-|z|) in [0, 1], q = 1 / (1 + e) by vrcp14ps
// alone (1 + e in [1, 2]); sigma = q where z > 0, e q where not, 1 - sigma the other one. The
// mask: the lanes where z <= 0. Relative error of q and e q: under
// 2^-13.9 (rcp14) plus 2^-12.1 (bf16: expm1 of degree 1) or 2^-19 (f16: degree 2), against the
// stored result's half unit in the last place, 2^-9 (bf16) and 2^-12 (f16) relative at the least
// (docs/derivations/norm_act.md, "SiLU at the stored precision"). A NaN z: q, e q of -110's, and
// the caller's product with z is NaN.
template <class S> inline __mmask16 sigmoid_low(vec<float> z, vec<float>* q, vec<float>* eq) {
  const vec<float> e = vmath::vexp_neg_abs_low<std::is_same_v<S, bf16> ? 1 : 2>(z);
  *q = vmath::vrcp14(e + 1.0f);
  *eq = e * *q;
  return _mm512_cmp_ps_mask((__m512)z, _mm512_setzero_ps(), _CMP_LE_OQ);
}
// silu(z) = z sigma(z)
template <class S> inline vec<float> silu_low(vec<float> z) {
  vec<float> q, eq;
  const __mmask16 neg = sigmoid_low<S>(z, &q, &eq);
  return z * (vec<float>)_mm512_mask_mov_ps((__m512)q, neg, (__m512)eq);
}
// silu'(z) = s + s z (1 - s), s = sigma(z) (one fused step)
template <class S> inline vec<float> silu_grad_low(vec<float> z) {
  vec<float> q, eq;
  const __mmask16 neg = sigmoid_low<S>(z, &q, &eq);
  const vec<float> s = (vec<float>)_mm512_mask_mov_ps((__m512)q, neg, (__m512)eq);
  const vec<float> c = (vec<float>)_mm512_mask_mov_ps((__m512)eq, neg, (__m512)q);
  return vmath::vfma(s, z * c, s);
}
#else
template <class S> vec<float> silu_low(vec<float> z);       // (never instantiated: kLow is false)
template <class S> vec<float> silu_grad_low(vec<float> z);
#endif

template <class A> inline A gelu_tanh_inner(A z) {
  const A k = A(0.7978845608028654);  // sqrt(2 / pi)
  return k * (z + A(0.044715) * z * z * z);
}
}  // namespace detail

// act(z), the activation Act with parameter p (LeakyReLU's slope), on a vector of the accumulation
// type A = acc_t<S>. S: the type the result is stored as (float, double, bf16 or f16; S = A for
// callers that keep the result in the accumulation type). Only silu looks at it: for bf16 and f16
// on AVX-512 it is computed as precisely as the stored result needs (detail::sigmoid_low); every
// other activation, and silu at float32/float64 or below AVX-512, is the same for any S.
template <int Act, class S, class A = acc_t<S>> inline vec<A> apply(vec<A> z, A p) {
  if constexpr (Act == kIdentity) {
    return z;
  } else if constexpr (Act == kRelu) {
    return z <= A(0) ? vzero<A>() : z;
  } else if constexpr (Act == kLeakyRelu) {
    return z > A(0) ? z : z * p;
  } else if constexpr (Act == kHardswish) {
    vec<A> t = z + A(3);
    t = t < A(0) ? vzero<A>() : t;  // (NaN: kept)
    t = t > A(6) ? vset1(A(6)) : t;
    return z * t / A(6);
  } else if constexpr (Act == kSilu) {
    if constexpr (detail::kLow<S>) {
      return detail::silu_low<S>(z);
    } else if constexpr (sizeof(A) == 4) {
      const vec<float> e = vmath::vexp_table(-z);
      const vec<float> big = vset1(__builtin_inff());
      return z / (1.0f + (-z > 88.0f ? big : e));
    } else {
      return detail::lanewise<A>(z, [](A v) { return v / (A(1) + std::exp(-v)); });
    }
  } else if constexpr (Act == kTanh) {
    if constexpr (sizeof(A) == 4) return detail::vtanh(z);
    else return detail::lanewise<A>(z, [](A v) { return std::tanh(v); });
  } else if constexpr (Act == kGelu) {
    if constexpr (sizeof(A) == 4) {
      return z * 0.5f * (1.0f + vmath::verf(z * 0.7071067811865476f));
    } else {
      return detail::lanewise<A>(z, [](A v) { return v * A(0.5) * (A(1) + std::erf(v * A(0.7071067811865476))); });
    }
  } else {
    static_assert(Act == kGeluTanh);
    if constexpr (sizeof(A) == 4) {
      const vec<float> u = A(0.7978845608028654) * (z + A(0.044715) * (z * z * z));
      return A(0.5) * z * (A(1) + detail::vtanh(u));
    } else {
      return detail::lanewise<A>(z, [](A v) { return A(0.5) * v * (A(1) + std::tanh(detail::gelu_tanh_inner(v))); });
    }
  }
}

// Whether act(z) is never NaN where z is not (z of either sign, infinities included): the identity,
// relu, and leaky_relu with a finite slope other than 0 (-inf * 0 is NaN); not hardswish (-inf * 0)
// nor the transcendental ones. A pass whose z cannot be NaN (vec.h, nan_free_affine) may then
// leave the bfloat16 store's NaN test out for these activations too.
template <int Act, class A> inline bool keeps_nan_free(A p) {
  if constexpr (Act == kIdentity || Act == kRelu) return true;
  else if constexpr (Act == kLeakyRelu) return std::isfinite(p) && p != A(0);
  else return false;
}

// apply<Act, S>(z, p); with NoNaN (z known not to be NaN: a pass that skips its store's NaN test,
// keeps_nan_free) relu as one max, z > 0 ? z : +0 (vmax_nan: the bits of apply's z <= 0 ? 0 : z for
// every z but NaN, -0 included), where apply's form compiles to a compare and a blend.
template <int Act, class S, bool NoNaN> inline vec<acc_t<S>> apply_nan_free(vec<acc_t<S>> z, acc_t<S> p) {
  if constexpr (NoNaN && Act == kRelu && std::is_same_v<acc_t<S>, float>) return vmath::vmax_nan(z, vzero<float>());
  else return apply<Act, S>(z, p);
}

// A fused norm's output act(z) stored as S: whether z is first rounded to S, as the plain norm's
// output is, so that the fused output has the bits of the norm followed by the activation on its
// output -- not for the identity, nor for relu (relu of the rounded z is the rounding of relu(z):
// the same bits without the rounding), nor where S is the accumulation type, nor for silu computed
// at S's own precision (detail::kLow: its bits are not torch's anyway; rounding z first cost a store
// and a load a vector: bfloat16 GroupNormAct(SiLU) channels-last 16x64x56x56 forward 1.23x ->
// 1.55x the unfused path).
template <int Act, class S>
inline constexpr bool kRoundsZ = Act != kIdentity && Act != kRelu && sizeof(S) < sizeof(acc_t<S>) &&
                                 !(Act == kSilu && detail::kLow<S>);
// act(z) for that output (z as kRoundsZ says).
template <int Act, class S> inline vec<acc_t<S>> apply_stored(vec<acc_t<S>> z, acc_t<S> p) {
  if constexpr (kRoundsZ<Act, S> && std::is_same_v<S, bf16>) {
    z = vround_bf16(z);  // (in registers: the store and load cost bfloat16 SiLU a third of its pass)
  } else if constexpr (kRoundsZ<Act, S>) {
    S t[vlanes<S>];
    vstore(t, z);
    z = vload(t);
  }
  return apply<Act, S>(z, p);
}

// act'(z) on a vector of A = acc_t<S>, S the type of the result that act'(z) goes into (apply's).
template <int Act, class S, class A = acc_t<S>> inline vec<A> grad(vec<A> z, A p) {
  const vec<A> one = vset1(A(1));
  if constexpr (Act == kIdentity) {
    return one;
  } else if constexpr (Act == kRelu) {
    return z > A(0) ? one : vzero<A>();
  } else if constexpr (Act == kLeakyRelu) {
    return z > A(0) ? one : vset1(p);
  } else if constexpr (Act == kHardswish) {
    const vec<A> mid = z / A(3) + A(0.5);
    return z < A(-3) ? vzero<A>() : (z <= A(3) ? mid : one);
  } else if constexpr (Act == kSilu) {
    vec<A> s;
    if constexpr (detail::kLow<S>) {
      return detail::silu_grad_low<S>(z);
    } else if constexpr (sizeof(A) == 4) {
      const vec<float> e = vmath::vexp_table(-z);
      s = 1.0f / (1.0f + (-z > 88.0f ? vset1(__builtin_inff()) : e));
    } else {
      s = detail::lanewise<A>(z, [](A v) { return A(1) / (A(1) + std::exp(-v)); });
    }
    return s * (one + z * (one - s));
  } else if constexpr (Act == kTanh) {
    if constexpr (sizeof(A) == 4) {
      vec<float> s;
      vmath::vtanh<true>(z, &s);  // (1 - t^2 without its cancellation near |t| = 1)
      return s;
    } else {
      return detail::lanewise<A>(z, [](A v) { const A t = std::tanh(v); return A(1) - t * t; });
    }
  } else if constexpr (Act == kGelu) {
    if constexpr (sizeof(A) == 4) {
      const vec<float> cdf = 0.5f * (1.0f + vmath::verf(z * 0.7071067811865476f));
      const vec<float> pdf = vmath::vexp_table(-0.5f * z * z) * 0.3989422804014327f;
      return cdf + z * pdf;
    } else {
      return detail::lanewise<A>(z, [](A v) {
        const A cdf = A(0.5) * (A(1) + std::erf(v * A(0.7071067811865476)));
        const A pdf = std::exp(A(-0.5) * v * v) * A(0.3989422804014327);
        return cdf + v * pdf;
      });
    }
  } else {
    static_assert(Act == kGeluTanh);
    const A k = A(0.7978845608028654);
    if constexpr (sizeof(A) == 4) {
      const vec<float> t = detail::vtanh(k * (z + A(0.044715) * (z * z * z)));
      return A(0.5) * (one + t) + A(0.5) * z * (one - t * t) * k * (one + A(3 * 0.044715) * z * z);
    } else {
      return detail::lanewise<A>(z, [k](A v) {
        const A t = std::tanh(detail::gelu_tanh_inner(v));
        return A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * k * (A(1) + A(3 * 0.044715) * v * v);
      });
    }
  }
}

// dz = dy * act'(z), the backward's input to the norm's own backward. relu: dy itself where z > 0
// or z is NaN, +0 where z <= 0 (torch's threshold_backward) -- not dy * 0, which is -0 for a
// negative dy and NaN for an infinite one, where the unfused path gives +0.
template <int Act, class S, class A = acc_t<S>> inline vec<A> dz_of(vec<A> dy, vec<A> z, A p) {
  if constexpr (Act == kRelu) return z <= A(0) ? vzero<A>() : dy;
  else return dy * grad<Act, S>(z, p);
}

// f.template operator()<Act>() for the runtime id `id` (each activation its own instantiation)
template <class F> inline void visit(int id, const F& f) {
  switch (id) {
    case kIdentity: return f.template operator()<kIdentity>();
    case kRelu: return f.template operator()<kRelu>();
    case kLeakyRelu: return f.template operator()<kLeakyRelu>();
    case kSilu: return f.template operator()<kSilu>();
    case kGelu: return f.template operator()<kGelu>();
    case kGeluTanh: return f.template operator()<kGeluTanh>();
    case kHardswish: return f.template operator()<kHardswish>();
    default: return f.template operator()<kTanh>();
  }
}

}  // namespace normlab::act
