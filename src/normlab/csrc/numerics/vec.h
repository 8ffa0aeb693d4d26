// Explicit SIMD: vectors of the accumulation type with loads and stores from every storage type.
//
// Written with GCC/Clang vector extensions, so the same source is compiled to AVX-512, AVX2 or
// SSE registers by the flags of the build (setup.py picks one level for the whole extension and
// records it; normlab refuses to load on a CPU without it). Every sum that crosses lanes is
// written out (hsum): the order of additions is fixed by this source, not by the compiler, and
// the build never allows reassociation or contraction (-ffp-contract=off, no -ffast-math), so
// a kernel gives the same bits whatever the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "half.h"

#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define NORMLAB_VEC_BYTES 64
#elif defined(__AVX2__)
#define NORMLAB_VEC_BYTES 32
#else
#define NORMLAB_VEC_BYTES 16
#endif

namespace normlab {

template <class T> struct vec_of { typedef T type __attribute__((vector_size(NORMLAB_VEC_BYTES))); };
template <class T> using vec = typename vec_of<T>::type;       // a register of T
template <class T> constexpr int64_t lanes = NORMLAB_VEC_BYTES / sizeof(T);

// The vector a storage type S loads into: lanes<acc_t<S>> values of its accumulation type.
template <class S> using vacc = vec<acc_t<S>>;
template <class S> constexpr int64_t vlanes = lanes<acc_t<S>>;

template <class T> inline vec<T> vset1(T v) { return vec<T>{} + v; }
template <class T> inline vec<T> vzero() { return vec<T>{}; }

namespace detail {
typedef uint16_t u16v __attribute__((vector_size(NORMLAB_VEC_BYTES / 2)));
typedef uint32_t u32v __attribute__((vector_size(NORMLAB_VEC_BYTES)));
typedef int32_t i32v __attribute__((vector_size(NORMLAB_VEC_BYTES)));
typedef _Float16 h16v __attribute__((vector_size(NORMLAB_VEC_BYTES / 2)));
}  // namespace detail

// vload(p): vlanes<S> values from p (no alignment needed), in the accumulation type.
inline vec<float> vload(const float* p) { vec<float> v; std::memcpy(&v, p, sizeof v); return v; }
inline vec<double> vload(const double* p) { vec<double> v; std::memcpy(&v, p, sizeof v); return v; }
// (The half-precision loads and the float16 store are written with the instructions themselves
// where the build has them: GCC compiles the generic forms to a split zero-extension for bfloat16
// and to one scalar conversion per lane for float16 without AVX512-FP16. Same values.)
inline vec<float> vload(const bf16* p) {
#if NORMLAB_VEC_BYTES == 64  // one widening load (GCC splits the generic one into halves)
  __m512i u = _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  vec<float> r; std::memcpy(&r, &u, sizeof r); return r;
#elif NORMLAB_VEC_BYTES == 32  // one vpmovzxwd from memory and a shift (GCC: two halves, an insert)
  const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  vec<float> r; std::memcpy(&r, &u, sizeof r); return r;
#else
  detail::u16v h; std::memcpy(&h, p, sizeof h);
  detail::u32v u = __builtin_convertvector(h, detail::u32v) << 16;
  vec<float> v; std::memcpy(&v, &u, sizeof v); return v;
#endif
}
// (maskz forms with a full mask: the plain intrinsics trip GCC 12's -Wmaybe-uninitialized.)
// float16: the CPU's conversion instructions (GCC scalarises a _Float16 vector conversion without
// AVX512-FP16: one instruction and two shuffles per value); the same bits (nearest even, NaN quiet).
inline vec<float> vload(const f16* p) {
#if NORMLAB_VEC_BYTES == 64
  __m512 v = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  vec<float> r; std::memcpy(&r, &v, sizeof r); return r;
#elif NORMLAB_VEC_BYTES == 32 && defined(__F16C__)
  __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  vec<float> r; std::memcpy(&r, &v, sizeof r); return r;
#else
  detail::h16v h; std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vec<float>);
#endif
}

// lanes<double> floats at p as a vector of float64 (one vcvtps2pd from memory: GCC 12 splits the
// generic conversion into two halves and an insert).
inline vec<double> vload_widen(const float* p) {
#if NORMLAB_VEC_BYTES == 64
  __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(p));
  vec<double> r; std::memcpy(&r, &v, sizeof r); return r;
#elif NORMLAB_VEC_BYTES == 32
  __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(p));
  vec<double> r; std::memcpy(&r, &v, sizeof r); return r;
