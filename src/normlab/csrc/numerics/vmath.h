// Vector math on float32 lanes (vec<float>), the one copy that the kernels share: DyT
// (cpu/dyt_kernels.cpp) and the activations of the norm+act kernels (numerics/activation.h).
//
//   vabs, vcopysign   bit operations (exact)
//   vfma(a, b, c)     a * b + c, rounded once where the build level has fused multiply-add
//                     (x86-64-v3, v4), else a * b rounded and then + c (the baseline, SSE2)
//   vexp(v)           exp, v clamped to [-87, 88] (Cody-Waite reduction, a degree-7 polynomial)
//   vexp_table(v)     the same by a table: of 2^(j/16) and a degree-3 expm1 on AVX-512, of 2^(j/8)
//                     and a degree-4 expm1 on AVX2 (SiLU's; vexp's steps on the baseline)
//   vexp_neg_abs_low<D>(z)  exp(-|z|) to half precision's needs (AVX-512: D = 1 bfloat16, 2 float16)
//   vrcp14(v)         1 / v to 2^-14 (AVX-512)
//   vtanh<S>(u, &s)   tanh, and with S also 1 - tanh^2: docs/derivations/dyt.md, "Numerics"
//   verf(v)           erf: docs/derivations/norm_act.md, "Accuracy"
// tanh and erf are evaluated by intervals, their coefficients looked up per lane (scripts/vmath-fit.py
// fits them; scripts/erf-ulp.py scans every float32 at each level).
//
// Every function but vexp_table is the same sequence of operations at every level; with fused
// multiply-add (v3 and v4) the same bits whatever the vector width (no operation crosses lanes). The build
// never contracts or reassociates (-ffp-contract=off): a fused step is only where written.
#pragma once

#include <cstdint>
#include <cstring>

#include "numerics/vec.h"

#if NORMLAB_VEC_BYTES == 64 || defined(__FMA__)
#define NORMLAB_VMATH_FMA 1
#else
#define NORMLAB_VMATH_FMA 0
#endif

