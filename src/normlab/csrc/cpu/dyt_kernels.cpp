// DyT's kernels (dyt_kernels.h): docs/derivations/dyt.md.
//
//   u = alpha * x,  t = tanh(u),  y = t * w + b
//   s = 1 - t^2 (tanh'(u)),  du = dy * w * s,  dx = du * alpha
//   dalpha = sum(du * x),  dw = sum_rows(dy * t),  db = sum_rows(dy)
//
// tanh (float32 lanes): numerics/vmath.h, the one copy shared with the activations. The forward
// takes vmath::vtanh<false>: by 16 intervals of |u| where the level has fused multiply-add (v3, v4:
// the same bits at both; within 0.74 ulp over every float32), through exp on the baseline (1.33
// ulp). The backward takes vmath::vtanh<true>, t and s = 1 - t^2 together through exp: s = 1 - t^2
// where |u| < 0.625 (no cancellation: t <= 0.56; rounded once), else (4r)(1 - r), r = 1 / (e + 1),
// e = exp(2|u|) -- 1 - t^2 from a rounded t near 1 would lose most of its digits (at |u| = 5,
// thousands of ulp) -- and 0 past 2|u| = 88, near float32's subnormals: within 2.9 ulp; its t within
// 1.33 ulp (dw's terms dy * t).
// float64: std::tanh and std::exp per value.
//
// The forward is elementwise: rows split among threads as they come; bfloat16 rows (more than one
// in a call) two vectors at a time, even and odd values apart (numerics/vec.h, vload_eo / vstore_eo:
// a shift and a mask each way instead of a widening and a packing a vector), w and b reordered to
// match once a call -- the same bits (512x768 forward, one thread: 7 % faster). The backward's sums run
// over fixed tasks (Geometry: a chunk of rows by a block of columns, from the shape alone):
// the terms of dw and db (dy * t and dy, rounded once to float32) added in float64; dalpha's
// terms in float32 over 16 vectors of a row, then float64; each task writes its float64
// partials, merged in chunk order (merge) -- the same bits for any number of threads.
#include "cpu/dyt_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "numerics/chunks.h"
#include "numerics/vec.h"
#include "numerics/vmath.h"

namespace normlab::dyt {

namespace {
constexpr int64_t kBlockRows = 16;         // row chunks are multiples of this
constexpr int64_t kChainVecs = 16;         // float32 sums over at most this many vectors
constexpr int64_t kWideCols = 2048;        // wider rows are cut into column blocks of kColBlock
constexpr int64_t kColBlock = 1024;
constexpr int64_t kMaxChunks = 256;        // row chunks of the backward, at most
constexpr int64_t kMaxPartials = 1 << 20;  // float64 partials, at most (8 MB)

using vf = vec<float>;
using vmath::vfma;
using vmath::vtanh;

inline double tanh_sech2(double u, double* s) {
  const double a = std::fabs(u);
  const double t = std::tanh(u);
  if (a < 0.625) {
    *s = 1.0 - t * t;
  } else {
    const double e = std::exp(a + a), e1 = e + 1.0;
    *s = a + a < 700.0 ? (4.0 / e1) * (e / e1) : 0.0;  // (past 700: below float64's normal range)
  }
  return t;
}

template <class S> inline const acc_t<S>* col(const acc_t<S>* p, int64_t j) { return p ? p + j : nullptr; }

// t * w + b, t * w, t + b or t: W, B whether there is a weight, a bias (one fused step where the
// build has it).
template <bool W, bool B> inline vf dyt_affine(vf t, vf wv, vf bv) {
  if constexpr (W && B) return vfma(t, wv, bv);
  else if constexpr (W) return t * wv;
  else if constexpr (B) return t + bv;
  else return t;
}
// f.template operator()<W, B>() for the weight and bias present (non-null)
template <class F> inline void with_affine(const float* w, const float* b, const F& f) {
  if (w && b) f.template operator()<true, true>();
  else if (w) f.template operator()<true, false>();
  else if (b) f.template operator()<false, true>();
  else f.template operator()<false, false>();
}

// y for columns [j, n) of one row (j = 0: the whole row; bfloat16 rows: from where the pairs of
// fwd_eo_row stopped); float32 lanes (float, bf16, f16 storage).
template <bool W, bool B, class S>
void fwd_row_of(const S* x, float a, const float* w, const float* b, S* y, int64_t n, int64_t j = 0) {
  constexpr int64_t L = vlanes<S>;
  const auto affine = [&](vf t, int64_t j, int64_t m) {
    const vf wv = W ? (m == L ? vload(w + j) : vload_n(w + j, m)) : vf{};
    const vf bv = B ? (m == L ? vload(b + j) : vload_n(b + j, m)) : vf{};
    return dyt_affine<W, B>(t, wv, bv);
  };
  for (; j + L <= n; j += L) vstore(y + j, affine(vtanh<false>(vload(x + j) * a), j, L));
  if (j < n) {
    const int64_t m = n - j;
    vstore_n(y + j, affine(vtanh<false>(vload_n(x + j, m) * a), j, m), m);
  }
}

template <class S> void fwd_row(const S* x, float a, const float* w, const float* b, S* y, int64_t n) {
  with_affine(w, b, [&]<bool W, bool B>() { fwd_row_of<W, B>(x, a, w, b, y, n); });
}

// A bfloat16 row two vectors at a time, even and odd values apart (vload_eo / vstore_eo: a shift
// and a mask each way, where vload / vstore widen and pack each vector), over its first n2 columns
// (n2 a multiple of 2 * lanes); we, be: w and b of those columns in eo_order. The rest of the row
// as fwd_row writes it, from w and b in order. The same bits as fwd_row.
void fwd_eo_row(const bf16* x, float a, const float* we, const float* be, const float* w, const float* b, bf16* y,
                int64_t n, int64_t n2) {
  with_affine(w, b, [&]<bool W, bool B>() {
    constexpr int64_t L = lanes<float>;
    for (int64_t j = 0; j < n2; j += 2 * L) {
      vf e, o;
      vload_eo(x + j, e, o);
      const vf te = vtanh<false>(e * a), to = vtanh<false>(o * a);
      vstore_eo(y + j, dyt_affine<W, B>(te, W ? vload(we + j) : vf{}, B ? vload(be + j) : vf{}),
                dyt_affine<W, B>(to, W ? vload(we + j + L) : vf{}, B ? vload(be + j + L) : vf{}));
    }
    fwd_row_of<W, B>(x, a, w, b, y, n, n2);
  });
}

void fwd_row(const double* x, double a, const double* w, const double* b, double* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double t = std::tanh(a * x[j]);
    if (w) t = t * w[j];
    if (b) t = t + b[j];
    y[j] = t;
  }
}
}  // namespace

