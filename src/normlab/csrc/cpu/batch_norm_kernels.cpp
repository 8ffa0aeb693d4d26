// BatchNorm's CPU kernels: docs/derivations/batch_norm.md, "The cpu kernels" (statistics,
// normalisation, backward). Shapes of the arguments are given at each function; the view is
// (R, W) = (n_rows, width) after folding, channel c at columns f*C*S + c*S .. + S of a row.
// Rows view, statistics of a chunk: columns in blocks of 8 vectors (pass 1) / 4 vectors (pass 2)
// whose sums stay in registers down the chunk's rows; the last columns row by row, their tail a
// masked vector. Every column's additions keep one order (four rows paired, then single rows).
// Where x passes half the last-level cache, pass 1 of a chunk asks for the next chunk's lines as
// it goes (numerics/prefetch.h, Ahead): it walks the chunk one column block at a time, a stride
// the hardware prefetcher does not follow from memory (float16 BatchNorm2d(485) 39x485x17x39
// channels-last training forward: 0.85-0.93x torch without, 1.18-1.24x with; bfloat16
// 0.83-0.98x -> 1.20-1.31x; one thread). In cache it is left out (it cost up to 10 % there).
// The output pass of rows of channels back to back (channels-last, (M, C)) streams y as one run
// of whole lines (numerics/stream.h, stream_affine_flat) when x and y pass the forward's share of
// the last-level cache (streams_forward: half of it on one thread, three quarters on more): 2-4 %
// faster in eval on BatchNorm2d(128) 4x128x166x152 bfloat16 and BatchNorm2d(485) float16 when
// measured (an earlier row-by-row streaming, which left rows off whole lines plain, was slower)
// -- bfloat16 no longer streams y (streams_y: later timings found it slower).
// The output passes of planes (y but in bfloat16, streams_y; dx, also where a channel's dx
// follows its sums in cache) stream each run's whole lines by the same rule (streamed_run; dx by
// streams_output: half the last level at any thread count), its end lines plain -- a store that
// misses the caches otherwise reads its line from memory first -- where the runs gain by it
// (stream.h, streams_runs: short runs off whole lines lost; float32 planes off whole lines stream
// as runs of consecutive planes instead, forward_planes' stream_planes), and
// fenced once a chunk of tasks (run_tasks), not once a run.
// One process, the knob switched between calls: BatchNorm3d(1) 37x1x22x139x139 float32 eval forward 6.06 -> 4.31 ms (one
// thread; torch.nn 5.44), BatchNorm3d(16) 2x16x10x170x170 bfloat16 training forward+backward
// 6.50 -> 5.49 ms (two threads; torch.nn 6.05), BatchNorm2d(256) 16x256x56x56 float32 19.2 ->
// 16.8 ms (one thread), eval forward+backward 8x64x112x112 float32 5.93 -> 4.81 ms. The rows'
// dx pass streams rows of whole lines (channels-last with C * size a multiple of 64 bytes, the
// constants per column) by the rule of dy, x, dx: training forward+backward channels-last float32
// BatchNorm2d(128) 16x128x28x28 1.70 -> 1.37 ms (two threads; torch.nn 1.45), BatchNorm2d(64)
// 64x64x56x56 14.7 -> 12.4 ms (torch.nn 14.4); rows off whole lines stay plain.
#include "cpu/batch_norm_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "numerics/chunks.h"
#include "numerics/moments.h"
#include "numerics/prefetch.h"
#include "numerics/relu_bound.h"
#include "numerics/scratch.h"
#include "numerics/stream.h"
#include "numerics/vec.h"

