// GroupNorm / InstanceNorm over group rows: contiguous (NCHW) x viewed as (N*G, Cg, S), one group per
// row of Cg*S contiguous values; also every input with S == 1 (there a row is a group's Cg channels).
// And InstanceNorm's running-statistics update. Layouts and conventions: group_norm_kernels.h.
#include "cpu/group_norm_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cpu/group_norm_sums.h"
#include "numerics/chunks.h"
#include "numerics/moments.h"
#include "numerics/relu_bound.h"
#include "numerics/prefetch.h"
#include "numerics/vec.h"

namespace normlab::group_norm {

namespace {

// y[k] = act(((x[k] - shift) - md) * (rs * w[k]) + b[k]) over the n channels of an S == 1 group row.
template <class S, int Act>
inline void affine_channels(const S* x, S* y, int64_t n, acc_t<S> shift, acc_t<S> md, acc_t<S> rs,
                            const acc_t<S>* w, const acc_t<S>* b, acc_t<S> p) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> vs = vset1<A>(shift), vm = vset1<A>(md), vr = vset1<A>(rs);
  int64_t j = 0;
  for (; j + L <= n; j += L)
    vstore(y + j, out_act<S, Act>(((vload(x + j) - vs) - vm) * (vr * vload(w + j)) + vload(b + j), p));
  for (; j < n; ++j) y[j] = out_act1<S, Act>(((to_acc(x[j]) - shift) - md) * (rs * w[j]) + b[j], p);
}

// dx[j] = (dy[j] * a - (x[j] - m) * t3) - t2 over a run of n values (one channel); Stream: its
// aligned vectors stored past the caches (numerics/stream.h; fence_streams() before the values
// are read by another thread), the same bits.
// R: dy read as relu's dz (numerics/relu_bound.h, relu_masked; sg, tt the channel's).
template <class S, bool Stream, bool R = false>
inline void grad_run_as(const S* dy, const S* x, S* dx, int64_t n, acc_t<S> m, acc_t<S> a, acc_t<S> t2, acc_t<S> t3,
                        acc_t<S> sg = 0, acc_t<S> tt = 0) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> vm = vset1<A>(m), va = vset1<A>(a), v2 = vset1<A>(t2), v3 = vset1<A>(t3), vs = vset1<A>(sg), vt = vset1<A>(tt);
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    const vec<A> xv = vload(x + j);
    const vec<A> v = (act::relu_masked<R>(vload(dy + j), xv, vs, vt) * va - (xv - vm) * v3) - v2;
    if constexpr (Stream) vstream(dx + j, v);
    else vstore(dx + j, v);
  }
  for (; j < n; ++j) {
    const A xs = to_acc(x[j]);
    dx[j] = from_acc<S>((act::relu_masked<R>(to_acc(dy[j]), xs, sg, tt) * a - (xs - m) * t3) - t2);
  }
}
template <class S, bool R = false>
inline void grad_run(const S* dy, const S* x, S* dx, int64_t n, acc_t<S> m, acc_t<S> a, acc_t<S> t2, acc_t<S> t3,
                     bool stream, acc_t<S> sg = 0, acc_t<S> tt = 0) {
  if (stream) grad_run_as<S, true, R>(dy, x, dx, n, m, a, t2, t3, sg, tt);
  else grad_run_as<S, false, R>(dy, x, dx, n, m, a, t2, t3, sg, tt);
}

// dx[j] = dy[j] * a over a run of n values (term 1 alone: fixed statistics); Stream as grad_run_as.
template <class S, bool Stream> inline void scale_run_as(const S* dy, S* dx, int64_t n, acc_t<S> a) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> va = vset1<A>(a);
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    if constexpr (Stream) vstream(dx + j, vload(dy + j) * va);
    else vstore(dx + j, vload(dy + j) * va);
  }
  for (; j < n; ++j) dx[j] = from_acc<S>(to_acc(dy[j]) * a);
}
template <class S> inline void scale_run(const S* dy, S* dx, int64_t n, acc_t<S> a, bool stream) {
  if (stream) scale_run_as<S, true>(dy, dx, n, a);
  else scale_run_as<S, false>(dy, dx, n, a);
}

// Whether a backward over `values` values of runs of ns streams dx: what its dx pass reads and
// writes (`tensors` tensors) passes half the last level (stream.h, streams_output) and its runs
// gain by it (streams_runs) -- as BatchNorm's dx. Measured (one thread unless said, x torch.nn,
// plain -> streamed, the order rotated): GroupNorm(8, 512) 48x512x8x8 float32 forward+backward
// 0.87 -> 1.13 (two threads 0.89 -> 1.15), GroupNorm(32, 128) 16x128x32x32 1.03 -> 1.30,
// GroupNorm(32, 256) 8x256x28x28 two threads 1.08 -> 1.24, float16 8x64x112x112 3.10 -> 3.39;
// bfloat16 16x256x28x28 1.17 -> 1.15 (even). Runs of 196 float32 values (784 bytes, off whole
// lines) lose: 32x256x14x14 1.10 -> 0.83, so they stay plain.
template <class S> inline bool streams_dx(int64_t values, int64_t ns, int64_t tensors) {
  return streams_runs(ns * int64_t(sizeof(S))) && streams_output(tensors * values * int64_t(sizeof(S)));
}

// shifted_sum / shifted_sqdev of a row shorter than a vector: their vector loops do not run, so
// their sum is 0 + the scalar tail in order -- the same additions, without the empty lane sums.
template <class S> inline acc_t<S> small_shifted_sum(const S* x, int64_t n, acc_t<S> shift) {
  acc_t<S> s = acc_t<S>(0);
  for (int64_t j = 0; j < n; ++j) s += to_acc(x[j]) - shift;
  return s;
}
template <class S> inline acc_t<S> small_shifted_sqdev(const S* x, int64_t n, acc_t<S> shift, acc_t<S> m) {
  acc_t<S> s = acc_t<S>(0);
  for (int64_t j = 0; j < n; ++j) {
    acc_t<S> e = (to_acc(x[j]) - shift) - m;
    s += e * e;
  }
  return s;
}