Geometry geometry(int64_t n_rows, int64_t n_cols) {
  Geometry g;
  g.col_block = n_cols > kWideCols ? kColBlock : std::max<int64_t>(n_cols, 1);
  g.n_col_blocks = std::max<int64_t>(1, (n_cols + g.col_block - 1) / g.col_block);
  const int64_t max_chunks = std::clamp<int64_t>(kMaxPartials / (2 * std::max<int64_t>(n_cols, 1) + g.n_col_blocks),
                                                 1, kMaxChunks);
  int64_t rows = (std::max<int64_t>(n_rows, 1) + max_chunks - 1) / max_chunks;
  g.chunk_rows = (rows + kBlockRows - 1) / kBlockRows * kBlockRows;
  g.n_chunks = std::max<int64_t>(1, (n_rows + g.chunk_rows - 1) / g.chunk_rows);
  return g;
}

template <class S>
void forward(const S* x, acc_t<S> alpha, const acc_t<S>* w, const acc_t<S>* b, S* y, int64_t n_rows,
             int64_t n_cols) {
  if constexpr (std::is_same_v<S, bf16>) {
    // bfloat16: the even/odd pairs where a row has one, and more than one row shares the reordered
    // w and b (a single row: the reordering would cost what it saves)
    constexpr int64_t P = 2 * lanes<float>;
    const int64_t n2 = n_cols / P * P;
    if (n2 > 0 && n_rows > 1) {
      std::vector<float> we(w ? n2 : 0), be(b ? n2 : 0);
      if (w) eo_order(w, n2, we.data());
      if (b) eo_order(b, n2, be.data());
      for_rows(n_rows, n_cols, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          fwd_eo_row(x + r * n_cols, alpha, we.data(), be.data(), w, b, y + r * n_cols, n_cols, n2);
      });
      return;
    }
  }
  for_rows(n_rows, n_cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fwd_row(x + r * n_cols, alpha, w, b, y + r * n_cols, n_cols);
  });
}

