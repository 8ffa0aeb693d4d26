// Non-temporal ("streaming") stores: an output written around the caches, so that they keep what
// the kernel reads again (the input of a second pass, the next rows). A kernel streams an output
// when the call's input and output together take more than half the last-level cache (a cache
// shared with the other cores): then the output would evict the input before its last pass, and
// its lines would be read from memory only to be overwritten (a store's read-for-ownership).
// The same bits as vstore; only where values land changes.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

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
// Whether a forward pass streams its output y: as streams_output on one thread; on more, only
// where x and y together pass three quarters of the last level. Below it, plain stores leave y
// (and x) in the cache for whoever reads them next, and several threads' plain stores into the
// cache scale with the threads where streamed ones are bound by the memory's write bandwidth: two
// threads, x and y 16-21 MB, float32 eval forward BatchNorm2d 7x512x27x27 0.78x torch.nn streamed,
// 1.26x plain. Not the whole level: the cache is shared with the other cores (a virtual machine's
// neighbours too), and a call whose x and y nearly fill it finds x gone before its output pass.
// Measured 2026-12-07 (two threads, the builds' order rotated, x torch.nn, whole level -> three
// quarters): x and y 24-31 MB, channels-last GroupNorm(384, 384) float16 2x384x41x16x16 forward
// 0.64x -> 0.91x, GroupNorm(32, 512) bfloat16 2x512x143x47 0.79 -> 1.01, GroupNorm(32, 64)
// float32 16x64x56x56 0.85 -> 1.08 (NCHW 1.20 -> 1.50), BatchNorm2d 16x64x56x56 float32 eval
// forward 1.04 -> 1.36, training forward+backward 2.79 -> 3.32, 3x24x214x214 eval forward 1.19 ->
// 1.35; none lost (BatchNorm3d, LayerNorm, InstanceNorm, bfloat16 forward+backward). (One thread
// streams from half: 12x256x33x33 1.35x streamed, 1.26x plain; from three eighths GroupNorm gained
// 9-25 % and BatchNorm's evaluation forward, one pass over x, lost 2-16 %. A backward's dx keeps
// streams_output: it reads three tensors, and its forward's y, left in the cache, was x's room --
// the forward+backward cells lost 5-25 % with the forward's y plain, none below 1.0x.)
inline bool streams_forward(int64_t bytes) {
  return bytes > (at::get_num_threads() > 1 ? llc_bytes() / 4 * 3 : llc_bytes() / 2);
}
// streams_forward's rule with the whole last level at two or more threads (its rule before
// 2026-12-07), for the one forward measured to lose from three quarters: GroupNorm's long NCHW
// rows, whose output pass comes after every row's moments (group_norm_kernels.cpp, fwd_long_rows).
inline bool streams_forward_whole_level(int64_t bytes) {
  return bytes > (at::get_num_threads() > 1 ? llc_bytes() : llc_bytes() / 2);
}

// Whether an output written in runs of `run_bytes` (the planes of a channel, the channels of a
// group: one run after another, each run's whole lines streamed and its end lines plain) may
// stream: runs of whole cache lines at any length, others from 2048 bytes. Measured with the
// order of the contenders rotated between rounds (one thread, float32, x torch.nn, plain ->
// streamed): BatchNorm2d evaluation forward, runs of whole lines: 192 values 0.72 -> 1.36, 256
// 0.66 -> 1.38, 320 0.66 -> 1.37; GroupNorm(32, 256), 256 values: 0.73 -> 0.92 (two threads 1.07
// -> 1.84). Runs off whole lines: 196 values 0.98 -> 0.53 (BatchNorm training forward+backward
// 1.69 -> 1.55), 729 0.95 -> 0.92, 1000 0.77 -> 1.07, 1521 0.86 -> 1.10, 2025 1.03 -> 1.22.
inline bool streams_runs(int64_t run_bytes) { return run_bytes % 64 == 0 || run_bytes >= 2048; }

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

// An output made of runs of ns values back to back (the channels of a GroupNorm group row, a
// sample's planes in BatchNorm), ns at least the lanes (a vector spans at most two runs): mk(k)
// gives run k's functor r, and y[i] for the m <= L lanes at i = r(i, m); a vector across a run's
// end takes the lanes of run k + 1's from the end on (a blend of results: each lane's arithmetic
// is its own run's, the same bits as run by run). r is made once a run (its constants in
// registers: one functor call a vector, reloading its captures past the streamed stores and
// testing for a run's end each vector, ran GroupNorm(99, 99) 16x99x2100 float32 forward at 0.77x
// torch.nn where streaming each run alone ran 1.15x -- Zen 3, one thread). Stream: the whole lines
// of y streamed and the values before and after them plain, as partial vectors -- for runs that
// do not stream alone (streams_runs: short runs off whole lines) where the whole is long enough
// to. Not Stream: every vector stored plainly, the last partial -- short runs in cache, where a
// run's own partial last vector and its set-up cost as much as a quarter of its time (BatchNorm2d
// planes of 289 float16 values).
template <bool Stream, class S, class Mk> inline void write_runs(S* y, int64_t n, int64_t ns, const Mk& mk) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> lane;
  for (int64_t j = 0; j < L; ++j) lane[j] = A(j);
  const Span sp = Stream ? whole_lines(y, n) : Span{0, n / L * L};
  auto g = [&](int64_t i, int64_t m) {  // the m lanes at i: one run's, or a blend of two
    const int64_t k = i / ns, edge = (k + 1) * ns;
    if (i + m <= edge) return mk(k)(i, m);
    return lane >= A(edge - i) ? mk(k + 1)(i, m) : mk(k)(i, m);
  };
  auto put = [&](int64_t i, vec<A> v) {
    if constexpr (Stream) vstream(y + i, v);
    else vstore(y + i, v);
  };
  int64_t i = 0;
  for (; i < sp.k; i += L) {
    const int64_t m = std::min(L, sp.k - i);
    vstore_n(y + i, g(i, m), m);
  }
  for (i = sp.k; i < sp.e;) {
    const int64_t k = i / ns, edge = std::min(sp.e, (k + 1) * ns);
    const auto r = mk(k);
    for (; i + L <= edge; i += L) put(i, r(i, L));
    if (i < edge) put(i, g(i, L)), i += L;  // (across run k's end: edge < sp.e, whole vectors)
  }
  for (i = sp.e; i < n; i += L) {
    const int64_t m = std::min(L, n - i);
    vstore_n(y + i, g(i, m), m);
  }
}
template <class S, class Mk> inline void streamed_runs(S* y, int64_t n, int64_t ns, const Mk& mk) {
  write_runs<true>(y, n, ns, mk);
}

