// GroupNorm over NHWC samples: x as (N, S, C), channels fastest -- channels_last inputs with S > 1,
// and the backward of every S == 1 input. Every inner loop runs over contiguous channels with
// per-channel vectors of length C; per-group values are spread to their channels, per-channel sums
// added per group in channel order. Layouts and conventions: group_norm_kernels.h; the math:
// docs/derivations/group_norm.md.
//
// The rule (from the shape alone, so the bits are the same for any number of threads):
//   tile   ceil(64 KiB / a row's bytes) rows of a sample: the forward's statistics read a tile
//          once about a shift, and again from L2 where that shift is far from the tile's mean
//          (chunk_moments), giving per group (count, mean, M2);
//          the backward's column sums run per tile in float32 and are added in float64;
//   chunk  a run of tiles: rows = max(ceil(32K / C), ceil(S / 32)) rounded up to whole tiles -- the
//          unit of work a thread takes; tiles merge into their chunk and chunks into their sample
//          in order (Chan in float64; backward: float64 sums).
// Column sums keep NV <= 4 vectors of channels in registers, in blocks of 32 rows with 2 (NV > 2)
// or 4 row chains a block (col_sums_m): float32 chains of at most ~40 terms. Pass 1 of a tile asks
// for the next tile's cache lines, a few at each row, so that the next pass 1 finds them in cache
// (memory read beside the arithmetic, not before it): within the chunk (the forward: the sample),
// and where the call's tensors take more than half the last-level cache, across chunks and samples
// to the end of the thread's task (channels-last float32 GroupNorm(32, 256) N x 256 x 14 x 14
// backward, one thread: N = 32-64 10-20 % faster than within the chunk; N = 8-16, whose tensors
// stay in cache in a loop of backwards, 5-15 % faster with no hints at all, but in a
// forward+backward the forward's x comes from past the caches and the hints within the chunk gain:
// N = 16 and 32 forward+backward 0.64-0.86 and 1.67-1.79 ms with them, 0.74-0.82 and 2.02-2.25
// without).
// The output passes (y, and the backward's dx) run kOutRows = 4 rows at a time, channel vector by
// channel vector, the per-channel vectors loaded once for the 4 rows (x read and y written over 4
// adjacent rows: one region, in order; a streamed y row by row, so that each streamed line is
// written whole in one run; the backward's dx row by row where rows of at least 512 bytes come from
// past L2 -- the sums before it read more than 1 MiB of x and dy, a sample's or a run's by chunks;
// x, dy and dx of 4 rows were 12 streams at once: channels-last float32 GroupNorm(1, 256)
// 10x256x12x363 forward+backward 0.83x torch -> 0.99x; in cache the 4 rows stay faster).
// A chunk's first tile is shifted by its groups' means over the chunk's first rows (64 values a
// group, at most 32 rows), the next tiles by the chunk's running mean.
// Channels past the last whole vector (C off a multiple of the lanes, where the view below does not
// apply) go as one partial vector (vload_n / vstore_n: a masked load or store with AVX-512), and a
// tile's per-channel sums are added per group as vectors (channel_sum), not one scalar chain.
// Threads (which never changes a bit): whole samples (forward) or whole runs of kRun samples
// (backward) go to threads when that leaves at most an eighth of the thread-time idle; otherwise
// (N = 1, 2 samples on 3 threads, a single run, ...) the chunks of the samples are spread over the
// threads, their partials in scratch of (samples) x (chunks a sample, <= 32) x 2G + 1 (forward: the
// samples are then fewer than 7 a thread) or (samples of one run) x (chunks) x 3C (backward), then
// merged, and the output pass runs by chunks. The forward's y streams past the caches when x and y
// take more than half the last-level cache (numerics/stream.h), the backward's dx when x, dy and dx
// do and its rows are whole cache lines (no read for ownership: N = 64 above 0.85 -> 0.63 ns a
// value).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu/group_norm_kernels.h"
#include "cpu/group_norm_sums.h"
#include "numerics/chunks.h"
#include "numerics/prefetch.h"
#include "numerics/relu_bound.h"
#include "numerics/scratch.h"
#include "numerics/stream.h"
#include "numerics/vec.h"

