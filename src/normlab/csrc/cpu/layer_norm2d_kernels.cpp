// LayerNorm2d's kernels (layer_norm2d_kernels.h): docs/derivations/layer_norm.md, "LayerNorm" (the
// forward and the three terms of dx), "LayerNorm2d: the same rows, in channels-last memory" and
// "Numerics" (the shifted two passes, sums in float32 / float64).
//
// Per pixel p of sample n, over its C channels c (NCHW: the planes x[n, c, :]; rows: x[p, :]):
//
//   d     = x - x[c = 0]                       shifted by the pixel's first channel
//   mean  = x[c = 0] + mean_c(d)
//   var   = mean_c((d - mean_c(d))^2)          biased, a second pass
//   rstd  = 1 / sqrt(var + eps)
//   y     = ((d - mean_c(d)) * rstd) * w[c] + b[c]
//
// and backward, with g = dy * w and x_hat = (x - mean) * rstd:
//
//   dx    = rstd * ((g - mean_c(g)) - x_hat * mean_c(g * x_hat))   terms 1, 2, 3
//   dw[c] = sum over pixels of dy * x_hat,   db[c] = sum over pixels of dy
//
// NCHW: each pixel's sums run over c in order, one pixel per vector lane: no lane ever adds
// to another, so y, mean, rstd and dx do not depend on the block, the vector width or the
// threads. dw/db: one partial per task (block) and channel, merged in task order in float64;
// the blocks depend on the shape only. Rows: each row's sums in vectors then hsum (a fixed
// order); dw/db through fixed chunks of rows (for_chunks), merged in chunk order in float64.
#include "cpu/layer_norm2d_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "numerics/chunks.h"
#include "numerics/moments.h"
#include "numerics/vec.h"

#if NORMLAB_VEC_BYTES == 64
#include <immintrin.h>
#endif

