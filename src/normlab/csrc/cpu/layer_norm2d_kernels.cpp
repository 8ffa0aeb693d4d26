// LayerNorm2d's kernels (layer_norm2d_kernels.h): docs/derivations/layer_norm.md, "LayerNorm" (the
// forward and the three terms of dx), "LayerNorm2d: the same rows, in channels-last memory" and
// "Numerics" (the shifted two passes, sums in float32 / float64).
//
// Per pixel p of sample n, over its C channels c (the planes x[n, c, :]):
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
// the blocks depend on the shape only. (Channels-last rows run on LayerNorm's row kernels,
// cpu/layer_norm_kernels.cpp.)
#include "cpu/layer_norm2d_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "numerics/activation.h"
#include "numerics/chunks.h"
#include "numerics/prefetch.h"
#include "numerics/vec.h"

#if NORMLAB_VEC_BYTES == 64
#include <immintrin.h>
#endif

namespace normlab::ln2d {

// A task covers a block of pixels of one sample, all C channels: about kBlockBytes (the forward:
// kFwdBlockBytes), so the block's planes stay in L2 through the passes; each plane's run at least kRunBytes (runs of a
// few cache lines leave the hardware prefetcher no time to start) while the block stays within
// kMaxBytes; at least kMinBlock pixels, a multiple of kVecPixels; halved (not below kMinBlock)
// while there are fewer than kMinTasks tasks. (The measurements behind these sizes:
// docs/notes/performance-log-numba.md, "LayerNorm2d across channel counts; NCHW blocks in bytes".)
namespace {
constexpr int64_t kBlockBytes = 256 << 10;
// The forward's smaller blocks write fewer plane runs at a time into a fresh output: 64 MB of
// float32, one thread, 0.83-0.85 of the copy's speed against 0.71-0.78 with kBlockBytes.
constexpr int64_t kFwdBlockBytes = 64 << 10;
constexpr int64_t kRunBytes = 1 << 10;
constexpr int64_t kMaxBytes = 1 << 20;
constexpr int64_t kMinBlock = 64;
constexpr int64_t kVecPixels = 16;
constexpr int64_t kMinTasks = 16;
// The first pass asks for the runs of the plane kAhead planes on (far tensors only).
constexpr int64_t kAhead = 4;
}  // namespace

namespace {
int64_t block_of(int64_t n, int64_t nc, int64_t ns, int64_t itemsize, int64_t target) {
  int64_t pixel = std::max<int64_t>(nc, 1) * itemsize;  // bytes of one pixel's channels
  int64_t blk = std::max(target / pixel, std::min(kRunBytes / itemsize, kMaxBytes / pixel));
  blk = std::max(kMinBlock, blk / kVecPixels * kVecPixels);
  while (blk > kMinBlock && n * ((ns + blk - 1) / blk) < kMinTasks)
    blk = std::max(kMinBlock, blk / 2 / kVecPixels * kVecPixels);
  return std::max<int64_t>(1, std::min(blk, ns));
}
}  // namespace

int64_t block_size(int64_t n, int64_t nc, int64_t ns, int64_t itemsize) {
  return block_of(n, nc, ns, itemsize, kBlockBytes);
}
int64_t fwd_block_size(int64_t n, int64_t nc, int64_t ns, int64_t itemsize) {
  return block_of(n, nc, ns, itemsize, kFwdBlockBytes);
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
              int64_t n, int64_t nc, int64_t ns, double eps, bool far, int act_id, double act_param) {
  using A = acc_t<S>;
  using V = vec<A>;
  constexpr int64_t L = vlanes<S>;
  const int64_t block = fwd_block_size(n, nc, ns, sizeof(S));
  const int64_t n_blk = (ns + block - 1) / block;
  const int64_t nvmax = (block + L - 1) / L;
  const A an = A(nc), aeps = A(eps), one = A(1);
  const bool far_out = far && sizeof(S) >= 4;  // half precision's output pass is bound by conversions
  const A ap = A(act_param);
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
        if (far && c + kAhead < nc) prefetch_read(xi + (c + kAhead) * ns, m * int64_t(sizeof(S)));
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
      act::visit(act_id, [&]<int Act>() {
        for (int64_t c = 0; c < nc; ++c) {  // output: y = act(x_hat * w + b)
          if (far_out && c + kAhead < nc) prefetch_write(yi + (c + kAhead) * ns, m * int64_t(sizeof(S)));
          const S* xr = xi + c * ns;
          S* yr = yi + c * ns;
          const V wc = vset1<A>(w != nullptr ? w[c] : one), bc = vset1<A>(b != nullptr ? b[c] : A(0));
          for (int64_t v = 0; v < last; ++v)
            vstore(yr + v * L, act::apply_stored<Act, S>((((vload(xr + v * L) - sh[v]) - md[v]) * rs[v]) * wc + bc, ap));
          store_k(yr + last * L,
                  act::apply_stored<Act, S>((((load_k(xr + last * L, tail) - sh[last]) - md[last]) * rs[last]) * wc + bc, ap),
                  tail);
        }
      });
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
template <class S, int Act>
void bwd_nchw_act(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* mean,
                  const acc_t<S>* rstd, S* dx, acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t nc, int64_t ns, bool far,
                  acc_t<S> ap);

template <class S>
void bwd_nchw(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t nc, int64_t ns, bool far, const acc_t<S>* b,
              int act_id, double act_param) {
  act::visit(act_id, [&]<int Act>() {
    bwd_nchw_act<S, Act>(dy, x, w, b, mean, rstd, dx, dw, db, n, nc, ns, far, acc_t<S>(act_param));
  });
}

// bwd_nchw with the activation Act (identity: LayerNorm2d's own backward)
template <class S, int Act>
void bwd_nchw_act(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* b, const acc_t<S>* mean,
                  const acc_t<S>* rstd, S* dx, acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t nc, int64_t ns, bool far,
                  acc_t<S> ap) {
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
          prefetch_read(x + off + (c + kAhead) * ns, m * int64_t(sizeof(S)));
          prefetch_read(dy + off + (c + kAhead) * ns, m * int64_t(sizeof(S)));
        }
        const S* xr = x + off + c * ns;
        const S* dyr = dy + off + c * ns;
        const V wc = vset1<A>(w != nullptr ? w[c] : one);
        if constexpr (Act == act::kIdentity) {
          for (int64_t v = 0; v < nv; ++v) {
            const int64_t k = v == last ? tail : L;
            V xh = (load_k(xr + v * L, k) - mu[v]) * rs[v];
            V g = load_k(dyr + v * L, k) * wc;
            s1[v] += g;
            s2[v] += g * xh;
          }
        } else {  // dz = dy * act'(z) into dx's buffer (act::dz_of; rounded to S: read back as stored)
          S* dzr = dx + off + c * ns;
          const V bc = vset1<A>(b != nullptr ? b[c] : A(0));
          for (int64_t v = 0; v < nv; ++v) {
            const int64_t k = v == last ? tail : L;
            V xh = (load_k(xr + v * L, k) - mu[v]) * rs[v];
            V dz = act::dz_of<Act, S>(load_k(dyr + v * L, k), xh * wc + bc, ap);
            store_k(dzr + v * L, dz, k);
            if constexpr (sizeof(S) < sizeof(A)) dz = load_k(dzr + v * L, k);
            V g = dz * wc;
            s1[v] += g;
            s2[v] += g * xh;
          }
        }
      }
      for (int64_t v = 0; v < nv; ++v) {
        s1[v] = s1[v] / an;  // term 2
        s2[v] = s2[v] / an;  // term 3's factor
      }
      for (int64_t c = 0; c < nc; ++c) {  // dx (and this block's share of dw/db), from L2
        const S* xr = x + off + c * ns;
        const S* dyr = Act == act::kIdentity ? dy + off + c * ns : dx + off + c * ns;  // (dz: read, then dx written)
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

#define NORMLAB_LN2D_INSTANTIATE(S)                                                                          \
  template void fwd_nchw<S>(const S*, const acc_t<S>*, const acc_t<S>*, S*, acc_t<S>*, acc_t<S>*, int64_t,  \
                            int64_t, int64_t, double, bool, int, double);                                    \
  template void bwd_nchw<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*,      \
                            acc_t<S>*, acc_t<S>*, int64_t, int64_t, int64_t, bool, const acc_t<S>*, int,     \
                            double);                                                                         \

NORMLAB_LN2D_INSTANTIATE(float)
NORMLAB_LN2D_INSTANTIATE(double)
NORMLAB_LN2D_INSTANTIATE(bf16)
NORMLAB_LN2D_INSTANTIATE(f16)

}  // namespace normlab::ln2d