namespace normlab::group_norm {

namespace {

// f(j) on vectors of L channels at j (from j0), then part(j, n) on the n < L channels left (a
// partial vector).
template <int64_t L, class F, class G> inline void over_channels(int64_t c, const F& f, const G& part, int64_t j0 = 0) {
  int64_t j = j0;
  for (; j + L <= c; j += L) f(j);
  if (j < c) part(j, c - j);
}

// out[gi*cg + k] = v[gi]: a per-group value on each of its group's channels.
template <class A, class B> inline void spread(const A* v, int64_t g, int64_t cg, B* out) {
  if (cg == 1) {  // one loop the compiler vectorises (at G = C this runs once a tile)
    for (int64_t gi = 0; gi < g; ++gi) out[gi] = B(v[gi]);
    return;
  }
  for (int64_t gi = 0; gi < g; ++gi)
    for (int64_t k = 0; k < cg; ++k) out[gi * cg + k] = B(v[gi]);
}

// The sum of a[0..n): in order below two vectors; otherwise two vector chains (vectors 0, 2, 4, ...
// and 1, 3, ...), added, then across lanes (hsum), then the values past the last whole vector in
// order -- run once a tile per group, so a group of hundreds of channels is not one scalar chain.
template <class A> inline A channel_sum(const A* a, int64_t n) {
  constexpr int64_t L = lanes<A>;
  if (n < 2 * L) {
    A s = a[0];
    for (int64_t k = 1; k < n; ++k) s += a[k];
    return s;
  }
  vec<A> s0 = vload(a), s1 = vload(a + L);
  int64_t k = 2 * L;
  for (; k + 2 * L <= n; k += 2 * L) s0 += vload(a + k), s1 += vload(a + k + L);
  if (k + L <= n) s0 += vload(a + k), k += L;
  A s = hsum<A>(s0 + s1);
  for (; k < n; ++k) s += a[k];
  return s;
}
// out[gi] = the sum of a[gi*cg + k] over the group's channels k (channel_sum).
template <class A> inline void group_sums(const A* a, int64_t g, int64_t cg, A* out) {
  if (cg == 1) return void(std::copy(a, a + g, out));
  for (int64_t gi = 0; gi < g; ++gi) out[gi] = channel_sum(a + gi * cg, cg);
}

// Samples per row of the backward's dw/db partials: a run's terms are added in float32 (half types,
// float32) in sample order, the rows then in float64 -- short float32 chains.
constexpr int64_t kRun = 16;
// Bytes of x in a tile (two passes from L2), values at least of a chunk (below torch's grain a split does not
// pay), and the most chunks a sample is cut into (enough to share one sample among many threads).
constexpr int64_t kTileBytes = 65536;
constexpr int64_t kChunkValues = 32768;
constexpr int64_t kMaxChunks = 32;
// The first tile of a chunk is shifted by its groups' means over its first rows (chunk_moments):
// enough rows for kShiftValues values a group (the shift then within ~0.15 std of the tile's mean
// for a tile of normal values: far inside the one-pass test's 0.58), at most kShiftRows.
constexpr int64_t kShiftRows = 32, kShiftValues = 64;
// (Virtual) rows the output pass writes at a time (affine_rows).
constexpr int64_t kOutRows = 4;
constexpr int64_t kWideRowBytes = 512, kNearBytes = int64_t(1) << 20;  // the backward's dx pass (bwd_nhwc)

// C not a multiple of the lanes: runs of rep = P / C rows (P = lcm(C, lanes), at most 64 vectors)
// are read as virtual rows of ce = P values -- whole vectors, lane k holding channel k % C -- with
// the per-channel vectors tiled to P values and the virtual channels' sums folded back to C in order;
// the rows past the last whole run (only at a sample's end: tiles are whole runs) go one value at a
// time. The view costs O(P) a sample (the tiling, the folds), so it is taken where a sample holds at
// least P rows (ns >= P); otherwise, and for C a multiple of the lanes, ce = C, rep = 1 (each row's
// last channels a partial vector). One thread, float32, x torch.nn, with the view -> without:
// GroupNorm(1, 45) 26x45x7x7 (P = 720) forward 0.59 -> 1.30, 8x45x14x14 1.27 -> 1.82, 8x45x28x28
// forward+backward 1.26 -> 1.32; GroupNorm(1, 3) 8x3x56x56 (P = 48) keeps it: 18.1 with, 6.2 without.
struct View {
  int64_t ce, rep;
};
template <int64_t L> View view_of(int64_t c, int64_t ns) {
  if (c <= 0 || c % L == 0) return {c, 1};
  const int64_t p = std::lcm(c, L);
  return p <= 64 * L && ns >= p ? View{p, p / c} : View{c, 1};
}
// out[k] = v[k % c] for k < ce (ce a multiple of c).
template <class A> inline void tiled(const A* v, int64_t c, int64_t ce, A* out) {
  for (int64_t k0 = 0; k0 < ce; k0 += c)
    for (int64_t j = 0; j < c; ++j) out[k0 + j] = v[j];
}
// acc[j] = the sum of av[k] over k % c == j, k in order (ce values of av, ce a multiple of c), added
// in T and rounded to A once. The backward folds its sums in T = double: rep - 1 float32 additions
// put channels-last GroupNorm(1, 3) 2x3x8x8 dweight at 36x its rounding error at a mean of 1e4,
// over the accuracy rule's 32x (test_group_norm_large_mean.py); the forward's moments in T = A.
template <class T, class A> inline void fold(const A* av, int64_t c, int64_t ce, A* acc) {
  for (int64_t j = 0; j < c; ++j) {
    T t = T(av[j]);
    for (int64_t k0 = c; k0 < ce; k0 += c) t += T(av[k0 + j]);
    acc[j] = A(t);
  }
}

struct Blocking {
  int64_t tile, chunk, n_chunks;  // rows of a tile, of a chunk (whole tiles); chunks of a sample
};
Blocking blocking(int64_t ns, int64_t c, int64_t elem_bytes, int64_t rep) {
  const int64_t cc = std::max<int64_t>(c, 1), row_bytes = cc * elem_bytes;
  int64_t tile = std::max<int64_t>(1, (kTileBytes + row_bytes - 1) / row_bytes);
  tile = std::min(ns, (tile + rep - 1) / rep * rep);  // whole runs of the view
  int64_t chunk = std::max((kChunkValues + cc - 1) / cc, (ns + kMaxChunks - 1) / kMaxChunks);
  chunk = std::min(ns, (chunk + tile - 1) / tile * tile);
  return {tile, chunk, (ns + chunk - 1) / chunk};
}

// Whether `items` items in tasks of `per` (the last task shorter) on the pool's threads leave at
// most an eighth of the thread-time idle: a thread takes at most ceil(tasks / threads) whole tasks.
// (Counting tasks alone, 17 samples in runs of 16 read as 2 tasks for 2 threads, and one thread
// took 16 samples: channels-last bfloat16 GroupNorm(1, 192) 17x192x6x24x24 fwd+bwd 0.65x torch.)
// Where task units [.., u1) of (sample, chunk) -- q chunks of `chunk` rows a sample of ns rows --
// end, in rows from the first unit's sample: the rows a task's passes may ask for ahead of use
// (the next tile, across chunks and samples: NHWC rows are contiguous).
inline int64_t task_end(int64_t u1, int64_t q, int64_t ns, int64_t chunk) {
  return (u1 - 1) / q * ns + std::min(ns, ((u1 - 1) % q + 1) * chunk);
}

bool balanced(int64_t items, int64_t per = 1) {
  const int64_t t = std::max<int64_t>(1, at::get_num_threads());
  const int64_t tasks = (items + per - 1) / per, most = std::min(items, (tasks + t - 1) / t * per);
  return 8 * items >= 7 * t * most;
}

// Column sums: for v < NV, out[v] = sum over rows r of f(r, v) (a vector of channels), in blocks of
// kSumRows rows: a block's rows in RC interleaved chains from zero, added pairwise, the block then
// added to the total in order -- float32 chains of at most kSumRows / RC + rows / kSumRows terms, a
// fixed order for each (rows, NV).
constexpr int64_t kSumRows = 32;
// hook(r), where given, runs before row r's vectors (it adds nothing: cache hints).
struct NoHook {
  void operator()(int64_t) const {}
};
template <class A, int NV, int M, class F, class H = NoHook>
inline void col_sums_m(int64_t rows, const F& f, vec<A> (*o)[NV], const H& hook = H{}) {
  constexpr int RC = NV > 2 ? 2 : 4;
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < NV; ++v) o[m][v] = vzero<A>();
  for (int64_t r0 = 0; r0 < rows; r0 += kSumRows) {
    const int64_t r1 = std::min(rows, r0 + kSumRows);
    vec<A> a[M][RC][NV];
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < RC; ++k)
        for (int v = 0; v < NV; ++v) a[m][k][v] = vzero<A>();
    int64_t r = r0;
    for (; r + RC <= r1; r += RC)
#pragma GCC unroll 4
      for (int k = 0; k < RC; ++k) {
        hook(r + k);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          vec<A> t[M];
          f(r + k, v, t);
          for (int m = 0; m < M; ++m) a[m][k][v] += t[m];
        }
      }
#pragma GCC unroll 4
    for (int k = 0; k < RC - 1; ++k) {  // the last rows (fewer than RC): k a constant, a[] in registers
      if (r + k >= r1) break;
      hook(r + k);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        vec<A> t[M];
        f(r + k, v, t);
        for (int m = 0; m < M; ++m) a[m][k][v] += t[m];
      }
    }
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < NV; ++v) {
        if constexpr (RC == 4) o[m][v] += (a[m][0][v] + a[m][1][v]) + (a[m][2][v] + a[m][3][v]);
        else o[m][v] += a[m][0][v] + a[m][1][v];
      }
  }
}
// The same for one channel past the vectors: sums[m] = sum over rows of f(r, t)'s t[m], blocks of
// kSumRows rows from zero, added in order.
template <class A, int M, class F> inline void tail_sums(int64_t rows, const F& f, A* sums) {
  for (int m = 0; m < M; ++m) sums[m] = A(0);
  for (int64_t r0 = 0; r0 < rows; r0 += kSumRows) {
    A a[M] = {};
    for (int64_t r = r0; r < std::min(rows, r0 + kSumRows); ++r) {
      A t[M];
      f(r, t);
      for (int m = 0; m < M; ++m) a[m] += t[m];
    }
    for (int m = 0; m < M; ++m) sums[m] += a[m];
  }
}
template <class A, int NV, class F> inline void col_sums(int64_t rows, const F& f, vec<A>* out) {
  vec<A> o[1][NV];
  col_sums_m<A, NV, 1>(rows, [&](int64_t r, int v, vec<A>* t) { t[0] = f(r, v); }, o);
  for (int v = 0; v < NV; ++v) out[v] = o[0][v];
}
template <class A, int NV, class F> inline void col_sums3(int64_t rows, const F& f, vec<A> (*o)[NV]) {
  col_sums_m<A, NV, 3>(rows, f, o);
}

// blk.template operator()<NV>(j0) over blocks of NV <= 4 vectors of channels, then part(j, n) on the
// n < L channels past the last whole vector (one partial vector: vload_n / vstore_n).
template <int64_t L, class Blk, class Part> inline void channel_blocks(int64_t c, const Blk& blk, const Part& part) {
  int64_t j = 0;
  for (; j + 4 * L <= c; j += 4 * L) blk.template operator()<4>(j);
  switch ((c - j) / L) {
    case 3: blk.template operator()<3>(j); break;
    case 2: blk.template operator()<2>(j); break;
    case 1: blk.template operator()<1>(j); break;
    default: break;
  }
  j += (c - j) / L * L;
  if (j < c) part(j, c - j);
}
// How many blocks of whole vectors channel_blocks runs over c channels (its calls of blk).
template <int64_t L> constexpr int64_t sum_blocks(int64_t c) { return c / (4 * L) + (c % (4 * L) >= L ? 1 : 0); }

// The running (count, mean, M2) of G groups in float64 (the count is the same for every group of a
// sample's rows); merge() adds a part of count nb (Chan et al.), the first part taken as it is.
struct Moments {
  int64_t g;
  double* mean;  // (G,)
  double* m2;    // (G,)
  double n = 0;
  void reset() { n = 0; }
  void merge(double nb, const double* mb, const double* m2b) {
    if (n == 0) {
      for (int64_t gi = 0; gi < g; ++gi) mean[gi] = mb[gi], m2[gi] = m2b[gi];
      n = nb;
      return;
    }
    const double t = n + nb, w1 = nb / t, w2 = n * nb / t;
    for (int64_t gi = 0; gi < g; ++gi) {
      const double d = mb[gi] - mean[gi];
      mean[gi] += d * w1;
      m2[gi] += m2b[gi] + d * d * w2;
    }
    n = t;
  }
  void merge(const Moments& o) { merge(o.n, o.mean, o.m2); }
};