namespace normlab::ln2d {

// A task covers a block of pixels of one sample, all C channels: about kBlockBytes, so the
// block's planes stay in L2 through the passes; each plane's run at least kRunBytes (runs of a
// few cache lines leave the hardware prefetcher no time to start) while the block stays within
// kMaxBytes; at least kMinBlock pixels, a multiple of kVecPixels; halved (not below kMinBlock)
// while there are fewer than kMinTasks tasks. (Measured on the Numba kernels this replaces:
// docs/performance.md.)
namespace {
constexpr int64_t kBlockBytes = 256 << 10;
constexpr int64_t kRunBytes = 1 << 10;
constexpr int64_t kMaxBytes = 1 << 20;
constexpr int64_t kMinBlock = 64;
constexpr int64_t kVecPixels = 16;
constexpr int64_t kMinTasks = 16;
// The first pass asks for the runs of the plane kAhead planes on (far tensors only).
constexpr int64_t kAhead = 4;
constexpr int64_t kLineBytes = 64;
// bwd_rows' chunks: at least kChunkValues values and kMinChunkRows rows, enlarged up to
// kMaxChunkRows while at least kMinChunks chunks remain.
constexpr int64_t kChunkValues = 65536;
constexpr int64_t kMinChunkRows = 16;
constexpr int64_t kMaxChunkRows = 256;
constexpr int64_t kMinChunks = 32;
}  // namespace

int64_t block_size(int64_t n, int64_t nc, int64_t ns, int64_t itemsize) {
  int64_t pixel = std::max<int64_t>(nc, 1) * itemsize;  // bytes of one pixel's channels
  int64_t blk = std::max(kBlockBytes / pixel, std::min(kRunBytes / itemsize, kMaxBytes / pixel));
  blk = std::max(kMinBlock, blk / kVecPixels * kVecPixels);
  while (blk > kMinBlock && n * ((ns + blk - 1) / blk) < kMinTasks)
    blk = std::max(kMinBlock, blk / 2 / kVecPixels * kVecPixels);
  return std::max<int64_t>(1, std::min(blk, ns));
}

int64_t chunk_rows(int64_t n_rows, int64_t n_cols) {
  int64_t rows = std::max(kMinChunkRows, (kChunkValues + std::max<int64_t>(n_cols, 1) - 1) / std::max<int64_t>(n_cols, 1));
  rows = std::max<int64_t>(1, std::min(rows, n_rows));
  return std::max(rows, std::min(kMaxChunkRows, n_rows / kMinChunks));
}

namespace {

// k <= vlanes<S> values at p: a whole vector, or the first k lanes (the rest zero). With AVX-512,
// the partial vectors (a block's last run of every plane) are masked loads and stores: the
// generic vload_n / vstore_n go through a buffer and a memcpy call, per plane.
#if NORMLAB_VEC_BYTES == 64
template <class T> inline T bits_as(const auto& v) { T t; std::memcpy(&t, &v, sizeof t); return t; }
inline __mmask16 mask16(int64_t k) { return __mmask16((1u << k) - 1); }
inline vec<float> load_part(const float* p, int64_t k) { return bits_as<vec<float>>(_mm512_maskz_loadu_ps(mask16(k), p)); }
inline vec<double> load_part(const double* p, int64_t k) {
  return bits_as<vec<double>>(_mm512_maskz_loadu_pd(__mmask8((1u << k) - 1), p));
}
inline vec<float> load_part(const bf16* p, int64_t k) {
  return bits_as<vec<float>>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask16(k), p)), 16));
}
inline vec<float> load_part(const f16* p, int64_t k) {
  return bits_as<vec<float>>(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(k), p)));
}
inline void store_part(float* p, vec<float> v, int64_t k) { _mm512_mask_storeu_ps(p, mask16(k), bits_as<__m512>(v)); }
inline void store_part(double* p, vec<double> v, int64_t k) {
  _mm512_mask_storeu_pd(p, __mmask8((1u << k) - 1), bits_as<__m512d>(v));
}
template <class H> inline void store_part(H* p, vec<float> v, int64_t k) {  // bf16, f16: rounded as vstore
  H buf[16];
  vstore(buf, v);
  _mm256_mask_storeu_epi16(p, mask16(k), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(buf)));
}
#else
template <class S> inline vacc<S> load_part(const S* p, int64_t k) { return vload_n(p, k); }
template <class S> inline void store_part(S* p, vacc<S> v, int64_t k) { vstore_n(p, v, k); }
#endif
template <class S> inline vacc<S> load_k(const S* p, int64_t k) {
  return k == vlanes<S> ? vload(p) : load_part(p, k);
}
template <class S> inline void store_k(S* p, vacc<S> v, int64_t k) {
  if (k == vlanes<S>) vstore(p, v); else store_part(p, v, k);
}

