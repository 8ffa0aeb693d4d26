// Half-precision storage types and their scalar conversions to and from float.
//
// bf16 and f16 are the bits of torch's at::BFloat16 / at::Half (same size and layout, so a
// tensor's data pointer can be reinterpreted as one), kept free of torch headers so that the
// kernel translation units compile in well under a second. Conversions to float are exact;
// conversions from float round to nearest even, NaN stays NaN -- as torch rounds.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace normlab {

struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

// The accumulation type of a storage type: float64 for float64, float32 otherwise.
template <class S> struct acc_type { using type = float; };
template <> struct acc_type<double> { using type = double; };
template <class S> using acc_t = typename acc_type<S>::type;

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float to_float(bf16 h) { return bits_to_float(uint32_t(h.bits) << 16); }
inline bf16 to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if (f != f) return bf16{uint16_t(0x7FC0)};  // torch's quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);             // round to nearest, ties to even
  return bf16{uint16_t(u >> 16)};
}

// (With F16C, the instruction itself: GCC folds float(_Float16) into a float64 conversion where the
// result is widened to double, and that one is a library call -- BatchNorm's float16 parameters
// took 40 % of a BatchNorm2d(512) call on 8x8 planes. Without F16C -- the entry code that reads
// parameters, the baseline kernels -- float(_Float16) is libgcc's __extendhfsf2, a call a value:
// 13 % of a channels-last float16 GroupNorm(1, 2048) forward on 2x2048x7x7, its 4096 parameters
// converted. So the bits are moved instead: exact, no call.)
inline float f16_bits_to_float(uint16_t h) {
  const uint32_t em = uint32_t(h & 0x7FFFu) << 13;  // exponent and mantissa at float's positions
  const uint32_t e = em & (0x1Fu << 23);
  uint32_t o = em + ((127u - 15u) << 23);  // rebias the exponent
  if (e == (0x1Fu << 23)) {
    o += (128u - 16u) << 23;  // infinity, NaN: float's top exponent
    if (em & 0x7FE000u) o |= 0x400000u;  // a NaN comes out quiet, as the instruction's does
  } else if (e == 0) {
    // zero, subnormal: 2^-14 (1 + m / 1024) - 2^-14 = m 2^-24, exact (zero's bits 0)
    o = float_to_bits(bits_to_float(o + (1u << 23)) - bits_to_float(113u << 23));
  }
  return bits_to_float(o | (uint32_t(h & 0x8000u) << 16));
}
inline float to_float(f16 h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return f16_bits_to_float(h.bits);
#endif
}
inline f16 to_f16(float f) { _Float16 v = (_Float16)f; f16 h; std::memcpy(&h.bits, &v, 2); return h; }

// to_acc(s): the value in the accumulation type; from_acc<S>(a): rounded once to storage S.
inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }
inline float to_acc(bf16 v) { return to_float(v); }
inline float to_acc(f16 v) { return to_float(v); }

template <class S> inline S from_acc(acc_t<S> v);
template <> inline float from_acc<float>(float v) { return v; }
template <> inline double from_acc<double>(double v) { return v; }
template <> inline bf16 from_acc<bf16>(float v) { return to_bf16(v); }
template <> inline f16 from_acc<f16>(float v) { return to_f16(v); }

// round_as<S>(a): a rounded to storage S and back (the value a kernel would store).
template <class S> inline acc_t<S> round_as(acc_t<S> v) { return to_acc(from_acc<S>(v)); }

}  // namespace normlab