// The first two passes of shifted_sum / shifted_sqdev (numerics/moments.h) over a group row, with
// the row's differences kept in scratch (accumulation type): pass 1 (shifted_sum_into) stores
// d = x - shift, pass 2 (center_in_place) reads d and stores e = d - m in its place. The same
// differences added in the same order (two vector chains, hsum, the scalar tail), so the same sums; the output pass then reads e and
// converts nothing (a bfloat16 / float16 row is widened once, not three times).
// ahead: a cache line at ahead + k * ahead_step asked for at each step k (two vectors).
template <class A>
inline A center_in_place(A* d, int64_t n, A m, const char* ahead = nullptr, int64_t ahead_step = 0) {
  constexpr int64_t L = lanes<A>;
  vec<A> s0 = vzero<A>(), s1 = vzero<A>(), vm = vset1<A>(m);
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    if (ahead != nullptr) __builtin_prefetch(ahead + (j / (2 * L)) * ahead_step, 0, 3);
    const vec<A> e = vload(d + j) - vm, f = vload(d + j + L) - vm;
    vstore(d + j, e);
    vstore(d + j + L, f);
    s0 += e * e;
    s1 += f * f;
  }
  if (j + L <= n) {
    const vec<A> e = vload(d + j) - vm;
    vstore(d + j, e);
    s0 += e * e;
    j += L;
  }
  A s = hsum<A>(s0 + s1);
  for (; j < n; ++j) {
    const A e = d[j] - m;
    d[j] = e;
    s += e * e;
  }
  return s;
}

// y[j] = act(e[j] * a + bc) over n values (the output from the centred differences e of scratch),
// and y[j] = act(e[j] * (rs * w[j]) + b[j]) (S == 1: one value per channel).
template <class S, int Act>
inline void scale_shift_run(const acc_t<S>* e, S* y, int64_t n, acc_t<S> a, acc_t<S> bc, acc_t<S> p) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const vec<A> va = vset1<A>(a), vb = vset1<A>(bc);
  int64_t j = 0;
  for (; j + L <= n; j += L) vstore(y + j, out_act<S, Act>(vload(e + j) * va + vb, p));
  if constexpr (Act != act::kIdentity) {  // the tail as one partial vector (one activation, not one a value)
    if (j < n) vstore_n(y + j, out_act<S, Act>(vload_n(e + j, n - j) * va + vb, p), n - j);
    return;
  }
  for (; j < n; ++j) y[j] = out_act1<S, Act>(e[j] * a + bc, p);
}
// y[i] = act(e[i] * a[i / ns] + b[i / ns]) over a row of n values from its differences e (scratch;
// half precision, ns >= the lanes), streamed as one run (numerics/stream.h, streamed_runs) -- so
// that only the row's two end lines are plain (streaming each channel's run, each run's end lines
// plain: the slower in half precision, see fwd_long_rows). Each value's arithmetic is
// scale_shift_run's vector form: the same bits.
template <class S, int Act>
void stream_scale_shift_row(const acc_t<S>* e, S* y, int64_t n, int64_t ns, const acc_t<S>* a, const acc_t<S>* b,
                            acc_t<S> p) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  streamed_runs(y, n, ns, [&](int64_t j) {
    return [e, p, va = vset1<A>(a[j]), vb = vset1<A>(b[j])](int64_t i, int64_t m) {
      const vec<A> z = m == L ? vload(e + i) : vload_n(e + i, m);
      return out_act<S, Act>(z * va + vb, p);
    };
  });
}

template <class S, int Act>
inline void scale_shift_channels(const acc_t<S>* e, S* y, int64_t n, acc_t<S> rs, const acc_t<S>* w, const acc_t<S>* b,
                                 acc_t<S> p) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const vec<A> vr = vset1<A>(rs);
  int64_t j = 0;
  for (; j + L <= n; j += L) vstore(y + j, out_act<S, Act>(vload(e + j) * (vr * vload(w + j)) + vload(b + j), p));
  for (; j < n; ++j) y[j] = out_act1<S, Act>(e[j] * (rs * w[j]) + b[j], p);
}

// Channel runs shorter than this many values take the activation (GroupNormAct) in a loop over the
// row after its output pass (the row in L1/L2), not inside each run: the activation's constants are
// set up per loop, which a run of 196 values paid 12 vectors a time for (same values either way).
constexpr int64_t kShortRun = 1024;
// Half-precision output always so: the activation reads the row as stored (rounded), which the
// inline form reaches through a store and a load of every vector.
template <class S> constexpr bool kHalf = sizeof(S) < sizeof(acc_t<S>);
// ReLU neither: it has no constants to set up and gives the same bits on z or on z rounded (relu
// of a rounded value is the rounding of its relu), so it runs inside every run (GroupNormAct(32,
// 256) relu on 32x256x14x14 float32, one thread: forward 1.4x -> ~1.1x the plain GroupNorm).
template <class S, int Act> constexpr bool kActAfterRow(int64_t ns) {
  return Act != act::kIdentity && Act != act::kRelu && (ns < kShortRun || kHalf<S>);
}
// Rows of up to this many values keep their differences in scratch (64 KiB of float32: L2).
constexpr int64_t kScratchValues = 16384;
// A row's passes ask for the bytes of x this far ahead (a few rows of a (256, 256, 8, 8) input):
// the hardware prefetcher alone starts each row late. Measured: float32 (256, 256, 8, 8) forward
// ~20 % faster, bfloat16 ~8 %.
constexpr int64_t kAheadBytes = 4096;