// The forward's statistics of rows [r0, r1) of sample x (S, C) (a chunk), group shift sh (C,) per
// channel, merged into out in tile order. Per tile and group, about a shift c (the group's first
// value for the chunk's first tile, then the chunk's running mean so far, rounded to A):
//   pass 1   s1 = sum (x - c), s2 = sum (x - c)^2,  md = s1 / count     (one pass, from memory)
//   accept   M2 = s2 - count * md^2 when count * md^2 <= s2 / 4 (c within ~0.58 std of the tile's
//            mean: the subtraction then loses at most 2 bits of s2's; x - c is exact where x is
//            within a factor 2 of c) -- for every group of the tile, else
//   pass 2   M2 = sum (x - ct)^2 - count * (c + md - ct)^2,  ct = c + md rounded to A (from L2)
// -- the second pass about the tile's own rounded mean (no cancellation), its offset from the
// float64 mean taken out exactly as Chan's merge would. The chunk's first tile usually takes pass 2
// (one value is a poor shift); the next ones, shifted by the running mean, pass 1 only. tm: (2G,),
// acc, ctc: (C,), gs: (G,) scratch.
template <class S>
void chunk_moments(const S* x, int64_t r0, int64_t r1, int64_t r_end, int64_t tile, int64_t c, int64_t g,
                   const View& vw, const acc_t<S>* sh, acc_t<S>* acc, acc_t<S>* ctc, acc_t<S>* gs, double* tm,
                   Moments& out) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t cg = c / g;
  const int64_t ce = vw.ce;
  std::vector<A> vbuf(ce == c ? 0 : 4 * ce);  // the view's shift, ct and two sums
  Scratch<A> ebuf(2 * c + g);  // the tile's shift and second sums per channel; per group (each written first)
  A *cvc = ebuf.get(), *s2c = cvc + c, *gs2 = s2c + c;
  A* cvv = ce == c ? cvc : vbuf.data();
  A* ctv = ce == c ? ctc : vbuf.data() + ce;
  A* accv = ce == c ? acc : vbuf.data() + 2 * ce;
  A* s2v = ce == c ? s2c : vbuf.data() + 3 * ce;
  double *tmean = tm, *tm2 = tm + g;
  // the groups' shifts in float64, side by side: the per-tile loops over the groups below are
  // plain loops over arrays, which the compiler may vectorise (at G = C they run once a tile for
  // every channel)
  std::vector<double> gshd(g), gcd(g);  // the group shifts; the tile's shift c (float64 of its A value)
  for (int64_t gi = 0; gi < g; ++gi) gshd[gi] = gcd[gi] = double(sh[gi * cg]);
  {  // the first tile's shift: per group the mean of the chunk's first rows (kShiftValues; in
     // float32 for half types: only an estimate), where finite -- near the tile's mean, so that its
     // one pass is accepted for every group (about one value, 1 std off on average, it mostly took
     // pass 2)
    const int64_t k = std::min({kShiftRows, r1 - r0, (kShiftValues + cg - 1) / cg});
    std::fill(acc, acc + c, A(0));
    for (int64_t r = 0; r < k; ++r) {
      const S* xr = x + (r0 + r) * c;
      over_channels<L>(
          c, [&](int64_t j) { vstore(acc + j, vload(acc + j) + vload(xr + j)); },
          [&](int64_t j, int64_t nl) { vstore_n(acc + j, vload_n(acc + j, nl) + vload_n(xr + j, nl), nl); });
    }
    group_sums(acc, g, cg, gs);
    const double inv = 1.0 / double(k * cg);
    for (int64_t gi = 0; gi < g; ++gi) {
      const A e = A(double(gs[gi]) * inv);
      if (std::isfinite(e)) gcd[gi] = double(e);
      gs[gi] = A(gcd[gi]);
    }
    spread(gs, g, cg, cvc);
  }
  out.reset();
  for (int64_t t0 = r0; t0 < r1; t0 += tile) {
    const int64_t rows = std::min(tile, r1 - t0), vr = rows / vw.rep, rr = vr * vw.rep;
    const S* xt = x + t0 * c;
    if (ce != c) tiled(cvc, c, ce, cvv);
    // the next tile's lines asked for during pass 1, a few at each row of each block
    const int64_t next_rows = std::max<int64_t>(0, std::min(tile, r_end - t0 - tile));
    Ahead ahead(xt + tile * c, next_rows * c * int64_t(sizeof(S)), vr * sum_blocks<L>(ce));
    channel_blocks<L>(
        ce,
        [&]<int NV>(int64_t j0) {
          vec<A> vs[NV], o[2][NV];
          for (int v = 0; v < NV; ++v) vs[v] = vload(cvv + j0 + v * L);
          col_sums_m<A, NV, 2>(vr,
                               [&](int64_t r, int v, vec<A>* t) {
                                 t[0] = vload(xt + r * ce + j0 + v * L) - vs[v];
                                 t[1] = t[0] * t[0];
                               },
                               o, [&](int64_t) { ahead(); });
          for (int v = 0; v < NV; ++v) vstore(accv + j0 + v * L, o[0][v]), vstore(s2v + j0 + v * L, o[1][v]);
        },
        [&](int64_t j, int64_t nl) {
          const vec<A> vs = vload_n(cvv + j, nl);
          vec<A> o[2][1];
          col_sums_m<A, 1, 2>(vr,
                              [&](int64_t r, int, vec<A>* t) {
                                t[0] = vload_n(xt + r * ce + j, nl) - vs;
                                t[1] = t[0] * t[0];
                              },
                              o);
          vstore_n(accv + j, o[0][0], nl);
          vstore_n(s2v + j, o[1][0], nl);
        });
    ahead.rest();
    if (ce != c) fold<A>(accv, c, ce, acc), fold<A>(s2v, c, ce, s2c);
    for (int64_t j = 0; rr < rows && j < c; ++j) {  // rows past the last whole run of the view
      A t[2];
      tail_sums<A, 2>(rows - rr,
                      [&](int64_t r, A* q) {
                        q[0] = to_acc(xt[(rr + r) * c + j]) - cvc[j];
                        q[1] = q[0] * q[0];
                      },
                      t);
      acc[j] += t[0], s2c[j] += t[1];
    }
    group_sums(acc, g, cg, gs);
    group_sums(s2c, g, cg, gs2);
    const double cnt = double(rows * cg), inv = 1.0 / cnt;
    int one_pass = 1;  // for every group 4 q <= s2 < inf (false for NaN); no branch: a vector loop
    for (int64_t gi = 0; gi < g; ++gi) {
      const double md = double(gs[gi]) * inv, q = cnt * (md * md), s2 = double(gs2[gi]);
      tmean[gi] = (gcd[gi] - gshd[gi]) + md;  // the tile's mean of x - sh
      tm2[gi] = s2 - q;
      one_pass &= int(4.0 * q <= s2) & int(s2 <= std::numeric_limits<double>::max());
    }
    if (!one_pass) {  // pass 2 about the tile's rounded mean ct, from L2
      for (int64_t gi = 0; gi < g; ++gi) gs[gi] = A(gshd[gi] + tmean[gi]);  // ct
      spread(gs, g, cg, ctc);
      if (ce != c) tiled(ctc, c, ce, ctv);
      channel_blocks<L>(
          ce,
          [&]<int NV>(int64_t j0) {
            vec<A> vm[NV], o[NV];
            for (int v = 0; v < NV; ++v) vm[v] = vload(ctv + j0 + v * L);
            col_sums<A, NV>(vr,
                            [&](int64_t r, int v) {
                              const vec<A> e = vload(xt + r * ce + j0 + v * L) - vm[v];
                              return e * e;
                            },
                            o);
            for (int v = 0; v < NV; ++v) vstore(accv + j0 + v * L, o[v]);
          },
          [&](int64_t j, int64_t nl) {
            const vec<A> vm = vload_n(ctv + j, nl);
            vec<A> o[1];
            col_sums<A, 1>(vr,
                           [&](int64_t r, int) {
                             const vec<A> e = vload_n(xt + r * ce + j, nl) - vm;
                             return e * e;
                           },
                           o);
            vstore_n(accv + j, o[0], nl);
          });
      if (ce != c) fold<A>(accv, c, ce, acc);
      for (int64_t j = 0; rr < rows && j < c; ++j) {
        A t;
        tail_sums<A, 1>(rows - rr,
                        [&](int64_t r, A* q) {
                          const A e = to_acc(xt[(rr + r) * c + j]) - ctc[j];
                          q[0] = e * e;
                        },
                        &t);
        acc[j] += t;
      }
      A* m2g = ctc;  // (G,): ctc is free after pass 2
      group_sums(acc, g, cg, m2g);
      for (int64_t gi = 0; gi < g; ++gi) {
        const double off = (gshd[gi] + tmean[gi]) - double(gs[gi]);
        tm2[gi] = std::max(0.0, double(m2g[gi]) - cnt * (off * off));
      }
    }
    out.merge(cnt, tmean, tm2);
    if (t0 + tile >= r1) break;
    // the next tile's shift: the chunk's running mean so far, rounded to A
    for (int64_t gi = 0; gi < g; ++gi) gs[gi] = A(gshd[gi] + out.mean[gi]), gcd[gi] = double(gs[gi]);
    spread(gs, g, cg, cvc);
  }
}