namespace normlab::bn {

// ----------------------------------------------------------------------------------------------
// Per-channel vectors of any dtype
// ----------------------------------------------------------------------------------------------

double Chan::at(int64_t c) const {
  const int64_t i = c * stride;
  switch (dt) {
    case Dt::f32: return static_cast<const float*>(p)[i];
    case Dt::f64: return static_cast<const double*>(p)[i];
    case Dt::bf16: return to_float(static_cast<const bf16*>(p)[i]);
    case Dt::f16: return to_float(static_cast<const f16*>(p)[i]);
  }
  return 0.0;
}

double MutChan::at(int64_t c) const { return Chan{p, dt, stride}.at(c); }

void MutChan::set(int64_t c, double v) const {
  const int64_t i = c * stride;
  switch (dt) {  // one rounding from float64 (half types: through float32, as torch's copy_ does)
    case Dt::f32: static_cast<float*>(p)[i] = float(v); break;
    case Dt::f64: static_cast<double*>(p)[i] = v; break;
    case Dt::bf16: static_cast<bf16*>(p)[i] = to_bf16(float(v)); break;
    case Dt::f16: static_cast<f16*>(p)[i] = to_f16(float(v)); break;
  }
}

// ----------------------------------------------------------------------------------------------
// Geometry (the shape alone decides it: the same bits for any number of threads)
// ----------------------------------------------------------------------------------------------

Constants& constants() {
  static Constants k = [] {
    Constants c;
    c.plane_local_bytes = llc_bytes() / 8;
    return c;
  }();
  return k;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

Geometry geometry(int64_t n_rows, int64_t width, int64_t s_len, int64_t local_elems) {
  const Constants& k = constants();
  int64_t fold = 1, tail = 0;
  if (width < k.fold_below) {
    // narrow rows: F consecutive rows read as one -- the largest divisor of the rows down to half
    // of F_max, or else F_max itself and the last R mod F rows read unfolded (a prime number of
    // rows, 1x2x419x419 channels-last, had been left at F = 1: rows of 2 values, 0.45x torch.nn)
    const int64_t f_max = std::min(n_rows, std::max<int64_t>(1, k.fold_width / width));
    fold = f_max;
    tail = n_rows % f_max;
    for (int64_t f = f_max; tail != 0 && f > 1 && 2 * f >= f_max; --f)
      if (n_rows % f == 0) fold = f, tail = 0;
  }
  n_rows /= fold;
  width *= fold;
  const int64_t n_ch = width / s_len;
  const int64_t per_block = std::max<int64_t>(
      1, std::min({n_ch, local_elems / std::max<int64_t>(1, n_rows * s_len), cdiv(k.column_block, s_len)}));
  if (fold == 1 && n_rows * s_len <= local_elems && per_block * s_len >= k.min_local_run) {
    const int64_t n_blocks = cdiv(n_ch, per_block);
    const int64_t cw = cdiv(n_ch, n_blocks) * s_len;  // whole channels, split evenly
    const int64_t sub = std::max<int64_t>(1, std::min({k.max_chunk_rows, n_rows, k.chunk_elems / cw}));
    return {fold, tail, cw, sub, cdiv(n_rows, sub), true};
  }
  const int64_t n_cb = std::max<int64_t>(1, cdiv(width, k.column_block));
  const int64_t cw = std::max<int64_t>(1, cdiv(width, n_cb));
  const int64_t sub = std::max<int64_t>(1, std::min({k.max_chunk_rows, n_rows, k.chunk_elems / cw}));
  // row groups (tasks down the rows) of about task_elems values; at most 64 of them and at most
  // max_partials per-column partials in all: the scratch stays small whatever the tensor
  const int64_t max_groups = std::clamp<int64_t>(k.max_partials / width, 1, 64);
  const int64_t group = std::max({int64_t(1), k.task_elems / (sub * cw), cdiv(cdiv(n_rows, max_groups), sub)});
  return {fold, tail, cw, sub, group, false};
}

namespace {

template <class A> inline A acc_cast(double v) { return A(v); }

// out[c - c0] = t[c] as float64 for c in [c0, c1) (absent: `absent`), rounded through the
// accumulation dtype A first (as the kernels' weight and bias: torch's mixed-precision rule).
template <class A> void load_chan(const Chan& t, double* out, int64_t c0, int64_t c1, double absent) {
  const int64_t n = c1 - c0;
  if (!t.p) { for (int64_t i = 0; i < n; ++i) out[i] = absent; return; }
  if (t.dt == Dt::f32 && t.stride == 1) {
    const float* p = static_cast<const float*>(t.p) + c0;
    for (int64_t i = 0; i < n; ++i) out[i] = double(A(p[i]));
  } else if (t.dt == Dt::f64 && t.stride == 1) {
    const double* p = static_cast<const double*>(t.p) + c0;
    for (int64_t i = 0; i < n; ++i) out[i] = double(A(p[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = double(A(t.at(c0 + i)));
  }
}

// Tasks: phase 0, (row group g, column block) of `rows` rows by `cw` columns; phase 1, whole
// rows, about phase1_values values each.
struct Span { int64_t g, r0, r1, c0, n; };

inline int64_t n_tasks(int64_t n_rows, int64_t width, int64_t rows, int64_t cw, int phase) {
  if (phase == 0) return cdiv(n_rows, rows) * cdiv(width, cw);
  return cdiv(n_rows, std::max<int64_t>(1, constants().phase1_values / width));
}

inline Span span(int64_t task, int phase, int64_t n_rows, int64_t width, int64_t rows, int64_t cw) {
  if (phase == 0) {
    const int64_t n_cb = cdiv(width, cw), g = task / n_cb, c0 = (task - g * n_cb) * cw, r0 = g * rows;
    return {g, r0, std::min(r0 + rows, n_rows), c0, std::min(cw, width - c0)};
  }
  const int64_t per = std::max<int64_t>(1, constants().phase1_values / width), r0 = task * per;
  return {0, r0, std::min(r0 + per, n_rows), 0, width};
}

// f(t) for the tasks t < n in parallel; each thread's streamed stores (stream.h) fenced once at
// the end of its chunk of tasks, before another thread may read them.
template <class F> inline void run_tasks(int64_t n, int64_t values_per_task, const F& f) {
  for_rows(n, values_per_task, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) f(t);
    fence_streams();
  });
}
// f(t, buf) as run_tasks' f(t), buf a scratch of `slot` values of T that a thread's tasks share:
// allocated once a thread a call (a heap block freed and taken again by every task can make the
// allocator give pages back and fault them in again, task after task)
template <class T, class F> inline void run_tasks_with(int64_t n, int64_t values_per_task, int64_t slot, const F& f) {
  for_rows(n, values_per_task, [&](int64_t b, int64_t e) {
    Scratch<T, 1> buf(slot);
    for (int64_t t = b; t < e; ++t) f(t, buf.get());
    fence_streams();
  });
}

// ----------------------------------------------------------------------------------------------
// Statistics: per column over a chunk of rows (the corrected two-pass algorithm)
// ----------------------------------------------------------------------------------------------

// Per-column loops over u in [0, n): body(u) on a vector of L columns, then part(u, k) on the
// k < L columns left as one partial vector (loads and stores through vload_n / vstore_n).
template <class S, class V, class P> inline void columns_part(int64_t n, const V& body, const P& part, int64_t u0 = 0) {
  constexpr int64_t L = vlanes<S>;
  int64_t u = u0;
  for (; u + L <= n; u += L) body(u);
  if (u < n) part(u, n - u);
}

// s1[u] += sum_i (x[i, u] - sh[u]) over rows r0..r1 of the block at x (row stride ld), four rows
// at a time summed in pairs.  x: (R, ld) storage; sh, s1: (n,) accumulation dtype.
// Columns in blocks of K vectors held in registers down all the rows (s1 read and written once a
// block, not once every four rows); the remaining columns row by row. Each column's additions in
// the same order either way.
template <class S, class Tick>
void acc_shifted(const S* x, int64_t ld, int64_t r0, int64_t r1, int64_t n, const acc_t<S>* sh, acc_t<S>* s1,
                 Tick& tick) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>, K = 8;
  int64_t u0 = 0;
  for (; u0 + K * L <= n; u0 += K * L) {
    vec<A> m[K], s[K];
    for (int64_t q = 0; q < K; ++q) { m[q] = vload(sh + u0 + q * L); s[q] = vload(s1 + u0 + q * L); }
    int64_t i = r0;
    for (; i + 4 <= r1; i += 4) {
      tick();
      const S *xa = x + i * ld + u0, *xb = xa + ld, *xc = xb + ld, *xd = xc + ld;
      for (int64_t q = 0; q < K; ++q)
        s[q] = s[q] + (((vload(xa + q * L) - m[q]) + (vload(xb + q * L) - m[q])) +
                       ((vload(xc + q * L) - m[q]) + (vload(xd + q * L) - m[q])));
    }
    for (; i < r1; ++i)
      for (int64_t q = 0; q < K; ++q) s[q] = s[q] + (vload(x + i * ld + u0 + q * L) - m[q]);
    for (int64_t q = 0; q < K; ++q) vstore(s1 + u0 + q * L, s[q]);
  }
  const int64_t nr = n - u0;
  x += u0; sh += u0; s1 += u0;
  int64_t i = r0;
  for (; i + 4 <= r1; i += 4) {
    if (nr > 0) tick();
    const S *xa = x + i * ld, *xb = xa + ld, *xc = xb + ld, *xd = xc + ld;
    columns_part<S>(nr, [&](int64_t u) {
      vec<A> m = vload(sh + u);
      vstore(s1 + u, vload(s1 + u) + (((vload(xa + u) - m) + (vload(xb + u) - m)) +
                                       ((vload(xc + u) - m) + (vload(xd + u) - m))));
    }, [&](int64_t u, int64_t k) {
      vec<A> m = vload_n(sh + u, k);
      vstore_n(s1 + u, vload_n(s1 + u, k) + (((vload_n(xa + u, k) - m) + (vload_n(xb + u, k) - m)) +
                                                   ((vload_n(xc + u, k) - m) + (vload_n(xd + u, k) - m))), k);
    });
  }
  for (; i < r1; ++i) {
    const S* xa = x + i * ld;
    columns_part<S>(nr, [&](int64_t u) { vstore(s1 + u, vload(s1 + u) + (vload(xa + u) - vload(sh + u))); },
                    [&](int64_t u, int64_t k) {
                      vstore_n(s1 + u, vload_n(s1 + u, k) + (vload_n(xa + u, k) - vload_n(sh + u, k)), k);
                    });
  }
}

// With d = x[i, u] - m[u]: s1[u] += sum_i d, s2[u] += sum_i d * d (pass 2), blocked as acc_shifted.
template <class S>
void acc_centred(const S* x, int64_t ld, int64_t r0, int64_t r1, int64_t n, const acc_t<S>* m, acc_t<S>* s1,
                 acc_t<S>* s2) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>, K = 4;
  int64_t u0 = 0;
  for (; u0 + K * L <= n; u0 += K * L) {
    vec<A> mu[K], a[K], b[K];
    for (int64_t q = 0; q < K; ++q) {
      mu[q] = vload(m + u0 + q * L); a[q] = vload(s1 + u0 + q * L); b[q] = vload(s2 + u0 + q * L);
    }
    int64_t i = r0;
    for (; i + 4 <= r1; i += 4) {
      const S *xa = x + i * ld + u0, *xb = xa + ld, *xc = xb + ld, *xd = xc + ld;
      for (int64_t q = 0; q < K; ++q) {
        const vec<A> da = vload(xa + q * L) - mu[q], db = vload(xb + q * L) - mu[q];
        const vec<A> dc = vload(xc + q * L) - mu[q], dd = vload(xd + q * L) - mu[q];
        a[q] = a[q] + ((da + db) + (dc + dd));
        b[q] = b[q] + ((da * da + db * db) + (dc * dc + dd * dd));
      }
    }
    for (; i < r1; ++i)
      for (int64_t q = 0; q < K; ++q) {
        const vec<A> d = vload(x + i * ld + u0 + q * L) - mu[q];
        a[q] = a[q] + d;
        b[q] = b[q] + d * d;
      }
    for (int64_t q = 0; q < K; ++q) { vstore(s1 + u0 + q * L, a[q]); vstore(s2 + u0 + q * L, b[q]); }
  }
  const int64_t nr = n - u0;
  x += u0; m += u0; s1 += u0; s2 += u0;
  int64_t i = r0;
  for (; i + 4 <= r1; i += 4) {
    const S *xa = x + i * ld, *xb = xa + ld, *xc = xb + ld, *xd = xc + ld;
    auto four = [&](const vec<A>& mu, const vec<A>& xa_, const vec<A>& xb_, const vec<A>& xc_, const vec<A>& xd_,
                    vec<A>& o1, vec<A>& o2) {
      const vec<A> da = xa_ - mu, db = xb_ - mu, dc = xc_ - mu, dd = xd_ - mu;
      o1 = o1 + ((da + db) + (dc + dd));
      o2 = o2 + ((da * da + db * db) + (dc * dc + dd * dd));
    };
    columns_part<S>(nr, [&](int64_t u) {
      vec<A> o1 = vload(s1 + u), o2 = vload(s2 + u);
      four(vload(m + u), vload(xa + u), vload(xb + u), vload(xc + u), vload(xd + u), o1, o2);
      vstore(s1 + u, o1);
      vstore(s2 + u, o2);
    }, [&](int64_t u, int64_t k) {
      vec<A> o1 = vload_n(s1 + u, k), o2 = vload_n(s2 + u, k);
      four(vload_n(m + u, k), vload_n(xa + u, k), vload_n(xb + u, k), vload_n(xc + u, k),
           vload_n(xd + u, k), o1, o2);
      vstore_n(s1 + u, o1, k);
      vstore_n(s2 + u, o2, k);
    });
  }
  for (; i < r1; ++i) {
    const S* xa = x + i * ld;
    columns_part<S>(nr, [&](int64_t u) {
      vec<A> d = vload(xa + u) - vload(m + u);
      vstore(s1 + u, vload(s1 + u) + d);
      vstore(s2 + u, vload(s2 + u) + d * d);
    }, [&](int64_t u, int64_t k) {
      vec<A> d = vload_n(xa + u, k) - vload_n(m + u, k);
      vstore_n(s1 + u, vload_n(s1 + u, k) + d, k);
      vstore_n(s2 + u, vload_n(s2 + u, k) + d * d, k);
    });
  }
}

// Per-column mean (tm) and M2 (tq), float64, of rows t0..t1 of the block at x (columns 0..n):
// each chunk of `sub` rows by two passes, the chunks merged in order (Chan). far: x is read from
// memory (more than half the last-level cache): the next chunk's lines asked for ahead.
// x: (R, ld) storage, offset to the block's first column; tm, tq: (n,) float64 out.
template <class S>
void task_stats(const S* x, int64_t ld, int64_t t0, int64_t t1, int64_t n, int64_t sub, bool far, double* tm,
                double* tq) {
  using A = acc_t<S>;
  std::vector<A> buf(3 * n);
  A *sh = buf.data(), *s1 = sh + n, *s2 = s1 + n;
  int64_t n_a = 0;
  for (int64_t r0 = t0; r0 < t1; r0 += sub) {
    const int64_t r1 = std::min(r0 + sub, t1), k = r1 - r0;
    const S* x0 = x + r0 * ld;
    columns_part<S>(n, [&](int64_t u) { vstore(sh + u, vload(x0 + u)); vstore(s1 + u, vzero<A>()); },
                    [&](int64_t u, int64_t k) { vstore_n(sh + u, vload_n(x0 + u, k), k); vstore_n(s1 + u, vzero<A>(), k); });
    // pass 1, asking for the next chunk's lines as it goes (prefetch.h): one tick every four rows
    // of each column block -- a stride the hardware prefetcher does not follow from memory
    const int64_t next = far ? std::max<int64_t>(0, std::min(sub, t1 - r1)) : 0, n_bl = n / (8 * vlanes<S>);
    Ahead ahead(x + r1 * ld, ld * int64_t(sizeof(S)), n * int64_t(sizeof(S)), next,
                (n_bl + (n % (8 * vlanes<S>) > 0 ? 1 : 0)) * (k / 4));
    acc_shifted(x, ld, r0, r1, n, sh, s1, ahead);
    ahead.rest();
    const A inv_k = acc_cast<A>(1.0 / double(k));
    for (int64_t u = 0; u < n; ++u) { sh[u] = sh[u] + s1[u] * inv_k; s1[u] = 0; s2[u] = 0; }  // m
    acc_centred(x, ld, r0, r1, n, sh, s1, s2);  // pass 2
    // chunk: mean = m + s1 / k, M2 = s2 - s1^2 / k (float64); Chan into the task's
    const double inv = 1.0 / double(k), f_b = double(k) / double(n_a + k), f_ab = double(n_a) * f_b;
    for (int64_t u = 0; u < n; ++u) {
      const double d1 = s1[u];
      double q = double(s2[u]) - d1 * d1 * inv;
      q = q < 0.0 ? 0.0 : q;  // rounding; NaN stays NaN
      const double cm = double(sh[u]) + d1 * inv;
      if (n_a == 0) {
        tm[u] = cm;
        tq[u] = q;
      } else {
        const double delta = cm - tm[u];
        tm[u] += delta * f_b;
        tq[u] += q + delta * delta * f_ab;
      }
    }
    n_a += k;
  }
}

// sum_j (x[j] - shift) over k values in float64 (shifted_sum64), added into the four float64
// chains s (their hsum is the sum; float32: minus k * shift): from x for float32, whose
// differences round; from the exact differences d (accumulation dtype) otherwise, each widened to
// float64 (half precision summed in float32 chains of 16 terms first put the running mean of
// zero-mean channels at up to 2.4x its rounding error: float32 additions of differences of
// mixed exponents round). One loop that also writes d[j] = x[j] - shift,
// with four float64 chains (the adds of one overlap the others'; two chains left the loop waiting
// on add latency).  x: (k,) storage; d: (k,) scratch.
template <class S> void shifted_sum64(const S* x, acc_t<S>* d, int64_t k, acc_t<S> shift, vec<double>* s) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  constexpr int64_t D = lanes<double>;
  static_assert((std::is_same_v<A, float> || std::is_same_v<A, double>) && 2 * L / D <= 4);
  auto load64 = [](const A* p) {  // D values at p as float64, widened from memory
    if constexpr (std::is_same_v<A, float>) return vload_widen(p);
    else return vload(p);
  };
  const vec<A> vs = vset1<A>(shift);
  // the chains in registers for the loop (the stores to d, memcpy, may alias s[] in the compiler's
  // view: with s[] itself the loop kept its four chains in memory, a store and a load a vector)
  vec<double> s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
  auto add = [&](int64_t i, vec<double> v) {
    if (i == 0) s0 += v;
    else if (i == 1) s1 += v;
    else if (i == 2) s2 += v;
    else s3 += v;
  };
  int64_t j = 0;
  for (; j + 2 * L <= k; j += 2 * L) {
    const vec<A> xa = vload(x + j), xb = vload(x + j + L);
    const vec<A> da = xa - vs, db = xb - vs;
    vstore(d + j, da);
    vstore(d + j + L, db);
    const A* src;  // float32: x itself; otherwise the exact differences just written
    if constexpr (std::is_same_v<S, float>) src = x + j;
    else src = d + j;
    for (int64_t i = 0; i < 2 * L / D; ++i) add(i, load64(src + i * D));  // 4 (float) or 2 (double) vectors
  }
  if (j < k) {
    // the last values (fewer than 2L) as partial vectors, the lanes past the end 0 on both sides of
    // the subtraction: a chain of scalar adds here was the longest part of a short plane's pass
    // (100-150 cycles of latency for a run of 169 values)
    alignas(64) A shifts[L], t[2 * L];
    for (int64_t i = 0; i < L; ++i) shifts[i] = shift;
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t r = std::clamp<int64_t>(k - j - h * L, 0, L);
      const vec<A> xv = vload_n(x + j + h * L, r), dv = xv - vload_n(shifts, r);
      if (r > 0) vstore_n(d + j + h * L, dv, r);
      if constexpr (std::is_same_v<S, float>) vstore(t + h * L, xv);  // float32: x itself, as the loop
      else vstore(t + h * L, dv);
    }
    for (int64_t i = 0; i < 2 * L / D; ++i) add(i, load64(t + i * D));
  }
  s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3;
}

// sum_j (d[j] - m)^2 over k values, in the accumulation dtype, four chains (pass 2 of a piece).
template <class A> A sqdev4(const A* d, int64_t k, A m) {
  constexpr int64_t L = lanes<A>;
  vec<A> s[4] = {vzero<A>(), vzero<A>(), vzero<A>(), vzero<A>()};
  const vec<A> vm = vset1<A>(m);
  int64_t j = 0;
  for (; j + 4 * L <= k; j += 4 * L)
    for (int i = 0; i < 4; ++i) {
      const vec<A> e = vload(d + j + i * L) - vm;
      s[i] += e * e;
    }
  int i = 0;
  for (; j + L <= k; j += L, ++i) {
    const vec<A> e = vload(d + j) - vm;
    s[i] += e * e;
  }
  if (j < k) {  // the last values as a partial vector (i < 4: at most 3 whole ones above)
    alignas(64) A ms[L];
    for (int64_t l = 0; l < L; ++l) ms[l] = m;
    const vec<A> e = vload_n(d + j, k - j) - vload_n(ms, k - j);
    s[i] += e * e;
  }
  return hsum<A>((s[0] + s[1]) + (s[2] + s[3]));
}