// ----------------------------------------------------------------------------------------------
// Long group rows (Cg * S > kScratchValues): a group of a large image at batch 1, up to and past
// 2^31 values. The rule, from the shape alone:
//   forward: a row is cut into P = ceil(ncols / kPartValues) parts (at most 64) of whole cache
//     lines -- one part if the row fits 8 MiB (its second read comes from L3) and there are at
//     least 4 rows; a task is one (row, part), reading its part in pieces of kScratchValues values, two
//     passes over each piece in cache; the pieces' (count, mean, M2) merged in float64 (Chan) in
//     order, the parts of a row merged in part order. Then one elementwise pass over (row, part)
//     tasks writes y; a row of one part (<= 64K values, in L2) is written by its task at once. y
//     streams past the caches when x and y exceed half the last level (half precision: where a
//     channel's run is whole cache lines): the row's third read then
//     finds x still in L3, and y's lines are not read for ownership (GroupNorm(1, 154) on
//     11x154x41x9x9 float32: 0.90-1.02x -> 1.05-1.19x torch; GroupNorm(32, 256) on 4x256x64x64
//     0.87-0.99x -> 1.14-1.25x; pieces of 4096 values instead, for a second pass from L1: no gain). (A row summed in float32 lanes stops growing once a lane passes 2^24 times
//     its values: a (1, 2, 32768, 32768) GroupNorm(1, 2) gave y = 1 where torch gives 2.33.)
//   backward: a task is one (row, channel of the group); its run of S values is summed in pieces
//     of kScratchValues in the accumulation dtype, the pieces added in float64 in order.
// Same bits for any number of threads; scratch: (rows, P) float64 partials, freed on return.
constexpr int64_t kPartValues = 65536;
// The forward's pieces: float32 chains of 512 terms a lane at every level (16384 values on
// AVX-512's 16 lanes, 4096 on the baseline's 4: there, 16384 put y of a long row at 7x its
// rounding error at a mean of 1e4).
template <class S> constexpr int64_t kPiece = kScratchValues / 16 * vlanes<S>;

struct RowParts {
  int64_t n_parts, len;
};
inline RowParts row_parts(int64_t ncols, int64_t nrows, int64_t value_bytes) {
  // a row of at most 8 MiB stays one part (its output pass reads it back from L3) when there are
  // rows enough to share the threads
  if (nrows >= 4 && ncols * value_bytes <= (int64_t(8) << 20)) return {1, ncols};
  const int64_t p = std::clamp<int64_t>((ncols + kPartValues - 1) / kPartValues, 1, 64);
  const int64_t len = ((ncols + p - 1) / p + 63) / 64 * 64;
  return {(ncols + len - 1) / len, len};
}

template <class S>
void fwd_long_rows(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var,
                   acc_t<S>* rstd, int64_t nrows, int64_t cg, int64_t g, int64_t ns, int64_t ncols, double eps,
                   int act_id, acc_t<S> p) {
  using A = acc_t<S>;
  const RowParts rp = row_parts(ncols, nrows, int64_t(sizeof(S)));
  const int64_t n_items = nrows * rp.n_parts;
  std::vector<double> part(3 * n_items);  // per (row, part): count, mean, M2
  std::vector<double> hi_lo_rs(3 * nrows);  // per row: mean rounded to A, the rest, rstd
  // a row's (merged) statistics, into mean/var/rstd and hi_lo_rs
  auto finish_row = [&](int64_t r, double m_a, double q_a) {
    const double v = (q_a < 0.0 ? 0.0 : q_a) / double(ncols);
    const A rs = A(1) / std::sqrt(A(v) + A(eps));
    A m = A(m_a);
    if (m != m) m = torch_mean(m, inf_mask(x + r * ncols, 1, 0, ncols));
    if (mean != nullptr) { mean[r] = m; var[r] = A(v); rstd[r] = rs; }
    hi_lo_rs[3 * r] = double(m);
    hi_lo_rs[3 * r + 1] = std::isfinite(m_a) ? m_a - double(m) : 0.0;
    hi_lo_rs[3 * r + 2] = double(rs);
  };
  // y = act(((x - hi) - lo) * (rstd * w[c]) + b[c]) over values [v0, v1) of row r, channel run by
  // run; y streams past the caches when x and y together exceed half the last level (numerics/stream.h)
  // -- half precision only where a channel's run is whole cache lines: a run off whole lines streams
  // its middle and stores its first and last lines plainly, and in half precision that was the
  // slower, from 5 % at runs of 90000 values to 45 % at runs of 729 (bfloat16 GroupNorm(4, 512)
  // 29x512x27x27 forward: 4.8 ms streamed, 3.3 plain, torch.nn 3.6; float32 streams: 2.0 ms
  // streamed, 2.7 plain on 11x154x41x9x9, whose runs of 3321 values are off whole lines too)
  // (at two or more threads from the whole last level, stream.h streams_forward_whole_level: the
  // rows' output pass comes after every row's moments; GroupNorm(4, 64) 1x64x227x227 float32
  // forward, x and y 26 MB, two threads, ran 1.14-1.23x torch.nn plain in four rounds of an A/B,
  // 0.86-1.43x streamed from three quarters -- three of the four below 1.05)
  const bool stream = streams_forward_whole_level(2 * nrows * ncols * int64_t(sizeof(S))) &&
                      (sizeof(S) > 2 || (ns * int64_t(sizeof(S))) % kCacheLineBytes == 0) &&
                      streams_runs(ns * int64_t(sizeof(S)));  // (runs that gain by it: stream.h)
  auto write_part = [&](int64_t r, int64_t v0, int64_t v1) {
    const int64_t gi = r % g;
    const A hi = A(hi_lo_rs[3 * r]), lo = A(hi_lo_rs[3 * r + 1]), rs = A(hi_lo_rs[3 * r + 2]);
    act::visit(act_id, [&]<int Act>() {
      for (int64_t lo_v = v0; lo_v < v1;) {
        const int64_t k = lo_v / ns, hi_v = std::min(v1, (k + 1) * ns), cc = gi * cg + k;
        const S* xp = x + r * ncols + lo_v;
        S* yp = y + r * ncols + lo_v;
        if (stream) affine_run<S, true, Act>(xp, yp, hi_v - lo_v, hi, lo, rs * w[cc], b[cc], p, true);
        else affine_run<S, false, Act>(xp, yp, hi_v - lo_v, hi, lo, rs * w[cc], b[cc], p, true);
        lo_v = hi_v;
      }
    });
  };
  const bool local = rp.n_parts == 1;  // a row of one part (<= 64K values, in L2): written at once
  for_rows(n_items, rp.len, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / rp.n_parts, v0 = (t - r * rp.n_parts) * rp.len, v1 = std::min(ncols, v0 + rp.len);
      const S* xr = x + r * ncols;
      Moments mo;
      for (int64_t lo = v0; lo < v1; lo += kPiece<S>) {
        const int64_t k = std::min(kPiece<S>, v1 - lo);
        const A shift = to_acc(xr[lo]);
        const A md = over_count(shifted_sum(xr + lo, k, shift), k);                 // from memory
        mo.merge(double(k), double(shift) + double(md), double(shifted_sqdev(xr + lo, k, shift, md)));  // from L2
      }
      if (local) { finish_row(r, mo.mean, mo.m2); write_part(r, 0, ncols); continue; }
      part[3 * t] = mo.n; part[3 * t + 1] = mo.mean; part[3 * t + 2] = mo.m2;
    }
    if (stream) fence_streams();
  });
  if (local) return;
  for (int64_t r = 0; r < nrows; ++r) {
    Moments mo;
    for (int64_t p = 0; p < rp.n_parts; ++p) {
      const double* q = part.data() + 3 * (r * rp.n_parts + p);
      mo.merge(q[0], q[1], q[2]);
    }
    finish_row(r, mo.mean, mo.m2);
  }
  for_rows(n_items, rp.len, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / rp.n_parts, v0 = (t - r * rp.n_parts) * rp.len;
      write_part(r, v0, std::min(ncols, v0 + rp.len));
    }
    if (stream) fence_streams();
  });
}