// Whether no output of the pass y = act((x - ch) * a + bb) over C channels can be NaN, so that a
// bfloat16 store may leave its NaN test out: an activation that keeps z's NaN-free values NaN-free
// (act::keeps_nan_free: none, relu, leaky_relu) and every channel's constants nan_free_affine
// (vec.h; ch is x's own group mean).
template <int Act, class A> inline bool outputs_nan_free(const A* ch, const A* a, const A* bb, int64_t c, A p) {
  return act::keeps_nan_free<Act>(p) && nan_free_affines(ch, a, bb, c);
}

// Stream: y written around the caches (vstream), so that they keep x for this pass. Act: the
// activation applied to each output value (group_norm_sums.h, out_act).
template <class S, bool Stream, int Act>
void affine_rows(const S* x, S* y, int64_t r0, int64_t r1, int64_t tile, int64_t c, const View& vw, const acc_t<S>* ch,
                 const acc_t<S>* a, const acc_t<S>* bb, acc_t<S> p) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t ce = vw.ce;
  std::vector<A> vbuf(ce == c ? 0 : 3 * ce);  // the view's ch, a, bb
  const A* chv = ch;
  const A* av = a;
  const A* bv = bb;
  if (ce != c) {
    tiled(ch, c, ce, vbuf.data());
    tiled(a, c, ce, vbuf.data() + ce);
    tiled(bb, c, ce, vbuf.data() + 2 * ce);
    chv = vbuf.data(), av = vbuf.data() + ce, bv = vbuf.data() + 2 * ce;
  }
  // bfloat16: channels in pairs of vectors, their even and odd values apart (vload_eo / vstore_eo:
  // no widening or packing shuffles), the per-channel vectors put in that order once a call (e*).
  // Where no output can be NaN (outputs_nan_free), the store's NaN test is left out. About a
  // third fewer instructions a vector of output.
  constexpr bool kPairs = std::is_same_v<S, bf16>;
  const int64_t ce2 = kPairs ? ce - ce % (2 * L) : 0;
  std::vector<A> ebuf(3 * ce2);
  A *ech = ebuf.data(), *ea = ech + ce2, *eb = ea + ce2;
  bool no_nan = false;
  if constexpr (kPairs) {
    eo_order(chv, ce2, ech), eo_order(av, ce2, ea), eo_order(bv, ce2, eb);
    no_nan = outputs_nan_free<Act>(ch, a, bb, c, p);
  }
  // K (virtual) rows from xr to yr, channel by channel: a channel's ch, a, bb loaded once for the
  // K rows (four loads a vector of output made the pass ~1.3x a plain scaling of x: the loads, not
  // memory, bounded it), x read and y written over K adjacent rows -- one region of memory, in
  // order. A streamed y goes row by row (K = 1): a streamed line is sent whole only when written
  // in one run (4 rows at a time left 4 lines half-written at once: float16 GroupNorm(16, 384)
  // 7x384x249x11 forward 0.9x -> 0.55x torch)
  auto rows_of = [&]<int64_t K, bool NoNaN>(const S* xr, S* yr) {
    if constexpr (kPairs) {
      for (int64_t j = 0; j < ce2; j += 2 * L) {
        const vec<A> m0 = vload(ech + j), a0 = vload(ea + j), b0 = vload(eb + j);
        const vec<A> m1 = vload(ech + j + L), a1 = vload(ea + j + L), b1 = vload(eb + j + L);
#pragma GCC unroll 4
        for (int64_t k = 0; k < K; ++k) {
          vec<A> e, o;
          vload_eo(xr + k * ce + j, e, o);
          e = out_act<S, Act, NoNaN>((e - m0) * a0 + b0, p), o = out_act<S, Act, NoNaN>((o - m1) * a1 + b1, p);
          if constexpr (Stream) vstream_eo<NoNaN>(yr + k * ce + j, e, o);
          else vstore_eo<NoNaN>(yr + k * ce + j, e, o);
        }
      }
    }
    over_channels<L>(
        ce,
        [&](int64_t j) {
          const vec<A> m = vload(chv + j), va = vload(av + j), vb = vload(bv + j);
#pragma GCC unroll 4
          for (int64_t k = 0; k < K; ++k) {
            const vec<A> v = out_act<S, Act>((vload(xr + k * ce + j) - m) * va + vb, p);
            if constexpr (Stream) vstream(yr + k * ce + j, v);
            else vstore(yr + k * ce + j, v);
          }
        },
        [&](int64_t j, int64_t nl) {
          const vec<A> m = vload_n(chv + j, nl), va = vload_n(av + j, nl), vb = vload_n(bv + j, nl);
          for (int64_t k = 0; k < K; ++k)
            vstore_n(yr + k * ce + j, out_act<S, Act>((vload_n(xr + k * ce + j, nl) - m) * va + vb, p), nl);
        },
        ce2);
  };
  auto run = [&]<int64_t K>(const S* xr, S* yr) {
    if (kPairs && no_nan) rows_of.template operator()<K, kPairs>(xr, yr);
    else rows_of.template operator()<K, false>(xr, yr);
  };
  for (int64_t t0 = r0; t0 < r1; t0 += tile) {
    const int64_t rows = std::min(tile, r1 - t0), vr = rows / vw.rep, rr = vr * vw.rep;
    const S* xt = x + t0 * c;
    S* yt = y + t0 * c;
    int64_t r = 0;
    if constexpr (!Stream)
      for (; r + kOutRows <= vr; r += kOutRows) run.template operator()<kOutRows>(xt + r * ce, yt + r * ce);
    for (; r < vr; ++r) run.template operator()<1>(xt + r * ce, yt + r * ce);
    for (int64_t o = rr * c; o < rows * c; ++o) {
      const int64_t j = o % c;
      yt[o] = out_act1<S, Act>((to_acc(xt[o]) - ch[j]) * a[j] + bb[j], p);
    }
  }
  if constexpr (Stream) fence_streams();
}

// A streamed y whose rows are not whole cache lines (C values not a multiple of a line's): rows
// [r0, r1) as one run of values (stream.h, stream_affine_flat): the same bits as affine_rows.
// (Row by row, such rows streamed only their aligned vectors and left y plain: float16
// GroupNorm(1, 485) 39x485x17x39 channels-last forward 0.79x torch, one thread, AVX2.)
template <class S, int Act>
void affine_flat(const S* x, S* y, int64_t r0, int64_t r1, int64_t c, const acc_t<S>* ch, const acc_t<S>* a,
                 const acc_t<S>* bb, acc_t<S> p) {
  const FlatConstants<S> k(ch, a, bb, c);
  stream_affine_flat(x + r0 * c, y + r0 * c, (r1 - r0) * c, k, outputs_nan_free<Act>(ch, a, bb, c, p),
                     [&](vacc<S> z) { return out_act<S, Act>(z, p); }, [&](acc_t<S> z) { return out_act1<S, Act>(z, p); });
}

}  // namespace

int64_t nhwc_samples_per_chunk(int64_t n, int64_t ns, int64_t c) {
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(std::max<int64_t>(16, (65536 + c - 1) / std::max<int64_t>(c, 1)), n * ns));
  return std::max<int64_t>(1, std::min<int64_t>(n, (rows + ns - 1) / std::max<int64_t>(ns, 1)));
}

