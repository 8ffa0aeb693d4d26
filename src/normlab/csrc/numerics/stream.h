// Non-temporal ("streaming") stores: an output written around the caches, so that they keep what
// the kernel reads again (the input of a second pass, the next rows). A kernel streams an output
// when the call's input and output together take more than half the last-level cache (a cache
// shared with the other cores): then the output would evict the input before its last pass, and
// its lines would be read from memory only to be overwritten (a store's read-for-ownership).
// The same bits as vstore; only where values land changes.
#pragma once

#include <immintrin.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "vec.h"

namespace normlab {

// The last-level cache's bytes: the highest level sysfs lists for cpu0 (sysconf's answer where it
// lists none -- in a virtual machine sysconf may give the host's), else 32 MiB.
inline int64_t llc_bytes() {
  static const int64_t bytes = [] {
    int64_t best_level = 0, best = 0;
    for (int k = 0; k < 16; ++k) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(k) + "/";
      std::ifstream lf(dir + "level"), sf(dir + "size");
      int64_t level = 0, size = 0;
      std::string unit;
      if (!(lf >> level) || !(sf >> size)) continue;
      sf >> unit;  // "32768K" reads as 32768, then "K"
      if (!unit.empty() && (unit[0] == 'K' || unit[0] == 'k')) size <<= 10;
      else if (!unit.empty() && unit[0] == 'M') size <<= 20;
      if (level > best_level) best_level = level, best = size;
    }
    if (best > 0) return best;
    const long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return v > 0 ? int64_t(v) : int64_t(32) << 20;
  }();
  return bytes;
}

// Whether a call that reads and writes `bytes` (inputs and outputs together) streams its output.
inline bool streams_output(int64_t bytes) { return bytes > llc_bytes() / 2; }

// Bytes of one vstore of storage S.
template <class S> constexpr int64_t vstore_bytes = vlanes<S> * int64_t(sizeof(S));

namespace detail {
// W bytes from t (64-byte aligned) to p (aligned to W) by non-temporal stores
template <int64_t W> inline void stream_bytes(void* p, const void* t) {
#if NORMLAB_VEC_BYTES == 64
  if constexpr (W == 64) {
    _mm512_stream_si512(static_cast<__m512i*>(p), _mm512_load_si512(t));
    return;
  }
#endif
#if NORMLAB_VEC_BYTES >= 32
  if constexpr (W == 32) {
    _mm256_stream_si256(static_cast<__m256i*>(p), _mm256_load_si256(static_cast<const __m256i*>(t)));
    return;
  }
#endif
  if constexpr (W == 8) {  // half precision at the baseline level: 4 lanes of 2 bytes (movnti)
    long long v8;
    std::memcpy(&v8, t, 8);
    _mm_stream_si64(static_cast<long long*>(p), v8);
  } else if constexpr (W == 16) {
    _mm_stream_si128(static_cast<__m128i*>(p), _mm_load_si128(static_cast<const __m128i*>(t)));
  } else {
    static_assert(W % 16 == 0, "vstream: a store of 8, 16 or a multiple of 16 bytes");
    for (int64_t k = 0; k < W; k += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(static_cast<char*>(p) + k),
                       _mm_load_si128(reinterpret_cast<const __m128i*>(static_cast<const char*>(t) + k)));
  }
}
}  // namespace detail

// vstore(p, v) as a non-temporal store where p is aligned to the store's bytes (a plain vstore
// elsewhere). fence_streams() before another thread may read the values.
template <class S> inline void vstream(S* p, vacc<S> v) {
  constexpr int64_t W = vstore_bytes<S>;
  if (reinterpret_cast<uintptr_t>(p) % W != 0) return vstore(p, v);
  alignas(64) S t[vlanes<S>];
  vstore(t, v);
  detail::stream_bytes<W>(p, t);
}
// vstore_eo (vec.h) the same way
template <bool NoNaN = false> inline void vstream_eo(bf16* p, vec<float> e, vec<float> o) {
  constexpr int64_t W = sizeof(vec<float>);
  if (reinterpret_cast<uintptr_t>(p) % W != 0) return vstore_eo<NoNaN>(p, e, o);
  alignas(64) bf16 t[2 * lanes<float>];
  vstore_eo<NoNaN>(t, e, o);
  detail::stream_bytes<W>(p, t);
}
inline void fence_streams() { _mm_sfence(); }

// The values [k, e) of the n from p that fill whole cache lines: a streamed output stores those
// with vstream and the values before k and from e on plainly (a line streamed in part and stored
// in part is written to memory in pieces: float16 rows of 1781 values ran 1.6x the time of rows
// of 1792). k is 0 or n for a line-aligned p.
struct Span {
  int64_t k, e;
};
template <class S> inline Span whole_lines(const S* p, int64_t n) {
  constexpr int64_t line = 64 / int64_t(sizeof(S));
  const int64_t off = int64_t(reinterpret_cast<uintptr_t>(p) % 64) / int64_t(sizeof(S));
  const int64_t k = off == 0 ? 0 : (line - off < n ? line - off : n);
  return {k, k + (n - k) / line * line};
}

}  // namespace normlab