// Hints: the cache lines of bytes [p, p + n) for reading / writing. They change no result.
inline void prefetch_run(const void* p, int64_t n) {
  for (int64_t q = 0; q < n; q += kLineBytes) __builtin_prefetch(static_cast<const char*>(p) + q, 0, 3);
}
inline void prefetch_run_write(void* p, int64_t n) {
  for (int64_t q = 0; q < n; q += kLineBytes) __builtin_prefetch(static_cast<char*>(p) + q, 1, 3);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// NCHW forward
//
// x       (N, C, S)  input, storage S, contiguous (S = H * W pixels)
// w, b    (C,)       weight, bias in acc_t<S>; nullptr for ones / zeros
// y       (N, C, S)  out: the normalised input, storage S
// mean    (N * S,)   out: per-pixel means, acc_t<S> (nullptr: not written)
// rstd    (N * S,)   out: per-pixel 1 / sqrt(var + eps) (nullptr with mean)
// far     bool       x streams from memory: prefetch the runs kAhead planes on (no effect on bits)
//
// Memory traffic: read x, write y; the second and third passes read the block from L2.
// ------------------------------------------------------------------------------------------------
template <class S>
void fwd_nchw(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* rstd,
              int64_t n, int64_t nc, int64_t ns, double eps, bool far) {
  using A = acc_t<S>;
  using V = vec<A>;
  constexpr int64_t L = vlanes<S>;
  const int64_t block = block_size(n, nc, ns, sizeof(S));
  const int64_t n_blk = (ns + block - 1) / block;
  const int64_t nvmax = (block + L - 1) / L;
  const A an = A(nc), aeps = A(eps), one = A(1);
  const bool far_out = far && sizeof(S) >= 4;  // half precision's output pass is bound by conversions
  for_rows(n * n_blk, nc * block, [&](int64_t t0, int64_t t1) {
    std::unique_ptr<V[]> buf(new V[4 * nvmax]);
    V* sh = buf.get();       // (block,) per pixel: the shift, its channel 0
    V* md = sh + nvmax;      // (block,) per pixel: mean_c(d)
    V* rs = md + nvmax;      // (block,) per pixel: rstd
    V* acc = rs + nvmax;     // (block,) per pixel: the running sum over channels
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / n_blk, p0 = (t - i * n_blk) * block;
      const int64_t m = std::min(block, ns - p0);  // pixels in this block
      const int64_t nv = (m + L - 1) / L, last = nv - 1, tail = m - last * L;
      const S* xi = x + i * nc * ns + p0;
      S* yi = y + i * nc * ns + p0;
      for (int64_t v = 0; v < nv; ++v) {
        sh[v] = load_k(xi + v * L, v == last ? tail : L);
        acc[v] = vzero<A>();
      }
      for (int64_t c = 0; c < nc; ++c) {  // pass 1: sum of d = x - shift
        if (far && c + kAhead < nc) prefetch_run(xi + (c + kAhead) * ns, m * int64_t(sizeof(S)));
        const S* xr = xi + c * ns;
        for (int64_t v = 0; v < last; ++v) acc[v] += vload(xr + v * L) - sh[v];
        acc[last] += load_k(xr + last * L, tail) - sh[last];
      }
      for (int64_t v = 0; v < nv; ++v) {
        md[v] = acc[v] / an;
        acc[v] = vzero<A>();
      }
      for (int64_t c = 0; c < nc; ++c) {  // pass 2: sum of (d - mean(d))^2, from L2
        const S* xr = xi + c * ns;
        for (int64_t v = 0; v < last; ++v) {
          V e = (vload(xr + v * L) - sh[v]) - md[v];
          acc[v] += e * e;
        }
        V e = (load_k(xr + last * L, tail) - sh[last]) - md[last];
        acc[last] += e * e;
      }
      for (int64_t v = 0; v < nv; ++v) {  // the statistics
        A var[L], r[L], sv[L], mv[L];
        V q = acc[v] / an;  // biased variance
        std::memcpy(var, &q, sizeof q);
        for (int64_t l = 0; l < L; ++l) r[l] = one / std::sqrt(var[l] + aeps);
        std::memcpy(&rs[v], r, sizeof r);
        if (mean != nullptr) {
          V mu = sh[v] + md[v];
          std::memcpy(mv, &mu, sizeof mu);
          std::memcpy(sv, &rs[v], sizeof sv);
          const int64_t k = v == last ? tail : L, at = i * ns + p0 + v * L;
          std::memcpy(mean + at, mv, k * sizeof(A));
          std::memcpy(rstd + at, sv, k * sizeof(A));
        }
      }
      for (int64_t c = 0; c < nc; ++c) {  // output: y = x_hat * w + b
        if (far_out && c + kAhead < nc) prefetch_run_write(yi + (c + kAhead) * ns, m * int64_t(sizeof(S)));
        const S* xr = xi + c * ns;
        S* yr = yi + c * ns;
        const V wc = vset1<A>(w != nullptr ? w[c] : one), bc = vset1<A>(b != nullptr ? b[c] : A(0));
        for (int64_t v = 0; v < last; ++v) vstore(yr + v * L, (((vload(xr + v * L) - sh[v]) - md[v]) * rs[v]) * wc + bc);
        store_k(yr + last * L, (((load_k(xr + last * L, tail) - sh[last]) - md[last]) * rs[last]) * wc + bc, tail);
      }
    }
  });
}