// Channel c's mean m, or torch's where the shift made it NaN: +-inf for a channel holding
// infinities of one sign and no NaN. Channel c: columns f*period + c*S .. + S of every row.
// x: (R, W) storage.
template <class S>
double inf_mean(const S* x, int64_t n_rows, int64_t width, double m, int64_t c, int64_t s_len, int64_t period) {
  if (!std::isnan(m)) return m;
  bool nan = false, pos = false, neg = false;
  for (int64_t i = 0; i < n_rows; ++i)
    for (int64_t lo = c * s_len; lo < width; lo += period)
      for (int64_t t = 0; t < s_len; ++t) {
        const double v = to_acc(x[i * width + lo + t]);
        nan |= std::isnan(v);
        pos |= v == std::numeric_limits<double>::infinity();
        neg |= v == -std::numeric_limits<double>::infinity();
      }
  if (!nan && pos && !neg) return std::numeric_limits<double>::infinity();
  if (!nan && neg && !pos) return -std::numeric_limits<double>::infinity();
  return m;
}

// (mean, biased var) of a channel from its columns' (mean, M2), each of n_rows values: columns
// start + r*period .. + S for r < fold (equal counts: the mean of the means shifted by the
// first, and M2 plus the spread of the means).  tm, tq: per-column float64.
inline void channel_stats(const double* tm, const double* tq, int64_t start, int64_t s_len, int64_t fold,
                          int64_t period, int64_t n_rows, double* mu_out, double* var_out) {
  const double n_col = double(fold * s_len), ref = tm[start];
  double tot = 0.0;
  for (int64_t r = 0; r < fold; ++r) {
    const double* t = tm + start + r * period;
    double s = 0.0;
    for (int64_t j = 0; j < s_len; ++j) s += t[j] - ref;  // in order: a constant channel gives 0
    tot += s;
  }
  const double mu = ref + tot / n_col;
  double m2 = 0.0, spread = 0.0;
  for (int64_t r = 0; r < fold; ++r) {
    const int64_t lo = start + r * period;
    double a = 0.0, b = 0.0;
    for (int64_t j = 0; j < s_len; ++j) a += tq[lo + j];
    for (int64_t j = 0; j < s_len; ++j) { const double e = tm[lo + j] - mu; b += e * e; }
    m2 += a;
    spread += b;
  }
  *mu_out = mu;
  *var_out = (m2 + double(n_rows) * spread) / (double(n_rows) * n_col);
}

// A channel's sums over its columns (as channel_stats), in order.
inline void channel_sums(const double* ty, const double* tx, int64_t start, int64_t s_len, int64_t fold,
                         int64_t period, double* sy, double* sx) {
  double a = 0.0, b = 0.0;
  for (int64_t r = 0; r < fold; ++r) {
    const int64_t lo = start + r * period;
    double p = 0.0, q = 0.0;
    for (int64_t j = 0; j < s_len; ++j) p += ty[lo + j];
    for (int64_t j = 0; j < s_len; ++j) q += tx[lo + j];
    a += p;
    b += q;
  }
  *sy = a;
  *sx = b;
}

// Per-channel constants of the normalisation, channels [c0, c1): rstd = 1 / sqrt(var + eps);
// y = ((x - hi) - lo) * a + b = (x - hi) * a + b2 with hi = the mean rounded to the accumulation
// dtype, lo = the rest, a = rstd * w, b2 = b - lo * a (float64, rounded once).
template <class A> struct Affine {
  Scratch<A> hs, as, bs;
  A *hi, *a, *b2;
  explicit Affine(int64_t c) : hs(c), as(c), bs(c), hi(hs.get()), a(as.get()), b2(bs.get()) {}
  void set(int64_t c0, int64_t c1, const double* mean, const double* var, double eps, const Chan& w, const Chan& b,
           double* rstd) {
    double wb[2 * 64];
    for (int64_t s0 = c0; s0 < c1; s0 += 64) {  // blocks of 64 channels: w, b read once as float64
      const int64_t s1 = std::min(c1, s0 + 64), n = s1 - s0;
      load_chan<A>(w, wb, s0, s1, 1.0);
      load_chan<A>(b, wb + 64, s0, s1, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t c = s0 + i;
        const double rs = 1.0 / std::sqrt(var[c] + eps);
        rstd[c] = rs;
        const A h = acc_cast<A>(mean[c]);
        const double f = rs * wb[i];
        hi[c] = h;
        a[c] = acc_cast<A>(f);
        b2[c] = acc_cast<A>(wb[64 + i] - (mean[c] - double(h)) * f);
      }
    }
  }
};

// Per-column copies of per-channel values for S == 1 (column u of a folded row: channel u % C),
// into e (width values).
template <class A> const A* tiled(const A* v, int64_t n_ch, int64_t width, A* e) {
  for (int64_t u = 0; u < width; u += n_ch) std::copy(v, v + n_ch, e + u);
  return e;
}

// The bfloat16 output in pairs of vectors, even and odd values apart (vec.h vload_eo / vstore_eo).
// no_nan: the statistics are x's own (training), so the store's NaN test may be left out where
// the constants are nan_free_affine (vec.h) -- per channel on planes and NCHW rows; for
// channels-last rows set only when every channel's are. (Running statistics say nothing of x: a
// NaN of x would keep its own bits, where torch stores 0x7FC0.) Channels-last: the per-column
// constants of columns [0, n) in eo_order.
template <class A> struct EoOut {
  bool no_nan = false;
  const A *hi = nullptr, *a = nullptr, *b2 = nullptr;
  int64_t n = 0;
};

// The whole cache lines of a run of y written by non-temporal stores (stream.h), the values
// before and after them by plain(offset, len): no line written part streamed, part plain.
// streamed(t) stores the vector -- or, bfloat16, the pair of vectors -- at offset t of the run.
// Not fenced here: run_tasks fences once a chunk of tasks (a fence a run, planes of 400 float32
// values, put BatchNorm2d(512) 11x512x20x20 eval forward at 0.58x torch.nn; 1.22x without).
template <class S, class Plain, class Streamed>
inline void streamed_run(S* y, int64_t len, const Plain& plain, const Streamed& streamed) {
  constexpr int64_t step = std::is_same_v<S, bf16> ? 2 * vlanes<S> : vlanes<S>;  // a line is whole steps
  const auto sp = whole_lines(y, len);
  plain(int64_t(0), sp.k);
  for (int64_t t = sp.k; t < sp.e; t += step) streamed(t);
  plain(sp.e, len - sp.e);
}

// Whether y may stream: not bfloat16, whose streamed pairs ran slower than plain stores in both
// views (one thread, eval forward, plain -> streamed: planes 7x209x402x9 0.94 -> 1.16 ms,
// 8x64x125x125 1.21 -> 1.31; channels-last 4x128x166x152 2.27 -> 2.72 ms, training 8x64x112x112
// 2.45 -> 2.93), where float16 and float32 gain (float16 planes 8x64x180x180 4.31 -> 3.15 ms,
// channels-last 8x64x112x112 1.33 -> 0.86; float32 planes 8x64x90x90 1.48 -> 1.05, channels-last
// 4x128x166x152 4.88 -> 3.37). dx streams in every dtype.
template <class S> constexpr bool streams_y() { return !std::is_same_v<S, bf16>; }

// y = (x - h) * f + bc over len values (no_nan: as EoOut's, for this channel); stream (not
// bfloat16: streams_y): y's whole lines streamed (streamed_run).
template <class S>
inline void normalise_run(const S* x, S* y, int64_t len, acc_t<S> h, acc_t<S> f, acc_t<S> bc, bool no_nan = false,
                          bool stream = false) {
  using A = acc_t<S>;
  vec<A> vh = vset1<A>(h), vf = vset1<A>(f), vb = vset1<A>(bc);
  auto fn = [&](vec<A> v) { return (v - vh) * vf + vb; };
  if constexpr (streams_y<S>()) {
    if (stream) {
      streamed_run(y, len, [&](int64_t o, int64_t k) { normalise_run(x + o, y + o, k, h, f, bc, no_nan); },
                   [&](int64_t t) { vstream(y + t, fn(vload(x + t))); });
      return;
    }
  }
  int64_t t0 = 0;
  if constexpr (std::is_same_v<S, bf16>)
    t0 = no_nan && nan_free_affine(f, h, bc) ? eo_map<true>(x, y, len, fn) : eo_map<false>(x, y, len, fn);
  columns_part<S>(len, [&](int64_t t) { vstore(y + t, fn(vload(x + t))); },
                  [&](int64_t t, int64_t k) { vstore_n(y + t, fn(vload_n(x + t, k)), k); }, t0);
}