// x, y (N, S, C); w, b (C,); mean, var, rstd (N*G,) out or null.
// docs/derivations/group_norm.md, "The grouped view" and "Numerics" -- per group, two passes per
// tile (from L2, chunk_moments), the tiles' (count, mean, M2) merged (Chan, float64):
//   shift    sh = the group's first value of the sample (pass 1 sums x - sh: small terms)
//   merged   mean = sh + mean(x - sh) in float64, var = M2 / count
//   output   y = (x - ch) * a + bb,  ch = mean rounded to A, a = rstd * w[c], bb = b[c] - (mean - ch) * a
template <class S>
void fwd_nhwc(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var,
              acc_t<S>* rstd, int64_t n, int64_t c, int64_t g, int64_t ns, double eps, int act_id, double act_param) {
  using A = acc_t<S>;
  const int64_t cg = c / g;
  const A p = A(act_param);
  const View vw = view_of<vlanes<S>>(c, ns);
  const Blocking bk = blocking(ns, c, int64_t(sizeof(S)), vw.rep);
  // sample i's statistics from its merged moments: per group the mean's rounding to A and what that
  // leaves out (gch, glo), rstd (grs); mean/var/rstd stored
  auto finish = [&](int64_t i, const A* gsh, const Moments& mo, A* gch, A* glo, A* grs, double* grsd) {
    for (int64_t gi = 0; gi < g; ++gi) {
      const double m = double(gsh[gi]) + mo.mean[gi];
      const A ch = A(m), v = A(mo.m2[gi] / mo.n);
      const double rsd = 1.0 / std::sqrt(mo.m2[gi] / mo.n + eps);
      const A rs = A(rsd);
      gch[gi] = ch;
      glo[gi] = A(m - double(ch));
      grs[gi] = rs;
      grsd[gi] = rsd;
      if (mean != nullptr) {
        A mm = ch;
        if (mm != mm) mm = torch_mean(mm, inf_mask(x + i * ns * c + gi * cg, ns, c, cg));
        mean[i * g + gi] = mm;
        var[i * g + gi] = v;
        rstd[i * g + gi] = rs;
      }
    }
  };
  // per-channel vectors of sample i: ch, a = rstd * w, bb = b - lo * a (a and bb from float64,
  // each rounded once: rounded twice in A, y was up to 1.3x its error bound at a mean of 1e4,
  // tests/ops/group_norm/test_group_norm_large_mean.py)
  auto channels = [&](const A* gch, const A* glo, const double* grsd, A* ch, A* ac, A* bb) {
    spread(gch, g, cg, ch);
    for (int64_t gi = 0; gi < g; ++gi)  // group by group: no integer division a channel
      for (int64_t j = gi * cg; j < (gi + 1) * cg; ++j) {
        const double a = grsd[gi] * double(w[j]);
        ac[j] = A(a);
        bb[j] = A(double(b[j]) - double(glo[gi]) * a);
      }
  };
  // the output pass streams y past the caches when x and y together take more than the forward's
  // share of the last level (stream.h, streams_forward: half on one thread, three quarters on more; a
  // cache shared with the other cores): the cache then keeps x for the output pass. Row
  // by row (affine_rows) where a position's C values are whole cache lines; otherwise rows start
  // mid-line, and streaming them row by row sent aligned vectors around the cache and stored the
  // others plainly, a line got both and was written to memory in pieces (float16 GroupNorm(1,
  // 161) 27x161x2x42x42 channels-last, one thread, AVX2: 10.7 ms, 0.81x torch), so those rows
  // go as one run of values in whole lines (affine_flat)
  const bool big = streams_forward(2 * n * ns * c * int64_t(sizeof(S)));
  const bool stream = big && (c * int64_t(sizeof(S))) % 64 == 0, flat = big && !stream;
  auto affine = [&](const S* xi, S* yi, int64_t r0, int64_t r1, const A* ch, const A* ac, const A* bb) {
    act::visit(act_id, [&]<int Act>() {
      if (stream) affine_rows<S, true, Act>(xi, yi, r0, r1, bk.tile, c, vw, ch, ac, bb, p);
      else if (flat) affine_flat<S, Act>(xi, yi, r0, r1, c, ch, ac, bb, p);
      else affine_rows<S, false, Act>(xi, yi, r0, r1, bk.tile, c, vw, ch, ac, bb, p);
    });
  };
  auto shifts = [&](int64_t i, A* gsh) {
    for (int64_t gi = 0; gi < g; ++gi) gsh[gi] = to_acc(x[i * ns * c + gi * cg]);
  };
  if (bk.n_chunks == 1 || balanced(n)) {  // whole samples a task
    for_rows(n, ns * c, [&](int64_t i0, int64_t i1) {
      Scratch<A> buf(5 * c + 4 * g);  // each written before it is read
      A *sh = buf.get(), *ch = sh + c, *ac = ch + c, *acc = ac + c, *bb = acc + c;
      A *gsh = bb + c, *gch = gsh + g, *glo = gch + g, *grs = glo + g;
      std::vector<double> dbuf(7 * g);
      double* grsd = dbuf.data() + 6 * g;
      Moments part{g, dbuf.data(), dbuf.data() + g}, mo{g, dbuf.data() + 2 * g, dbuf.data() + 3 * g};
      for (int64_t i = i0; i < i1; ++i) {
        const S* xi = x + i * ns * c;
        shifts(i, gsh);
        spread(gsh, g, cg, sh);
        mo.reset();
        for (int64_t r0 = 0; r0 < ns; r0 += bk.chunk) {
          chunk_moments(xi, r0, std::min(ns, r0 + bk.chunk), big ? (i1 - i) * ns : ns, bk.tile, c, g, vw, sh, acc,
                        ch, grs, dbuf.data() + 4 * g, part);
          mo.merge(part);
        }
        finish(i, gsh, mo, gch, glo, grs, grsd);
        channels(gch, glo, grsd, ch, ac, bb);
        affine(xi, y + i * ns * c, 0, ns, ch, ac, bb);
      }
    });
    return;
  }
  // chunks of a batch of samples a task (fewer than 7 samples a thread: balanced() failed)
  const int64_t q = bk.n_chunks;
  std::vector<double> part(n * q * (2 * g + 1));  // per chunk: the count, the means, the M2s
  std::vector<A> st(4 * n * g);  // per (sample, group): shift, ch, lo, rstd
  std::vector<double> rsd_all(n * g);  // rstd in float64
  A *gsh_all = st.data(), *gch_all = gsh_all + n * g, *glo_all = gch_all + n * g, *grs_all = glo_all + n * g;
  for (int64_t i = 0; i < n; ++i) shifts(i, gsh_all + i * g);
  for_rows(n * q, bk.chunk * c, [&](int64_t u0, int64_t u1) {
    Scratch<A> buf(3 * c + g);
    A *sh = buf.get(), *acc = sh + c, *tct = acc + c, *gs = tct + c;
    std::vector<double> tm(2 * g);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t i = u / q, r0 = (u % q) * bk.chunk;
      double* pu = part.data() + u * (2 * g + 1);
      Moments mu{g, pu + 1, pu + 1 + g};
      spread(gsh_all + i * g, g, cg, sh);
      const int64_t r_end = big ? task_end(u1, q, ns, bk.chunk) - i * ns : ns;
      chunk_moments(x + i * ns * c, r0, std::min(ns, r0 + bk.chunk), r_end, bk.tile, c, g, vw, sh, acc, tct, gs,
                    tm.data(), mu);
      pu[0] = mu.n;
    }
  });
  std::vector<double> mbuf(2 * g);
  Moments mo{g, mbuf.data(), mbuf.data() + g};
  for (int64_t i = 0; i < n; ++i) {
    mo.reset();
    for (int64_t k = 0; k < q; ++k) {
      const double* pu = part.data() + (i * q + k) * (2 * g + 1);
      mo.merge(pu[0], pu + 1, pu + 1 + g);
    }
    finish(i, gsh_all + i * g, mo, gch_all + i * g, glo_all + i * g, grs_all + i * g, rsd_all.data() + i * g);
  }
  for_rows(n * q, bk.chunk * c, [&](int64_t u0, int64_t u1) {
    Scratch<A> buf(3 * c);
    A *ch = buf.get(), *ac = ch + c, *bb = ac + c;
    int64_t cur = -1;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t i = u / q, r0 = (u % q) * bk.chunk;
      if (i != cur) channels(gch_all + i * g, glo_all + i * g, rsd_all.data() + i * g, ch, ac, bb), cur = i;
      affine(x + i * ns * c, y + i * ns * c, r0, std::min(ns, r0 + bk.chunk), ch, ac, bb);
    }
  });
}