namespace normlab::vmath {

typedef int32_t i32v __attribute__((vector_size(NORMLAB_VEC_BYTES)));
using vf = vec<float>;

inline i32v bits(vf v) { i32v u; std::memcpy(&u, &v, sizeof u); return u; }
inline vf from_bits(i32v u) { vf v; std::memcpy(&v, &u, sizeof v); return v; }

inline vf vabs(vf v) { return from_bits(bits(v) & 0x7FFFFFFF); }
// mag's bits with sign's sign bit added (mag >= 0)
inline vf vcopysign(vf mag, vf sign) { return from_bits(bits(mag) | (bits(sign) & int32_t(0x80000000u))); }
// lanes where m is true (all bits set) take a, the others b (m from a comparison)
inline vf vselect(i32v m, vf a, vf b) { return m ? a : b; }

inline vf vfma(vf a, vf b, vf c) {
#if NORMLAB_VEC_BYTES == 64
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif NORMLAB_VEC_BYTES == 32 && defined(__FMA__)
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

// v * 2^n for the integer-valued n, given the shifter's sum (n + 1.5 * 2^23, whose low bits hold
// n) with n + 127 in [1, 254]: vscalefps on AVX-512, else n + 127 put in the exponent bits.
inline vf scale_by(vf v, vf n, vf shifted) {
#if NORMLAB_VEC_BYTES == 64
  (void)shifted;
  return (vf)_mm512_scalef_ps((__m512)v, (__m512)n);
#else
  (void)n;
  const i32v e = (bits(shifted) << 23) + (127 << 23);  // (the shifter's own bits leave through the top)
  return v * from_bits(e);
#endif
}

// exp(v) - 1 = 2^n (1 + p) - 1 and its parts for -87 <= v <= 88 (and NaN): n = round(v / ln 2) by
// the 1.5 * 2^23 shifter, r = v - n ln 2 by two fused steps (ln 2 as float and its remainder;
// without fused multiply-add, Cody-Waite's ln 2 with trailing zeros, so that n * it is exact),
// |r| <= ln2 / 2, and p = expm1(r) = r + r^2 P(r), P of degree 5.
struct ExpParts {
  vf p, n, shifted;
};
inline ExpParts exp_parts(vf v) {
  const vf shifted = vfma(v, vset1(1.44269504088896341f), vset1(12582912.0f));
  const vf n = shifted - 12582912.0f;
#if NORMLAB_VMATH_FMA
  vf r = vfma(n, vset1(-0.693147182464599609375f), v);  // (ln 2 rounded, and what it lacks)
  r = vfma(n, vset1(1.904654299957768e-09f), r);
#else
  const vf r = (v - n * 0.693359375f) - n * -2.12194440e-4f;
#endif
  vf p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(p, r * r, r);
  return {p, n, shifted};
}

// exp(v) for 0 <= v <= 88 (and NaN), or any v in [-87, 88]
inline vf vexp_in_range(vf v) {
  const ExpParts e = exp_parts(v);
  return scale_by(e.p + 1.0f, e.n, e.shifted);
}

// min(x, y) and max(x, y), y where either is NaN or both are zeros (x < y ? x : y, x > y ? x : y:
// what minps and maxps compute, lane by lane). With AVX2 and AVX-512 as the instructions themselves:
// GCC compiles the conditional form to a compare and a blend, two dependent instructions for one.
// (AVX-512: the maskz forms with a full mask, as Lookup's permute: the plain ones trip GCC 12's
// -Wuninitialized.)
inline vf vmin_nan(vf x, vf y) {
#if NORMLAB_VEC_BYTES == 64
  return (vf)_mm512_maskz_min_ps(0xFFFF, (__m512)x, (__m512)y);
#elif NORMLAB_VEC_BYTES == 32
  return (vf)_mm256_min_ps((__m256)x, (__m256)y);
#else
  return x < y ? x : y;
#endif
}
inline vf vmax_nan(vf x, vf y) {
#if NORMLAB_VEC_BYTES == 64
  return (vf)_mm512_maskz_max_ps(0xFFFF, (__m512)x, (__m512)y);
#elif NORMLAB_VEC_BYTES == 32
  return (vf)_mm256_max_ps((__m256)x, (__m256)y);
#else
  return x > y ? x : y;
#endif
}

// exp(v), v clamped to [-87, 88] (a NaN stays NaN: the clamps keep v where the comparison fails)
inline vf vexp(vf v) { return vexp_in_range(vmin_nan(vset1(88.0f), vmax_nan(vset1(-87.0f), v))); }

// exp(v), v clamped to [-87, 88], for SiLU and GELU's derivative (numerics/activation.h). On
// AVX-512 by a table of 16, exp(v) = 2^k 2^(j/16) exp(r): n = round(16 v / ln 2) by the 1.5 * 2^23
// shifter (k = n >> 4; j = n & 15, the low 4 bits, which vpermps reads), r = v - n (ln 2 / 16) by
// two fused steps (ln 2 / 16 as float, exact with n times it; then what it lacks), |r| <= ln 2 / 32,
// expm1(r) = r + r^2 (1/2 + r/6) (Taylor; the rest, r^4 / 24 < 9.2e-9, is 0.08 ulp), then
// T + T q as one fused step (T = 2^(j/16) rounded) and k added to its exponent bits (the clamps keep
// it normal: k in [-126, 126], and T (1 + q) >= 1.38 where k = -126). 7 instructions on the
// multiply pipes where vexp takes 11; SiLU within 3.1 ulp (2.3 through vexp), mean 0.124 ulp
// (0.121): docs/performance.md, "Norm + activation". Not vexp's bits. AVX2: a table of 8 (below);
// the baseline: vexp's own steps.
namespace exp_table {
alignas(64) inline constexpr float kT[16] = {
    1.0f, 1.0442737340927124f, 1.0905077457427979f, 1.1387885808944702f, 1.1892070770263672f, 1.2418577671051025f,
    1.2968395948410034f, 1.3542555570602417f, 1.4142135381698608f, 1.4768261909484863f, 1.5422108173370361f,
    1.610490322113037f, 1.6817928552627563f, 1.7562521696090698f, 1.8340080976486206f, 1.9152065515518188f,
};
alignas(32) inline constexpr float kT8[8] = {
    1.0f, 1.0905077457427979f, 1.1892070770263672f, 1.2968395948410034f,
    1.4142135381698608f, 1.5422108173370361f, 1.6817928552627563f, 1.8340080976486206f,
};
}  // namespace exp_table
inline vf vexp_table(vf v) {
#if NORMLAB_VEC_BYTES == 64
  v = vmin_nan(vset1(88.0f), vmax_nan(vset1(-87.0f), v));  // (a NaN stays)
  const vf shifted = vfma(v, vset1(23.083120346069336f), vset1(12582912.0f));
  const vf n = shifted - 12582912.0f;
  vf r = vfma(n, vset1(-0.043321698904037476f), v);
  r = vfma(n, vset1(1.1904088825787085e-10f), r);
  const vf q = vfma(vfma(vset1(0.16666667f), r, vset1(0.5f)), r * r, r);
  const i32v sb = bits(shifted);
  const vf t = (vf)_mm512_maskz_permutexvar_ps(0xFFFF, (__m512i)sb, _mm512_load_ps(exp_table::kT));
  return from_bits(bits(vfma(t, q, t)) + ((sb >> 4) << 23));
#elif NORMLAB_VEC_BYTES == 32 && NORMLAB_VMATH_FMA
  // AVX2 (a table of 16 is two permutes and a blend there): a table of 8, 2^(j/8) (one vpermps,
  // which reads the low 3 bits of each lane), n = round(8 v / ln 2), k = n >> 3 in [-126, 127],
  // |r| <= ln 2 / 16, expm1(r) = r + r^2 (1/2 + r (1/6 + r/24)) (the rest, r^5 / 120 < 1.4e-9, is
  // 0.02 ulp); then T + T q and k added to the exponent bits, as above (exp(88) = 2^127 * 0.97 stays
  // finite, and T (1 + q) >= 1.40 where k = -126). 10 floating-point instructions where vexp takes 14;
  // SiLU within the bound of tests/ops/norm_act/test_act_accuracy.py. Not vexp's bits.
  v = vmin_nan(vset1(88.0f), vmax_nan(vset1(-87.0f), v));  // (a NaN stays)
  const vf shifted = vfma(v, vset1(11.541560173034668f), vset1(12582912.0f));
  const vf n = shifted - 12582912.0f;
  vf r = vfma(n, vset1(-0.08664339780807495f), v);
  r = vfma(n, vset1(2.380817765157417e-10f), r);
  const vf q = vfma(vfma(vfma(vset1(0.0416666679084301f), r, vset1(0.1666666716337204f)), r, vset1(0.5f)), r * r, r);
  const i32v sb = bits(shifted);
  const vf t = (vf)_mm256_permutevar8x32_ps(_mm256_load_ps(exp_table::kT8), (__m256i)sb);
  return from_bits(bits(vfma(t, q, t)) + ((sb >> 3) << 23));
#else
  return vexp(v);
#endif
}

#if NORMLAB_VEC_BYTES == 64
#define NORMLAB_VMATH_LOW_EXP 1
// exp(-|z|) only as precisely as a result stored as bfloat16 (Deg 1) or float16 (Deg 2) needs, in 7
// (Deg 1) or 9 instructions: v = -min(|z|, 110) by one vrangeps (exp(-110) is 0 in float32; a NaN
// z gives v = -110: the caller's product with z keeps the NaN); m = v / ln 2 rounded to a multiple
// of 1/16 by the 1.5 * 2^19 shifter (its unit in the last place is 2^-4, so the sum's low 4 bits are
// j = 16 m mod 16, which vpermps reads from vexp_table's table of 2^(j/16)); r = v - m ln 2 by one
// fused step (ln 2 rounded to float: m ln 2 off by under 3.1e-7, |r| <= ln 2 / 32 + that); expm1(r)
// by r (Deg 1: the rest r^2 / 2 <= 2^-12.1 relative) or r + r^2 / 2 (Deg 2: r^3 / 6 < 2^-19);
// then 2^floor(m) by vscalefps, which rounds into the subnormals and to 0 as exp(v) does.
// AVX-512 only (the table is one permute there): numerics/activation.h's silu for a bf16/f16 output.
template <int Deg> inline vf vexp_neg_abs_low(vf z) {
  static_assert(Deg == 1 || Deg == 2);
  const vf v = (vf)_mm512_range_ps((__m512)z, _mm512_set1_ps(110.0f), 0x0E);  // (min |.|, sign set)
  const vf shifted = vfma(v, vset1(1.44269504088896341f), vset1(786432.0f));
  const vf m = shifted - 786432.0f;
  const vf r = vfma(m, vset1(-0.693147182464599609375f), v);
  const vf t = (vf)_mm512_permutexvar_ps((__m512i)bits(shifted), _mm512_load_ps(exp_table::kT));
  vf e;
  if constexpr (Deg == 1) e = vfma(t, r, t);
  else e = vfma(t, vfma(r * 0.5f, r, r), t);
  return (vf)_mm512_scalef_ps((__m512)e, (__m512)m);  // (2^floor(m))
}
// 1 / v to 2^-14 relative (vrcp14ps, no Newton step): +-inf -> +-0, +-0 -> +-inf, NaN -> NaN
inline vf vrcp14(vf v) { return (vf)_mm512_rcp14_ps((__m512)v); }
#else
#define NORMLAB_VMATH_LOW_EXP 0
#endif

#if !NORMLAB_VMATH_FMA
// 1 - t^2 rounded once without fused multiply-add: t * t is exact in float64 (24-bit by 24-bit),
// 1 - t^2 rounded to float64 and then to float32.
inline vf one_minus_square(vf t) {
  typedef float half_t __attribute__((vector_size(NORMLAB_VEC_BYTES / 2)));
  half_t lo, hi;
  std::memcpy(&lo, &t, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&t) + sizeof lo, sizeof hi);
  const vec<double> dl = __builtin_convertvector(lo, vec<double>), dh = __builtin_convertvector(hi, vec<double>);
  const half_t rl = __builtin_convertvector(1.0 - dl * dl, half_t), rh = __builtin_convertvector(1.0 - dh * dh, half_t);
  vf r;
  std::memcpy(&r, &rl, sizeof rl);
  std::memcpy(reinterpret_cast<char*>(&r) + sizeof rl, &rh, sizeof rh);
  return r;
}
#endif

// 1 - tanh(a)^2 for a = |u| >= 0.625 (and NaN), from e = exp(2a): (4q)(1 - q), q = 1 / (e + 1) --
// 1 - t^2 from a rounded t near 1 would lose most of its digits -- and 0 past 2a = 88 (s < 2^-126).
inline vf sech2_from_exp(vf a, vf* q_out = nullptr) {
  const vf a2 = a + a;
  const vf e = vexp_in_range(vset1(88.0f) < a2 ? vset1(88.0f) : a2);  // (a NaN stays: the second operand)
  const vf q = 1.0f / (e + 1.0f);
  if (q_out) *q_out = q;
  return a2 < 88.0f ? (4.0f * q) * (1.0f - q) : vzero<float>();
}

// (NORMLAB_VMATH_NO_TABLE defined: the exp form everywhere, for comparisons: scripts/erf-ulp.py --time)
#if NORMLAB_VMATH_FMA && !defined(NORMLAB_VMATH_NO_TABLE)
#define NORMLAB_VMATH_TANH_TABLE 1
#else
#define NORMLAB_VMATH_TANH_TABLE 0
#endif
// tanh by intervals (x86-64-v3 and v4). For a = |u| capped at 10 (tanh is 1 in float32 from
// 9.01), interval k = min((bits(max(a, 0.5625)) >> 21) - 504, 15) (the exponent and two leading
// fraction bits): 0: [0, 0.625); 1-14: [0.625, 0.75), [0.75, 0.875), [0.875, 1), the quarters of
// [1, 2) and [2, 4), then [4, 5), [5, 6), [6, 7); 15: [7, 10]. On interval 0, Cephes' tanhf,
// a + a^3 Q(a^2) (Q of degree 4); on 1-15, c0 + y R(y), y = a - c exact (a and c in one interval:
// Sterbenz), c chosen in the interval so that c0 = tanh(c) rounded to float32 is within 0.001 ulp
// of it, R of degree 4 fitted to (tanh(c + y) - c0) / y by weighted least squares with its
// coefficients rounded to float32 one at a time (scripts/vmath-fit.py prints these tables). Both
// forms are one Horner evaluation of degree 4 and one fused step, their coefficients looked up
// per lane from 16-entry tables (one permute per table on AVX-512, two and a blend on AVX2): the
// same operations on every lane, the same bits at v3 and v4 (checked over every float32 by
// scripts/erf-ulp.py --fn tanh). Within 0.74 ulp of the exact tanh over every float32 (at 4.27;
// docs/derivations/dyt.md, "Accuracy"). About 27 vector instructions a vector with DyT's scale and
// affine, where the exp form below takes about 38.
namespace tanh_table {
alignas(64) inline constexpr float kC[16] = {
    0.0f, 0.6874732f, 0.81253767f, 0.9374493f, 1.1251353f, 1.3750954f, 1.6249857f, 1.875007f,
    2.2495773f, 2.7503352f, 3.2504308f, 3.7502475f, 4.4981236f, 5.4985805f, 6.498972f, 8.66434f,
};
alignas(64) inline constexpr float kC0[16] = {
    0.0f, 0.5963563f, 0.6709878f, 0.7340481f, 0.80934775f, 0.87984824f, 0.92534417f, 0.9540459f,
    0.97800773f, 0.99186516f, 0.9970002f, 0.998895f, 0.9997523f, 0.9999665f, 0.99999547f, 0.99999994f,
};
alignas(64) inline constexpr float kR0[16] = {
    -0.3333328f, 0.6443592f, 0.5497754f, 0.46117336f, 0.34495622f, 0.22586706f, 0.14373817f, 0.08979644f,
    0.043500867f, 0.016203512f, 0.0059905685f, 0.0022088008f, 0.0004953798f, 6.699563e-05f, 9.060052e-06f, 1.3067744e-07f,
};
alignas(64) inline constexpr float kR1[16] = {
    0.13331442f, -0.38426757f, -0.36889264f, -0.33852354f, -0.27919152f, -0.19872992f, -0.13300772f, -0.085669994f,
    -0.042542957f, -0.016070765f, -0.005972179f, -0.002206196f, -0.00049463735f, -6.6908804e-05f, -9.048547e-06f, -1.070597e-07f,
};
alignas(64) inline constexpr float kR2[16] = {
    -0.053739715f, 0.01437368f, 0.06426373f, 0.094767936f, 0.110976845f, 0.09956324f, 0.0751654f, 0.051801145f,
    0.027108755f, 0.0105393445f, 0.003957566f, 0.0014675545f, 0.00032973094f, 4.4618653e-05f, 6.0341536e-06f, 4.9529394e-08f,
};
alignas(64) inline constexpr float kR3[16] = {
    0.020639088f, 0.11945425f, 0.079887494f, 0.043370478f, 0.003649867f, -0.02111704f, -0.02512786f, -0.02084965f,
    -0.012394238f, -0.005144493f, -0.0019763426f, -0.00073891535f, -0.00017263053f, -2.338786e-05f, -3.1635832e-06f, -5.7102383e-08f,
};
alignas(64) inline constexpr float kR4[16] = {
    -0.0057049887f, -0.061568785f, -0.06266853f, -0.053059045f, -0.03204099f, -0.009515033f, 0.0013950474f, 0.004600987f,
    0.0039765155f, 0.0019149999f, 0.00077059475f, 0.00029267019f, 6.82622e-05f, 9.275459e-06f, 1.2561153e-06f, 3.275605e-08f,
};
}  // namespace tanh_table

// table[k] per lane, k in [0, 16) (table: 16 floats, 64-byte aligned): one permute on AVX-512,
// two and a blend on AVX2, lane by lane on the baseline
struct Lookup {
  i32v k;
#if NORMLAB_VEC_BYTES == 32
  i32v hi;
#endif
  explicit Lookup(i32v k_) : k(k_) {
#if NORMLAB_VEC_BYTES == 32
    hi = k > 7;
#endif
  }
  vf operator()(const float* table) const {
#if NORMLAB_VEC_BYTES == 64
    // (the maskz form with a full mask: the plain one trips GCC 12's -Wuninitialized)
    return (vf)_mm512_maskz_permutexvar_ps(0xFFFF, (__m512i)k, _mm512_load_ps(table));
#elif NORMLAB_VEC_BYTES == 32 && defined(__AVX2__)
    const vf p0 = (vf)_mm256_permutevar8x32_ps(_mm256_load_ps(table), (__m256i)k);
    const vf p1 = (vf)_mm256_permutevar8x32_ps(_mm256_load_ps(table + 8), (__m256i)k);
    return vselect(hi, p1, p0);
#else
    vf r;
    for (int64_t i = 0; i < lanes<float>; ++i) r[i] = table[k[i]];
    return r;
#endif
  }
};

// tanh(u) and, with S, *s = 1 - tanh(u)^2 (tanh'(u)) through exp, at every level: |u| < 0.625,
// Cephes' u + u^3 Q(u^2); above, 1 - 2q, q = 1 / (e + 1), e = exp(2|u|) (capped at 88); both
// computed for every lane and one picked, then u's sign bit (tanh(-0) = -0); NaN stays NaN.
// s below 0.625: 1 - t^2 rounded once (no cancellation, t <= 0.56: a fused step, or through
// float64 without one); above, (4q)(1 - q) (sech2_from_exp). Within 1.33 ulp (t) and 2.9 ulp (s).
template <bool S> inline vf vtanh_by_exp(vf u, vf* s = nullptr) {
  const vf a = vabs(u);
  const vf z = u * u;
  vf q = vset1(-5.70498872745e-3f);
  q = vfma(q, z, vset1(2.06390887954e-2f));
  q = vfma(q, z, vset1(-5.37397155531e-2f));
  q = vfma(q, z, vset1(1.33314422036e-1f));
  q = vfma(q, z, vset1(-3.33332819422e-1f));
  const vf small = vfma(q * z, u, u);
  vf qe;
  const vf from_e = sech2_from_exp(a, &qe);
  const vf big = vfma(vset1(-2.0f), qe, vset1(1.0f));
  const vf t = vcopysign(a < 0.625f ? small : big, u);
  if constexpr (S) {
#if NORMLAB_VMATH_FMA
    *s = a < 0.625f ? vfma(-t, t, vset1(1.0f)) : from_e;
#else
    *s = a < 0.625f ? one_minus_square(t) : from_e;
#endif
  }
  return t;
}

#if NORMLAB_VMATH_TANH_TABLE
#if NORMLAB_VEC_BYTES == 32
// table[k] per lane for k in [0, 8): the first 8 entries, one permute (AVX2)
struct Lookup8 {
  i32v k;
  vf operator()(const float* table) const {
    return (vf)_mm256_permutevar8x32_ps(_mm256_load_ps(table), (__m256i)k);
  }
};
#endif
// tanh(u) by intervals (above): u's sign bit put on |t|; NaN stays NaN. Within 0.74 ulp. On AVX2,
// a vector whose lanes all lie in the first 8 intervals (|u| < 2: nearly every vector of DyT's
// tanh(0.5 x) on unit-scale x) looks its coefficients up with one permute a table, not two and a
// blend -- the same entries, so the same bits (DyT forward 512x768 float32: ~1.3x faster).
inline vf vtanh_by_table(vf u) {
  namespace tt = tanh_table;
  const vf a = vabs(u);
  // a capped at 10 (NaN kept: vminps and vmaxps return their second operand for a NaN); k from
  // the exponent and two leading fraction bits of max(a, 0.5625), at most 15
  const vf ac = vmin_nan(vset1(10.0f), a);
  i32v k = (bits(vmax_nan(vset1(0.5625f), ac)) >> 21) - 504;
  k = k > 15 ? i32v{} + 15 : k;
  const i32v m0 = a < 0.625f;  // interval 0: Cephes' form in z = a^2
  auto by = [&](const auto& at) {
    const vf y = ac - at(tt::kC);
    const vf z = y * y;
    const vf v = vselect(m0, z, y);
    vf r = at(tt::kR4);
    r = vfma(r, v, at(tt::kR3));
    r = vfma(r, v, at(tt::kR2));
    r = vfma(r, v, at(tt::kR1));
    r = vfma(r, v, at(tt::kR0));
    return vcopysign(vfma(r, vselect(m0, z * y, y), vselect(m0, y, at(tt::kC0))), u);
  };
#if NORMLAB_VEC_BYTES == 32
  const i32v high = k > 7;
  if (_mm256_testz_si256((__m256i)high, (__m256i)high)) return by(Lookup8{k});
#endif
  return by(Lookup(k));
}
#endif

// t = tanh(u); with S, also *s = 1 - tanh(u)^2. Without S: by intervals where the level has fused
// multiply-add (v3, v4: the same bits at both), else through exp; with S (the backward, which needs
// s to its last digits where t is near 1): through exp at every level.
template <bool S> inline vf vtanh(vf u, vf* s = nullptr) {
#if NORMLAB_VMATH_TANH_TABLE
  if constexpr (!S) return vtanh_by_table(u);
#endif
  return vtanh_by_exp<S>(u, s);
}

// erf(x), float32 lanes, by intervals as tanh's (scripts/vmath-fit.py prints these tables;
// scripts/erf-ulp.py scans every float32): for a = |x| capped at 4 (erf is 1 in float32 from 3.92), interval
// k = min((bits(max(a, 0.5625)) >> 21) - 504, 11): 0: [0, 0.625), a + a R(a^2) (R of degree 5
// fitted to erf(a) / a - 1); 1-11: the quarters of [0.625, 1), [1, 2), [2, 4), c0 + y R(y),
// y = a - c exact, c0 = erf(c) rounded to float32 within 0.001 ulp of it, R of degree 5. One
// Horner evaluation of degree 5 and one fused step; then x's sign bit; NaN stays NaN. The same
// bits at v3 and v4; the baseline level rounds products and sums apart and looks its
// coefficients up lane by lane. Within 0.68 ulp at v3 and v4, 0.73 at v1, over every float32
// (docs/derivations/norm_act.md).
namespace erf_table {
alignas(64) inline constexpr float kC[16] = {
    0.0f, 0.68738663f, 0.81257904f, 0.93744224f, 1.124919f, 1.3751392f, 1.6248713f, 1.8750187f,
    2.2498941f, 2.7501175f, 3.2503858f, 3.7439213f, 3.7439213f, 3.7439213f, 3.7439213f, 3.7439213f,
};
alignas(64) inline constexpr float kC0[16] = {
    0.0f, 0.6690049f, 0.7495101f, 0.81507534f, 0.88836247f, 0.9481938f, 0.9784334f, 0.9919907f,
    0.9985365f, 0.99989945f, 0.9999957f, 0.9999999f, 0.9999999f, 0.9999999f, 0.9999999f, 0.9999999f,
};
alignas(64) inline constexpr float kR0[16] = {
    0.12837917f, 0.7034784f, 0.5830383f, 0.46859533f, 0.31833193f, 0.17029455f, 0.08050594f, 0.03354347f,
    0.007145703f, 0.00058591535f, 2.9120542e-05f, 9.229703e-07f, 9.229703e-07f, 9.229703e-07f, 9.229703e-07f, 9.229703e-07f,
};
alignas(64) inline constexpr float kR1[16] = {
    -0.37612638f, -0.48356164f, -0.4737647f, -0.43928105f, -0.35809767f, -0.23417872f, -0.13081178f, -0.06289463f,
    -0.016077071f, -0.0016112933f, -9.464208e-05f, -3.4536179e-06f, -3.4536179e-06f, -3.4536179e-06f, -3.4536179e-06f, -3.4536179e-06f,
};
alignas(64) inline constexpr float kR2[16] = {
    0.112837076f, -0.012897149f, 0.06230115f, 0.118335076f, 0.16244122f, 0.157921f, 0.11486754f, 0.06743898f,
    0.021735063f, 0.002756676f, 0.00019477817f, 8.254414e-06f, 8.254414e-06f, 8.254414e-06f, 8.254414e-06f, 8.254414e-06f,
};
alignas(64) inline constexpr float kR3[16] = {
    -0.026856266f, 0.16562408f, 0.13261609f, 0.09096181f, 0.028000765f, -0.030520959f, -0.0497171f, -0.04226079f,
    -0.019093402f, -0.0032561086f, -0.00028557927f, -1.4405714e-05f, -1.4405714e-05f, -1.4405714e-05f, -1.4405714e-05f, -1.4405714e-05f,
};
alignas(64) inline constexpr float kR4[16] = {
    0.0051720147f, -0.04155444f, -0.061662864f, -0.069490954f, -0.06106864f, -0.030625507f, -0.0023143715f, 0.011328492f,
    0.010582909f, 0.0028246574f, 0.00033198297f, 2.0960984e-05f, 2.0960984e-05f, 2.0960984e-05f, 2.0960984e-05f, 2.0960984e-05f,
};
alignas(64) inline constexpr float kR5[16] = {
    -0.00072879065f, -0.0352184f, -0.019643223f, -0.002673151f, 0.0153154135f, 0.022039961f, 0.0143929245f, 0.004205743f,
    -0.0027837239f, -0.001667316f, -0.00027329405f, -2.074065e-05f, -2.074065e-05f, -2.074065e-05f, -2.074065e-05f, -2.074065e-05f,
};
}  // namespace erf_table

inline vf verf(vf x) {
  namespace et = erf_table;
  const vf a = vabs(x);
  const vf ac = vmin_nan(vset1(4.0f), a);
  i32v k = (bits(vmax_nan(vset1(0.5625f), ac)) >> 21) - 504;
  k = k > 11 ? i32v{} + 11 : k;
  const Lookup at(k);
  const i32v m0 = a < 0.625f;  // interval 0: in z = a^2, erf(a) = a + a R(z)
  const vf y = ac - at(et::kC);
  const vf v = vselect(m0, y * y, y);
  vf r = at(et::kR5);
  r = vfma(r, v, at(et::kR4));
  r = vfma(r, v, at(et::kR3));
  r = vfma(r, v, at(et::kR2));
  r = vfma(r, v, at(et::kR1));
  r = vfma(r, v, at(et::kR0));
  return vcopysign(vfma(r, y, vselect(m0, y, at(et::kC0))), x);
}

}  // namespace normlab::vmath