// A streamed output whose rows are not whole cache lines: y = out((x - h[j]) * a[j] + b[j]) over
// a run of n values that starts at column 0 (value o at column j = o mod c: rows of c values
// back to back, per-column constants), the run's whole lines streamed vector by vector
// (whole_lines), each vector's constants read at its first value's column j from copies extended
// past c (e[i] = v[i mod c]), the values before the first whole line and after the last stored
// plainly -- no line written partly streamed and partly plain. Each value's arithmetic is the
// row pass's: the same bits. bfloat16 in pairs of vectors (vload_eo / vstream_eo): the even
// values of a pair at column j = 2t are columns 2(t + k), e's even entries (h0[t + k], h0[i] =
// e[2i]); the odd ones e's odd entries (h1[t + k]); at j = 2t + 1, h1[t + k] and h0[t + 1 + k].
// out (on a vector) and out1 (on one value, returning S) apply what follows the affine step (an
// activation; the identity: out1 rounds to S). no_nan: no output can be NaN (bfloat16 stores
// leave their NaN test out: vstore_eo).
template <class S> class FlatConstants {
 public:
  using A = acc_t<S>;
  static constexpr bool kPairs = std::is_same_v<S, bf16>;
  FlatConstants(const A* h, const A* a, const A* b, int64_t c)
      : c_(c), ce_(c + 2 * vlanes<S> + 2), buf_((kPairs ? 6 : 3) * ce_) {  // (even: pairs read 2 past j + 2L)
    A* e = buf_.data();
    for (int64_t i = 0; i < ce_; ++i) e[i] = h[i % c], e[ce_ + i] = a[i % c], e[2 * ce_ + i] = b[i % c];
    if constexpr (kPairs) {  // h0, h1 of each: (6, ce / 2)
      const int64_t he = ce_ / 2;
      A* hv = e + 3 * ce_;
      for (int64_t q = 0; q < 3; ++q)
        for (int64_t i = 0; i < he; ++i)
          hv[2 * q * he + i] = e[q * ce_ + 2 * i], hv[(2 * q + 1) * he + i] = e[q * ce_ + 2 * i + 1];
    }
  }
  int64_t c() const { return c_; }
  int64_t ce() const { return ce_; }
  const A* e(int64_t q) const { return buf_.data() + q * ce_; }  // q: 0 h, 1 a, 2 b
  const A* halves() const { return buf_.data() + 3 * ce_; }

 private:
  int64_t c_, ce_;
  std::vector<A> buf_;
};

template <class S, class Out, class Out1>
void stream_affine_flat(const S* x, S* y, int64_t n, const FlatConstants<S>& k, bool no_nan, const Out& out,
                        const Out1& out1) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t c = k.c();
  const A *eh = k.e(0), *ea = k.e(1), *eb = k.e(2);
  const Span sp = whole_lines(y, n);
  auto one = [&](int64_t o) {
    const int64_t j = o % c;
    y[o] = out1((to_acc(x[o]) - eh[j]) * ea[j] + eb[j]);
  };
  for (int64_t o = 0; o < sp.k; ++o) one(o);
  int64_t j = sp.k % c;
  if constexpr (FlatConstants<S>::kPairs) {  // (a line is a whole number of pairs at every level)
    const int64_t he = k.ce() / 2;
    const A* h = k.halves();
    auto pairs = [&]<bool NoNaN>() {
      for (int64_t o = sp.k; o < sp.e; o += 2 * L) {
        const int64_t t = j >> 1, odd = j & 1;
        const int64_t ie = odd * he + t, io = (1 - odd) * he + t + odd;  // into h0 / h1 of each
        vec<A> ve, vo;
        vload_eo(x + o, ve, vo);
        ve = out((ve - vload(h + ie)) * vload(h + 2 * he + ie) + vload(h + 4 * he + ie));
        vo = out((vo - vload(h + io)) * vload(h + 2 * he + io) + vload(h + 4 * he + io));
        vstream_eo<NoNaN>(y + o, ve, vo);
        for (j += 2 * L; j >= c;) j -= c;
      }
    };
    if (no_nan) pairs.template operator()<true>();
    else pairs.template operator()<false>();
  } else {
    (void)no_nan;
    for (int64_t o = sp.k; o < sp.e; o += L) {
      vstream(y + o, out((vload(x + o) - vload(eh + j)) * vload(ea + j) + vload(eb + j)));
      for (j += L; j >= c;) j -= c;
    }
  }
  for (int64_t o = sp.e; o < n; ++o) one(o);
  fence_streams();
}

}  // namespace normlab