// y = (x - hi) * a + b2 over rows r0..r1, columns c0..c0+n. S == 1: per-column constants
// (hi, a, b2 indexed by column - c0); S > 1: whole planes from channel ch0 (per-channel).
// x, y: (R, W) storage.
template <class S>
void normalise(const S* x, S* y, int64_t width, int64_t r0, int64_t r1, int64_t c0, int64_t n, int64_t s_len,
               int64_t ch0, int64_t n_ch, const acc_t<S>* hi, const acc_t<S>* a, const acc_t<S>* b2,
               const EoOut<acc_t<S>>& eo = {}) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  for (int64_t i = r0; i < r1; ++i) {
    const S* xr = x + i * width + c0;
    S* yr = y + i * width + c0;
    // the next row's stretch of y asked for ahead where the stretches are apart (a jump of the row
    // stride every row outruns the hardware prefetcher, and the stores stall on their lines);
    // whole rows are one sequential stream, which the prefetcher follows
    if (n < width && i + 1 < r1) prefetch_write(yr + width, n * int64_t(sizeof(S)));
    if (s_len == 1) {
      int64_t u0 = 0;
      if constexpr (std::is_same_v<S, bf16>) {
        auto pairs = [&]<bool NoNaN>() {
          for (; u0 + 2 * L <= eo.n; u0 += 2 * L) {
            vec<A> e, o;
            vload_eo(xr + u0, e, o);
            vstore_eo<NoNaN>(yr + u0, (e - vload(eo.hi + u0)) * vload(eo.a + u0) + vload(eo.b2 + u0),
                             (o - vload(eo.hi + u0 + L)) * vload(eo.a + u0 + L) + vload(eo.b2 + u0 + L));
          }
        };
        if (eo.no_nan) pairs.template operator()<true>();
        else pairs.template operator()<false>();
      }
      columns_part<S>(n, [&](int64_t u) { vstore(yr + u, (vload(xr + u) - vload(hi + u)) * vload(a + u) + vload(b2 + u)); },
                      [&](int64_t u, int64_t k) {
                        vstore_n(yr + u, (vload_n(xr + u, k) - vload_n(hi + u, k)) * vload_n(a + u, k) + vload_n(b2 + u, k), k);
                      }, u0);
    } else {
      int64_t c = ch0;
      for (int64_t p0 = 0; p0 < n; p0 += s_len) {
        normalise_run(xr + p0, yr + p0, s_len, hi[c], a[c], b2[c], eo.no_nan);
        c = c + 1 < n_ch ? c + 1 : 0;
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// Planes: contiguous (N, C, *spatial) with S >= plane_min values per plane
// ----------------------------------------------------------------------------------------------
//
// Channel c holds V = N * S values, plane n at x + (n * C + c) * S. The rule, from the shape alone:
//   - the V values are cut into P parts of equal length (whole cache lines), P = ceil(V /
//     part_values) at most 64: a task is one (channel, part), so few channels still make many tasks;
//   - a task reads its part run by run (plane segments) in pieces of at most plane_piece values,
//     two passes over each piece in L1, the pieces merged into the part in order (Chan, float64);
//   - the parts of a channel are merged in part order: the same bits for any number of threads;
//   - P == 1 (a channel of at most part_values values: it stays in L2) lets the task finish its
//     channel and write it (y, dx) while it is in cache -- y only while x and y together take at
//     most an eighth of the last-level cache (plane_local_bytes); otherwise an elementwise pass
//     follows, over blocks of at most phase1_values values of the planes, in memory order. (A
//     channel's y is N runs of S values, C * S apart: where y's lines are not in cache, each run's
//     stores wait on their lines, where one pass in memory order is one stream the prefetcher
//     follows. Zen 4, one thread, training forward: BatchNorm2d(256) 8x256x56x56 bfloat16 2.50 ->
//     1.88 ms, (16, 64, 56, 56) float32 1.36 -> 1.18 ms; at 2 MB and less the same time either way.
//     The backward's dx keeps the local pass: there float32 lost up to 11 % without it.)
//   - P > 1 with at least 4 channels a thread: a task is a channel instead, its parts in order,
//     then its output while it is in the caches (channel_tasks: the same bits) -- the forward only
//     where y streams or the runs are long (kChannelOrderRun).
// Scratch: (C, P) float64 partials, freed at the end of the call.

// Whether an output pass of x and y of `bytes` together finds y's lines in cache (forward_planes).
inline bool cached_output(int64_t bytes) { return bytes <= constants().plane_local_bytes; }

// Which view a contiguous (N, C, S) input takes. A plane run costs a fixed ~100 cycles (its
// sums' horizontal adds, a division, a merge) besides its values; a column of the rows view costs
// ~25 cycles of float64 merging per chunk besides its N values: per channel, N runs against S
// columns. So planes when a run is long (S >= plane_min), or when it is at least short_plane_min
// and a column would hold few values against it (S >= 8 N: (2, 512, 8, 8) has 2 values per column,
// 64 per run; 1 thread, float16 forward 0.73x -> 1.2x torch, (4, 64, 14, 14) float32
// forward+backward 0.97x -> 2.1x). Half precision with sums to take (training, or the backward's
// dweight/dbias) from S >= mid_plane_min and S >= 4 N, where the two fixed costs meet; measured
// on a grid of both views, half precision gains there (32x256x14x14 bfloat16 forward+backward
// 0.98-1.03x -> 1.25-1.31x torch), float32 gains less and loses up to 15 % at N = 40-64 (its plane
// runs lie C * S apart: 40x256x14x14 was 8 % slower by planes), so it stays at 8 N; an evaluation
// forward, with no sums, streams rows in order and keeps the old rule.
inline bool takes_planes(const View& v, bool half_sums) {
  const Constants& k = constants();
  return v.s_len >= k.plane_min || (v.s_len >= k.short_plane_min && v.s_len >= 8 * v.n_rows) ||
         (half_sums && v.s_len >= k.mid_plane_min && v.s_len >= 4 * v.n_rows);
}

struct Parts {
  int64_t total, n_parts, len;  // V, P, values per part (the last may be shorter)
};
// A (channel, part) task's fixed cost -- its pieces' horizontal adds and merges, the channel's
// divisions and square root -- in values of its passes (about 250 cycles): counted in the work
// that decides whether a call splits over the threads, so that many short channels do
// (BatchNorm2d(423) 1x423x7x7 float32 training forward: 20,727 values, alone under torch's grain,
// took 43 us on one thread or two, 0.94x torch.nn forward+backward at two threads).
constexpr int64_t kPlaneTaskValues = 256;

inline Parts parts_of(int64_t n, int64_t s_len) {
  const int64_t total = n * s_len;
  const int64_t p = std::clamp<int64_t>(cdiv(total, constants().part_values), 1, 64);
  const int64_t len = cdiv(cdiv(total, p), 64) * 64;
  return {total, cdiv(total, len), len};
}

// Whether a call whose channels hold more than one part (P > 1) takes a task per channel -- its
// parts in order, then its output pass while the channel is in the caches -- in place of a task
// per part and an output pass over the whole tensor from memory: where there are channels
// enough for every thread (at least 4 a thread; the same bits either way, the parts merged in the
// same order). One process, the two switched between calls: BatchNorm2d(64) 8x64x180x180 float16
// training forward+backward, two threads, 11.3 -> 9.4 ms (torch.nn 10.4); float32 14.4 -> 12.0;
// BatchNorm3d(16) 2x16x10x170x170 bfloat16 4.13 -> 3.97; forward alone 8x64x180x180 float16 4.03
// -> 3.46 ms, float32 5.68 -> 4.89.
inline bool channel_tasks(const Parts& pt, int64_t n_ch) {
  return pt.n_parts > 1 && n_ch >= 4 * int64_t(at::get_num_threads());
}
// The forward's channel task writes y run by run in channel order (N runs C * S apart): plain
// half-precision stores wait on each run's first lines, so runs shorter than this stay in the
// whole-tensor pass (bfloat16 training forward, one thread: 24x64x60x60 2.28 -> 3.06 ms, 96x64x28x28
// 1.66 -> 2.39 by channel tasks); streamed float32 stores do not wait.
constexpr int64_t kChannelOrderRun = 16384;

// y's whole lines streamed plane by plane (forward_planes: the rule, and why)
template <class S> bool planes_stream(int64_t n_planes, int64_t s_len) {
  return streams_y<S>() && (sizeof(S) >= 4 || s_len >= kChannelOrderRun) && streams_runs(s_len * int64_t(sizeof(S))) &&
         streams_forward(2 * n_planes * s_len * int64_t(sizeof(S)));
}

// f(offset, len) for the runs of channel c's values [v0, v1) in plane order: x + offset.
template <class F> inline void plane_runs(int64_t c, int64_t v0, int64_t v1, int64_t s_len, int64_t n_ch, const F& f) {
  while (v0 < v1) {
    const int64_t n = v0 / s_len, s = v0 - n * s_len, len = std::min(v1 - v0, s_len - s);
    f((n * n_ch + c) * s_len + s, len);
    v0 += len;
  }
}

// The moments of channel c's values [v0, v1) by the shifted two passes, in pieces of at most
// plane_piece values taken in plane order across the runs (a short plane's run is one piece's
// stretch, not a piece of its own: a piece's hsums, division and merge cost some 100 cycles, as
// much as a run of 150 values). A piece: pass 1 sums x - shift (shift: the piece's first value)
// in float64 and keeps the differences d; pass 2 sums (d - md)^2 around the mean rounded to the
// accumulation dtype (md), corrected for that rounding; the pieces merged in order (Chan).
// x: (N, C, S) storage; d: plane_piece scratch.
template <class S>
Moments part_moments(const S* x, int64_t c, int64_t v0, int64_t v1, int64_t s_len, int64_t n_ch, acc_t<S>* d) {
  using A = acc_t<S>;
  Moments mo;
  const int64_t piece = constants().plane_piece;
  vec<double> s[4];
  int64_t fill = 0;
  A shift = A(0);
  auto flush = [&] {
    double r = hsum<double>((s[0] + s[1]) + (s[2] + s[3]));
    if constexpr (std::is_same_v<S, float>) r -= double(fill) * double(shift);
    const double sk = r / double(fill);
    const A md = acc_cast<A>(sk);
    const double corr = sk - double(md);  // md's rounding
    const double qq = double(sqdev4<A>(d, fill, md)) - double(fill) * corr * corr;  // pass 2
    mo.merge(double(fill), double(shift) + sk, qq < 0.0 ? 0.0 : qq);  // rounding; NaN stays NaN
    fill = 0;
  };
  plane_runs(c, v0, v1, s_len, n_ch, [&](int64_t off, int64_t len) {
    for (int64_t lo = 0; lo < len;) {
      if (fill == 0) {
        shift = to_acc(x[off + lo]);
        for (auto& v : s) v = vzero<double>();
      }
      const int64_t k = std::min(piece - fill, len - lo);
      shifted_sum64(x + off + lo, d + fill, k, shift, s);  // pass 1
      fill += k;
      lo += k;
      if (fill == piece) flush();
    }
  });
  if (fill > 0) flush();
  return mo;
}

// g(c, offset, len) over every plane in blocks of at most phase1_values values, in parallel.
// (over_planes_with: g(c, offset, len, buf), buf a thread's scratch of `slot` values of T)
template <class T, class G> void over_planes_with(int64_t n_planes, int64_t s_len, int64_t n_ch, int64_t slot, const G& g) {
  const int64_t block = constants().phase1_values, nb = cdiv(s_len, block), len = std::min(block, s_len);
  run_tasks_with<T>(n_planes * nb, len, slot, [&](int64_t t, T* buf) {
    const int64_t pl = t / nb, s0 = (t - pl * nb) * block;
    g(pl % n_ch, pl * s_len + s0, std::min(block, s_len - s0), buf);
  });
}
template <class G> void over_planes(int64_t n_planes, int64_t s_len, int64_t n_ch, const G& g) {
  over_planes_with<char>(n_planes, s_len, n_ch, 0, [&](int64_t c, int64_t off, int64_t len, char*) { g(c, off, len); });
}

template <class S>
void forward_planes(const S* x, S* y, const Chan& w, const Chan& b, const Chan& rm, const Chan& rv, double* stats,
                    View v, double eps, bool train) {
  using A = acc_t<S>;
  const int64_t n_ch = v.n_ch, s_len = v.s_len, n = v.n_rows, period = n_ch * s_len;
  double *mean = stats, *var = stats + n_ch, *rstd = stats + 2 * n_ch;
  Affine<A> k(n_ch);
  // y's whole lines streamed where x and y pass the forward's share of the LLC (stream.h,
  // streams_forward; not bfloat16: streams_y); float16 only from planes of kChannelOrderRun values
  // (runs of 729-784 values, their end lines plain, ran 1.2-1.3x slower streamed: 96x64x27x27
  // training forward 0.80x torch.nn; 8x64x180x180 gained). The output pass over all planes (eval,
  // and training where the statistics come first): float32 / float64 planes off whole lines and
  // shorter than a task stream as runs of consecutive planes (stream_planes; a plane's end lines
  // plain, plane by plane, cost 7x512x27x27 float32 eval forward 0.81x torch.nn -- 1.35x so, one
  // thread; float16 so ran 0.75x, its plane by plane 1.11x).
  const bool big = streams_forward(2 * n * period * int64_t(sizeof(S)));
  const bool stream = planes_stream<S>(n * n_ch, s_len);
  const bool stream_planes = sizeof(S) >= 4 && big && s_len >= vlanes<S> && s_len < constants().phase1_values &&
                             (s_len * int64_t(sizeof(S))) % kCacheLineBytes != 0;
  if (train) {
    auto set_stats = [&](int64_t c, const Moments& mo) {  // channel c's mean and biased variance
      mean[c] = inf_mean(x, n, period, mo.mean, c, s_len, period);
      var[c] = mo.m2 / mo.n;
    };
    const Parts pt = parts_of(n, s_len);
    const bool local = pt.n_parts == 1 && (!y || cached_output(2 * n * period * int64_t(sizeof(S))));
    if (y && channel_tasks(pt, n_ch) && (stream || s_len >= kChannelOrderRun)) {
      run_tasks(n_ch, pt.total + kPlaneTaskValues, [&](int64_t c) {
        Scratch<A, 1> d(std::min(constants().plane_piece, pt.len));
        Moments mo;
        for (int64_t p = 0; p < pt.n_parts; ++p) {  // the parts in order, as the merge below
          const Moments q = part_moments(x, c, p * pt.len, std::min(pt.total, (p + 1) * pt.len), s_len, n_ch, d.get());
          mo.merge(q.n, q.mean, q.m2);
        }
        set_stats(c, mo);
        k.set(c, c + 1, mean, var, eps, w, b, rstd);
        plane_runs(c, 0, pt.total, s_len, n_ch, [&](int64_t off, int64_t len) {
          normalise_run(x + off, y + off, len, k.hi[c], k.a[c], k.b2[c], true, stream);
        });
      });
      return;
    }
    Scratch<double> part(local ? 0 : 3 * n_ch * pt.n_parts);  // (C, P) of (count, mean, M2)
    run_tasks(n_ch * pt.n_parts, pt.len + kPlaneTaskValues, [&](int64_t t) {
      const int64_t c = t / pt.n_parts, v0 = (t - c * pt.n_parts) * pt.len, v1 = std::min(pt.total, v0 + pt.len);
      Scratch<A, 1> d(std::min(constants().plane_piece, v1 - v0));
      const Moments mo = part_moments(x, c, v0, v1, s_len, n_ch, d.get());
      if (!local) {
        part[3 * t] = mo.n; part[3 * t + 1] = mo.mean; part[3 * t + 2] = mo.m2;
        return;
      }
      set_stats(c, mo);
      k.set(c, c + 1, mean, var, eps, w, b, rstd);
      if (y)
        plane_runs(c, 0, pt.total, s_len, n_ch,
                   [&](int64_t off, int64_t len) { normalise_run(x + off, y + off, len, k.hi[c], k.a[c], k.b2[c], true); });
    });
    if (local) return;
    for (int64_t c = 0; c < n_ch; ++c) {  // the parts of a channel, in order
      Moments mo;
      for (int64_t p = 0; p < pt.n_parts; ++p) {
        const double* q = part.get() + 3 * (c * pt.n_parts + p);
        mo.merge(q[0], q[1], q[2]);
      }
      set_stats(c, mo);
    }
  } else {
    load_chan<double>(rm, mean, 0, n_ch, 0.0);
    load_chan<double>(rv, var, 0, n_ch, 1.0);
  }
  k.set(0, n_ch, mean, var, eps, w, b, rstd);
  if (!y) return;
  // Planes shorter than a task that do not stream (x and y in cache; float16 planes shorter than
  // kChannelOrderRun at any size): runs of consecutive planes too, stored plainly -- plane by
  // plane, each plane's set-up and partial last vector took a quarter of the time (BatchNorm2d(128)
  // 46x128x17x17 float16 eval forward 0.80x torch.nn, Zen 3). Not bfloat16, whose output goes in
  // even/odd pairs (normalise_run).
  const bool joined = stream_planes || (!stream && !std::is_same_v<S, bf16> && s_len >= vlanes<S> &&
                                        s_len < constants().phase1_values);
  if (joined) {  // tasks of `per` consecutive planes, each a run (stream.h, write_runs)
    const int64_t n_pl = n * n_ch, per = std::min(n_pl, std::max<int64_t>(1, constants().phase1_values / s_len));
    Scratch<A> ext(3 * (n_ch + per));  // hi, a, b2 of plane p0 + j at [p0 % C + j] (extended past C)
    A *eh = ext.get(), *ea = eh + n_ch + per, *eb = ea + n_ch + per;
    for (int64_t i = 0, c = 0; i < n_ch + per; ++i, c = c + 1 < n_ch ? c + 1 : 0)
      eh[i] = k.hi[c], ea[i] = k.a[c], eb[i] = k.b2[c];
    auto task = [&]<bool Stream>(int64_t t) {
      const int64_t p0 = t * per, c0 = p0 % n_ch;
      const S* xt = x + p0 * s_len;
      write_runs<Stream>(y + p0 * s_len, std::min(per, n_pl - p0) * s_len, s_len, [&](int64_t j) {
        return [xt, vh = vset1<A>(eh[c0 + j]), va = vset1<A>(ea[c0 + j]), vb = vset1<A>(eb[c0 + j])](int64_t i,
                                                                                                 int64_t m) {
          const vec<A> v = m == vlanes<S> ? vload(xt + i) : vload_n(xt + i, m);  // (normalise_run's arithmetic)
          return (v - vh) * va + vb;
        };
      });
    };
    run_tasks(cdiv(n_pl, per), per * s_len, [&](int64_t t) {
      if (stream_planes) task.template operator()<true>(t);
      else task.template operator()<false>(t);
    });
    return;
  }
  over_planes(n * n_ch, s_len, n_ch, [&](int64_t c, int64_t off, int64_t len) {
    normalise_run(x + off, y + off, len, k.hi[c], k.a[c], k.b2[c], train, stream);
  });
}

// ----------------------------------------------------------------------------------------------
// Rows: (M, C) and channels-last inputs (S = 1), and planes shorter than plane_min
// ----------------------------------------------------------------------------------------------

template <class S>
void forward_impl(const S* x, S* y, Chan w, Chan b, Chan rm, Chan rv, double* stats, View v, double eps, bool train) {
  using A = acc_t<S>;
  if (takes_planes(v, sizeof(S) == 2 && train)) return forward_planes(x, y, w, b, rm, rv, stats, v, eps, train);
  const int64_t n_ch = v.n_ch, s_len = v.s_len, period = n_ch * s_len;
  const Geometry g = geometry(v.n_rows, v.width, s_len, constants().local_elems);
  const int64_t n_rows = v.n_rows / g.fold, width = v.width * g.fold;
  const int64_t rows = g.sub * g.group, n_rg = cdiv(n_rows, rows);
  double *mean = stats, *var = stats + n_ch, *rstd = stats + 2 * n_ch;
  Affine<A> k(n_ch);
  const bool local = g.local && train;
  if (train) {
    const bool far = streams_output(v.n_rows * v.width * int64_t(sizeof(S)));  // (x alone)
    Scratch<double> part(2 * n_rg * width);
    double* pmean = part.get();          // (G, W) per-task, per-column partial means
    double* pm2 = pmean + n_rg * width;  // (G, W) ... M2
    run_tasks(n_tasks(n_rows, width, rows, g.cw, 0), rows * g.cw, [&](int64_t task) {
      const Span sp = span(task, 0, n_rows, width, rows, g.cw);
      double* tm = pmean + sp.g * width + sp.c0;
      double* tq = pm2 + sp.g * width + sp.c0;
      task_stats(x + sp.c0, width, sp.r0, sp.r1, sp.n, g.sub, far, tm, tq);
      if (!local) return;
      // whole channels, every row: finish them here, then normalise while in cache
      const int64_t ch0 = sp.c0 / s_len;
      for (int64_t c = ch0; c < ch0 + sp.n / s_len; ++c) {
        channel_stats(tm, tq, (c - ch0) * s_len, s_len, 1, period, n_rows, &mean[c], &var[c]);
        mean[c] = inf_mean(x, n_rows, width, mean[c], c, s_len, period);
      }
      k.set(ch0, ch0 + sp.n / s_len, mean, var, eps, w, b, rstd);
      if (y) {
        const int64_t off = s_len == 1 ? sp.c0 : 0;
        normalise(x, y, width, sp.r0, sp.r1, sp.c0, sp.n, s_len, ch0, n_ch, k.hi + off, k.a + off, k.b2 + off,
                  EoOut<A>{s_len > 1});  // (channels-last: in order, the pairs' constants not made)
      }
    });
    if (local) return;
    // per column: the row groups' partials in order (into row group 0)
    int64_t n_a = std::min(rows, n_rows);
    for (int64_t gi = 1; gi < n_rg; ++gi) {
      const int64_t kk = std::min(rows, n_rows - gi * rows);
      const double f_b = double(kk) / double(n_a + kk), f_ab = double(n_a) * f_b;
      const double *pg = pmean + gi * width, *qg = pm2 + gi * width;
      for (int64_t u = 0; u < width; ++u) {
        const double delta = pg[u] - pmean[u];
        pmean[u] += delta * f_b;
        pm2[u] += qg[u] + delta * delta * f_ab;
      }
      n_a += kk;
    }
    // the tail (R mod F rows, unfolded): its own per-column statistics, merged per channel (Chan)
    const int64_t vw = v.width, toff = n_rows * width;
    Scratch<double> tpart(g.tail ? 2 * vw : 0);
    if (g.tail) task_stats(x + toff, vw, 0, g.tail, vw, g.tail, false, tpart.get(), tpart.get() + vw);
    for (int64_t c = 0; c < n_ch; ++c) {  // per channel: its F * S columns (and the tail's S)
      channel_stats(pmean, pm2, c * s_len, s_len, g.fold, period, n_rows, &mean[c], &var[c]);
      if (g.tail) {
        double mt, vt;
        channel_stats(tpart.get(), tpart.get() + vw, c * s_len, s_len, 1, period, g.tail, &mt, &vt);
        const double na = double(n_rows * g.fold * s_len), nb = double(g.tail * s_len);
        Moments mo{na, mean[c], var[c] * na};
        mo.merge(nb, mt, vt * nb);
        mean[c] = mo.mean;
        var[c] = mo.m2 / mo.n;
      }
      mean[c] = inf_mean(x, v.n_rows, vw, mean[c], c, s_len, period);
    }
  } else {
    load_chan<double>(rm, mean, 0, n_ch, 0.0);
    load_chan<double>(rv, var, 0, n_ch, 1.0);
  }
  k.set(0, n_ch, mean, var, eps, w, b, rstd);
  if (!y) return;
  // the tail's y: its rows are (C * S) wide, the constants per channel (S == 1: per column)
  auto normalise_tail = [&] {
    if (g.tail)
      normalise(x + n_rows * width, y + n_rows * width, v.width, 0, g.tail, 0, v.width, s_len, 0, n_ch, k.hi, k.a,
                k.b2);
  };
  if (s_len == 1 && streams_y<S>() && streams_forward(2 * v.n_rows * v.width * int64_t(sizeof(S)))) {
    // rows of channels back to back: y streamed as one run of values a task (stream.h)
    const bool no_nan = train && nan_free_affines(k.hi, k.a, k.b2, n_ch);  // (as EoOut's)
    const FlatConstants<S> fk(k.hi, k.a, k.b2, n_ch);
    run_tasks(n_tasks(n_rows, width, rows, g.cw, 1), constants().phase1_values, [&](int64_t task) {
      const Span sp = span(task, 1, n_rows, width, rows, g.cw);
      stream_affine_flat(x + sp.r0 * width, y + sp.r0 * width, (sp.r1 - sp.r0) * width, fk, no_nan,
                         [](vec<A> z) { return z; }, [](A z) { return from_acc<S>(z); });
    });
    normalise_tail();
    return;
  }
  const bool tile = s_len == 1 && width != n_ch;
  Scratch<A> th(tile ? width : 0), ta(tile ? width : 0), tb(tile ? width : 0);
  const A *ph = k.hi, *pa = k.a, *pb = k.b2;
  if (tile) {
    ph = tiled(k.hi, n_ch, width, th.get()); pa = tiled(k.a, n_ch, width, ta.get()); pb = tiled(k.b2, n_ch, width, tb.get());
  }
  EoOut<A> eo{train};
  const int64_t n2 = std::is_same_v<S, bf16> && s_len == 1 ? width - width % (2 * vlanes<S>) : 0;
  Scratch<A> eh(n2), ea(n2), eb(n2);
  if (n2 > 0) {
    eo_order(ph, n2, eh.get()), eo_order(pa, n2, ea.get()), eo_order(pb, n2, eb.get());
    eo.hi = eh.get(), eo.a = ea.get(), eo.b2 = eb.get(), eo.n = n2;
    eo.no_nan = eo.no_nan && nan_free_affines(k.hi, k.a, k.b2, n_ch);
  }
  run_tasks(n_tasks(n_rows, width, rows, g.cw, 1), constants().phase1_values, [&](int64_t task) {
    const Span sp = span(task, 1, n_rows, width, rows, g.cw);
    normalise(x, y, width, sp.r0, sp.r1, 0, width, s_len, 0, n_ch, ph, pa, pb, eo);
  });
  normalise_tail();
}

// ----------------------------------------------------------------------------------------------
// Backward
// ----------------------------------------------------------------------------------------------

// Per-channel constants of dx, channel c (docs/derivations/batch_norm.md, "Backward"):
//   train: dx = a * ((dy - m1) - xc * m2) = (a * dy - k2 * (x - hi)) - k0,
//          m1 = mean(dy) (term 2), m2 = rstd^2 * mean(dy * xc) (term 3), k2 = a * m2, k0 = a * m1 - k2 * lo
//   eval:  dx = a * dy,  a = rstd * w (term 1)
template <class A> struct GradConst {
  Scratch<A> hs, as, k2s, k0s;
  A *hi, *a, *k2, *k0;
  explicit GradConst(int64_t c)
      : hs(c), as(c), k2s(c), k0s(c), hi(hs.get()), a(as.get()), k2(k2s.get()), k0(k0s.get()) {}
  // hi, a of every channel; k2 = k0 = 0 (eval)
  void init(int64_t n_ch, const Chan& w, const double* mean, const double* rstd) {
    double wb[64];
    for (int64_t s0 = 0; s0 < n_ch; s0 += 64) {
      const int64_t s1 = std::min(n_ch, s0 + 64);
      load_chan<A>(w, wb, s0, s1, 1.0);
      for (int64_t c = s0; c < s1; ++c) {
        hi[c] = acc_cast<A>(mean[c]);
        a[c] = acc_cast<A>(rstd[c] * wb[c - s0]);
        k2[c] = 0;
        k0[c] = 0;
      }
    }
  }
  // train: k2, k0 of channel c from its sums
  void set_train(int64_t c, const Chan& w, const double* mean, const double* rstd, double sum_dy, double sum_dyxc,
                 double cnt) {
    const double rs = rstd[c];
    const double f = rs * (w.p ? double(acc_cast<A>(w.at(c))) : 1.0);
    const double q2 = f * (rs * rs * sum_dyxc / cnt);
    k2[c] = acc_cast<A>(q2);
    k0[c] = acc_cast<A>(f * (sum_dy / cnt) - q2 * (mean[c] - double(hi[c])));
  }
  // channel c's sums done: sy = sum(dy), sx = sum(dy * (x - hi)) over its cnt values. db, dw
  // (the rounded mean's rest lo taken out of sx: sum(dy * x_c) = sx - lo * sy), and in training
  // the constants of dx.
  void finish(int64_t c, double sy, double sx, const Chan& w, const double* mean, const double* rstd, double cnt,
              bool train, double* dw, double* db) {
    const double sum_dyxc = sx - (mean[c] - double(hi[c])) * sy;  // minus lo * sum(dy)
    db[c] = sy;
    dw[c] = sum_dyxc * rstd[c];  // sum(dy * x_hat)
    if (train) set_train(c, w, mean, rstd, sy, sum_dyxc, cnt);
  }
};

// The backward's sums run in the accumulation dtype for at most kSumRun terms per lane (rows of a
// column; values of a SIMD lane in a plane piece of kSumRun * 4 vectors), then in float64: short
// float32 chains keep dweight and dbias near the rounding of their exact values.
constexpr int64_t kSumRun = 16;
// Values of dy a piece that dy_runs writes into a task's scratch in evaluation (backward_planes):
// with x's, 16 KiB of float32 in L1.
constexpr int64_t kDzPiece = 2048;

// ReLU's derivative read where dy is read (BatchNormAct2d, relu: ReluZ in the header): with the
// channel's z = (x - h) * a + b, as the forward and nact's dz pass compute it, g = dy where z > 0
// or z is NaN, +0 where z <= 0 -- the bits of the dz that pass would have stored, so the sums and
// dx are those of the backward over a written dz, without writing or reading it. Each of the three
// rounded operations is monotone in x, so with h, a, b finite and a != 0 "z <= 0" is "x <= t"
// (a > 0) or "x >= t" (a < 0) for one value t of the accumulation type, found once a channel by
// search over the ordered values (relu_kind; from the root h - b / a in float64, a few steps a
// channel): one compare a vector instead of four operations (and NaN x, whose z is NaN, fails
// either compare: dy kept, as with z). Otherwise z itself.
// K: 0 none (the plain backward), 1 zero where x <= t, 2 where x >= t, 3 where z <= 0, 4 where
// x * a <= t (the rows view's per-column form of 1 and 2: a = +1 or -1, t = the bound or minus it;
// the product exact).
template <class A> struct ZRelu {
  vec<A> h, a, b, t;
};
template <int K, class A> [[gnu::always_inline]] inline vec<A> relu_g(vec<A> g, vec<A> xv, const ZRelu<A>* z) {
  if constexpr (K == 1) return xv <= z->t ? vzero<A>() : g;
  else if constexpr (K == 2) return xv >= z->t ? vzero<A>() : g;
  else if constexpr (K == 3) return (xv - z->h) * z->a + z->b <= A(0) ? vzero<A>() : g;
  else if constexpr (K == 4) return act::relu_masked<true>(g, xv, z->a, z->t);
  else return g;
}
// The same, columns of per-column constants (sg, tt: act::relu_sign_bound's) at column u
template <bool R, class A>
[[gnu::always_inline]] inline vec<A> relu_cols(vec<A> g, vec<A> xv, const A* sg, const A* tt, int64_t u) {
  if constexpr (R) return act::relu_masked<true>(g, xv, vload(sg + u), vload(tt + u));
  else return g;
}
template <bool R, class A>
[[gnu::always_inline]] inline vec<A> relu_cols_n(vec<A> g, vec<A> xv, const A* sg, const A* tt, int64_t u, int64_t k) {
  if constexpr (R) return act::relu_masked<true>(g, xv, vload_n(sg + u, k), vload_n(tt + u, k));
  else return g;
}
// f<K>() for a channel's kind k; without relu (R false) f<0>() alone, no other kind compiled in
template <bool R, class F> [[gnu::always_inline]] inline void by_kind(int k, const F& f) {
  if constexpr (!R) return f.template operator()<0>();
  switch (k) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    default: return f.template operator()<3>();
  }
}

// Per-column sums of dy (ty) and dy * (x - eh[u]) (tx), float64, of rows t0..t1 of the block
// (columns 0..n): chunk sums in the accumulation dtype added in chunk order. fused: also
// dx = dy * ea[u].  dy, x, dx: (R, ld) storage at the block's first column; eh, ea: (n,).
// chunks (given): each chunk's two sums stored there instead, (2, n) values a chunk, in order --
// for the caller to add in the same order (backward_impl's few row groups).
// R: dy read as relu's dz, es / et the columns' relu_cols constants.
template <class S, bool R = false>
void task_grad_sums(const S* dy, const S* x, S* dx, int64_t ld, int64_t t0, int64_t t1, int64_t n, int64_t sub,
                    const acc_t<S>* eh, const acc_t<S>* ea, double* ty, double* tx, bool fused,
                    acc_t<S>* chunks = nullptr, const acc_t<S>* es = nullptr, const acc_t<S>* et = nullptr) {
  using A = acc_t<S>;
  std::vector<A> buf(chunks ? 0 : 2 * n);
  A *s1 = chunks ? chunks : buf.data(), *s2 = s1 + n;
  if (!chunks) {
    std::fill(ty, ty + n, 0.0);
    std::fill(tx, tx + n, 0.0);
  }
  for (int64_t r0 = t0; r0 < t1; r0 += sub) {
    if (chunks && r0 != t0) s1 += 2 * n, s2 += 2 * n;
    const int64_t r1 = std::min(r0 + sub, t1);
    std::fill(s1, s1 + 2 * n, A(0));
    for (int64_t i = r0; i < r1; ++i) {
      const S *xa = x + i * ld, *ga = dy + i * ld;
      S* o = fused ? dx + i * ld : nullptr;
      // (the fused dx from the vector of dy just summed, not a loop of its own that reads it again)
      columns_part<S>(n, [&](int64_t u) {
        const vec<A> xv = vload(xa + u), g = relu_cols<R>(vload(ga + u), xv, es, et, u);
        vstore(s1 + u, vload(s1 + u) + g);
        vstore(s2 + u, vload(s2 + u) + g * (xv - vload(eh + u)));
        if (fused) vstore(o + u, g * vload(ea + u));
      }, [&](int64_t u, int64_t k) {
        const vec<A> xv = vload_n(xa + u, k), g = relu_cols_n<R>(vload_n(ga + u, k), xv, es, et, u, k);
        vstore_n(s1 + u, vload_n(s1 + u, k) + g, k);
        vstore_n(s2 + u, vload_n(s2 + u, k) + g * (xv - vload_n(eh + u, k)), k);
        if (fused) vstore_n(o + u, g * vload_n(ea + u, k), k);
      });
    }
    if (!chunks)
      for (int64_t u = 0; u < n; ++u) { ty[u] += double(s1[u]); tx[u] += double(s2[u]); }
  }
}

// (sum dy, sum dy * (x - m)) over k values of a plane piece, in the accumulation dtype, split
// into SIMD lanes.  g, x: (k,) storage. R: g is relu_g's (z: the channel's constants).
template <class S, int R = 0>
inline void grad_sums(const S* g, const S* x, int64_t k, acc_t<S> m, acc_t<S>* o1, acc_t<S>* o2,
                      const ZRelu<acc_t<S>>* z = nullptr) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  vec<A> a[4], q[4], vm = vset1<A>(m);  // four chains each: the adds overlap, and short partial sums
  for (int i = 0; i < 4; ++i) a[i] = q[i] = vzero<A>();
  int64_t j = 0;
  for (; j + 4 * L <= k; j += 4 * L)
    for (int i = 0; i < 4; ++i) {
      const vec<A> xv = vload(x + j + i * L), gi = relu_g<R>(vload(g + j + i * L), xv, z);
      a[i] += gi;
      q[i] += gi * (xv - vm);
    }
  int i = 0;
  for (; j + L <= k; j += L, ++i) {
    const vec<A> xv = vload(x + j), gi = relu_g<R>(vload(g + j), xv, z);
    a[i] += gi;
    q[i] += gi * (xv - vm);
  }
  if (j < k) {  // the last values as a partial vector, 0 past the end (as sqdev4)
    alignas(64) A ms[L];
    for (int64_t l = 0; l < L; ++l) ms[l] = m;
    const vec<A> xv = vload_n(x + j, k - j), gi = relu_g<R>(vload_n(g + j, k - j), xv, z);
    a[i] += gi;
    q[i] += gi * (xv - vload_n(ms, k - j));
  }
  *o1 = hsum<A>((a[0] + a[1]) + (a[2] + a[3]));
  *o2 = hsum<A>((q[0] + q[1]) + (q[2] + q[3]));
}

// dx over len values of channel c's run: (f * dy - q2 * (x - h)) - q0 (train) or dy * f (eval).
// bfloat16: pairs of vectors first, even and odd values apart (vec.h vload_eo / vstore_eo: no
// widening or packing of halves; the same bits), then the rest of the run.
template <class S, int R = 0>
inline void grad_x_run(const S* dy, const S* x, S* dx, int64_t len, acc_t<S> f, acc_t<S> h, acc_t<S> q2, acc_t<S> q0,
                       bool train, bool stream = false, const ZRelu<acc_t<S>>* z = nullptr) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const vec<A> vf = vset1<A>(f), vh = vset1<A>(h), v2 = vset1<A>(q2), v0 = vset1<A>(q0);
  auto dx_train = [&](vec<A> g, vec<A> xv) { return (vf * g - v2 * (xv - vh)) - v0; };
  const bool read_x = train || R;  // (R: relu_g reads x in evaluation too)
  if (stream) {
    auto fn = [&](vec<A> g, vec<A> xv) {
      g = relu_g<R>(g, xv, z);
      return train ? dx_train(g, xv) : g * vf;
    };
    auto plain = [&](int64_t o, int64_t k) { grad_x_run<S, R>(dy + o, x + o, dx + o, k, f, h, q2, q0, train, false, z); };
    if constexpr (std::is_same_v<S, bf16>) {
      streamed_run(dx, len, plain, [&](int64_t t) {
        vec<A> ge, go, xe = vzero<A>(), xo = vzero<A>();
        vload_eo(dy + t, ge, go);
        if (read_x) vload_eo(x + t, xe, xo);
        vstream_eo(dx + t, fn(ge, xe), fn(go, xo));
      });
    } else {
      streamed_run(dx, len, plain,
                   [&](int64_t t) { vstream(dx + t, fn(vload(dy + t), read_x ? vload(x + t) : vzero<A>())); });
    }
    return;
  }
  int64_t t0 = 0;
  if (train || R) {
    auto fn = [&](vec<A> g, vec<A> xv) {
      if constexpr (R) {
        g = relu_g<R>(g, xv, z);
        return train ? dx_train(g, xv) : g * vf;
      } else {
        return dx_train(g, xv);
      }
    };
    if constexpr (std::is_same_v<S, bf16>) {
      for (; t0 + 2 * L <= len; t0 += 2 * L) {
        vec<A> ge, go, xe, xo;
        vload_eo(dy + t0, ge, go);
        vload_eo(x + t0, xe, xo);
        vstore_eo(dx + t0, fn(ge, xe), fn(go, xo));
      }
    }
    columns_part<S>(len, [&](int64_t t) { vstore(dx + t, fn(vload(dy + t), vload(x + t))); },
                    [&](int64_t t, int64_t k) { vstore_n(dx + t, fn(vload_n(dy + t, k), vload_n(x + t, k)), k); },
                    t0);
  } else {
    if constexpr (std::is_same_v<S, bf16>) t0 = eo_map(dy, dx, len, [&](vec<A> g) { return g * vf; });
    columns_part<S>(len, [&](int64_t t) { vstore(dx + t, vload(dy + t) * vf); },
                    [&](int64_t t, int64_t k) { vstore_n(dx + t, vload_n(dy + t, k) * vf, k); }, t0);
  }
}