// dy, x, dx (N, S, C); w (C,); mean, rstd (N*G,); dw, db (C,) out.
// docs/derivations/group_norm.md, "The input" and "The parameters" (the terms as in bwd_rows):
//   dx = dy * (rstd * w[c]) - (x - mean) * t3 - t2,  t2 = rstd * mean_grp(g),
//   t3 = rstd^3 * mean_grp(g * (x - mean)),  g = dy * w[c];
// from the per-channel sums sdy[c] = sum_s dy, sdx[c] = sum_s dy * (x - mean) (S > 1: per tile in
// float32, added over the tiles and chunks in order in float64; and sum_s (x - mean), which takes the rounding
// of the saved mean out: sample_terms), which also make dw/db: each run of kRun
// samples adds its samples' terms in order into its own (C,) partials; the (runs, C) partials are
// merged in run order in float64. Whole runs a task (about nhwc_samples_per_chunk samples), or,
// when the runs are too few for the threads, one run at a time by chunks: the same bits either way.
// S == 1: the sums over s are single values and each group's Cg channels are contiguous, so a
// group's sums run as one vector loop over its channels.
// R: dy read as relu's dz, rb (N * C) pairs (sg, tt): act::relu_sign_bound's for each (sample,
// channel) -- S > 1 only.
template <class S, bool R>
void bwd_nhwc_as(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
                 acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t c, int64_t g, int64_t ns, const acc_t<S>* rb) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t cg = c / g, m_grp = cg * ns;
  const A *rsg = rb, *rtt = R ? rb + n * c : nullptr;  // (R: (N, C) each)
  // dw/db partials: one row per kRun samples (a task's chunk is whole runs), merged in float64
  const int64_t spc = (nhwc_samples_per_chunk(n, ns, c) + kRun - 1) / kRun * kRun;
  const int64_t nrun = n_chunks(n, kRun);
  std::vector<A> pw(nrun * c, A(0)), pb(nrun * c, A(0));  // per run: sums of dy * x_hat, of dy
  if constexpr (!R) {  // (S == 1: rows of C values, without relu only)
  if (ns == 1 && s1_packed<S>(c, g)) {  // small groups packed in vectors (group_norm_s1_kernels.cpp)
    bwd_s1_packed<S>(dy, x, w, mean, rstd, dx, pw.data(), pb.data(), n, c, g, spc, kRun);
    merge_partials(pw.data(), pb.data(), nrun, c, dw, db);
    return;
  }
  if (ns == 1) {
    for_chunks(n, spc, 2 * c, [&](int64_t, int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        A* tw = pw.data() + (i / kRun) * c;
        A* tb = pb.data() + (i / kRun) * c;
        const S* xi = x + i * c;
        const S* dyi = dy + i * c;
        S* dxi = dx == nullptr ? nullptr : dx + i * c;
        const A* mi = mean + i * g;
        const A* ri = rstd + i * g;
        for (int64_t gi = 0; gi < g; ++gi) {
          const int64_t c0 = gi * cg;
          const A m = mi[gi], rs = ri[gi];
          // e = mean(x - m) over the group: what the mean's rounding to A left out, taken from
          // every x - m (at a mean of 1e4 dx and dw were ~1e-4 relative off without it)
          vec<A> vm = vset1<A>(m), vsx = vzero<A>();
          int64_t k = 0;
          for (; k + L <= cg; k += L) vsx += vload(xi + c0 + k) - vm;
          A sx = hsum<A>(vsx);
          for (; k < cg; ++k) sx += to_acc(xi[c0 + k]) - m;
          const A e = sx / A(cg);
          const vec<A> ve = vset1<A>(e);
          vec<A> vr = vset1<A>(rs), vsg = vzero<A>(), vsgx = vzero<A>();
          k = 0;
          for (; k + L <= cg; k += L) {
            const int64_t j = c0 + k;
            vec<A> g0 = vload(dyi + j), d0 = g0 * ((vload(xi + j) - vm) - ve), w0 = vload(w + j);
            vstore(tw + j, vload(tw + j) + d0 * vr);
            vstore(tb + j, vload(tb + j) + g0);
            vsg += w0 * g0;
            vsgx += w0 * d0;
          }
          A sg = hsum<A>(vsg), sgx = hsum<A>(vsgx);
          for (; k < cg; ++k) {
            const int64_t j = c0 + k;
            A g0 = to_acc(dyi[j]), d0 = g0 * ((to_acc(xi[j]) - m) - e);
            tw[j] += d0 * rs;
            tb[j] += g0;
            sg += w[j] * g0;
            sgx += w[j] * d0;
          }
          if (dxi == nullptr) continue;
          const A t2g = A(double(sg) / double(m_grp) * double(rs));
          const A t3g = A(double(sgx * rs) / double(m_grp) * double(rs * rs));
          vec<A> v2 = vset1<A>(t2g), v3 = vset1<A>(t3g);
          k = 0;
          for (; k + L <= cg; k += L) {
            const int64_t j = c0 + k;
            vstore(dxi + j, (vload(dyi + j) * (vr * vload(w + j)) - ((vload(xi + j) - vm) - ve) * v3) - v2);
          }
          for (; k < cg; ++k) {
            const int64_t j = c0 + k;
            dxi[j] = from_acc<S>((to_acc(dyi[j]) * (rs * w[j]) - ((to_acc(xi[j]) - m) - e) * t3g) - t2g);
          }
        }
      }
    });
    merge_partials(pw.data(), pb.data(), nrun, c, dw, db);
    return;
  }
  }
  const View vw = view_of<vlanes<S>>(c, ns);
  const Blocking bk = blocking(ns, c, int64_t(sizeof(S)), vw.rep);
  const int64_t q = bk.n_chunks;
  // big: x, dy and dx together take more than half the last level (numerics/stream.h), so x and dy
  // come from memory: the sums ask for the next tile's lines ahead across chunks and samples (else
  // within the chunk), and dx streams past the caches where its (virtual) rows are whole cache lines
  const bool big = streams_output(3 * n * ns * c * int64_t(sizeof(S)));
  const bool dxs = big && (vw.ce * int64_t(sizeof(S))) % 64 == 0;
  // sdy, sdx, sxm (C,) = sums of dy, dy * (x - m), x - m over rows [r0, r1) of sample i (a tile), mc (C,)
  // its means m per channel
  // (mv: mc tiled to the view's ce values, or mc; wv: 3 ce scratch for the view's sums)
  const int64_t ce = vw.ce;
  // (next_rows: the rows of the next tile, whose lines of x and dy are asked for during these
  // sums, a few at each row of each block, as the forward's pass 1 does)
  // (R: sv, tv sample i's relu constants sg, tt, tiled as mv; sc, tc untiled, as mc)
  auto tile_sums = [&](int64_t i, int64_t r0, int64_t r1, int64_t next_rows, const A* mc, const A* mv, A* wv,
                       A* sdy, A* sdx, A* sxm, const A* sv, const A* tv, const A* sc, const A* tc) {
    const S* xs = x + (i * ns + r0) * c;
    const S* gs = dy + (i * ns + r0) * c;
    const int64_t rows = r1 - r0, vr = rows / vw.rep, rr = vr * vw.rep;
    A *vy = ce == c ? sdy : wv, *vx = ce == c ? sdx : wv + ce, *vm = ce == c ? sxm : wv + 2 * ce;
    const int64_t next_bytes = next_rows * c * int64_t(sizeof(S)), ticks = vr * sum_blocks<L>(ce);
    Ahead ax(xs + rows * c, next_bytes, ticks), ag(gs + rows * c, next_bytes, ticks);
    auto ahead = [&](int64_t) { ax(), ag(); };
    channel_blocks<L>(
        ce,
        [&]<int NV>(int64_t j0) {
          vec<A> cm[NV], o[3][NV], rs[R ? NV : 1], rt[R ? NV : 1];
          for (int v = 0; v < NV; ++v) cm[v] = vload(mv + j0 + v * L);
          if constexpr (R)
            for (int v = 0; v < NV; ++v) rs[v] = vload(sv + j0 + v * L), rt[v] = vload(tv + j0 + v * L);
          col_sums_m<A, NV, 3>(vr,
                               [&](int64_t r, int v, vec<A>* t) {
                                 const int64_t o = r * ce + j0 + v * L;
                                 const vec<A> xv = vload(xs + o);
                                 if constexpr (R) t[0] = act::relu_masked<R>(vload(gs + o), xv, rs[v], rt[v]);
                                 else t[0] = vload(gs + o);
                                 t[2] = xv - cm[v];
                                 t[1] = t[0] * t[2];
                               },
                               o, ahead);
          for (int v = 0; v < NV; ++v) {
            vstore(vy + j0 + v * L, o[0][v]);
            vstore(vx + j0 + v * L, o[1][v]);
            vstore(vm + j0 + v * L, o[2][v]);
          }
        },
        [&](int64_t j, int64_t nl) {
          const vec<A> cm = vload_n(mv + j, nl);
          vec<A> o[3][1], rs{}, rt{};
          if constexpr (R) rs = vload_n(sv + j, nl), rt = vload_n(tv + j, nl);
          col_sums3<A, 1>(vr,
                          [&](int64_t r, int, vec<A>* t) {
                            const int64_t o = r * ce + j;
                            const vec<A> xv = vload_n(xs + o, nl);
                            t[0] = act::relu_masked<R>(vload_n(gs + o, nl), xv, rs, rt);
                            t[2] = xv - cm;
                            t[1] = t[0] * t[2];
                          },
                          o);
          vstore_n(vy + j, o[0][0], nl);
          vstore_n(vx + j, o[1][0], nl);
          vstore_n(vm + j, o[2][0], nl);
        });
    ax.rest(), ag.rest();
    if (ce != c) {
      fold<double>(vy, c, ce, sdy);
      fold<double>(vx, c, ce, sdx);
      fold<double>(vm, c, ce, sxm);
    }
    for (int64_t j = 0; rr < rows && j < c; ++j) {  // rows past the last whole run of the view
      A t3[3];
      tail_sums<A, 3>(rows - rr,
                      [&](int64_t r, A* t) {
                        const A xs1 = to_acc(xs[(rr + r) * c + j]);
                        t[0] = to_acc(gs[(rr + r) * c + j]);
                        if constexpr (R) t[0] = act::relu_masked<R>(t[0], xs1, sc[j], tc[j]);
                        t[2] = xs1 - mc[j];
                        t[1] = t[0] * t[2];
                      },
                      t3);
      sdy[j] += t3[0];
      sdx[j] += t3[1];
      sxm[j] += t3[2];
    }
  };
  // the same over the rows [r0, r1) of a chunk: out (3C,) = the tiles' sums added in order in float64;
  // acc (3C,) scratch; the lines of rows up to r_end (from sample i's first) asked for ahead
  auto chunk_sums = [&](int64_t i, int64_t r0, int64_t r1, int64_t r_end, const A* mc, A* acc, double* out) {
    std::vector<A> vbuf(ce == c ? 0 : (R ? 6 : 4) * ce);
    const A* mv = mc;
    const A *sc = R ? rsg + i * c : nullptr, *tc = R ? rtt + i * c : nullptr, *sv = sc, *tv = tc;
    if (ce != c) {
      tiled(mc, c, ce, vbuf.data()), mv = vbuf.data();
      if constexpr (R) {
        tiled(sc, c, ce, vbuf.data() + 4 * ce), tiled(tc, c, ce, vbuf.data() + 5 * ce);
        sv = vbuf.data() + 4 * ce, tv = vbuf.data() + 5 * ce;
      }
    }
    for (int64_t t0 = r0; t0 < r1; t0 += bk.tile) {
      tile_sums(i, t0, std::min(r1, t0 + bk.tile), std::max<int64_t>(0, std::min(bk.tile, r_end - t0 - bk.tile)), mc,
                mv, vbuf.data() + ce, acc, acc + c, acc + 2 * c, sv, tv, sc, tc);
      for (int64_t j = 0; j < 3 * c; ++j) out[j] = t0 == r0 ? double(acc[j]) : out[j] + double(acc[j]);
    }
  };
  // sample i's sums (float64) into its run's dw/db partials, and its t2, t3 (G,). The saved mean m is
  // the float64 mean rounded to A: its offset dm = mean(x - m) is taken out of the sums (sum dy *
  // (x - mean) = sdx - dm * sdy) and of dx (t2 - dm * t3), so x_hat keeps its digits at large means.
  auto sample_terms = [&](int64_t i, const double* sdyd, const double* sdxd, const double* sxmd, A* t2g, A* t3g) {
    A* tw = pw.data() + (i / kRun) * c;
    A* tb = pb.data() + (i / kRun) * c;
    const A* ri = rstd + i * g;
    for (int64_t gi = 0; gi < g; ++gi) {
      const A rs = ri[gi];
      double sm = 0;
      for (int64_t k = 0; k < cg; ++k) sm += sxmd[gi * cg + k];
      const double dm = sm / double(m_grp);
      A sp = A(0), sq = A(0);  // sums over the group of dy * w, of dy * w * (x - mean)
      for (int64_t k = 0; k < cg; ++k) {
        const int64_t j = gi * cg + k;
        const A sy = A(sdyd[j]), sx = A(sdxd[j] - dm * sdyd[j]);
        tw[j] += sx * rs;
        tb[j] += sy;
        sp = k == 0 ? w[j] * sy : sp + w[j] * sy;
        sq = k == 0 ? w[j] * sx : sq + w[j] * sx;
      }
      const double t3 = double(sq * rs) / double(m_grp) * double(rs * rs);  // t3
      t3g[gi] = A(t3);
      t2g[gi] = A(double(sp) / double(m_grp) * double(rs) - dm * double(t3g[gi]));  // t2 = rstd * mean_grp(g)
    }
  };
  // dx over rows [r0, r1) of sample i: per-channel mean mc, a = rstd * w, t2, t3 (C,)
  // (far: the x and dy this pass reads were read last by the sums of more than kNearBytes of
  // them -- a sample, or a run summed by chunks -- so they come from past L2)
  auto dx_rows = [&](int64_t i, int64_t r0, int64_t r1, bool far, const A* mc, const A* ac, const A* t2,
                     const A* t3) {
    std::vector<A> vbuf(ce == c ? 0 : (R ? 6 : 4) * ce);
    const A *mv = mc, *av = ac, *v2p = t2, *v3p = t3;
    const A *sc = R ? rsg + i * c : nullptr, *tc = R ? rtt + i * c : nullptr, *svp = sc, *tvp = tc;
    if (ce != c) {
      tiled(mc, c, ce, vbuf.data());
      tiled(ac, c, ce, vbuf.data() + ce);
      tiled(t2, c, ce, vbuf.data() + 2 * ce);
      tiled(t3, c, ce, vbuf.data() + 3 * ce);
      mv = vbuf.data(), av = mv + ce, v2p = av + ce, v3p = v2p + ce;
      if constexpr (R) {
        tiled(sc, c, ce, vbuf.data() + 4 * ce), tiled(tc, c, ce, vbuf.data() + 5 * ce);
        svp = vbuf.data() + 4 * ce, tvp = vbuf.data() + 5 * ce;
      }
    }
    // kOutRows rows at a time, each channel's four vectors loaded once for them, as the forward's
    // output pass
    const int64_t rows = r1 - r0, off = (i * ns + r0) * c, vr = rows / vw.rep, rr = vr * vw.rep;
    {
      const S *xs = x + off, *gs = dy + off;
      S* ds = dx + off;
      int64_t r = 0;
      // (rows of at least kWideRowBytes from past L2, or a streamed dx: one row at a time, three
      // streams in order, not twelve; each streamed line written whole in one run)
      const bool wide = dxs || (far && ce * int64_t(sizeof(S)) >= kWideRowBytes);
      for (; !wide && r + kOutRows <= vr; r += kOutRows) {
        const S *xr = xs + r * ce, *gr = gs + r * ce;
        S* dr = ds + r * ce;
        over_channels<L>(
            ce,
            [&](int64_t j) {
              const vec<A> va = vload(av + j), vm = vload(mv + j), v3 = vload(v3p + j), v2 = vload(v2p + j);
              vec<A> rs{}, rt{};
              if constexpr (R) rs = vload(svp + j), rt = vload(tvp + j);
#pragma GCC unroll 4
              for (int64_t k = 0; k < kOutRows; ++k) {
                const int64_t o = k * ce + j;
                const vec<A> xv = vload(xr + o);
                vstore(dr + o, (act::relu_masked<R>(vload(gr + o), xv, rs, rt) * va - (xv - vm) * v3) - v2);
              }
            },
            [&](int64_t j, int64_t nl) {
              const vec<A> va = vload_n(av + j, nl), vm = vload_n(mv + j, nl), v3 = vload_n(v3p + j, nl), v2 = vload_n(v2p + j, nl);
              vec<A> rs{}, rt{};
              if constexpr (R) rs = vload_n(svp + j, nl), rt = vload_n(tvp + j, nl);
              for (int64_t k = 0; k < kOutRows; ++k) {
                const int64_t o = k * ce + j;
                const vec<A> xv = vload_n(xr + o, nl);
                vstore_n(dr + o, (act::relu_masked<R>(vload_n(gr + o, nl), xv, rs, rt) * va - (xv - vm) * v3) - v2, nl);
              }
            });
      }
      for (; r < vr; ++r) {
        const S *xr = xs + r * ce, *gr = gs + r * ce;
        S* dr = ds + r * ce;
        over_channels<L>(
            ce,
            [&](int64_t j) {
              const vec<A> xv = vload(xr + j);
              vec<A> gv = vload(gr + j);
              if constexpr (R) gv = act::relu_masked<R>(gv, xv, vload(svp + j), vload(tvp + j));
              const vec<A> v = (gv * vload(av + j) - (xv - vload(mv + j)) * vload(v3p + j)) - vload(v2p + j);
              if (dxs) vstream(dr + j, v);
              else vstore(dr + j, v);
            },
            [&](int64_t j, int64_t nl) {
              const vec<A> xv = vload_n(xr + j, nl);
              vec<A> gv = vload_n(gr + j, nl);
              if constexpr (R) gv = act::relu_masked<R>(gv, xv, vload_n(svp + j, nl), vload_n(tvp + j, nl));
              vstore_n(dr + j, (gv * vload_n(av + j, nl) - (xv - vload_n(mv + j, nl)) * vload_n(v3p + j, nl)) - vload_n(v2p + j, nl),
                       nl);
            });
      }
      for (int64_t o = rr * c; o < rows * c; ++o) {
        const int64_t j = o % c;
        const A xs1 = to_acc(xs[o]);
        A gv = to_acc(gs[o]);
        if constexpr (R) gv = act::relu_masked<R>(gv, xs1, sc[j], tc[j]);
        ds[o] = from_acc<S>((gv * ac[j] - (xs1 - mc[j]) * t3[j]) - t2[j]);
      }
      if (dxs) fence_streams();
    }
  };
  // per-channel vectors of sample i: mc (means), ac = rstd * w, and t2c, t3c from t2g, t3g (G,)
  auto channels = [&](int64_t i, const A* t2g, const A* t3g, A* mc, A* ac, A* t2c, A* t3c) {
    spread(mean + i * g, g, cg, mc);
    spread(rstd + i * g, g, cg, ac);
    for (int64_t j = 0; j < c; ++j) ac[j] = ac[j] * w[j];
    spread(t2g, g, cg, t2c);
    spread(t3g, g, cg, t3c);
  };
  // whole runs a task where they keep the threads busy (balanced); else by (sample, chunk) units,
  // also where a sample is one chunk (q == 1): fewer samples than a run (kRun) had been one task,
  // one thread idle (channels-last bfloat16 GroupNorm(4, 384) 7x384x8x8 backward, two threads:
  // 108 us, torch.nn 62; fwd+bwd 0.91x -> 1.02x torch.nn, GroupNorm(1, 512) 3x512x59x8 float16
  // 0.94x -> 1.13x; the same bits either way)
  if (balanced(n, spc)) {
    for_chunks(n, spc, 2 * ns * c, [&](int64_t, int64_t i0, int64_t i1) {
      std::vector<A> buf(7 * c + 2 * g);
      A *mc = buf.data(), *ac = mc + c, *acc = ac + c, *t2c = acc + 3 * c, *t3c = t2c + c;
      A *t2g = t3c + c, *t3g = t2g + g;
      std::vector<double> sd(3 * c), part(3 * c);
      for (int64_t i = i0; i < i1; ++i) {
        spread(mean + i * g, g, cg, mc);
        for (int64_t r0 = 0; r0 < ns; r0 += bk.chunk) {
          const int64_t r1 = std::min(ns, r0 + bk.chunk);
          chunk_sums(i, r0, r1, big ? (i1 - i) * ns : r1, mc, acc, part.data());
          for (int64_t j = 0; j < 3 * c; ++j) sd[j] = r0 == 0 ? part[j] : sd[j] + part[j];
        }
        sample_terms(i, sd.data(), sd.data() + c, sd.data() + 2 * c, t2g, t3g);
        if (dx == nullptr) continue;
        channels(i, t2g, t3g, mc, ac, t2c, t3c);
        dx_rows(i, 0, ns, 2 * ns * c * int64_t(sizeof(S)) > kNearBytes, mc, ac, t2c, t3c);
      }
    });
  } else {  // a run at a time, by chunks: their sums (run, chunks, 3C) in scratch
    std::vector<double> part(std::min(n, kRun) * q * 3 * c), sd(3 * c);
    std::vector<A> tg(std::min(n, kRun) * 2 * g);
    for (int64_t b0 = 0; b0 < n; b0 += kRun) {
      const int64_t nb = std::min(kRun, n - b0);
      for_rows(nb * q, 2 * bk.chunk * c, [&](int64_t u0, int64_t u1) {
        std::vector<A> mc(c), acc(3 * c);
        int64_t cur = -1;
        for (int64_t u = u0; u < u1; ++u) {
          const int64_t i = b0 + u / q, r0 = (u % q) * bk.chunk;
          if (i != cur) spread(mean + i * g, g, cg, mc.data()), cur = i;
          const int64_t r1 = std::min(ns, r0 + bk.chunk);
          chunk_sums(i, r0, r1, big ? b0 * ns + task_end(u1, q, ns, bk.chunk) - i * ns : r1, mc.data(), acc.data(),
                     part.data() + u * 3 * c);
        }
      });
      for (int64_t k = 0; k < nb; ++k) {
        for (int64_t u = k * q; u < (k + 1) * q; ++u) {
          const double* pu = part.data() + u * 3 * c;
          for (int64_t j = 0; j < 3 * c; ++j) sd[j] = u == k * q ? pu[j] : sd[j] + pu[j];
        }
        sample_terms(b0 + k, sd.data(), sd.data() + c, sd.data() + 2 * c, tg.data() + k * 2 * g,
                     tg.data() + k * 2 * g + g);
      }
      if (dx == nullptr) continue;
      for_rows(nb * q, 3 * bk.chunk * c, [&](int64_t u0, int64_t u1) {
        std::vector<A> buf(4 * c);
        A *mc = buf.data(), *ac = mc + c, *t2c = ac + c, *t3c = t2c + c;
        int64_t cur = -1;
        for (int64_t u = u0; u < u1; ++u) {
          const int64_t k = u / q, i = b0 + k, r0 = (u % q) * bk.chunk;
          if (i != cur) channels(i, tg.data() + k * 2 * g, tg.data() + k * 2 * g + g, mc, ac, t2c, t3c), cur = i;
          dx_rows(i, r0, std::min(ns, r0 + bk.chunk), 2 * nb * ns * c * int64_t(sizeof(S)) > kNearBytes, mc, ac, t2c,
                  t3c);
        }
      });
    }
  }
  merge_partials(pw.data(), pb.data(), nrun, c, dw, db);
}