// ------------------------------------------------------------------------------------------------
// NCHW backward
//
// dy      (N, C, S)  gradient of y, storage S, contiguous
// x       (N, C, S)  the forward's input
// w       (C,)       weight, acc_t<S>; nullptr for ones
// mean    (N * S,)   the forward's per-pixel means
// rstd    (N * S,)   the forward's per-pixel 1 / sqrt(var + eps)
// dx      (N, C, S)  out: gradient of x, storage S
// dw, db  (C,)       out: sums over pixels of dy * x_hat and dy, acc_t<S> (nullptr: not needed)
//
// Memory traffic: read x and dy, write dx (the second pass reads x and dy from L2).
// ------------------------------------------------------------------------------------------------
template <class S>
void bwd_nchw(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t nc, int64_t ns, bool far) {
  using A = acc_t<S>;
  using V = vec<A>;
  constexpr int64_t L = vlanes<S>;
  const int64_t block = block_size(n, nc, ns, sizeof(S));
  const int64_t n_blk = (ns + block - 1) / block, n_tasks = n * n_blk;
  const int64_t nvmax = (block + L - 1) / L;
  const bool need_wb = dw != nullptr;
  const A an = A(nc), one = A(1);
  std::vector<A> dw_part(need_wb ? n_tasks * nc : 0);  // (tasks, C) per-task partial sums of dy * x_hat
  std::vector<A> db_part(need_wb ? n_tasks * nc : 0);  // (tasks, C) per-task partial sums of dy
  for_rows(n_tasks, nc * block, [&](int64_t t0, int64_t t1) {
    std::unique_ptr<V[]> buf(new V[4 * nvmax]);
    V* mu = buf.get();    // (block,) per pixel: mean
    V* rs = mu + nvmax;   // (block,) per pixel: rstd
    V* s1 = rs + nvmax;   // (block,) per pixel: sum of g, then term 2 mean_c(g)
    V* s2 = s1 + nvmax;   // (block,) per pixel: sum of g * x_hat, then term 3's mean_c(g * x_hat)
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / n_blk, p0 = (t - i * n_blk) * block;
      const int64_t m = std::min(block, ns - p0);
      const int64_t nv = (m + L - 1) / L, last = nv - 1, tail = m - last * L;
      const int64_t off = i * nc * ns + p0;
      for (int64_t v = 0; v < nv; ++v) {
        const int64_t k = v == last ? tail : L;
        mu[v] = load_k(mean + i * ns + p0 + v * L, k);
        rs[v] = load_k(rstd + i * ns + p0 + v * L, k);
        s1[v] = vzero<A>();
        s2[v] = vzero<A>();
      }
      for (int64_t c = 0; c < nc; ++c) {  // the per-pixel sums over channels
        if (far && c + kAhead < nc) {
          prefetch_run(x + off + (c + kAhead) * ns, m * int64_t(sizeof(S)));
          prefetch_run(dy + off + (c + kAhead) * ns, m * int64_t(sizeof(S)));
        }
        const S* xr = x + off + c * ns;
        const S* dyr = dy + off + c * ns;
        const V wc = vset1<A>(w != nullptr ? w[c] : one);
        for (int64_t v = 0; v < nv; ++v) {
          const int64_t k = v == last ? tail : L;
          V xh = (load_k(xr + v * L, k) - mu[v]) * rs[v];
          V g = load_k(dyr + v * L, k) * wc;
          s1[v] += g;
          s2[v] += g * xh;
        }
      }
      for (int64_t v = 0; v < nv; ++v) {
        s1[v] = s1[v] / an;  // term 2
        s2[v] = s2[v] / an;  // term 3's factor
      }
      for (int64_t c = 0; c < nc; ++c) {  // dx (and this block's share of dw/db), from L2
        const S* xr = x + off + c * ns;
        const S* dyr = dy + off + c * ns;
        S* dxr = dx + off + c * ns;
        const V wc = vset1<A>(w != nullptr ? w[c] : one);
        V sw = vzero<A>(), sb = vzero<A>();
        for (int64_t v = 0; v < nv; ++v) {
          const int64_t k = v == last ? tail : L;
          V xh = (load_k(xr + v * L, k) - mu[v]) * rs[v];
          V dyv = load_k(dyr + v * L, k);
          store_k(dxr + v * L, rs[v] * ((dyv * wc - s1[v]) - xh * s2[v]), k);
          sw += dyv * xh;  // the padded lanes of a last vector add 0 * 0
          sb += dyv;
        }
        if (need_wb) {
          dw_part[t * nc + c] = hsum<A>(sw);
          db_part[t * nc + c] = hsum<A>(sb);
        }
      }
    }
  });
  if (need_wb) {  // merge the partials in task order, in float64
    for_rows(nc, n_tasks, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double sw = 0, sb = 0;
        for (int64_t t = 0; t < n_tasks; ++t) {
          sw += double(dw_part[t * nc + c]);
          sb += double(db_part[t * nc + c]);
        }
        dw[c] = A(sw);
        db[c] = A(sb);
      }
    });
  }
}