// (sum dy, sum dy * (x - m), sum (x - m)) over n values in pieces of kGradPieceValues, each piece
// in the accumulation dtype (two vector chains), the pieces added in float64 in order. The third
// sum gives the rounding of the saved mean m back: sum dy * (x - mean) = sum dy * (x - m) -
// mean(x - m) * sum dy (at a mean of 1e4, m is off by up to 5e-4: dweight 1e-2 wrong without it).
template <class S> struct Sums3 { double dy = 0.0, dyx = 0.0, x = 0.0; };
// Pieces of 2048 values on AVX-512 (128 lanes x 16: chains of 64 terms a lane at every level; at
// 16384, dweight of a channel of 40000 values came out at 36x its rounding error at a mean of 1e4;
// now within the 32x of tests/ops/group_norm/test_group_norm_large_mean.py).
constexpr int64_t kGradPieceValues = 2048 / 16 * vlanes<float>;
template <class S> inline Sums3<S> long_grad_sums(const S* dy, const S* x, int64_t n, acc_t<S> m) {
  Sums3<S> out;
  for (int64_t lo = 0; lo < n; lo += kGradPieceValues) {
    const auto t = grad_sums3(dy + lo, x + lo, std::min(kGradPieceValues, n - lo), m);  // group_norm_sums.h
    out.dy += double(t.dy); out.dyx += double(t.dyx); out.x += double(t.x);
  }
  return out;
}

template <class S>
void bwd_long_rows(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
                   acc_t<S>* pw, acc_t<S>* pb, int64_t nrows, int64_t c, int64_t g, int64_t ns) {
  using A = acc_t<S>;
  const int64_t cg = c / g, ncols = cg * ns, n_items = nrows * cg;
  std::vector<Sums3<S>> sums(n_items);  // per (row, channel of the group)
  for_rows(n_items, 2 * ns, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / cg, k = t - r * cg;
      sums[t] = long_grad_sums(dy + r * ncols + k * ns, x + r * ncols + k * ns, ns, mean[r]);
    }
  });
  std::vector<A> t2s(dx ? nrows : 0), t3s(dx ? nrows : 0);
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t i = r / g, gi = r % g;
    const double rs = double(rstd[r]);
    double dm = 0.0;  // mean over the group of (x - m): the saved mean's rounding
    for (int64_t k = 0; k < cg; ++k) dm += sums[r * cg + k].x;
    dm = std::isfinite(dm) ? dm / double(ncols) : 0.0;
    double sg = 0.0, sgx = 0.0;  // over the group, in channel order: sums of dy * w, of dy * w * (x - mean)
    for (int64_t k = 0; k < cg; ++k) {
      const int64_t cc = gi * cg + k;
      const Sums3<S>& q = sums[r * cg + k];
      const double sdx = q.dyx - dm * q.dy;
      pb[i * c + cc] = A(q.dy);
      pw[i * c + cc] = A(sdx * rs);
      sg += double(w[cc]) * q.dy;
      sgx += double(w[cc]) * sdx;
    }
    if (dx) {
      const double t3 = sgx * rs / double(ncols) * rs * rs;  // rstd^3 * mean_grp(g * (x - mean))
      t3s[r] = A(t3);
      t2s[r] = A(sg / double(ncols) * rs - dm * t3);          // rstd * mean_grp(g), less (m - mean) * t3
    }
  }
  if (!dx) return;
  const bool stream = streams_dx<S>(nrows * ncols, ns, 3);
  for_rows(n_items, 2 * ns, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / cg, k = t - r * cg, off = r * ncols + k * ns, cc = (r % g) * cg + k;
      grad_run(dy + off, x + off, dx + off, ns, mean[r], rstd[r] * w[cc], t2s[r], t3s[r], stream);
    }
    if (stream) fence_streams();
  });
}

template <class R> inline void store_double(R* p, double v) {
  if constexpr (std::is_same_v<R, double>) *p = v;
  else *p = from_acc<R>(float(v));  // rounded to float first, then (half types) to R
}

}  // namespace