#else
  typedef float h_t __attribute__((vector_size(NORMLAB_VEC_BYTES / 2)));
  h_t h; std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vec<double>);
#endif
}

// vstore(p, v): v rounded once to storage S (nearest even; NaN stays NaN), stored at p.
inline void vstore(float* p, vec<float> v) { std::memcpy(p, &v, sizeof v); }
inline void vstore(double* p, vec<double> v) { std::memcpy(p, &v, sizeof v); }
inline void vstore(bf16* p, vec<float> v) {
#if NORMLAB_VEC_BYTES == 64
  // r = u + 0x7FFF + (bit 16 of u): the lsb as a mask (vptestmd) and a masked add; the high words
  // picked by one word permute; NaN lanes then take 0x7FC0 (a masked word move). Three fewer
  // instructions than the generic form below (GCC: two shifts, two zeroing moves, a blend); the
  // same bits for every float (checked on all 2^32).
  __m512i u; std::memcpy(&u, &v, sizeof u);
  const __mmask16 odd = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000));
  const __m512i base = _mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF));
  const __m512i r = _mm512_mask_add_epi32(base, odd, base, _mm512_set1_epi32(1));
  const __m512i hi = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                      23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  __m256i h = _mm512_castsi512_si256(_mm512_permutexvar_epi16(hi, r));
  __m512 f; std::memcpy(&f, &v, sizeof f);
  h = _mm256_mask_mov_epi16(h, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm256_set1_epi16(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
#elif NORMLAB_VEC_BYTES == 32
  // The rule below in nine instructions: NaN lanes blended to 0x7FC0, the two halves' words packed
  // by one vpackusdw (every word is at most 0xFFFF: no saturation). GCC's generic form: thirteen.
  __m256i u; std::memcpy(&u, &v, sizeof u);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  __m256 f; std::memcpy(&f, &v, sizeof f);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
#else
  detail::u32v u; std::memcpy(&u, &v, sizeof u);
  detail::u32v r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  detail::i32v nan = v != v;                                 // -1 where NaN
  r = (detail::u32v)((detail::i32v)r & ~nan) | ((detail::u32v)nan & 0x7FC0u);
  detail::u16v h = __builtin_convertvector(r, detail::u16v);
  std::memcpy(p, &h, sizeof h);
#endif
}
inline void vstore(f16* p, vec<float> v) {
#if NORMLAB_VEC_BYTES == 64
  __m512 a; std::memcpy(&a, &v, sizeof a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtps_ph(0xFFFF, a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif NORMLAB_VEC_BYTES == 32 && defined(__F16C__)
  __m256 a; std::memcpy(&a, &v, sizeof a);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  detail::h16v h = __builtin_convertvector(v, detail::h16v);
  std::memcpy(p, &h, sizeof h);
#endif
}

// bfloat16 two vectors at a time, even and odd elements apart. vload_eo(p, e, o): the 2 * lanes<float>
// values at p as the floats of the even ones (e) and of the odd ones (o) -- a shift and a mask on
// the words as they lie, where a load in order widens with a zero-extension per vector.
// vstore_eo(p, e, o) puts them back in order, each rounded as vstore rounds (NaN lanes to 0x7FC0;
// NoNaN: the caller knows no lane is NaN and the test is left out), as one vector store: no packing
// of halves, no permute. Per-channel vectors beside them are read in the same order (eo_order).
// Generic forms: the same few instructions at every level.
inline void vload_eo(const bf16* p, vec<float>& e, vec<float>& o) {
  detail::u32v w;
  std::memcpy(&w, p, sizeof w);
  const detail::u32v we = w << 16, wo = w & 0xFFFF0000u;
  std::memcpy(&e, &we, sizeof e);
  std::memcpy(&o, &wo, sizeof o);
}
namespace detail {
// v rounded to bfloat16 (nearest even), in the high word of each lane; the low word is left over
template <bool NoNaN> inline u32v bf16_high(vec<float> v) {
  u32v u;
  std::memcpy(&u, &v, sizeof u);
  u32v r = u + 0x7FFFu + ((u >> 16) & 1u);
  if constexpr (!NoNaN) {
    const i32v nan = v != v;  // -1 where NaN
    r = (u32v)(((i32v)r & ~nan) | (nan & 0x7FC00000));
  }
  return r;
}
}  // namespace detail
// v rounded to bfloat16 and widened back, in registers: the bits of vstore then vload (nearest
// even; NaN lanes the quiet NaN 0x7FC0) without the trip through memory.
inline vec<float> vround_bf16(vec<float> v) {
  const detail::u32v r = detail::bf16_high<false>(v) & 0xFFFF0000u;
  vec<float> f;
  std::memcpy(&f, &r, sizeof f);
  return f;
}
template <bool NoNaN = false> inline void vstore_eo(bf16* p, vec<float> e, vec<float> o) {
  const detail::u32v w = (detail::bf16_high<NoNaN>(e) >> 16) | (detail::bf16_high<NoNaN>(o) & 0xFFFF0000u);
  std::memcpy(p, &w, sizeof w);
}
// Whether y = (x - m) * a + b (or with more constants added) can be NaN only where x is NaN or
// infinite: the scale a not zero and every constant finite -- y then at worst overflows to an
// infinity. An output pass whose constants come from x's own statistics (a mean is finite only
// where every value it holds is) may then leave vstore_eo's NaN test out.
template <class A, class... C> inline bool nan_free_affine(A a, C... c) {
  return a != A(0) && std::isfinite(a) && (std::isfinite(c) && ...);
}
// The same for every column j of y = (x - h[j]) * a[j] + b[j], j < n.
template <class A> inline bool nan_free_affines(const A* h, const A* a, const A* b, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if (!nan_free_affine(a[j], h[j], b[j])) return false;
  return true;
}
// y = f(x) over the first m values of a bfloat16 run of n, m the most that make whole pairs of
// vectors (f elementwise, the same for every value); returns m.
template <bool NoNaN = false, class F> inline int64_t eo_map(const bf16* x, bf16* y, int64_t n, const F& f) {
  constexpr int64_t P = 2 * lanes<float>;
  int64_t j = 0;
  for (; j + P <= n; j += P) {
    vec<float> e, o;
    vload_eo(x + j, e, o);
    vstore_eo<NoNaN>(y + j, f(e), f(o));
  }
  return j;
}
// out = v (n values, n a multiple of 2 * lanes<T>) in the order vload_eo reads a pair of vectors:
// per block of 2 * lanes<T>, the even-indexed values, then the odd ones.
template <class T> inline void eo_order(const T* v, int64_t n, T* out) {
  constexpr int64_t L = lanes<T>;
  for (int64_t j0 = 0; j0 < n; j0 += 2 * L)
    for (int64_t k = 0; k < L; ++k) out[j0 + k] = v[j0 + 2 * k], out[j0 + L + k] = v[j0 + 2 * k + 1];
}

// Partial vectors for the tail of a row: n <= vlanes<S> values, the rest zero, and v's first n lanes
// stored at p. With AVX-512 one masked load / store (no byte past the n values is touched: a tail
// of scalar conversions otherwise costs as much as a quarter of a short run's vectors); otherwise
// as below. The values and roundings of the full-width loads and stores, lane by lane.
#if NORMLAB_VEC_BYTES == 64
template <class S> inline vacc<S> vload_n(const S* p, int64_t n) {
  if constexpr (std::is_same_v<S, float>) {
    return (vec<float>)_mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p);
  } else if constexpr (std::is_same_v<S, double>) {
    return (vec<double>)_mm512_maskz_loadu_pd(__mmask8((1u << n) - 1), p);
  } else {  // bf16, f16: widened as vload does
    static_assert(sizeof(S) == 2, "vload_n: float, double, bf16 or f16");
    const __m256i h = _mm256_maskz_loadu_epi16(__mmask16((1u << n) - 1), p);
    if constexpr (std::is_same_v<S, f16>) {
      return (vec<float>)_mm512_maskz_cvtph_ps(0xFFFF, h);
    } else {
      return (vec<float>)_mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
    }
  }
}
template <class S> inline void vstore_n(S* p, vacc<S> v, int64_t n) {
  if constexpr (std::is_same_v<S, float>) {
    _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1), (__m512)v);
  } else if constexpr (std::is_same_v<S, double>) {
    _mm512_mask_storeu_pd(p, __mmask8((1u << n) - 1), (__m512d)v);
  } else {  // rounded as vstore does, then the n half values stored
    static_assert(sizeof(S) == 2, "vstore_n: float, double, bf16 or f16");
    S t[16];
    vstore(t, v);
    _mm256_mask_storeu_epi16(p, __mmask16((1u << n) - 1), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
  }
}
#elif NORMLAB_VEC_BYTES == 32
// AVX2: loads by vmaskmov / vpmaskmovd (masked lanes read nothing, fault nothing); a half row's
// odd last value blended in from a broadcast. Stores through an aligned buffer in pieces of
// fixed size (4, 2, 1 values): masked stores are microcoded on some AMD cores, and a buffer with a
// variable-length memcpy was a call to memcpy a tail, load and store alike.
namespace detail {
alignas(32) inline constexpr int32_t kLaneMask32[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
alignas(32) inline constexpr int64_t kLaneMask64[8] = {-1, -1, -1, -1, 0, 0, 0, 0};
alignas(16) inline constexpr uint16_t kLaneMask16[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0xFFFF, 0, 0, 0, 0, 0, 0, 0};
// the first n (<= 8) half values at p in the low words, the rest zero
inline __m128i load_halves_n(const void* p, int64_t n) {
  const __m128i pairs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kLaneMask32 + 8 - n / 2));
  __m128i h = _mm_maskload_epi32(static_cast<const int*>(p), pairs);
  if (n & 1) {
    uint16_t last;
    std::memcpy(&last, static_cast<const char*>(p) + 2 * (n - 1), 2);
    const __m128i at = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kLaneMask16 + 8 - (n - 1)));
    h = _mm_blendv_epi8(h, _mm_set1_epi16(short(last)), at);
  }
  return h;
}
// n (< L) values of T from buf (aligned, whole vector) to p, in pieces of fixed size
template <class T, int64_t L> inline void store_pieces(T* p, const T* buf, int64_t n) {
  int64_t o = 0;
  if constexpr (L >= 8) if (n & 4) { std::memcpy(p, buf, 4 * sizeof(T)); o = 4; }
  if (n & 2) { std::memcpy(p + o, buf + o, 2 * sizeof(T)); o += 2; }
  if (n & 1) std::memcpy(p + o, buf + o, sizeof(T));
}
}  // namespace detail
template <class S> inline vacc<S> vload_n(const S* p, int64_t n) {
  if constexpr (std::is_same_v<S, float>) {
    return (vec<float>)_mm256_maskload_ps(p, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(detail::kLaneMask32 + 8 - n)));
  } else if constexpr (std::is_same_v<S, double>) {
    return (vec<double>)_mm256_maskload_pd(p, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(detail::kLaneMask64 + 4 - n)));
  } else {  // bf16, f16: widened as vload does
    static_assert(sizeof(S) == 2, "vload_n: float, double, bf16 or f16");
    const __m128i h = detail::load_halves_n(p, n);
    if constexpr (std::is_same_v<S, bf16>) {
      const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      vec<float> r; std::memcpy(&r, &f, sizeof r); return r;
    } else {  // float16 as vload converts it (F16C where the build has it)
      alignas(16) S t[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(t), h);
      return vload(t);
    }
  }
}
template <class S> inline void vstore_n(S* p, vacc<S> v, int64_t n) {
  if (n == vlanes<S>) return vstore(p, v);
  alignas(32) S buf[vlanes<S>];
  vstore(buf, v);
  detail::store_pieces<S, vlanes<S>>(p, buf, n);
}
#else
template <class S> inline vacc<S> vload_n(const S* p, int64_t n) {
  S buf[vlanes<S>];
  std::memset(buf, 0, sizeof buf);
  std::memcpy(buf, p, n * sizeof(S));
  return vload(buf);
}
template <class S> inline void vstore_n(S* p, vacc<S> v, int64_t n) {
  S buf[vlanes<S>];
  vstore(buf, v);
  std::memcpy(p, buf, n * sizeof(S));
}
#endif

// hsum(v): the sum of v's lanes as a fixed tree (halves added pairwise: lane i + lane i + w for
// w = lanes / 2, ..., 1), the same bits on any run. Written as half-width vector adds, so it
// compiles to a few shuffles and adds (a loop over an array compiled to stores and scalar adds).
namespace detail {
template <class T, int64_t N> struct vec_n { typedef T type __attribute__((vector_size(N * sizeof(T)))); };
template <class T, int64_t N> inline T hsum_n(typename vec_n<T, N>::type v) {
  if constexpr (N == 2) {
    return v[0] + v[1];
  } else {
    typename vec_n<T, N / 2>::type lo, hi;
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    return hsum_n<T, N / 2>(lo + hi);
  }
}
}  // namespace detail

template <class T> inline T hsum(vec<T> v) { return detail::hsum_n<T, lanes<T>>(v); }

}  // namespace normlab