// ------------------------------------------------------------------------------------------------
// Rows (channels_last) forward
//
// x       (n_rows, n_cols)  input, storage S, contiguous (a pixel's C channels per row)
// w, b    (n_cols,)         weight, bias in acc_t<S>; nullptr for ones / zeros
// y       (n_rows, n_cols)  out, storage S
// mean    (n_rows,)         out: row means (nullptr: not written)
// rstd    (n_rows,)         out: 1 / sqrt(var + eps) (nullptr with mean)
// ------------------------------------------------------------------------------------------------
namespace {
template <class S, bool HasW, bool HasB>
void fwd_rows_impl(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* rstd,
                   int64_t n_rows, int64_t n_cols, double eps) {
  using A = acc_t<S>;
  using V = vec<A>;
  constexpr int64_t L = vlanes<S>;
  const A an = A(n_cols), aeps = A(eps), one = A(1);
  const int64_t nfull = n_cols / L * L, tail = n_cols - nfull;
  // Rows longer than this are read from memory once into a scratch row of d = x - shift in
  // acc_t<S> (L1/L2), which the other passes read; shorter ones are read again (from L1), which
  // costs less than storing and reloading them -- and in half precision converts them again,
  // hence the shorter limit (the Numba kernels' SHORT_COLS / SHORT_COLS_HALF, measured there).
  // Both give the same bits: the passes see the same differences x - shift.
  const bool scratch = n_cols > (sizeof(S) >= 4 ? 2048 : 512);
  for_rows(n_rows, n_cols, [&](int64_t r0, int64_t r1) {
    std::unique_ptr<A[]> d(scratch ? new A[n_cols] : nullptr);  // (n_cols,) x - shift
    // the row's statistics and output from src, whose values less sshift are the row's d
    auto normalize = [&](const auto* src, A sshift, int64_t r, S* yr) {
      const A md = shifted_sum(src, n_cols, sshift) / an;  // mean of d = x - shift
      const A var = shifted_sqdev(src, n_cols, sshift, md) / an;  // biased
      const A r_ = one / std::sqrt(var + aeps);
      if (mean != nullptr) {
        mean[r] = (scratch ? to_acc(x[r * n_cols]) : sshift) + md;
        rstd[r] = r_;
      }
      const V vs = vset1<A>(sshift), vm = vset1<A>(md), vr = vset1<A>(r_);
      for (int64_t j = 0; j < nfull; j += L) {
        V o = ((vload(src + j) - vs) - vm) * vr;
        if constexpr (HasW) o = o * vload(w + j);
        if constexpr (HasB) o = o + vload(b + j);
        vstore(yr + j, o);
      }
      if (tail) {
        V o = ((load_part(src + nfull, tail) - vs) - vm) * vr;
        if constexpr (HasW) o = o * load_part(w + nfull, tail);
        if constexpr (HasB) o = o + load_part(b + nfull, tail);
        store_part(yr + nfull, o, tail);
      }
    };
    for (int64_t r = r0; r < r1; ++r) {
      const S* xr = x + r * n_cols;
      const A shift = to_acc(xr[0]);
      if (!scratch) {
        normalize(xr, shift, r, y + r * n_cols);
        continue;
      }
      const V vs = vset1<A>(shift);
      for (int64_t j = 0; j < nfull; j += L) vstore(d.get() + j, vload(xr + j) - vs);
      for (int64_t j = nfull; j < n_cols; ++j) d[j] = to_acc(xr[j]) - shift;
      normalize(static_cast<const A*>(d.get()), A(0), r, y + r * n_cols);  // d - 0 is d
    }
  });
}
}  // namespace