namespace {
// acc[0, m) += v's first m lanes, each widened to float64 (a full vector: two float64 vectors,
// the same additions lane by lane).
inline void add_widened(double* acc, vf v, int64_t m) {
  if (m == lanes<float>) {
    typedef float half_t __attribute__((vector_size(NORMLAB_VEC_BYTES / 2)));
    half_t lo, hi;
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    vec<double> a0, a1;
    std::memcpy(&a0, acc, sizeof a0);
    std::memcpy(&a1, acc + lanes<double>, sizeof a1);
    a0 += __builtin_convertvector(lo, vec<double>);
    a1 += __builtin_convertvector(hi, vec<double>);
    std::memcpy(acc, &a0, sizeof a0);
    std::memcpy(acc + lanes<double>, &a1, sizeof a1);
    return;
  }
  float t[lanes<float>];
  std::memcpy(t, &v, sizeof t);
  for (int64_t i = 0; i < m; ++i) acc[i] += double(t[i]);
}

// One backward task: rows [r0, r1), columns [j0, j1) (j1 - j0 <= kColBlock or the whole row);
// dw64, db64: the task's (j1 - j0) float64 sums, zeroed by the caller. Returns dalpha's part.
template <class S>
double bwd_task(const S* dy, const S* x, acc_t<S> a, const acc_t<S>* w, S* dx, double* dw64, double* db64,
                int64_t r0, int64_t r1, int64_t j0, int64_t j1, int64_t n_cols) {
  const int64_t n = j1 - j0;
  double dalpha = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    const S* dyr = dy + r * n_cols + j0;
    const S* xr = x + r * n_cols + j0;
    S* dxr = dx ? dx + r * n_cols + j0 : nullptr;
    if constexpr (std::is_same_v<S, double>) {
      for (int64_t j = 0; j < n; ++j) {
        double s;
        const double t = tanh_sech2(a * xr[j], &s);
        const double g = w ? dyr[j] * w[j0 + j] : dyr[j];
        const double du = g * s;
        if (dxr) dxr[j] = du * a;
        dalpha += du * xr[j];
        if (dw64) dw64[j] += dyr[j] * t;
        if (db64) db64[j] += dyr[j];
      }
    } else {
      constexpr int64_t L = vlanes<S>;
      vf chain = vzero<float>();
      int64_t in_chain = 0;
      for (int64_t j = 0; j < n; j += L) {
        const int64_t m = std::min(L, n - j);
        const vf xv = m == L ? vload(xr + j) : vload_n(xr + j, m);
        const vf dyv = m == L ? vload(dyr + j) : vload_n(dyr + j, m);
        vf s;
        const vf t = vtanh<true>(xv * a, &s);
        const vf g = w ? dyv * (m == L ? vload(w + j0 + j) : vload_n(w + j0 + j, m)) : dyv;
        const vf du = g * s;
        if (dxr) {
          if (m == L) vstore(dxr + j, du * a); else vstore_n(dxr + j, du * a, m);
        }
        chain = chain + du * xv;  // (a partial vector's missing lanes load as 0)
        if (++in_chain == kChainVecs) { dalpha += hsum<float>(chain); chain = vzero<float>(); in_chain = 0; }
        if (dw64) add_widened(dw64 + j, dyv * t, m);
        if (db64) add_widened(db64 + j, dyv, m);
      }
      if (in_chain) dalpha += hsum<float>(chain);
    }
  }
  return dalpha;
}
}  // namespace

template <class S>
void backward(const S* dy, const S* x, acc_t<S> alpha, const acc_t<S>* w, S* dx, double* dw_part, double* db_part,
              double* dalpha_part, int64_t n_rows, int64_t n_cols, const Geometry& g) {
  const int64_t tasks = g.n_chunks * g.n_col_blocks;
  for_rows(tasks, g.chunk_rows * g.col_block, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c = t / g.n_col_blocks, k = t % g.n_col_blocks;
      const int64_t r0 = c * g.chunk_rows, r1 = std::min(n_rows, r0 + g.chunk_rows);
      const int64_t j0 = k * g.col_block, j1 = std::min(n_cols, j0 + g.col_block);
      double* dw64 = dw_part ? dw_part + c * n_cols + j0 : nullptr;
      double* db64 = db_part ? db_part + c * n_cols + j0 : nullptr;
      if (dw64) std::fill(dw64, dw64 + (j1 - j0), 0.0);
      if (db64) std::fill(db64, db64 + (j1 - j0), 0.0);
      const double da = r0 < r1 ? bwd_task(dy, x, alpha, w, dx, dw64, db64, r0, r1, j0, j1, n_cols) : 0.0;
      if (dalpha_part) dalpha_part[t] = da;
    }
  });
}

void merge(const double* part, int64_t n_chunks, int64_t n, double* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = 0.0;
  for (int64_t c = 0; c < n_chunks; ++c)
    for (int64_t j = 0; j < n; ++j) out[j] += part[c * n + j];
}

#define NORMLAB_DYT_INSTANTIATE(S)                                                                            \
  template void forward<S>(const S*, acc_t<S>, const acc_t<S>*, const acc_t<S>*, S*, int64_t, int64_t);      \
  template void backward<S>(const S*, const S*, acc_t<S>, const acc_t<S>*, S*, double*, double*, double*,    \
                            int64_t, int64_t, const Geometry&);
NORMLAB_DYT_INSTANTIATE(float)
NORMLAB_DYT_INSTANTIATE(double)
NORMLAB_DYT_INSTANTIATE(bf16)
NORMLAB_DYT_INSTANTIATE(f16)
#undef NORMLAB_DYT_INSTANTIATE

}  // namespace normlab::dyt