// x, y (N*G, Cg, S); w, b (C,); mean, var, rstd (N*G,) out or null -- `fixed`: mean, rstd (C,) in.
// docs/derivations/group_norm.md, "The grouped view" and "Numerics": shifted two passes per group,
//   shift = x[0], md = mean(x - shift), var = mean(((x - shift) - md)^2), rstd = 1 / sqrt(var + eps),
//   y = ((x - shift) - md) * (rstd * w[c]) + b[c];
// the row is read three times (sum, squared deviations, output), from cache after the first.
template <class S>
void fwd_rows(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var,
              acc_t<S>* rstd, int64_t n, int64_t c, int64_t g, int64_t ns, double eps, bool fixed, int act_id,
              double act_param) {
  using A = acc_t<S>;
  const A p = A(act_param);
  if (ns == 1 && !fixed && s1_packed<S>(c, g)) {
    fwd_s1_packed<S>(x, w, b, y, mean, var, rstd, n, c, g, eps);
    act::visit(act_id, [&]<int Act>() { if constexpr (Act != act::kIdentity) act_in_place<S, Act>(y, n * c, p); });
    return;
  }
  const int64_t cg = c / g, ncols = cg * ns, nrows = n * g;
  const A aeps = A(eps);
  if (!fixed && ncols > kScratchValues)
    return fwd_long_rows<S>(x, w, b, y, mean, var, rstd, nrows, cg, g, ns, ncols, eps, act_id, p);
  if (sizeof(S) == 2 && !fixed && ncols > 256 && ncols <= kScratchValues) {
    // Long half-precision rows, one at a time: pass 1 reads x from memory into scratch (d = x -
    // shift, widened once); pass 2 and the output run over scratch in L1/L2 (e = d - md, y = e *
    // (rstd * w[c]) + b[c]). float32 / float64 rows take the passes over x below instead (the same
    // arithmetic, so the same bits): the scratch's two extra stores a value cost more than the
    // reads they replace (GroupNorm(25, 25) on 12x25x14x393 float32 forward: 0.83x torch).
    const int64_t row_bytes = ncols * int64_t(sizeof(S)), x_bytes = nrows * row_bytes;
    // While pass 2 runs, the task's next row is asked for a line a step, and y streams past the
    // caches when x and y together exceed half the last level, each row as one run of whole lines
    // (stream_scale_shift_row; ns >= the lanes). bfloat16 GroupNorm(32, 96) 18x96x68x68 forward,
    // one thread: 3.3 ms (0.80x torch.nn) with 4 KiB of the next row asked for after pass 1 and y
    // stored plainly -> 2.3 ms (1.16x); GroupNorm(32, 512) 29x512x27x27 0.88x -> 1.17x.
    const bool stream = sizeof(S) == 2 && ns >= vlanes<S> && streams_forward(2 * x_bytes);
    for_rows(nrows, ncols, [&](int64_t r0, int64_t r1) {
      std::vector<A> scratch(ncols + (stream ? cg : 0));
      A* d = scratch.data();
      A* as = d + ncols;  // (stream) rs * w[c] of the row's channels
      for (int64_t r = r0; r < r1; ++r) {
        const S* xr = x + r * ncols;
        const A shift = to_acc(xr[0]);
        const A md = over_count(shifted_sum_into(xr, d, ncols, shift), ncols);
        // pass 2 asks for the task's next row, a cache line each step (the row from memory while
        // this one's passes run in cache)
        const char* next = r + 1 < r1 ? reinterpret_cast<const char*>(xr + ncols) : nullptr;
        const A v = over_count(center_in_place(d, ncols, md, next, 2 * vlanes<S> * int64_t(sizeof(S))), ncols);
        const A rs = A(1) / std::sqrt(v + aeps);
        if (mean != nullptr) {
          A m = shift + md;
          if (m != m) m = torch_mean(m, inf_mask(xr, 1, 0, ncols));  // InstanceNorm's running mean
          mean[r] = m;
          var[r] = v;
          rstd[r] = rs;
        }
        const int64_t gi = r % g;
        S* yr = y + r * ncols;
        const A* wg = w + gi * cg;
        const A* bg = b + gi * cg;
        act::visit(act_id, [&]<int Act>() {
          if (ns == 1) {
            scale_shift_channels<S, Act>(d, yr, cg, rs, wg, bg, p);
          } else if (kActAfterRow<S, Act>(ns)) {  // the row, then act
            for (int64_t j = 0; j < cg; ++j)
              scale_shift_run<S, act::kIdentity>(d + j * ns, yr + j * ns, ns, rs * wg[j], bg[j], p);
            act_row<S, Act>(yr, ncols, p);
          } else if (stream) {  // (half precision only)
            for (int64_t j = 0; j < cg; ++j) as[j] = rs * wg[j];
            stream_scale_shift_row<S, Act>(d, yr, ncols, ns, as, bg, p);
          } else {
            for (int64_t j = 0; j < cg; ++j) scale_shift_run<S, Act>(d + j * ns, yr + j * ns, ns, rs * wg[j], bg[j], p);
          }
        });
      }
      if (stream) fence_streams();
    });
    return;
  }
  // Short rows a block of kBlock at a time, each step over the block's rows: the rows' chains (sum,
  // division, squared deviations, square root) are independent, so they overlap in the CPU.
  // Long rows (> 256 values) one at a time, each pass from L1 / L2, the next row's first bytes
  // asked for ahead; y streams past the caches when x and y pass the forward's share of the last
  // level (stream.h, streams_forward; the rows' second and third reads then find x in cache:
  // GroupNorm(32, 128) on 8x128x56x56 float32 forward 0.77x -> see docs/performance.md).
  // float32 / float64 rows of channels of at least the lanes stream as one run of the row's values
  // (affine_row_streamed: its whole lines); other rows channel run by channel run where the runs
  // gain by it (streams_runs). Channel by channel, GroupNorm(32, 256) 96x256x14x14 float32
  // forward's runs of 196 values (784 bytes, off whole lines) did not stream at all (0.87x
  // torch.nn, one thread; 1.10x as one run), and GroupNorm(32, 128) 64x128x27x27's streamed runs
  // of 729 values, their end lines plain, ran 0.86x (1.12x).
  constexpr int64_t kBlock = 8;
  const int64_t row_bytes = ncols * int64_t(sizeof(S)), x_bytes = nrows * row_bytes;
  const bool big = ncols > 256 && ns > 1 && streams_forward(2 * x_bytes);
  const bool stream_row = sizeof(S) >= 4 && big && ns >= vlanes<S> && streams_runs(row_bytes);
  const bool stream = big && !stream_row && streams_runs(ns * int64_t(sizeof(S)));
  for_rows(nrows, ncols, [&](int64_t r0, int64_t r1) {
    A shift[kBlock], md[kBlock], rs[kBlock];
    std::vector<A> rowk(stream_row ? 2 * cg : 0);  // (stream_row) the row's rs * w[c], then b[c]
    const int64_t block = ncols <= 256 ? kBlock : 1;  // long rows: one at a time, each pass from L1
    for (int64_t rb = r0; rb < r1; rb += block) {
      const int64_t nb = std::min(block, r1 - rb);
      const S* xb = x + rb * ncols;
      if (block == 1) {
        const int64_t ahead = (rb + 1) * row_bytes;
        if (ahead < x_bytes) prefetch_read(reinterpret_cast<const char*>(x) + ahead, std::min(kAheadBytes, x_bytes - ahead));
      }
      if (fixed) {  // running statistics: y = (x - mean) * (rstd * w) + b
        for (int64_t k = 0; k < nb; ++k) {
          const int64_t gi = (rb + k) % g;
          shift[k] = mean[gi];
          md[k] = A(0);
          rs[k] = rstd[gi];
        }
      } else {
        for (int64_t k = 0; k < nb; ++k) {
          shift[k] = to_acc(xb[k * ncols]);
          md[k] = ncols < vlanes<S> ? small_shifted_sum(xb + k * ncols, ncols, shift[k])
                                    : shifted_sum(xb + k * ncols, ncols, shift[k]);
        }
        for (int64_t k = 0; k < nb; ++k) md[k] = over_count(md[k], ncols);
        for (int64_t k = 0; k < nb; ++k)
          rs[k] = ncols < vlanes<S> ? small_shifted_sqdev(xb + k * ncols, ncols, shift[k], md[k])
                                    : shifted_sqdev(xb + k * ncols, ncols, shift[k], md[k]);
        for (int64_t k = 0; k < nb; ++k) {
          const A v = over_count(rs[k], ncols);
          rs[k] = A(1) / std::sqrt(v + aeps);
          if (mean != nullptr) {
            A m = shift[k] + md[k];
            if (m != m) m = torch_mean(m, inf_mask(xb + k * ncols, 1, 0, ncols));  // InstanceNorm's running mean
            mean[rb + k] = m;
            var[rb + k] = v;
            rstd[rb + k] = rs[k];
          }
        }
      }
      act::visit(act_id, [&]<int Act>() {
        for (int64_t k = 0; k < nb; ++k) {
          const int64_t gi = (rb + k) % g;
          const S* xr = xb + k * ncols;
          S* yr = y + (rb + k) * ncols;
          const A* wg = w + gi * cg;
          const A* bg = b + gi * cg;
          if (ns == 1) {
            affine_channels<S, Act>(xr, yr, cg, shift[k], md[k], rs[k], wg, bg, p);
          } else if (kActAfterRow<S, Act>(ns)) {  // the row, then act
            for (int64_t j = 0; j < cg; ++j)
              affine_run<S, false, act::kIdentity>(xr + j * ns, yr + j * ns, ns, shift[k], md[k], rs[k] * wg[j], bg[j],
                                                   p, !fixed);
            act_row<S, Act>(yr, ncols, p);
          } else if (stream) {
            for (int64_t j = 0; j < cg; ++j)
              affine_run<S, true, Act>(xr + j * ns, yr + j * ns, ns, shift[k], md[k], rs[k] * wg[j], bg[j], p, !fixed);
          } else if (stream_row) {
            for (int64_t j = 0; j < cg; ++j) rowk[j] = rs[k] * wg[j], rowk[cg + j] = bg[j];
            affine_row_streamed<S, Act>(xr, yr, ncols, ns, shift[k], md[k], rowk.data(), rowk.data() + cg, p);
          } else {
            for (int64_t j = 0; j < cg; ++j)
              affine_run<S, false, Act>(xr + j * ns, yr + j * ns, ns, shift[k], md[k], rs[k] * wg[j], bg[j], p, !fixed);
          }
        }
      });
    }
    if (stream || stream_row) fence_streams();
  });
}