template <class S>
void fwd_rows(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* rstd,
              int64_t n_rows, int64_t n_cols, double eps) {
  if (w && b) fwd_rows_impl<S, true, true>(x, w, b, y, mean, rstd, n_rows, n_cols, eps);
  else if (w) fwd_rows_impl<S, true, false>(x, w, b, y, mean, rstd, n_rows, n_cols, eps);
  else if (b) fwd_rows_impl<S, false, true>(x, w, b, y, mean, rstd, n_rows, n_cols, eps);
  else fwd_rows_impl<S, false, false>(x, w, b, y, mean, rstd, n_rows, n_cols, eps);
}

// ------------------------------------------------------------------------------------------------
// Rows (channels_last) backward
//
// dy      (n_rows, n_cols)  gradient of y, storage S, contiguous
// x       (n_rows, n_cols)  the forward's input
// w       (n_cols,)         weight, acc_t<S>; nullptr for ones
// mean    (n_rows,)         the forward's row means
// rstd    (n_rows,)         the forward's 1 / sqrt(var + eps)
// dx      (n_rows, n_cols)  out: gradient of x, storage S
// dw, db  (n_cols,)         out: sums over rows of dy * x_hat and dy (nullptr: not needed)
// ------------------------------------------------------------------------------------------------
namespace {
template <class S, bool HasW>
void bwd_rows_impl(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
                   acc_t<S>* dw, acc_t<S>* db, int64_t n_rows, int64_t n_cols) {
  using A = acc_t<S>;
  using V = vec<A>;
  constexpr int64_t L = vlanes<S>;
  const A an = A(n_cols);
  const int64_t nfull = n_cols / L * L, tail = n_cols - nfull;
  const bool need_wb = dw != nullptr;
  const int64_t rows = chunk_rows(n_rows, n_cols), nch = n_chunks(n_rows, rows);
  std::vector<A> dw_part(need_wb ? nch * n_cols : 0);  // (chunks, n_cols) partial sums of dy * x_hat
  std::vector<A> db_part(need_wb ? nch * n_cols : 0);  // (chunks, n_cols) partial sums of dy
  for_chunks(n_rows, rows, n_cols, [&](int64_t ch, int64_t lo, int64_t hi) {
    A* pw = need_wb ? dw_part.data() + ch * n_cols : nullptr;
    A* pb = need_wb ? db_part.data() + ch * n_cols : nullptr;
    for (int64_t r = lo; r < hi; ++r) {
      const S* xr = x + r * n_cols;
      const S* dyr = dy + r * n_cols;
      S* dxr = dx + r * n_cols;
      const A m = mean[r], rs = rstd[r];
      const V vm = vset1<A>(m), vr = vset1<A>(rs);
      V s1 = vzero<A>(), s2 = vzero<A>();  // sums of g and g * x_hat
      for (int64_t j = 0; j < nfull; j += L) {
        V xh = (vload(xr + j) - vm) * vr;
        V g = vload(dyr + j);
        if constexpr (HasW) g = g * vload(w + j);
        s1 += g;
        s2 += g * xh;
      }
      A sum_g = hsum<A>(s1), sum_gx = hsum<A>(s2);
      for (int64_t j = nfull; j < n_cols; ++j) {
        A xh = (to_acc(xr[j]) - m) * rs;
        A g = to_acc(dyr[j]);
        if constexpr (HasW) g = g * w[j];
        sum_g += g;
        sum_gx += g * xh;
      }
      const V mg = vset1<A>(sum_g / an);    // term 2
      const V mgx = vset1<A>(sum_gx / an);  // term 3's factor
      for (int64_t j = 0; j < nfull; j += L) {
        V xh = (vload(xr + j) - vm) * vr;
        V dyv = vload(dyr + j);
        V g = dyv;
        if constexpr (HasW) g = g * vload(w + j);
        vstore(dxr + j, vr * ((g - mg) - xh * mgx));
        if (need_wb) {
          vstore(pw + j, vload(pw + j) + dyv * xh);
          vstore(pb + j, vload(pb + j) + dyv);
        }
      }
      if (tail) {
        V xh = (load_part(xr + nfull, tail) - vm) * vr;
        V dyv = load_part(dyr + nfull, tail);
        V g = dyv;
        if constexpr (HasW) g = g * load_part(w + nfull, tail);
        store_part(dxr + nfull, vr * ((g - mg) - xh * mgx), tail);
        if (need_wb) {
          store_part(pw + nfull, load_part(pw + nfull, tail) + dyv * xh, tail);
          store_part(pb + nfull, load_part(pb + nfull, tail) + dyv, tail);
        }
      }
    }
  });
  if (need_wb) {  // merge the partials in chunk order, in float64
    for_rows(n_cols, nch, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        double sw = 0, sb = 0;
        for (int64_t c = 0; c < nch; ++c) {
          sw += double(dw_part[c * n_cols + j]);
          sb += double(db_part[c * n_cols + j]);
        }
        dw[j] = A(sw);
        db[j] = A(sb);
      }
    });
  }
}
}  // namespace