// dx over rows r0..r1, columns c0..c0+n: (a * dy - k2 * (x - hi)) - k0 (train) or dy * a (eval).
// S == 1: per-column constants (indexed by column - c0); S > 1: planes from channel ch0.
// R: dy read as relu's dz, sg / tt relu_cols' constants (indexed as a, hi, ...).
template <class S, bool R = false>
void grad_x(const S* dy, const S* x, S* dx, int64_t width, int64_t r0, int64_t r1, int64_t c0, int64_t n,
            int64_t s_len, int64_t ch0, int64_t n_ch, const acc_t<S>* a, const acc_t<S>* hi, const acc_t<S>* k2,
            const acc_t<S>* k0, bool train, bool stream = false, const acc_t<S>* sg = nullptr,
            const acc_t<S>* tt = nullptr) {
  using A = acc_t<S>;
  for (int64_t i = r0; i < r1; ++i) {
    const S *xr = x + i * width + c0, *gr = dy + i * width + c0;
    S* o = dx + i * width + c0;
    // dx of the vector at column u (s_len == 1)
    auto full_train = [&](int64_t u) {
      const vec<A> xv = vload(xr + u), g = relu_cols<R>(vload(gr + u), xv, sg, tt, u);
      return (vload(a + u) * g - vload(k2 + u) * (xv - vload(hi + u))) - vload(k0 + u);
    };
    auto full_eval = [&](int64_t u) {
      if constexpr (R) return relu_cols<R>(vload(gr + u), vload(xr + u), sg, tt, u) * vload(a + u);
      else return vload(gr + u) * vload(a + u);
    };
    if (stream) {  // (s_len == 1, rows of whole lines: n a multiple of the lanes)
      if (train)
        for (int64_t u = 0; u < n; u += vlanes<S>) vstream(o + u, full_train(u));
      else
        for (int64_t u = 0; u < n; u += vlanes<S>) vstream(o + u, full_eval(u));
    } else if (s_len == 1) {
      if (train)
        columns_part<S>(n, [&](int64_t u) { vstore(o + u, full_train(u)); }, [&](int64_t u, int64_t k) {
          const vec<A> xv = vload_n(xr + u, k), g = relu_cols_n<R>(vload_n(gr + u, k), xv, sg, tt, u, k);
          const vec<A> v = (vload_n(a + u, k) * g - vload_n(k2 + u, k) * (xv - vload_n(hi + u, k))) - vload_n(k0 + u, k);
          vstore_n(o + u, v, k);
        });
      else
        columns_part<S>(n, [&](int64_t u) { vstore(o + u, full_eval(u)); }, [&](int64_t u, int64_t k) {
          if constexpr (R)
            vstore_n(o + u, relu_cols_n<R>(vload_n(gr + u, k), vload_n(xr + u, k), sg, tt, u, k) * vload_n(a + u, k), k);
          else
            vstore_n(o + u, vload_n(gr + u, k) * vload_n(a + u, k), k);
        });
    } else {
      int64_t c = ch0;
      for (int64_t p0 = 0; p0 < n; p0 += s_len) {
        if constexpr (R) {
          ZRelu<A> zr;
          zr.a = vset1(sg[c]), zr.t = vset1(tt[c]);
          grad_x_run<S, 4>(gr + p0, xr + p0, o + p0, s_len, a[c], hi[c], k2[c], k0[c], train, false, &zr);
        } else {
          grad_x_run(gr + p0, xr + p0, o + p0, s_len, a[c], hi[c], k2[c], k0[c], train);
        }
        c = c + 1 < n_ch ? c + 1 : 0;
      }
    }
  }
}