// dy, x, dx (N*G, Cg, S); w (C,); mean, rstd (N*G,) (`fixed`: (C,)); dw, db (C,) out.
// docs/derivations/group_norm.md, "The input" and "The parameters": with g = dy * w[c],
//   dx = rstd * (g - mean_grp(g) - x_hat * mean_grp(g * x_hat))
//      = dy * (rstd * w[c])      term 1
//        - (x - mean) * t3       term 3, t3 = rstd^3 * mean_grp(g * (x - mean))
//        - t2                    term 2, t2 = rstd * mean_grp(g)
//   dw[c] = sum_{n,s} dy * x_hat,  db[c] = sum_{n,s} dy
// ("InstanceNorm is the case G = C": fixed statistics keep term 1 only).
// dw/db: each row writes its per-(n, c) sums into (N, C) partials, merged over n in order in float64.
// R: dy is relu's dz read through rb: sg (N, C), then tt (N, C) (relu_bounds).
template <class S, bool R>
void bwd_rows_as(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
                 acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t c, int64_t g, int64_t ns, bool fixed,
                 const std::function<void(int64_t, int64_t)>* dy_rows, const acc_t<S>* rb) {
  using A = acc_t<S>;
  const int64_t cg = c / g, ncols = cg * ns, nrows = n * g;
  std::vector<A> pw(n * c), pb(n * c);  // (N, C): sums of dy * x_hat, of dy
  if (dy_rows != nullptr && (fixed || ns > kScratchValues)) {  // every row's dy first
    for_rows(nrows, 3 * ncols, [&](int64_t r0, int64_t r1) { (*dy_rows)(r0, r1); });
    dy_rows = nullptr;
  }
  const int64_t dy_block = std::max<int64_t>(1, kScratchValues / ncols);  // rows a dy_rows call
  const bool stream = dx != nullptr && streams_dx<S>(nrows * ncols, ns, fixed ? 2 : 3);  // dx past the caches
  if (!fixed && ns > kScratchValues) {
    bwd_long_rows<S>(dy, x, w, mean, rstd, dx, pw.data(), pb.data(), nrows, c, g, ns);
    return merge_partials(pw.data(), pb.data(), n, c, dw, db);
  }
  for_rows(nrows, 2 * ncols, [&](int64_t r0, int64_t r1) {
    std::vector<double> sk(fixed ? 0 : 2 * cg);  // a group's per-channel sums (dy, dy * (x - m))
    for (int64_t r = r0, i = r0 / g, gi = r0 % g; r < r1; ++r, i += (gi + 1 == g), gi = gi + 1 == g ? 0 : gi + 1) {
      const A m = fixed ? mean[gi] : mean[r];
      const A rs = fixed ? rstd[gi] : rstd[r];
      const S* dyr = dy + r * ncols;
      const S* xr = x + r * ncols;
      if (dy_rows != nullptr && (r - r0) % dy_block == 0) (*dy_rows)(r, std::min(r1, r + dy_block));
      if (fixed) {  // term 1 only
        for (int64_t k = 0; k < cg; ++k) {
          auto [sdy, sdx] = grad_sums(dyr + k * ns, xr + k * ns, ns, m);
          const int64_t cc = gi * cg + k;
          pb[i * c + cc] = sdy;
          pw[i * c + cc] = sdx * rs;
        }
        if (dx == nullptr) continue;
        S* dxr = dx + r * ncols;
        for (int64_t k = 0; k < cg; ++k) scale_run(dyr + k * ns, dxr + k * ns, ns, rs * w[gi * cg + k], stream);
        continue;
      }
      // The group's sums around m, the mean rounded to A; e = mean(x - m), the part of the mean the
      // rounding left out, is added back in float64: sum dy * (x - mean) = sum dy * (x - m) -
      // e * sum dy, and (x - mean) * t3 = (x - m) * t3 - e * t3 (at a mean of 1e4 dx and dw were
      // ~1e-4 relative off without it: tests/ops/group_norm/test_group_norm_large_mean.py).
      double sx = 0.0;
      const A *rsg = R ? rb + r * cg : nullptr, *rtt = R ? rb + n * c + r * cg : nullptr;  // (row r's channels)
      for (int64_t k = 0; k < cg; ++k) {
        const auto t = grad_sums3<S, R>(dyr + k * ns, xr + k * ns, ns, m, R ? rsg[k] : A(0), R ? rtt[k] : A(0));
        sk[2 * k] = double(t.dy);
        sk[2 * k + 1] = double(t.dyx);
        sx += double(t.x);
      }
      double e = sx / double(ncols);
      if (!std::isfinite(e)) e = 0.0;  // an infinite / NaN group: its sums are NaN already
      double sg = 0.0, sgx = 0.0;  // sums over the group of dy * w, of dy * w * (x - mean)
      for (int64_t k = 0; k < cg; ++k) {
        const double sdy = sk[2 * k], sdx = sk[2 * k + 1] - e * sdy;
        const int64_t cc = gi * cg + k;
        pb[i * c + cc] = A(sdy);
        pw[i * c + cc] = A(sdx * double(rs));
        sg += double(w[cc]) * sdy;
        sgx += double(w[cc]) * sdx;
      }
      if (dx == nullptr) continue;
      S* dxr = dx + r * ncols;
      const double t3d = sgx * double(rs) / double(ncols) * double(rs) * double(rs);
      const A t2 = A(sg / double(ncols) * double(rs) - e * t3d);  // rstd * mean_grp(g), less e * t3
      const A t3 = A(t3d);                                          // rstd^3 * mean_grp(g * (x - mean))
      for (int64_t k = 0; k < cg; ++k)
        grad_run<S, R>(dyr + k * ns, xr + k * ns, dxr + k * ns, ns, m, rs * w[gi * cg + k], t2, t3, stream,
                       R ? rsg[k] : A(0), R ? rtt[k] : A(0));
    }
    if (stream) fence_streams();
  });
  merge_partials(pw.data(), pb.data(), n, c, dw, db);
}