template <class S>
void bwd_rows(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n_rows, int64_t n_cols) {
  if (w) bwd_rows_impl<S, true>(dy, x, w, mean, rstd, dx, dw, db, n_rows, n_cols);
  else bwd_rows_impl<S, false>(dy, x, w, mean, rstd, dx, dw, db, n_rows, n_cols);
}

#define NORMLAB_LN2D_INSTANTIATE(S)                                                                          \
  template void fwd_nchw<S>(const S*, const acc_t<S>*, const acc_t<S>*, S*, acc_t<S>*, acc_t<S>*, int64_t,  \
                            int64_t, int64_t, double, bool);                                                 \
  template void bwd_nchw<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*,      \
                            acc_t<S>*, acc_t<S>*, int64_t, int64_t, int64_t, bool);                          \
  template void fwd_rows<S>(const S*, const acc_t<S>*, const acc_t<S>*, S*, acc_t<S>*, acc_t<S>*, int64_t,  \
                            int64_t, double);                                                                \
  template void bwd_rows<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*,      \
                            acc_t<S>*, acc_t<S>*, int64_t, int64_t);

NORMLAB_LN2D_INSTANTIATE(float)
NORMLAB_LN2D_INSTANTIATE(double)
NORMLAB_LN2D_INSTANTIATE(bf16)
NORMLAB_LN2D_INSTANTIATE(f16)

}  // namespace normlab::ln2d