// The backward of planes (the forward_planes rule): a task sums channel c's part, per piece of
// kSumRun * 4 vectors in the accumulation dtype, the pieces added in float64 in order; the
// parts of a channel added in part order. fused (eval, dw/db and dx wanted): dx = dy * a in the
// same pass. P == 1: the task finishes its channel and writes its dx while in cache.
template <class S, bool R>
void backward_planes(const S* dy, const S* x, S* dx, const Chan& w, const double* stats, double* dw, double* db,
                     View v, bool train, bool need_dx, bool need_wb, const DyRuns* dy_runs, const ReluZ* relu) {
  using A = acc_t<S>;
  const int64_t n_ch = v.n_ch, s_len = v.s_len, n = v.n_rows;
  const double *mean = stats, *rstd = stats + 2 * n_ch;
  const bool need_sums = train || need_wb;
  const bool fused = need_dx && need_wb && !train;
  // dx streamed (whole lines) where what its pass reads and writes passes half the LLC, in runs
  // that gain by it (streams_runs)
  const bool stream = streams_runs(s_len * int64_t(sizeof(S))) &&
                      streams_output((train || fused ? 3 : 2) * n * n_ch * s_len * int64_t(sizeof(S)));
  GradConst<A> k(n_ch);
  k.init(n_ch, w, mean, rstd);
  auto finish = [&](int64_t c, double sy, double sx) {
    k.finish(c, sy, sx, w, mean, rstd, double(n * s_len), train, dw, db);
  };
  // R (relu given): channel c's z constants, each rounded once to A as nact's passes round them,
  // its bound t and kind (relu_kind)
  Scratch<A> zs(R ? 4 * n_ch : 0);
  Scratch<int> zk(R ? n_ch : 0);
  if constexpr (R)
    for (int64_t c = 0; c < n_ch; ++c) {
      A* q = zs.get() + 4 * c;
      q[0] = A(relu->hi[c]), q[1] = A(relu->a[c]), q[2] = A(relu->b[c]), q[3] = A(0);
      zk.get()[c] = act::relu_kind(q[0], q[1], q[2], q + 3);
    }
  auto zc = [&](int64_t c) {  // (R only: the plain backward builds no vectors a run)
    const A* q = zs.get() + 4 * c;
    return ZRelu<A>{vset1(q[0]), vset1(q[1]), vset1(q[2]), vset1(q[3])};
  };
  auto kind = [&](int64_t c) { return R ? zk.get()[c] : 0; };
  // dx of len values of channel c at offset off, its dy read at g
  auto dx_from = [&](int64_t c, const S* g, int64_t off, int64_t len) {
    if constexpr (R) {
      const ZRelu<A> zr = zc(c);
      by_kind<R>(kind(c), [&]<int K>() __attribute__((always_inline)) {
        grad_x_run<S, K>(g, x + off, dx + off, len, k.a[c], k.hi[c], k.k2[c], k.k0[c], train, stream, &zr);
      });
    } else {
      grad_x_run<S>(g, x + off, dx + off, len, k.a[c], k.hi[c], k.k2[c], k.k0[c], train, stream);
    }
  };
  auto dx_channel = [&](int64_t c, int64_t off, int64_t len) { dx_from(c, dy + off, off, len); };
  const Parts pt = parts_of(n, s_len);
  const bool local = pt.n_parts == 1;
  // Where dy_runs writes (dy's own buffer unless given a place): in evaluation dy is read once,
  // by the sums and dx of its piece, so a piece of kDzPiece values goes to a task's scratch in L1
  // (dx read and written as the plain backward does; a multiple of every dtype's sums piece, so
  // the pieces are the same); in training a local channel's dy (P == 1, at most part_values)
  // goes to a task's scratch too, read back by its dx while in L2; other training calls write dy's
  // buffer, read again by a later pass.
  const bool dz_pieces = dy_runs && !train;
  const int64_t dz_channel = dy_runs && train && local ? pt.total : 0;
  auto dz_piece_dx = [&](int64_t c, int64_t off, int64_t len, S* g) {  // evaluation, no sums: dy_runs, then dx
    for (int64_t lo = 0; lo < len; lo += kDzPiece) {
      const int64_t m = std::min(kDzPiece, len - lo);
      (*dy_runs)(c, off + lo, m, g);
      dx_from(c, g, off + lo, m);
    }
  };
  if (need_sums) {
    Scratch<double> part(local ? 0 : 2 * n_ch * pt.n_parts);  // (C, P) of (sum dy, sum dy * (x - hi))
    const int64_t piece = kSumRun * 4 * vlanes<S>;
    static_assert(kDzPiece % (kSumRun * 4 * vlanes<S>) == 0, "dz pieces of whole sums pieces");
    // (sum dy, sum dy * (x - hi)) over channel c's values [v0, v1), from 0 (fused: dx too);
    // buf: a task's scratch, the channel's dy from v0 (dz_channel) or a piece's (dz_pieces)
    auto part_sums = [&](int64_t c, int64_t v0, int64_t v1, double* py, double* px, S* buf) {
      const A h = k.hi[c], f = k.a[c];
      ZRelu<A> zr;
      if constexpr (R) zr = zc(c);
      const ZRelu<A>* z = R ? &zr : nullptr;
      const int kc = kind(c);
      double sy = 0.0, sx = 0.0;
      S* const g_ch = dz_channel ? buf : nullptr;
      auto sums = [&](const S* g, int64_t off, int64_t len) {
        for (int64_t lo = 0; lo < len; lo += piece) {
          A s1, s2;
          by_kind<R>(kc, [&]<int K>() __attribute__((always_inline)) { grad_sums<S, K>(g + lo, x + off + lo, std::min(piece, len - lo), h, &s1, &s2, z); });
          sy += double(s1);
          sx += double(s2);
        }
      };
      int64_t at = 0;  // values of the part before this run
      plane_runs(c, v0, v1, s_len, n_ch, [&](int64_t off, int64_t len) {
        if (dz_pieces) {
          for (int64_t lo = 0; lo < len; lo += kDzPiece) {
            const int64_t m = std::min(kDzPiece, len - lo);
            (*dy_runs)(c, off + lo, m, buf);
            sums(buf, off + lo, m);
            if (fused) grad_x_run(buf, x + off + lo, dx + off + lo, m, f, h, A(0), A(0), false, stream);
          }
        } else {
          const S* g = dy + off;
          if (dy_runs) {
            (*dy_runs)(c, off, len, g_ch ? g_ch + at : nullptr);  // (the run into L1 for its sums)
            if (g_ch) g = g_ch + at;
          }
          sums(g, off, len);
          if (fused)
            by_kind<R>(kc, [&]<int K>() __attribute__((always_inline)) { grad_x_run<S, K>(g, x + off, dx + off, len, f, h, A(0), A(0), false, stream, z); });
        }
        at += len;
      });
      *py = sy, *px = sx;
    };
    const int64_t slot = dz_pieces ? kDzPiece : dz_channel;
    if (channel_tasks(pt, n_ch)) {
      run_tasks_with<S>(n_ch, 2 * pt.total + kPlaneTaskValues, slot, [&](int64_t c, S* buf) {
        double sy = 0.0, sx = 0.0;
        for (int64_t p = 0; p < pt.n_parts; ++p) {  // the parts in order, as the merge below
          double py, px;
          part_sums(c, p * pt.len, std::min(pt.total, (p + 1) * pt.len), &py, &px, buf);
          sy += py;
          sx += px;
        }
        finish(c, sy, sx);
        if (need_dx && !fused)
          plane_runs(c, 0, pt.total, s_len, n_ch, [&](int64_t off, int64_t len) { dx_channel(c, off, len); });
      });
      return;
    }
    run_tasks_with<S>(n_ch * pt.n_parts, 2 * pt.len + kPlaneTaskValues, slot, [&](int64_t t, S* buf) {
      const int64_t c = t / pt.n_parts, v0 = (t - c * pt.n_parts) * pt.len, v1 = std::min(pt.total, v0 + pt.len);
      double sy, sx;
      part_sums(c, v0, v1, &sy, &sx, buf);
      if (!local) { part[2 * t] = sy; part[2 * t + 1] = sx; return; }
      finish(c, sy, sx);
      if (need_dx && !fused) {
        int64_t at = 0;
        plane_runs(c, 0, pt.total, s_len, n_ch, [&](int64_t off, int64_t len) {
          dx_from(c, dz_channel ? buf + at : dy + off, off, len);
          at += len;
        });
      }
    });
    if (local) return;
    for (int64_t c = 0; c < n_ch; ++c) {  // the parts of a channel, in order
      double sy = 0.0, sx = 0.0;
      for (int64_t p = 0; p < pt.n_parts; ++p) { sy += part[2 * (c * pt.n_parts + p)]; sx += part[2 * (c * pt.n_parts + p) + 1]; }
      finish(c, sy, sx);
    }
  }
  if (!need_dx || fused) return;
  if (dy_runs && !need_sums) return over_planes_with<S>(n * n_ch, s_len, n_ch, kDzPiece, dz_piece_dx);  // (no sums pass wrote dy)
  over_planes(n * n_ch, s_len, n_ch, dx_channel);
}