template <class S>
void bwd_rows(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t c, int64_t g, int64_t ns, bool fixed,
              const std::function<void(int64_t, int64_t)>* dy_rows, const ReluDy* relu) {
  using A = acc_t<S>;
  // (a bound a sample and channel costs a few evaluations of z: on runs under 512 values that was
  // more than the dz pass it saves -- GroupNormAct(32, 256) 32x256x14x14 bfloat16 backward 1.33 ->
  // 1.63x the plain backward's time; 8x128x28x28 float16 1.81 -> 1.30-1.41, 16x64x56x56 float32
  // 1.71-1.89 -> 1.01-1.13)
  if (relu != nullptr && !fixed && ns <= kScratchValues && ns >= 512) {
    std::vector<A> rb(2 * n * c);  // sg (N, C), then tt (N, C)
    if (relu_bounds(relu->hi, relu->a, relu->b, n * c, rb.data(), rb.data() + n * c))
      return bwd_rows_as<S, true>(static_cast<const S*>(relu->dy), x, w, mean, rstd, dx, dw, db, n, c, g, ns, false,
                                  nullptr, rb.data());
  }
  bwd_rows_as<S, false>(dy, x, w, mean, rstd, dx, dw, db, n, c, g, ns, fixed, dy_rows, nullptr);
}