template <class S>
bool bwd_nhwc(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t c, int64_t g, int64_t ns, const ReluDy* relu) {
  using A = acc_t<S>;
  if (relu == nullptr) {
    bwd_nhwc_as<S, false>(dy, x, w, mean, rstd, dx, dw, db, n, c, g, ns, nullptr);
    return true;
  }
  if (ns == 1) return false;  // (rows of C values: the S == 1 kernels take dz)
  std::vector<A> rb(2 * n * c);  // sg (N, C), then tt (N, C)
  if (!relu_bounds(relu->hi, relu->a, relu->b, n * c, rb.data(), rb.data() + n * c)) return false;
  bwd_nhwc_as<S, true>(static_cast<const S*>(relu->dy), x, w, mean, rstd, dx, dw, db, n, c, g, ns, rb.data());
  return true;
}

#define NORMLAB_GN_NHWC(S)                                                                                      \
  template void fwd_nhwc<S>(const S*, const acc_t<S>*, const acc_t<S>*, S*, acc_t<S>*, acc_t<S>*, acc_t<S>*, \
                            int64_t, int64_t, int64_t, int64_t, double, int, double);                        \
  template bool bwd_nhwc<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*,       \
                            acc_t<S>*, acc_t<S>*, int64_t, int64_t, int64_t, int64_t, const ReluDy*);
NORMLAB_GN_NHWC(float)
NORMLAB_GN_NHWC(double)
NORMLAB_GN_NHWC(bf16)
NORMLAB_GN_NHWC(f16)
#undef NORMLAB_GN_NHWC

}  // namespace normlab::group_norm