// R (relu given): false, before any work, where a channel's mask is not a bound on x (relu_kind
// 3: constants not finite, or a == 0) -- the caller then writes dz first; the planes view takes
// every channel (kind 3 there: z itself).
template <class S, bool R>
bool backward_impl(const S* dy, const S* x, S* dx, Chan w, const double* stats, double* dw, double* db, View v,
                   bool train, bool need_dx, bool need_wb, const DyRuns* dy_runs, const ReluZ* relu) {
  using A = acc_t<S>;
  if (takes_planes(v, sizeof(S) == 2 && (train || need_wb))) {
    backward_planes<S, R>(dy, x, dx, w, stats, dw, db, v, train, need_dx, need_wb, R ? nullptr : dy_runs, relu);
    return true;
  }
  const int64_t n_ch = v.n_ch, s_len = v.s_len, period = n_ch * s_len;
  // R: each channel's relu_cols constants, sg (+1 or -1) and tt (zero where x * sg <= tt)
  Scratch<A> rs(R ? 2 * n_ch : 0);
  A *rsg = rs.get(), *rtt = rsg + (R ? n_ch : 0);
  if constexpr (R)
    for (int64_t c = 0; c < n_ch; ++c)
      if (!act::relu_sign_bound(A(relu->hi[c]), A(relu->a[c]), A(relu->b[c]), rsg + c, rtt + c)) return false;
  const Geometry g = geometry(v.n_rows, v.width, s_len, constants().local_elems / 2);
  const int64_t n_rows = v.n_rows / g.fold, width = v.width * g.fold;
  const int64_t rows = g.sub * g.group, n_rg = cdiv(n_rows, rows);
  const double *mean = stats, *rstd = stats + 2 * n_ch;
  const bool need_sums = train || need_wb;
  const bool fused = need_dx && need_wb && !train;  // eval: dx in the same pass as the sums
  const double cnt = double(v.n_rows * s_len);  // values per channel
  const int64_t vw = v.width, toff = n_rows * width;  // the tail (R mod F rows, unfolded) at toff
  GradConst<A> k(n_ch);
  k.init(n_ch, w, mean, rstd);
  const bool local = g.local && need_sums;
  auto finish = [&](int64_t c, double sy, double sx) { k.finish(c, sy, sx, w, mean, rstd, cnt, train, dw, db); };
  // per column u < n from column c0 of a row: hi, a (R: sg, tt) of its channel, in runs of S
  // columns a channel (an integer division a column was half of BatchNorm2d(192)'s 9x192x8x8
  // evaluation backward, 104 -> 57 us)
  auto column_consts = [&](int64_t c0, int64_t n, A* eh, A* ea, A* es, A* et) {
    const int64_t q = c0 % period;
    int64_t c = q / s_len;
    for (int64_t u = 0, m = std::min(n, s_len - q % s_len); u < n; u += m, m = std::min(n - u, s_len)) {
      std::fill(eh + u, eh + u + m, k.hi[c]);
      std::fill(ea + u, ea + u + m, k.a[c]);
      if constexpr (R) {
        std::fill(es + u, es + u + m, rsg[c]);
        std::fill(et + u, et + u + m, rtt[c]);
      }
      if (++c == n_ch) c = 0;
    }
  };
  if (need_sums) {
    Scratch<double> part(2 * n_rg * width);
    double* pdy = part.get();          // (G, W) per-task, per-column sums of dy
    double* pdx = pdy + n_rg * width;  // (G, W) ... of dy * (x - hi)
    // Few row groups for the threads (fewer than 8 a thread, not a multiple of them: 3 groups on
    // 2 threads left one idle a third of the pass): each group's rows cut into as many pieces as
    // there are threads, at chunk boundaries, each piece's chunk sums kept (`chunks`, (G, chunks
    // a group, 2, W) of the accumulation dtype, at most max_partials values), then added a group
    // at a time in chunk order -- a group's float64 sums the very additions of one task doing the
    // group, so the same bits for any thread count. (Cutting the columns instead lost: half-rows
    // read with a stride, their other halves fetched by the prefetchers.)
    const int64_t n_thr = std::max<int64_t>(1, at::get_num_threads());
    const int64_t cpg = cdiv(rows, kSumRun);  // chunks a group (the last group's may be fewer)
    const bool by_chunks = !local && g.cw == width && n_thr > 1 && n_rg % n_thr != 0 && n_rg < 8 * n_thr &&
                           n_rg * cpg * 2 * width <= constants().max_partials && cpg >= n_thr;
    const int64_t per_piece = by_chunks ? cdiv(cpg, n_thr) : 0;  // chunks a piece
    Scratch<A> chunk_sums(by_chunks ? n_rg * cpg * 2 * width : 0);
    const int64_t tasks = by_chunks ? n_rg * n_thr : n_tasks(n_rows, width, rows, g.cw, 0);
    run_tasks(tasks, by_chunks ? per_piece * kSumRun * width : rows * g.cw, [&](int64_t task) {
      Span sp;
      A* cs = nullptr;
      if (by_chunks) {  // group task / n_thr, its piece task % n_thr
        const int64_t gi = task / n_thr, k0 = (task % n_thr) * per_piece;
        const int64_t r0 = gi * rows + k0 * kSumRun, r1 = std::min({gi * rows + rows, n_rows, r0 + per_piece * kSumRun});
        if (r0 >= r1) return;
        sp = {gi, r0, r1, 0, width};
        cs = chunk_sums.get() + (gi * cpg + k0) * 2 * width;
      } else {
        sp = span(task, 0, n_rows, width, rows, g.cw);
      }
      double* ty = pdy + sp.g * width + sp.c0;
      double* tx = pdx + sp.g * width + sp.c0;
      Scratch<A> eh(sp.n), ea(sp.n), es(R ? sp.n : 0), et(R ? sp.n : 0);
      column_consts(sp.c0, sp.n, eh.get(), ea.get(), es.get(), et.get());
      task_grad_sums<S, R>(dy + sp.c0, x + sp.c0, dx ? dx + sp.c0 : nullptr, width, sp.r0, sp.r1, sp.n, kSumRun,
                           eh.get(), ea.get(), ty, tx, fused, cs, es.get(), et.get());
      if (!local) return;  // (a task: returns nothing)
      // whole channels, every row: finish them here, then dx while in cache
      const int64_t ch0 = sp.c0 / s_len;
      for (int64_t c = ch0; c < ch0 + sp.n / s_len; ++c) {
        double sy, sx;
        channel_sums(ty, tx, (c - ch0) * s_len, s_len, 1, period, &sy, &sx);
        finish(c, sy, sx);
      }
      if (need_dx && !fused) {
        const int64_t off = s_len == 1 ? sp.c0 : 0;
        grad_x<S, R>(dy, x, dx, width, sp.r0, sp.r1, sp.c0, sp.n, s_len, ch0, n_ch, k.a + off, k.hi + off,
                     k.k2 + off, k.k0 + off, train, false, rsg + off, rtt + off);
      }
    });
    if (local) return true;
    if (by_chunks) {  // each group's chunk sums in chunk order, as one task would (columns in blocks)
      constexpr int64_t kCols = 256;
      run_tasks(n_rg * cdiv(width, kCols), cpg * 2 * kCols, [&](int64_t t) {
        const int64_t gi = t / cdiv(width, kCols), u0 = (t % cdiv(width, kCols)) * kCols, u1 = std::min(width, u0 + kCols);
        const int64_t nk = cdiv(std::min(rows, n_rows - gi * rows), kSumRun);
        double *ty = pdy + gi * width, *tx = pdx + gi * width;
        std::fill(ty + u0, ty + u1, 0.0);
        std::fill(tx + u0, tx + u1, 0.0);
        for (int64_t k = 0; k < nk; ++k) {
          const A* c1 = chunk_sums.get() + (gi * cpg + k) * 2 * width;
          const A* c2 = c1 + width;
          for (int64_t u = u0; u < u1; ++u) { ty[u] += double(c1[u]); tx[u] += double(c2[u]); }
        }
      });
    }
    for (int64_t gi = 1; gi < n_rg; ++gi) {  // per column, over tasks in order
      const double *yg = pdy + gi * width, *xg = pdx + gi * width;
      for (int64_t u = 0; u < width; ++u) { pdy[u] += yg[u]; pdx[u] += xg[u]; }
    }
    // the tail's per-column sums (and its fused dx), the constants per column of its rows
    Scratch<double> tsum(g.tail ? 2 * vw : 0);
    if (g.tail) {
      Scratch<A> eh(vw), ea(vw), es(R ? vw : 0), et(R ? vw : 0);
      column_consts(0, vw, eh.get(), ea.get(), es.get(), et.get());
      task_grad_sums<S, R>(dy + toff, x + toff, dx ? dx + toff : nullptr, vw, 0, g.tail, vw, kSumRun, eh.get(),
                           ea.get(), tsum.get(), tsum.get() + vw, fused, nullptr, es.get(), et.get());
    }
    for (int64_t c = 0; c < n_ch; ++c) {  // per channel, over its columns in order (then the tail's)
      double sy, sx;
      channel_sums(pdy, pdx, c * s_len, s_len, g.fold, period, &sy, &sx);
      if (g.tail) {
        double ty, tx;
        channel_sums(tsum.get(), tsum.get() + vw, c * s_len, s_len, 1, period, &ty, &tx);
        sy += ty, sx += tx;
      }
      finish(c, sy, sx);
    }
  }
  if (!need_dx || fused) return true;
  const bool tile = s_len == 1 && width != n_ch;
  Scratch<A> t1(tile ? width : 0), t2(tile ? width : 0), t3(tile ? width : 0), t4(tile ? width : 0);
  Scratch<A> t5(tile && R ? width : 0), t6(tile && R ? width : 0);
  const A *pa = k.a, *ph = k.hi, *p2 = k.k2, *p0 = k.k0, *ps = rsg, *pt = rtt;
  if (tile) {
    pa = tiled(k.a, n_ch, width, t1.get()); ph = tiled(k.hi, n_ch, width, t2.get());
    p2 = tiled(k.k2, n_ch, width, t3.get()); p0 = tiled(k.k0, n_ch, width, t4.get());
    if constexpr (R) ps = tiled(rsg, n_ch, width, t5.get()), pt = tiled(rtt, n_ch, width, t6.get());
  }
  // rows of whole cache lines (channels-last): dx streamed where the pass's arrays pass half the LLC
  const bool stream = s_len == 1 && (width * int64_t(sizeof(S))) % 64 == 0 &&
                      reinterpret_cast<uintptr_t>(dx) % 64 == 0 &&
                      streams_output((train ? 3 : 2) * n_rows * width * int64_t(sizeof(S)));
  run_tasks(n_tasks(n_rows, width, rows, g.cw, 1), constants().phase1_values, [&](int64_t task) {
    const Span sp = span(task, 1, n_rows, width, rows, g.cw);
    grad_x<S, R>(dy, x, dx, width, sp.r0, sp.r1, 0, width, s_len, 0, n_ch, pa, ph, p2, p0, train, stream, ps, pt);
  });
  if (g.tail)  // (its constants per channel, or per column: S == 1 and C columns)
    grad_x<S, R>(dy + toff, x + toff, dx + toff, vw, 0, g.tail, 0, vw, s_len, 0, n_ch, k.a, k.hi, k.k2, k.k0, train,
                 false, rsg, rtt);
  return true;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Entry points: the storage dtype chosen once
// ----------------------------------------------------------------------------------------------

template <class F> static void by_dtype(Dt dt, const F& f) {
  switch (dt) {
    case Dt::f32: f(float{}); break;
    case Dt::f64: f(double{}); break;
    case Dt::bf16: f(bf16{}); break;
    case Dt::f16: f(f16{}); break;
  }
}

void forward(Dt dt, const void* x, void* y, Chan w, Chan b, Chan rm, Chan rv, double* stats, View v, double eps,
             bool train) {
  by_dtype(dt, [&](auto s) {
    using S = decltype(s);
    forward_impl<S>(static_cast<const S*>(x), static_cast<S*>(y), w, b, rm, rv, stats, v, eps, train);
  });
}

bool streams_planes(Dt dt, int64_t n_planes, int64_t s_len) {
  bool r = false;
  by_dtype(dt, [&](auto s) { r = planes_stream<decltype(s)>(n_planes, s_len); });
  return r;
}

bool backward_takes_planes(Dt dt, View v, bool train, bool need_wb) {
  const bool half = dt == Dt::bf16 || dt == Dt::f16;
  return takes_planes(v, half && (train || need_wb));
}

bool backward(Dt dt, const void* dy, const void* x, void* dx, Chan w, const double* stats, double* dw, double* db,
              View v, bool train, bool need_dx, bool need_wb, const DyRuns* dy_runs, const ReluZ* relu) {
  bool done = false;
  by_dtype(dt, [&](auto s) {
    using S = decltype(s);
    auto run = [&]<bool R>() {
      done = backward_impl<S, R>(static_cast<const S*>(dy), static_cast<const S*>(x), static_cast<S*>(dx), w, stats,
                                 dw, db, v, train, need_dx, need_wb, dy_runs, relu);
    };
    if (relu) run.template operator()<true>();
    else run.template operator()<false>();
  });
  return done;
}

void update_running(MutChan rm, MutChan rv, const double* mean, const double* var, int64_t n_ch, int64_t n,
                    double momentum) {
  const double keep = 1.0 - momentum, bessel = double(n) / (double(n) - 1.0);
  for (int64_t c = 0; c < n_ch; ++c) {
    rm.set(c, keep * rm.at(c) + momentum * mean[c]);
    rv.set(c, keep * rv.at(c) + momentum * (var[c] * bessel));
  }
}

}  // namespace normlab::bn