namespace {
// Blocks of kTPos positions x kTChan channels, gathered into a local block first and written out
// as kTChan runs of kTPos values: the loads of x and the stores to y (rows of y a power of two
// apart, 64 KiB for S = 16384 float32) never wait on each other's addresses (4K aliasing).
constexpr int64_t kTPos = 64, kTChan = 16;
#if defined(__SSE2__)
// A whole block by register transposes (SSE2, so every x86-64 level; VEX-encoded at v3 / v4):
// 8x8 tiles of 16-bit values (three rounds of unpacks: 16-, 32-, 64-bit), 4x4 tiles of 32-bit
// ones. Row i of a tile is at src + i * ld (a position's channels), column j goes to
// dst + j * ldd (a channel's positions). The element-by-element gather it replaces took 2.4 ms
// of a 3.3 ms channels-last InstanceNorm2d(64) 1x64x229x229 float16 forward (AVX2, one thread).
inline void tile8x8(const uint16_t* src, int64_t ld, uint16_t* dst, int64_t ldd) {
  __m128i r[8], a[8], b[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * ld));
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);      // columns 0-3 of rows 2i, 2i + 1
    a[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);  // columns 4-7
  }
  for (int h = 0; h < 2; ++h)    // rows 0-3 (h = 0), 4-7 (h = 1)
    for (int q = 0; q < 2; ++q) {  // columns 0-3 (q = 0), 4-7 (q = 1)
      b[4 * h + 2 * q] = _mm_unpacklo_epi32(a[4 * h + q], a[4 * h + 2 + q]);      // 2 columns x 4 rows
      b[4 * h + 2 * q + 1] = _mm_unpackhi_epi32(a[4 * h + q], a[4 * h + 2 + q]);  // the next 2
    }
  for (int j = 0; j < 4; ++j) {  // b[j]: columns 2j, 2j + 1 of rows 0-3; b[4 + j]: of rows 4-7
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * j) * ldd), _mm_unpacklo_epi64(b[j], b[4 + j]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * j + 1) * ldd), _mm_unpackhi_epi64(b[j], b[4 + j]));
  }
}
inline void tile4x4(const uint32_t* src, int64_t ld, uint32_t* dst, int64_t ldd) {
  __m128i r[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * ld));
  const __m128i a0 = _mm_unpacklo_epi32(r[0], r[1]), a1 = _mm_unpackhi_epi32(r[0], r[1]);
  const __m128i a2 = _mm_unpacklo_epi32(r[2], r[3]), a3 = _mm_unpackhi_epi32(r[2], r[3]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_unpacklo_epi64(a0, a2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + ldd), _mm_unpackhi_epi64(a0, a2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * ldd), _mm_unpacklo_epi64(a1, a3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 3 * ldd), _mm_unpackhi_epi64(a1, a3));
}
// blk[k][p] = si[p * c + k] for a whole block; false where T has no tile (64-bit values)
template <class T> inline bool tile_block(const T* si, int64_t c, T (*blk)[kTPos]) {
  if constexpr (sizeof(T) == 2) {
    for (int64_t p0 = 0; p0 < kTPos; p0 += 8)
      for (int64_t k0 = 0; k0 < kTChan; k0 += 8) tile8x8(si + p0 * c + k0, c, &blk[k0][p0], kTPos);
    return true;
  } else if constexpr (sizeof(T) == 4) {
    for (int64_t p0 = 0; p0 < kTPos; p0 += 4)
      for (int64_t k0 = 0; k0 < kTChan; k0 += 4) tile4x4(si + p0 * c + k0, c, &blk[k0][p0], kTPos);
    return true;
  }
  return false;
}
#else
template <class T> inline bool tile_block(const T*, int64_t, T (*)[kTPos]) { return false; }
#endif
template <class T> void transpose_blocks(const T* src, T* dst, int64_t n, int64_t c, int64_t s) {
  const int64_t sb = (s + kTPos - 1) / kTPos;
  for_rows(n * sb, kTPos * c, [&](int64_t u0, int64_t u1) {
    T blk[kTChan][kTPos];
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t i = u / sb, s0 = (u % sb) * kTPos, np = std::min(s, s0 + kTPos) - s0;
      const T* si = src + (i * s + s0) * c;
      T* di = dst + i * c * s + s0;
      for (int64_t c0 = 0; c0 < c; c0 += kTChan) {
        const int64_t nc = std::min(c - c0, kTChan);
        if (np < kTPos || nc < kTChan || !tile_block(si + c0, c, blk))
          for (int64_t p = 0; p < np; ++p)
            for (int64_t k = 0; k < nc; ++k) blk[k][p] = si[p * c + c0 + k];
        for (int64_t k = 0; k < nc; ++k) std::memcpy(di + (c0 + k) * s, blk[k], np * sizeof(T));
      }
    }
  });
}
}  // namespace

void nhwc_to_nchw(const void* src, void* dst, int64_t n, int64_t c, int64_t s, int64_t bytes) {
  switch (bytes) {
    case 2: return transpose_blocks(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), n, c, s);
    case 4: return transpose_blocks(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), n, c, s);
    default: return transpose_blocks(static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), n, c, s);
  }
}

// rm, rv (C,) running mean / variance of storage R (element strides); mean, var (N, C) in A.
// running = (1 - momentum) * running + momentum * (batch average), the variance joining unbiased
// (var * S / (S - 1)); averages over n in order, in float64; each new value rounded once to R.
template <class R, class A>
void update_running(R* rm, int64_t rm_stride, R* rv, int64_t rv_stride, const A* mean, const A* var, int64_t n,
                    int64_t c, double momentum, int64_t n_spatial) {
  const double corr = double(n_spatial) / (double(n_spatial) - 1.0);
  for (int64_t j = 0; j < c; ++j) {
    double sm = 0.0, sv = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      sm += double(mean[i * c + j]);
      sv += double(var[i * c + j]);
    }
    const double old_m = double(to_acc(rm[j * rm_stride])), old_v = double(to_acc(rv[j * rv_stride]));
    store_double(rm + j * rm_stride, (1.0 - momentum) * old_m + momentum * (sm / double(n)));
    store_double(rv + j * rv_stride, (1.0 - momentum) * old_v + momentum * ((sv / double(n)) * corr));
  }
}

#define NORMLAB_GN_ROWS(S)                                                                                      \
  template void fwd_rows<S>(const S*, const acc_t<S>*, const acc_t<S>*, S*, acc_t<S>*, acc_t<S>*, acc_t<S>*, \
                            int64_t, int64_t, int64_t, int64_t, double, bool, int, double);                  \
  template void bwd_rows<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*,       \
                            acc_t<S>*, acc_t<S>*, int64_t, int64_t, int64_t, int64_t, bool,               \
                            const std::function<void(int64_t, int64_t)>*, const ReluDy*);
NORMLAB_GN_ROWS(float)
NORMLAB_GN_ROWS(double)
NORMLAB_GN_ROWS(bf16)
NORMLAB_GN_ROWS(f16)
#undef NORMLAB_GN_ROWS

#define NORMLAB_GN_RUNNING(R, A) \
  template void update_running<R, A>(R*, int64_t, R*, int64_t, const A*, const A*, int64_t, int64_t, double, int64_t);
NORMLAB_GN_RUNNING(float, float)
NORMLAB_GN_RUNNING(double, float)
NORMLAB_GN_RUNNING(bf16, float)
NORMLAB_GN_RUNNING(f16, float)
NORMLAB_GN_RUNNING(float, double)
NORMLAB_GN_RUNNING(double, double)
NORMLAB_GN_RUNNING(bf16, double)
NORMLAB_GN_RUNNING(f16, double)
#undef NORMLAB_GN_RUNNING

}  // namespace normlab::group_norm
