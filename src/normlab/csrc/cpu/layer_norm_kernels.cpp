// LayerNorm / RMSNorm row kernels: docs/derivations/layer_norm.md ("Statistics", "Backward").
//
// One row kernel serves four ops. RMSNorm is LayerNorm without centring (center = false: the
// shift and the mean are 0, there is no bias, and the backward loses the mean(g) term); the
// fused residual add normalises h = x + res, written first (res != nullptr); the Llama-style
// RMSNorm rounds x_hat to the storage dtype before the weight multiplies it (cast_x_hat).
// Statistics and sums in the accumulation type (float32 for the half types, float64 for
// float64), the output rounded once. Each pass reads the row again (from L1 or L2): no scratch.
// Sums cross lanes only through hsum (numerics/vec.h): one order of additions for every run.
#include "cpu/layer_norm_kernels.h"

#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include "numerics/chunks.h"
#include "numerics/moments.h"
#include "numerics/prefetch.h"
#include "numerics/stream.h"
#include "numerics/vec.h"

namespace normlab::ln {
namespace {

// s / n in the accumulation type. float32: for n <= 2**24 (exact in float32) the float32
// quotient equals the float64 quotient rounded to float32 (float64 carries more than twice
// float32's digits), and one divss is shorter than the round trip through float64.
template <class A> inline A over_n(A s, int64_t n) {
  if constexpr (sizeof(A) == 4) {
    if (n > 16777216) return A(double(s) / double(n));
  }
  return s / A(n);
}

// v rounded to storage S and back, lane by lane (the identity for float32 / float64).
template <class S> inline vacc<S> vround(vacc<S> v) {
  if constexpr (sizeof(S) == 2) {
    S t[vlanes<S>];
    vstore(t, v);
    return vload(t);
  } else {
    return v;
  }
}

// h = x + res over one row, rounded to storage S as torch.add rounds it.
template <class S> inline void add_row(const S* xr, const S* rr, S* hr, int64_t n) {
  constexpr int64_t L = vlanes<S>;
  int64_t j = 0;
  for (; j + L <= n; j += L) vstore(hr + j, vload(xr + j) + vload(rr + j));
  for (; j < n; ++j) hr[j] = from_acc<S>(to_acc(xr[j]) + to_acc(rr[j]));
}

// ---------------------------------------------------------------------------------------------
// Short rows: fewer values than a vector has lanes (n < 16, float32 accumulation, AVX-512 builds).
//
// A row shorter than a vector runs every pass one value at a time (the vector loops above never
// start): its sums are sum_j v_j added in order from +0 (hsum of the empty vectors, then the scalar
// tail). A block of 16 such rows -- 16 n contiguous values, n vectors "flat" -- is instead worked
// one row per lane: the row sums over the columns, transposed out of the flat vectors (two-source
// permutes, merged by masks), added in the same order from +0 in every lane (the same additions
// as the scalar tail, so the same bits); the elementwise passes run on the flat vectors, each
// row's mean / rstd / factors spread over its values by a permute; the column sums of the
// backward (dw, db) add the block's rows one after another, each row picked out of the flat
// vectors (the same order of additions as row after row). Rows that do not fill a block, and
// blocks that would cross a grouped weight's rows, take the row path.
// ---------------------------------------------------------------------------------------------
#if NORMLAB_VEC_BYTES == 64
#define NORMLAB_LN_SHORT_ROWS 1
constexpr int64_t kShort = 16;  // rows per block: the lanes of a float32 vector

// The permute tables for rows of N values (flat value p = 16 k + l: register k, lane l; row p / N).
template <int N> struct ShortPlan {
  static constexpr int P = (N + 1) / 2;  // register pairs
  int32_t col_idx[N][P][16] = {};        // column j from registers (2m, 2m + 1): lane r's index
  uint16_t col_mask[N][P] = {};          //   the lanes (rows) it supplies
  int32_t row_idx[16][16] = {};          // row r from registers (row_reg, row_reg + 1): lane j's index
  int row_reg[16] = {};
  int32_t exp_idx[N][16] = {};           // flat register k: the row of each lane
  constexpr ShortPlan() {
    for (int j = 0; j < N; ++j)
      for (int r = 0; r < 16; ++r) {
        const int p = r * N + j, m = p / 32;
        col_idx[j][m][r] = p - 32 * m;
        col_mask[j][m] = uint16_t(col_mask[j][m] | (1u << r));
      }
    for (int r = 0; r < 16; ++r) {
      row_reg[r] = (r * N) / 16;
      for (int j = 0; j < 16; ++j) row_idx[r][j] = j < N ? r * N + j - 16 * row_reg[r] : 0;
    }
    for (int k = 0; k < N; ++k)
      for (int l = 0; l < 16; ++l) exp_idx[k][l] = (16 * k + l) / N;
  }
};
template <int N> inline constexpr ShortPlan<N> kShortPlan{};

inline __m512i idx_at(const int32_t* p) { return _mm512_loadu_si512(p); }
inline __m512 m512(vec<float> v) { return (__m512)v; }
inline vec<float> vf(__m512 v) { return (vec<float>)v; }

// Column j of the 16 rows held flat in V[0..N): lane r = row r's value j.
template <int N> inline vec<float> short_col(const vec<float>* V, int j) {
  constexpr auto& T = kShortPlan<N>;
  __m512 c = _mm512_permutex2var_ps(m512(V[0]), idx_at(T.col_idx[j][0]), m512(V[N > 1 ? 1 : 0]));
  for (int m = 1; m < T.P; ++m) {
    const __m512 t = _mm512_permutex2var_ps(m512(V[2 * m]), idx_at(T.col_idx[j][m]), m512(V[2 * m + 1 < N ? 2 * m + 1 : 2 * m]));
    c = _mm512_mask_blend_ps(T.col_mask[j][m], c, t);
  }
  return vf(c);
}
// Row r of the 16 rows held flat in V[0..N): lane j = its value j (lanes from N: junk).
template <int N> inline vec<float> short_row(const vec<float>* V, int r) {
  constexpr auto& T = kShortPlan<N>;
  const int k = T.row_reg[r];
  return vf(_mm512_permutex2var_ps(m512(V[k]), idx_at(T.row_idx[r]), m512(V[k + 1 < N ? k + 1 : k])));
}
// The per-row values v (lane r: row r) spread over flat register k.
template <int N> inline vec<float> short_spread(vec<float> v, int k) {
  return vf(_mm512_permutexvar_ps(idx_at(kShortPlan<N>.exp_idx[k]), m512(v)));
}

// A weight / bias row of n values tiled over a block's flat vectors: t[p] = w[p % n].
template <class W> void short_tile(const W* w, int64_t n, float* t) {
  for (int64_t p = 0; p < kShort * n; ++p) t[p] = to_acc(w[p % n]);
}

// nb blocks of 16 rows from row pointers x (res, h), y, mean, rstd; wt / bt: the tiled weight
// and bias (nullptr: none). The arithmetic of fwd_row / fwd_finish, lane by lane.
template <class S, int N>
void fwd_short(const S* x, const S* res, S* h, const float* wt, const float* bt, S* y, float* mean, float* rstd,
               int64_t nb, float eps, bool center, bool cast, int64_t ahead, const S* x_end) {
  constexpr int64_t B = kShort * N;  // values a block
  const vec<float> zero = vzero<float>(), vn = vset1<float>(float(N)), veps = vset1<float>(eps);
  for (int64_t b = 0; b < nb; ++b, x += B, y += B) {
    if (ahead > 0 && x + ahead * N < x_end) {
      prefetch_read(x + ahead * N, B * int64_t(sizeof(S)));
      if (res != nullptr) prefetch_read(res + ahead * N, B * int64_t(sizeof(S)));
    }
    vec<float> V[N];
    if (res != nullptr) {  // the fused add: h's values rounded to storage, as the row path reads them back
      for (int k = 0; k < N; ++k) {
        V[k] = vload(x + 16 * k) + vload(res + 16 * k);
        vstore(h + 16 * k, V[k]);
        V[k] = vround<S>(V[k]);
      }
      res += B;
      h += B;
    } else {
      for (int k = 0; k < N; ++k) V[k] = vload(x + 16 * k);
    }
    vec<float> shift = zero, md = zero;
    if (center) {
      shift = short_col<N>(V, 0);
      vec<float> s = zero;
      for (int j = 0; j < N; ++j) s += short_col<N>(V, j) - shift;
      md = s / vn;
    }
    vec<float> q = zero;
    for (int j = 0; j < N; ++j) {
      const vec<float> e = (short_col<N>(V, j) - shift) - md;
      q += e * e;
    }
    const vec<float> var = q / vn;
    const vec<float> rs = vset1<float>(1.0f) / vf(_mm512_sqrt_ps(m512(var + veps)));
    if (mean != nullptr) { vstore(mean, shift + md); mean += kShort; }
    if (rstd != nullptr) { vstore(rstd, rs); rstd += kShort; }
    for (int k = 0; k < N; ++k) {
      vec<float> v = ((V[k] - short_spread<N>(shift, k)) - short_spread<N>(md, k)) * short_spread<N>(rs, k);
      if (cast) v = vround<S>(v);
      if (wt != nullptr) v = v * vload(wt + 16 * k);
      if (bt != nullptr) v = v + vload(bt + 16 * k);
      else if (center) v = v + zero;  // torch's LayerNorm adds a bias of 0: -0 comes out +0
      vstore(y + 16 * k, v);
    }
  }
}

// nb blocks of 16 rows of the backward: the arithmetic of bwd_rows, lane by lane; pw / pb the
// chunk's column sums (nullptr: not needed), added to row after row.
template <class S, int N>
void bwd_short(const S* dy, const S* x, const float* wt, const float* mean, const float* rstd, const S* dh, S* dx,
               float* pw, float* pb, int64_t nb, bool center, bool cast, int64_t ahead, const S* x_end) {
  constexpr int64_t B = kShort * N;
  const vec<float> zero = vzero<float>(), vn = vset1<float>(float(N));
  const __mmask16 cols = __mmask16((1u << N) - 1);
  vec<float> aw = zero, ab = zero;
  if (pw != nullptr) aw = vf(_mm512_maskz_loadu_ps(cols, pw));
  if (pb != nullptr) ab = vf(_mm512_maskz_loadu_ps(cols, pb));
  for (int64_t b = 0; b < nb; ++b, x += B, dy += B, dx += B, rstd += kShort) {
    if (ahead > 0 && x + ahead * N < x_end) {
      prefetch_read(x + ahead * N, B * int64_t(sizeof(S)));
      prefetch_read(dy + ahead * N, B * int64_t(sizeof(S)));
      if (dh != nullptr) prefetch_read(dh + ahead * N, B * int64_t(sizeof(S)));
    }
    vec<float> m = zero;
    if (center) { m = vload(mean); mean += kShort; }
    const vec<float> r = vload(rstd);
    vec<float> XH[N], DY[N], G[N], GX[N];
    for (int k = 0; k < N; ++k) {
      XH[k] = (vload(x + 16 * k) - short_spread<N>(m, k)) * short_spread<N>(r, k);
      DY[k] = vload(dy + 16 * k);
      G[k] = wt != nullptr ? DY[k] * vload(wt + 16 * k) : DY[k];
      GX[k] = G[k] * XH[k];
    }
    vec<float> sg = zero, sgx = zero;
    for (int j = 0; j < N; ++j) {
      sg += short_col<N>(G, j);
      sgx += short_col<N>(GX, j);
    }
    const vec<float> mg = center ? sg / vn : zero, mgx = sgx / vn;
    for (int k = 0; k < N; ++k) {
      vec<float> d = short_spread<N>(r, k) * ((G[k] - short_spread<N>(mg, k)) - XH[k] * short_spread<N>(mgx, k));
      if (dh != nullptr) d = d + vload(dh + 16 * k);
      vstore(dx + 16 * k, d);
    }
    if (dh != nullptr) dh += B;
    if (pw != nullptr) {
      for (int k = 0; k < N; ++k) GX[k] = DY[k] * (cast ? vround<S>(XH[k]) : XH[k]);  // dy * x_hat as seen
      for (int q = 0; q < kShort; ++q) aw = aw + short_row<N>(GX, q);
      if (pb != nullptr)
        for (int q = 0; q < kShort; ++q) ab = ab + short_row<N>(DY, q);
    }
  }
  if (pw != nullptr) _mm512_mask_storeu_ps(pw, cols, m512(aw));
  if (pb != nullptr) _mm512_mask_storeu_ps(pb, cols, m512(ab));
}

#define NORMLAB_LN_SHORT_CASES(F) \
  F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) F(13) F(14) F(15)

template <class S>
void fwd_short_n(int64_t n, const S* x, const S* res, S* h, const float* wt, const float* bt, S* y, float* mean,
                 float* rstd, int64_t nb, float eps, bool center, bool cast, int64_t ahead, const S* x_end) {
  switch (n) {
#define NORMLAB_CASE(K) \
  case K: return fwd_short<S, K>(x, res, h, wt, bt, y, mean, rstd, nb, eps, center, cast, ahead, x_end);
    NORMLAB_LN_SHORT_CASES(NORMLAB_CASE)
#undef NORMLAB_CASE
  }
}
template <class S>
void bwd_short_n(int64_t n, const S* dy, const S* x, const float* wt, const float* mean, const float* rstd, const S* dh,
                 S* dx, float* pw, float* pb, int64_t nb, bool center, bool cast, int64_t ahead, const S* x_end) {
  switch (n) {
#define NORMLAB_CASE(K) \
  case K: return bwd_short<S, K>(dy, x, wt, mean, rstd, dh, dx, pw, pb, nb, center, cast, ahead, x_end);
    NORMLAB_LN_SHORT_CASES(NORMLAB_CASE)
#undef NORMLAB_CASE
  }
}

// ---------------------------------------------------------------------------------------------
// Rows of 1-15 vectors and a tail (16 <= n < 256 float32 values forward, < 128 backward, AVX-512).
//
// The row path sums such a row in two vector chains (s0: vectors 0, 2, 4, ...; s1: vectors 1, 3, ...), then
// hsum(s0 + s1), then the tail's values one at a time: a dependent chain of a tree and 1-15
// scalar adds per sum, three sums a row -- latency, not work (LayerNorm(24) on 4096 rows: 140
// cycles a row forward). A block of 16 rows is worked with the same additions: each row's head
// (its NV = n / 16 whole vectors) is added up as the two chains add it; the 16 heads' hsum trees
// run together as one transposing reduction (lane i + lane i + 8 of two rows' heads side by side,
// then i + 4, i + 2, i + 1: hsum's tree, 15 adds and 30 shuffles for 16 rows), giving a vector
// whose lane r is row r's head sum; the tail's columns are gathered (lane r: row r's value
// 16 NV + c) and added to it in column order. The elementwise passes run on each row's head and
// masked tail with the row's statistics broadcast. Same additions, same order: the same bits as
// the row path. The backward stops at 8 vectors: its blocks hold four sets of 16 + 2 (NV + 1)
// vectors (the sums, the weight and the column sums), and past 8 the spills cost what the blocks
// save (LayerNorm(200) on 4096 rows: forward 1.2x -> 1.85x torch with blocks, fwd+bwd no gain).
template <int Imm> inline __m512 shuf4(__m512 a, __m512 b) { return _mm512_shuffle_f32x4(a, b, Imm); }
template <int Imm> inline __m512 shuf(__m512 a, __m512 b) { return _mm512_shuffle_ps(a, b, Imm); }

// v[r] (r < 16): lane r of the result = hsum(v[r]) (numerics/vec.h's tree).
inline __m512 hsum16(const __m512* v) {
  __m512 b[8], c[4], d[2];
  // level 1, lanes i + i + 8: rows 2k (lanes 0-7) and 2k + 1 (lanes 8-15)
  for (int k = 0; k < 8; ++k)
    b[k] = _mm512_add_ps(shuf4<0x44>(v[2 * k], v[2 * k + 1]), shuf4<0xEE>(v[2 * k], v[2 * k + 1]));
  // level 2, i + i + 4: b[2m] = rows (4m, 4m + 1) in halves -> quarters rows 4m, 4m + 1, 4m + 2, 4m + 3
  for (int m = 0; m < 4; ++m)
    c[m] = _mm512_add_ps(shuf4<0x88>(b[2 * m], b[2 * m + 1]), shuf4<0xDD>(b[2 * m], b[2 * m + 1]));
  // level 3, i + i + 2, within each quarter: d[p] quarter q = (row 8p + q: 2 lanes, row 8p + 4 + q: 2 lanes)
  for (int p = 0; p < 2; ++p)
    d[p] = _mm512_add_ps(shuf<0x44>(c[2 * p], c[2 * p + 1]), shuf<0xEE>(c[2 * p], c[2 * p + 1]));
  // level 4, i + i + 1: quarter q = rows (q, 4 + q, 8 + q, 12 + q)
  const __m512 e = _mm512_add_ps(shuf<0x88>(d[0], d[1]), shuf<0xDD>(d[0], d[1]));
  // lane 4q + s holds row 4s + q: back to lane r = row r
  const __m512i back = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(back, e);
}
inline __m512 lane_bcast(__m512 v, int r) { return _mm512_permutexvar_ps(_mm512_set1_epi32(r), v); }

// s0 + s1 of the row path's two chains over a head of NV vectors v[0..NV): s0 = 0 + v0 + v2 + ...
// (even vectors), s1 = 0 + v1 + v3 + ... (odd ones; NV = 1: none, and 0 + v0 + 0 is 0 + v0, which
// holds no -0).
template <int NV> inline __m512 chains(const __m512* v) {
  const __m512 zero = _mm512_setzero_ps();
  __m512 s0 = _mm512_add_ps(zero, v[0]);
  if constexpr (NV == 1) {
    return s0;
  } else {
    __m512 s1 = _mm512_add_ps(zero, v[1]);
    for (int k = 2; k + 1 < NV; k += 2) { s0 = _mm512_add_ps(s0, v[k]); s1 = _mm512_add_ps(s1, v[k + 1]); }
    if constexpr (NV % 2 == 1) s0 = _mm512_add_ps(s0, v[NV - 1]);
    return _mm512_add_ps(s0, s1);
  }
}

// What a block of rows of n values shares: row r's first value at lane r (gather indices), the
// tail's mask, a weight / bias row as NV head vectors and a masked tail (nullptr: zeros).
template <int NV> struct MidRows {
  static constexpr int H = 16 * NV;  // head values a row
  int t;                             // tail values a row (0-15)
  __mmask16 tm;
  __m512i rows;
  MidRows(int64_t n) : t(int(n - H)), tm(__mmask16((1u << (n - H)) - 1)),
      rows(_mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                              _mm512_set1_epi32(int(n)))) {}
  void load(const float* p, __m512* v) const {  // NV head vectors and the masked tail
    for (int k = 0; k < NV; ++k) v[k] = p != nullptr ? _mm512_loadu_ps(p + 16 * k) : _mm512_setzero_ps();
    v[NV] = p != nullptr ? _mm512_maskz_loadu_ps(tm, p + H) : _mm512_setzero_ps();
  }
  __m512 col(const float* p, int c) const { return _mm512_i32gather_ps(rows, p + H + c, 4); }  // lane r: row r's tail value c
};

// nb blocks of 16 rows of n values (16 NV <= n < 16 (NV + 1)). w / b: the block's weight / bias
// row (nullptr: none). The arithmetic of fwd_row / fwd_finish.
template <int NV>
void fwd_mid(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t n,
             int64_t nb, float eps, bool center) {
  const MidRows<NV> m(n);
  constexpr int H = MidRows<NV>::H;
  const __m512 zero = _mm512_setzero_ps(), vn = _mm512_set1_ps(float(n)), veps = _mm512_set1_ps(eps);
  __m512 wv[NV + 1], bv[NV + 1];
  m.load(w, wv);
  m.load(b, bv);
  for (int64_t blk = 0; blk < nb; ++blk, x += 16 * n, y += 16 * n) {
    __m512 a[16], v[NV];
    __m512 shift = zero, md = zero;
    if (center) {
      shift = _mm512_i32gather_ps(m.rows, x, 4);  // lane r: row r's value 0
      for (int r = 0; r < 16; ++r) {
        const __m512 sr = _mm512_set1_ps(x[r * n]);
        for (int k = 0; k < NV; ++k) v[k] = _mm512_sub_ps(_mm512_loadu_ps(x + r * n + 16 * k), sr);
        a[r] = chains<NV>(v);
      }
      __m512 s = hsum16(a);
      for (int c = 0; c < m.t; ++c) s = _mm512_add_ps(s, _mm512_sub_ps(m.col(x, c), shift));
      md = _mm512_div_ps(s, vn);
    }
    for (int r = 0; r < 16; ++r) {
      const __m512 sr = lane_bcast(shift, r), mr = lane_bcast(md, r);
      for (int k = 0; k < NV; ++k) {
        const __m512 e = _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + r * n + 16 * k), sr), mr);
        v[k] = _mm512_mul_ps(e, e);
      }
      a[r] = chains<NV>(v);
    }
    __m512 q = hsum16(a);
    for (int c = 0; c < m.t; ++c) {
      const __m512 e = _mm512_sub_ps(_mm512_sub_ps(m.col(x, c), shift), md);
      q = _mm512_add_ps(q, _mm512_mul_ps(e, e));
    }
    const __m512 rs = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(_mm512_add_ps(_mm512_div_ps(q, vn), veps)));
    if (mean != nullptr) { _mm512_storeu_ps(mean, _mm512_add_ps(shift, md)); mean += 16; }
    if (rstd != nullptr) { _mm512_storeu_ps(rstd, rs); rstd += 16; }
    for (int r = 0; r < 16; ++r) {
      const __m512 sr = lane_bcast(shift, r), mr = lane_bcast(md, r), rr = lane_bcast(rs, r);
      for (int k = 0; k <= NV; ++k) {
        const float* xp = x + r * n + 16 * k;
        const __m512 xv = k < NV ? _mm512_loadu_ps(xp) : _mm512_maskz_loadu_ps(m.tm, xp);
        __m512 h = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(xv, sr), mr), rr);
        if (w != nullptr) h = _mm512_mul_ps(h, wv[k]);
        if (b != nullptr) h = _mm512_add_ps(h, bv[k]);
        else if (center) h = _mm512_add_ps(h, zero);
        if (k < NV) _mm512_storeu_ps(y + r * n + 16 * k, h);
        else _mm512_mask_storeu_ps(y + r * n + H, m.tm, h);
      }
    }
  }
}

// nb blocks of 16 rows of the backward (float32 storage): the arithmetic of bwd_rows; pw / pb the
// chunk's column sums (nullptr: not needed), added to row after row.
template <int NV>
void bwd_mid(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
             const float* dh, float* dx, float* pw, float* pb, int64_t n, int64_t nb, bool center) {
  const MidRows<NV> mr_(n);
  constexpr int H = MidRows<NV>::H;
  const int t = mr_.t;
  const __mmask16 tm = mr_.tm;
  const __m512 zero = _mm512_setzero_ps(), vn = _mm512_set1_ps(float(n));
  __m512 wv[NV + 1], aw[NV + 1], ab[NV + 1];
  mr_.load(w, wv);
  mr_.load(pw, aw);
  mr_.load(pb, ab);
  for (int64_t blk = 0; blk < nb; ++blk, x += 16 * n, dy += 16 * n, dx += 16 * n, rstd += 16) {
    const __m512 m = center ? _mm512_loadu_ps(mean) : zero, rv = _mm512_loadu_ps(rstd);
    if (center) mean += 16;
    __m512 a1[16], a2[16];
    for (int r = 0; r < 16; ++r) {
      const __m512 mb = lane_bcast(m, r), rb = lane_bcast(rv, r);
      __m512 g[NV], gx[NV];
      for (int k = 0; k < NV; ++k) {
        const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + r * n + 16 * k), mb), rb);
        g[k] = _mm512_loadu_ps(dy + r * n + 16 * k);
        if (w != nullptr) g[k] = _mm512_mul_ps(g[k], wv[k]);
        gx[k] = _mm512_mul_ps(g[k], xh);
      }
      a1[r] = chains<NV>(g);
      a2[r] = chains<NV>(gx);
    }
    __m512 sg = hsum16(a1), sgx = hsum16(a2);
    for (int c = 0; c < t; ++c) {
      const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(mr_.col(x, c), m), rv);
      __m512 g = mr_.col(dy, c);
      if (w != nullptr) g = _mm512_mul_ps(g, _mm512_set1_ps(w[H + c]));
      sg = _mm512_add_ps(sg, g);
      sgx = _mm512_add_ps(sgx, _mm512_mul_ps(g, xh));
    }
    const __m512 mg = center ? _mm512_div_ps(sg, vn) : zero, mgx = _mm512_div_ps(sgx, vn);
    for (int r = 0; r < 16; ++r) {
      const __m512 mb = lane_bcast(m, r), rr = lane_bcast(rv, r), gr = lane_bcast(mg, r), gxr = lane_bcast(mgx, r);
      for (int k = 0; k <= NV; ++k) {
        const int64_t o = r * n + 16 * k;
        const bool head = k < NV;
        const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(head ? _mm512_loadu_ps(x + o) : _mm512_maskz_loadu_ps(tm, x + o), mb), rr);
        const __m512 dyv = head ? _mm512_loadu_ps(dy + o) : _mm512_maskz_loadu_ps(tm, dy + o);
        const __m512 g = w != nullptr ? _mm512_mul_ps(dyv, wv[k]) : dyv;
        __m512 d = _mm512_mul_ps(rr, _mm512_sub_ps(_mm512_sub_ps(g, gr), _mm512_mul_ps(xh, gxr)));
        if (dh != nullptr) d = _mm512_add_ps(d, head ? _mm512_loadu_ps(dh + o) : _mm512_maskz_loadu_ps(tm, dh + o));
        if (head) _mm512_storeu_ps(dx + o, d);
        else _mm512_mask_storeu_ps(dx + o, tm, d);
        if (pw != nullptr) {
          aw[k] = _mm512_add_ps(aw[k], _mm512_mul_ps(dyv, xh));
          if (pb != nullptr) ab[k] = _mm512_add_ps(ab[k], dyv);
        }
      }
    }
    if (dh != nullptr) dh += 16 * n;
  }
  for (int k = 0; k <= NV; ++k) {
    if (pw != nullptr) { if (k < NV) _mm512_storeu_ps(pw + 16 * k, aw[k]); else _mm512_mask_storeu_ps(pw + H, tm, aw[k]); }
    if (pb != nullptr) { if (k < NV) _mm512_storeu_ps(pb + 16 * k, ab[k]); else _mm512_mask_storeu_ps(pb + H, tm, ab[k]); }
  }
}

// By the number of whole vectors a row holds (16 <= n < kMidMax).
constexpr int64_t kMidMax = 256, kMidMaxBwd = 128;
template <int NV = 1>
inline void fwd_mid_n(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t n,
                      int64_t nb, float eps, bool center) {
  if constexpr (NV < kMidMax / 16 - 1) {
    if (n >= 16 * (NV + 1)) return fwd_mid_n<NV + 1>(x, w, b, y, mean, rstd, n, nb, eps, center);
  }
  fwd_mid<NV>(x, w, b, y, mean, rstd, n, nb, eps, center);
}
template <int NV = 1>
inline void bwd_mid_n(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                      const float* dh, float* dx, float* pw, float* pb, int64_t n, int64_t nb, bool center) {
  if constexpr (NV < kMidMaxBwd / 16 - 1) {
    if (n >= 16 * (NV + 1)) return bwd_mid_n<NV + 1>(dy, x, w, mean, rstd, dh, dx, pw, pb, n, nb, center);
  }
  bwd_mid<NV>(dy, x, w, mean, rstd, dh, dx, pw, pb, n, nb, center);
}
#endif

// The whole blocks of 16 rows from row i on (below hi) that share one weight row and one bias row.
inline int64_t short_blocks(int64_t i, int64_t hi, int64_t n_w, int64_t rpw, int64_t n_b, int64_t rpb) {
  int64_t end = hi;
  if (n_w > 1) end = std::min(end, (i / rpw + 1) * rpw);
  if (n_b > 1) end = std::min(end, (i / rpb + 1) * rpb);
  return (end - i) / 16;
}

// ---------------------------------------------------------------------------------------------
// Forward: rows [lo, hi) of norm_fwd.
//
//   x     (n_rows, n_cols)  S        res, h: the same (fused add: h = x + res, then normalise h)
//   w, b  (n_w, n_cols)     W        row i uses weight row i / (n_rows / n_w); absent: 1 / 0
//   y     (n_rows, n_cols)  S
//   mean, rstd (n_rows,)    acc_t<S> (nullptr: not kept -- inference)
//
// Statistics by the shifted two passes (numerics/moments.h):
//   d = x - x[0];  mean = x[0] + mean(d);  xc = d - mean(d);  var = mean(xc^2)  (biased)
//   y = (xc * rstd) * w + b,  rstd = 1 / sqrt(var + eps)
//   (no bias: + 0 all the same, as torch adds its bias of 0: a zero comes out +0, never -0)
// RMSNorm: shift = mean(d) = 0, var = mean(x^2), y = (x * rstd) * w.
// ---------------------------------------------------------------------------------------------
// Half-precision rows longer than this many values are widened once into a float32 scratch
// row, d = x - shift, and the other passes read that: each pass would otherwise convert the row
// again. The widening pass also sums d (the first statistics pass). The same values (the
// conversion is exact; d - 0 is d), the same order of additions, the same lanes (vlanes<bf16>
// == vlanes<float>): the same bits as the passes over the half row.
constexpr int64_t kWidenCols = 512;

// The output pass of a row, its statistics known: y = x_hat * w + b, x_hat = ((x - shift) - md) * rs.
// xr: n values of P (S, or the float32 scratch row d of a half row), shift: what the pass
// subtracts from xr (the row's shift, or 0 for the scratch row, which holds d already).
// Stream: y written around the caches (numerics/stream.h) in whole cache lines (whole_lines), the
// values before and after them stored plainly; ends as partial vectors (vstore_n: the same
// arithmetic lane by lane, the same bits).
template <class S, class P, class W, bool Stream>
inline void fwd_out(const P* xr, const W* wr, const W* br, S* yr, int64_t n, bool center, bool cast, acc_t<S> shift,
                    acc_t<S> md, acc_t<S> rs) {
  using A = acc_t<S>;
  static_assert(vlanes<P> == vlanes<S>, "the scratch row must keep the lanes");
  constexpr int64_t L = vlanes<S>;
  const vec<A> vs = vset1<A>(shift), vm = vset1<A>(md), vr = vset1<A>(rs);
  auto part = [&](int64_t j, int64_t m) {  // m < L values: one masked vector, the same arithmetic
    vec<A> v = ((vload_n(xr + j, m) - vs) - vm) * vr;
    if (cast) v = vround<S>(v);
    if (wr != nullptr) v = v * vload_n(wr + j, m);
    if (br != nullptr) v = v + vload_n(br + j, m);
    else if (center) v = v + vzero<A>();
    vstore_n(yr + j, v, m);
  };
  auto full = [&](int64_t j) {  // y = x_hat * w + b, x_hat = ((x - shift) - mean(d)) * rstd
    vec<A> v = ((vload(xr + j) - vs) - vm) * vr;
    if (cast) v = vround<S>(v);
    if (wr != nullptr) v = v * vload(wr + j);
    if (br != nullptr) v = v + vload(br + j);
    else if (center) v = v + vzero<A>();
    return v;
  };
  int64_t j = 0;
  if constexpr (Stream) {  // streamed: whole cache lines only, plain stores before and after them
    const auto [k, e] = whole_lines(yr, n);
    for (; j < k; j += L) part(j, std::min(L, k - j));
    for (j = k; j < e; j += L) vstream(yr + j, full(j));
  }
  for (; j + L <= n; j += L) vstore(yr + j, full(j));
  if (j < n) part(j, n - j);
}

// A row's shift and the mean of its differences, md (RMSNorm: 0 and 0).
template <class S> inline void row_shift_md(const S* xr, int64_t n, bool center, acc_t<S>& shift, acc_t<S>& md) {
  shift = center ? to_acc(xr[0]) : acc_t<S>(0);
  md = center ? over_n(shifted_sum(xr, n, shift), n) : acc_t<S>(0);  // mean of the differences
}

// The variance pass and rstd (RMSNorm: the mean square).
template <class S, class P> inline acc_t<S> row_rstd(const P* xr, int64_t n, acc_t<S> shift, acc_t<S> md, acc_t<S> eps) {
  using A = acc_t<S>;
  const A var = over_n(shifted_sqdev(xr, n, shift, md), n);
  return A(1) / std::sqrt(var + eps);
}

// The rest of a row once mean(d) is known: the variance pass, rstd, the output pass (fwd_out's
// xr and shift); mean_at: the row's mean, shift + mean(d).
template <class S, class P, class W, bool Stream>
inline void fwd_finish(const P* xr, const W* wr, const W* br, S* yr, int64_t n, acc_t<S> eps, bool center, bool cast,
                       acc_t<S> shift, acc_t<S> md, acc_t<S> mean_at, acc_t<S>* mean, acc_t<S>* rstd) {
  const acc_t<S> rs = row_rstd<S>(xr, n, shift, md, eps);
  if (mean != nullptr) *mean = mean_at;
  if (rstd != nullptr) *rstd = rs;
  fwd_out<S, P, W, Stream>(xr, wr, br, yr, n, center, cast, shift, md, rs);
}

// One row of S, read by every pass.
template <class S, class W, bool Stream>
inline void fwd_row(const S* xr, const W* wr, const W* br, S* yr, int64_t n, acc_t<S> eps, bool center, bool cast,
                    acc_t<S>* mean, acc_t<S>* rstd) {
  acc_t<S> shift, md;
  row_shift_md(xr, n, center, shift, md);
  fwd_finish<S, S, W, Stream>(xr, wr, br, yr, n, eps, center, cast, shift, md, shift + md, mean, rstd);
}

// Rows of at most kBlockCols values, kBlockRows at a time, pass by pass: the sums of the block's
// rows, then their variance passes, then their outputs. A row's passes wait on each other (a sum
// is a chain of adds, a tree, a division); the block's rows do not, so the CPU overlaps them (row
// by row, channels-last LayerNorm2d(64) on 126736 rows float32, AVX2: 160 cycles a row). fwd_row's
// steps a row, in another order: the same bits.
constexpr int64_t kBlockRows = 4, kBlockCols = 256;
template <class S, class W, bool Stream>
inline void fwd_block(const S* const* xr, const W* const* wr, const W* const* br, S* const* yr, int64_t n,
                      acc_t<S> eps, bool center, bool cast, acc_t<S>* mean, acc_t<S>* rstd) {
  using A = acc_t<S>;
  A shift[kBlockRows], md[kBlockRows], rs[kBlockRows];
  for (int k = 0; k < kBlockRows; ++k) row_shift_md(xr[k], n, center, shift[k], md[k]);
  for (int k = 0; k < kBlockRows; ++k) rs[k] = row_rstd<S>(xr[k], n, shift[k], md[k], eps);
  for (int k = 0; k < kBlockRows; ++k) {
    if (mean != nullptr) mean[k] = shift[k] + md[k];
    if (rstd != nullptr) rstd[k] = rs[k];
    fwd_out<S, S, W, Stream>(xr[k], wr[k], br[k], yr[k], n, center, cast, shift[k], md[k], rs[k]);
  }
}

// One half row of more than kWidenCols values through the scratch row d.
template <class S, class W, bool Stream>
inline void fwd_row_widened(const S* xr, float* d, const W* wr, const W* br, S* yr, int64_t n, float eps, bool center,
                            bool cast, float* mean, float* rstd) {
  const float shift = center ? to_acc(xr[0]) : 0.0f;
  const float sum_d = shifted_sum_into(xr, d, n, shift);  // d = x - shift, widened
  const float md = center ? over_n(sum_d, n) : 0.0f;
  fwd_finish<S, float, W, Stream>(d, wr, br, yr, n, eps, center, cast, 0.0f, md, shift + md, mean, rstd);
}

// Rows of a large tensor are asked for ahead of use: the hardware prefetcher does not run far
// enough ahead of the passes over short rows (one thread, 262144 x 64 bfloat16: the forward
// took 1.7x as long, the backward 1.6x, without). A hint only: no result changes.
constexpr int64_t kFarBytes = 1 << 20;     // tensors from this size stream from memory
constexpr int64_t kAheadBytes = 2048;      // how far ahead, at least
constexpr int64_t kAheadMaxRow = 2048;     // longer rows: the hardware prefetcher keeps up
// How many rows ahead to ask for rows of row_bytes (0: none).
inline int64_t rows_ahead(int64_t n_rows, int64_t row_bytes) {
  if (row_bytes > kAheadMaxRow || n_rows * row_bytes < kFarBytes) return 0;
  return (kAheadBytes + row_bytes - 1) / row_bytes;
}

template <class S, class W, bool Stream> void fwd_rows(const FwdArgs& a, int64_t lo, int64_t hi) {
  using A = acc_t<S>;
  const int64_t n = a.n_cols;
  const S* X = static_cast<const S*>(a.x);
  const S* R = static_cast<const S*>(a.res);
  S* H = static_cast<S*>(a.h);
  S* Y = static_cast<S*>(a.y);
  const W* Wt = static_cast<const W*>(a.w);
  const W* Bs = static_cast<const W*>(a.b);
  A* M = static_cast<A*>(a.mean);
  A* RS = static_cast<A*>(a.rstd);
  const int64_t rpw = a.n_rows / (a.n_w > 0 ? a.n_w : 1);  // rows per weight row
  const int64_t rpb = a.n_rows / (a.n_b > 0 ? a.n_b : 1);
  auto w_row = [&](int64_t r) { return Wt == nullptr ? nullptr : Wt + (a.n_w > 1 ? r / rpw : 0) * n; };  // row r's
  auto b_row = [&](int64_t r) { return Bs == nullptr ? nullptr : Bs + (a.n_b > 1 ? r / rpb : 0) * n; };
  const A eps = A(a.eps);
  const bool center = a.center, cast = a.cast_x_hat;
  std::unique_ptr<float[]> scratch;  // half rows longer than kWidenCols, widened
  if constexpr (sizeof(S) == 2) {
    if (n > kWidenCols) scratch.reset(new float[n]);
  }
  const int64_t row_bytes = n * int64_t(sizeof(S)), ahead = rows_ahead(a.n_rows, row_bytes);
#ifdef NORMLAB_LN_SHORT_ROWS
  float tiles[2][kShort * (kShort - 1)];  // the weight and bias rows tiled for short rows
  int64_t tiled_w = -1, tiled_b = -1;
#endif
  for (int64_t i = lo; i < hi; ++i) {
#ifdef NORMLAB_LN_SHORT_ROWS
    if constexpr (sizeof(A) == 4) {
      const int64_t nb = n < kShort && i + kShort <= hi ? short_blocks(i, hi, a.n_w, rpw, a.n_b, rpb) : 0;
      if (nb > 0) {
        const int64_t gw = a.n_w > 1 ? i / rpw : 0, gb = a.n_b > 1 ? i / rpb : 0;
        if (Wt != nullptr && tiled_w != gw) { short_tile(Wt + gw * n, n, tiles[0]); tiled_w = gw; }
        if (Bs != nullptr && tiled_b != gb) { short_tile(Bs + gb * n, n, tiles[1]); tiled_b = gb; }
        fwd_short_n<S>(n, X + i * n, R == nullptr ? nullptr : R + i * n, R == nullptr ? nullptr : H + i * n,
                       Wt == nullptr ? nullptr : tiles[0], Bs == nullptr ? nullptr : tiles[1], Y + i * n,
                       M == nullptr ? nullptr : M + i, RS == nullptr ? nullptr : RS + i, nb, eps, center, cast, ahead,
                       X + hi * n);
        i += nb * kShort - 1;
        continue;
      }
    }
#endif
#ifdef NORMLAB_LN_SHORT_ROWS
    if constexpr (std::is_same_v<S, float> && std::is_same_v<W, float>) {
      const int64_t nb = n >= 16 && n < kMidMax && R == nullptr && i + kShort <= hi
                             ? short_blocks(i, hi, a.n_w, rpw, a.n_b, rpb) : 0;
      if (nb > 0) {
        fwd_mid_n(X + i * n, w_row(i), b_row(i), Y + i * n,
                M == nullptr ? nullptr : M + i, RS == nullptr ? nullptr : RS + i, n, nb, eps, center);
        i += nb * kShort - 1;
        continue;
      }
    }
#endif
    if (R == nullptr && n <= kBlockCols && i + kBlockRows <= hi) {
      const S* xb[kBlockRows];
      const W* wb[kBlockRows];
      const W* bb[kBlockRows];
      S* yb[kBlockRows];
      for (int k = 0; k < kBlockRows; ++k) {
        const int64_t r = i + k;
        xb[k] = X + r * n;
        yb[k] = Y + r * n;
        wb[k] = w_row(r);
        bb[k] = b_row(r);
        if (ahead > 0 && r + ahead < hi) prefetch_read(xb[k] + ahead * n, row_bytes);
      }
      fwd_block<S, W, Stream>(xb, wb, bb, yb, n, eps, center, cast, M == nullptr ? nullptr : M + i,
                              RS == nullptr ? nullptr : RS + i);
      i += kBlockRows - 1;
      continue;
    }
    const S* xr = X + i * n;
    if (ahead > 0 && i + ahead < hi) {
      prefetch_read(xr + ahead * n, row_bytes);
      if (R != nullptr) prefetch_read(R + (i + ahead) * n, row_bytes);
    }
    if (R != nullptr) {  // the fused add: h's row, then normalise it (from L1)
      add_row(xr, R + i * n, H + i * n, n);
      xr = H + i * n;
    }
    const W* wr = w_row(i);
    const W* br = b_row(i);
    A* mi = M == nullptr ? nullptr : M + i;
    A* ri = RS == nullptr ? nullptr : RS + i;
    if constexpr (sizeof(S) == 2) {
      if (scratch) {
        fwd_row_widened<S, W, Stream>(xr, scratch.get(), wr, br, Y + i * n, n, eps, center, cast, mi, ri);
        continue;
      }
    }
    fwd_row<S, W, Stream>(xr, wr, br, Y + i * n, n, eps, center, cast, mi, ri);
  }
  if constexpr (Stream) fence_streams();
}

// A half-precision weight or bias in float32, for calls of many rows: each row would
// otherwise convert it again (the same values: the conversion is exact).
template <class W> void widen_into(const void* p, int64_t n, float* out) {
  const W* q = static_cast<const W*>(p);
  constexpr int64_t L = vlanes<W>;
  int64_t j = 0;
  for (; j + L <= n; j += L) vstore(out + j, vload(q + j));
  for (; j < n; ++j) out[j] = to_float(q[j]);
}
template <class W> std::vector<float> widened(const void* p, int64_t n) {
  std::vector<float> out(p == nullptr ? 0 : n);
  widen_into<W>(p, int64_t(out.size()), out.data());
  return out;
}
constexpr int64_t kWidenRows = 8;  // rows from which the widened weight pays (backward)
// Forward: a task widens from this many rows on. The row loop converts a half weight nearly for
// free (a conversion per vector beside the load), while the widened copy is written and read back:
// it pays only once the rows are many.
constexpr int64_t kWidenTaskRows = 64;

// Rows a task, at least: a task of fewer than kTaskValues values costs less than the pool's
// fork and join (about 1-2 us, the time of some 8K values here), so it is not split off.
constexpr int64_t kTaskValues = 8192;
template <class F> void over_rows(int64_t n_rows, int64_t n_cols, const F& f) {
  const int64_t grain = std::max<int64_t>(1, (kTaskValues + n_cols - 1) / std::max<int64_t>(n_cols, 1));
  if (n_rows <= grain) return f(int64_t(0), n_rows);
  at::parallel_for(0, n_rows, grain, f);
}

// A task of at least kWidenTaskRows rows with a half-precision weight / bias widens them first, in
// its own thread (a copy made by the calling thread would reach the others through their caches:
// slower than converting), into scratch of the weight's size aligned to a cache line.
template <class S, class W, bool Stream> void fwd_task(const FwdArgs& a, int64_t lo, int64_t hi) {
  if constexpr (sizeof(W) == 2) {
    if (hi - lo >= kWidenTaskRows && (a.w != nullptr || a.b != nullptr)) {
      const int64_t nw = a.w == nullptr ? 0 : a.n_w * a.n_cols, nb = a.b == nullptr ? 0 : a.n_b * a.n_cols;
      std::unique_ptr<float[]> buf(new float[nw + nb + 16]);
      float* w = buf.get() + (16 - int64_t(reinterpret_cast<uintptr_t>(buf.get()) % 64) / 4) % 16;
      widen_into<W>(a.w, nw, w);
      widen_into<W>(a.b, nb, w + nw);
      FwdArgs f = a;
      f.w = a.w == nullptr ? nullptr : w;
      f.b = a.b == nullptr ? nullptr : w + nw;
      return fwd_rows<S, float, Stream>(f, lo, hi);
    }
  }
  fwd_rows<S, W, Stream>(a, lo, hi);
}

// The output y streams past the caches (numerics/stream.h) for rows of at least kStreamRowBytes
// when x and y (and res and h) take more than half the last level (float32 / float64, and half
// rows of at least 4 KiB), or more than the whole last level (shorter half-precision rows). Short
// rows share cache lines: a line gets the streaming stores of one row and the plain stores of the
// next row's unaligned ends, and is written to memory in pieces (channels-last LayerNorm2d(25), 34x25x95x95 bfloat16, one thread: 44 ms streamed,
// 13.5 ms not; float32 rows of 43: 16 vs 11 ms). Half rows are bound more by the conversions than
// by the stores' reads-for-ownership: below the size of the last level, where a repeated call
// finds its output's lines in cache, 200-3000 bfloat16 values a row ran 5-25 % slower streamed;
// from 16384 x 1024 bfloat16 on (32 MB read, 32 MB written; the last level 32 MB) streaming was
// 3-8 % faster (one thread, fastest of 25). From 2000-4000 float32 bytes a row, streaming saves a
// quarter to a third.
// Half rows of at least 4 KiB stream from half the last level on, as float32 does: 1840 x 3456
// float16 (25 MB in + out) forward 0.83x -> 1.1-1.3x torch, 3000 x 2048 0.82-0.88x -> 0.96-1.46x,
// 1073 x 5376 bfloat16 1.1x -> 1.4x; rows of 768-1024 values at the same sizes ran slower streamed
// (10000 x 768 bfloat16 1.58x -> 1.0-1.4x), so they keep the whole-cache rule. Half rows under 4 KiB
// that are not whole cache lines do not stream at all: each row's end lines are then stored plainly
// beside streamed ones, and that ran 1.25-1.6x the time of plain stores (one thread, forward:
// 12000 x 1100 float16 6.0 -> 4.3 ms, 20000 x 900 bfloat16 7.1 -> 5.7, 30000 x 600 7.1 -> 5.5; at
// 1500 and 1781 values the same time either way; whole-line rows of 1024 bfloat16 keep streaming,
// 6.3 -> 5.7 ms). The same held for GroupNorm's half-precision runs (group_norm_kernels.cpp).
constexpr int64_t kStreamRowBytes = 1024, kStreamHalfRowBytes = 4096;
template <class S, class W> void fwd(const FwdArgs& a) {
  const int64_t bytes = a.n_rows * a.n_cols * int64_t(sizeof(S)) * (a.res != nullptr ? 4 : 2);
  const int64_t row_bytes = a.n_cols * int64_t(sizeof(S));
  const bool half_rule = sizeof(S) == 2 && row_bytes < kStreamHalfRowBytes;  // short half rows: the whole last level
  const bool half_off_lines = half_rule && row_bytes % kCacheLineBytes != 0;  // (plain: see above)
  if (!half_off_lines && row_bytes >= kStreamRowBytes && streams_output(half_rule ? bytes / 2 : bytes))
    over_rows(a.n_rows, a.n_cols, [&](int64_t lo, int64_t hi) { fwd_task<S, W, true>(a, lo, hi); });
  else
    over_rows(a.n_rows, a.n_cols, [&](int64_t lo, int64_t hi) { fwd_task<S, W, false>(a, lo, hi); });
}

// ---------------------------------------------------------------------------------------------
// Backward: rows [lo, hi) of norm_bwd; pw / pb (n_cols,) gather this chunk's dw / db (nullptr:
// not needed; pb is nullptr for RMSNorm, which has no bias).
//
//   dy, x, dh, dx (n_rows, n_cols) S;  w (n_w, n_cols) W;  mean, rstd (n_rows,) acc_t<S>
//
// With g = dy * w and x_hat = (x - mean) * rstd:
//   dx = rstd * ( g                          term 1: through x directly
//                 - mean(g)                  term 2: through the mean (LayerNorm only)
//                 - x_hat * mean(g * x_hat)) term 3: through the variance
//        (+ dh for the fused add: h's own gradient)
//   dw = sum over rows of dy * x_hat  (cast_x_hat: dy * round(x_hat), what the weight saw;
//                                      the rounding counts as the identity in dx)
//   db = sum over rows of dy
// ---------------------------------------------------------------------------------------------
template <class S, class W> void bwd_rows(const BwdArgs& a, int64_t lo, int64_t hi, acc_t<S>* pw, acc_t<S>* pb) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t n = a.n_cols;
  const S* DY = static_cast<const S*>(a.dy);
  const S* X = static_cast<const S*>(a.x);
  const S* DH = static_cast<const S*>(a.dh);
  S* DX = static_cast<S*>(a.dx);
  const W* Wt = static_cast<const W*>(a.w);
  const A* M = static_cast<const A*>(a.mean);
  const A* RS = static_cast<const A*>(a.rstd);
  const int64_t rpw = a.n_rows / (a.n_w > 0 ? a.n_w : 1);
  const bool center = a.center, cast = a.cast_x_hat;
  // half precision only: float32 rows came out 5-15 % slower with the hints (their sums' pass
  // waits on memory less than on the conversions a half row needs)
  const int64_t row_bytes = n * int64_t(sizeof(S));
  const int64_t ahead = sizeof(S) == 2 ? rows_ahead(a.n_rows, row_bytes) : 0;
#ifdef NORMLAB_LN_SHORT_ROWS
  float wtile[kShort * (kShort - 1)];  // the weight row tiled for short rows
  int64_t tiled_w = -1;
#endif
  for (int64_t i = lo; i < hi; ++i) {
#ifdef NORMLAB_LN_SHORT_ROWS
    if constexpr (sizeof(A) == 4) {
      const int64_t nb = n < kShort && i + kShort <= hi ? short_blocks(i, hi, a.n_w, rpw, 1, 1) : 0;
      if (nb > 0) {
        const int64_t gw = a.n_w > 1 ? i / rpw : 0;
        if (Wt != nullptr && tiled_w != gw) { short_tile(Wt + gw * n, n, wtile); tiled_w = gw; }
        bwd_short_n<S>(n, DY + i * n, X + i * n, Wt == nullptr ? nullptr : wtile, center ? M + i : nullptr, RS + i,
                       DH == nullptr ? nullptr : DH + i * n, DX + i * n, pw, pb, nb, center, cast, ahead, X + hi * n);
        i += nb * kShort - 1;
        continue;
      }
    }
#endif
#ifdef NORMLAB_LN_SHORT_ROWS
    if constexpr (std::is_same_v<S, float> && std::is_same_v<W, float>) {
      const int64_t nb = n >= 16 && n < kMidMaxBwd && i + kShort <= hi ? short_blocks(i, hi, a.n_w, rpw, 1, 1) : 0;
      if (nb > 0) {
        bwd_mid_n(DY + i * n, X + i * n, Wt == nullptr ? nullptr : Wt + (a.n_w > 1 ? i / rpw : 0) * n,
                center ? M + i : nullptr, RS + i, DH == nullptr ? nullptr : DH + i * n, DX + i * n, pw, pb, n, nb,
                center);
        i += nb * kShort - 1;
        continue;
      }
    }
#endif
    const S* xr = X + i * n;
    const S* dyr = DY + i * n;
    if (ahead > 0 && i + ahead < hi) {
      prefetch_read(xr + ahead * n, row_bytes);
      prefetch_read(dyr + ahead * n, row_bytes);
      if (DH != nullptr) prefetch_read(DH + (i + ahead) * n, row_bytes);
    }
    const S* dhr = DH == nullptr ? nullptr : DH + i * n;
    S* dxr = DX + i * n;
    const W* wr = Wt == nullptr ? nullptr : Wt + (a.n_w > 1 ? i / rpw : 0) * n;
    const A m = center ? M[i] : A(0);
    const A rs = RS[i];
    const vec<A> vm = vset1<A>(m), vr = vset1<A>(rs);
    // sum(g) and sum(g * x_hat): two chains each, lanes added by hsum, then the tail
    vec<A> s1a = vzero<A>(), s1b = vzero<A>(), s2a = vzero<A>(), s2b = vzero<A>();
    int64_t j = 0;
    for (; j + 2 * L <= n; j += 2 * L) {
      vec<A> xa = (vload(xr + j) - vm) * vr, xb = (vload(xr + j + L) - vm) * vr;
      vec<A> ga = vload(dyr + j), gb = vload(dyr + j + L);
      if (wr != nullptr) { ga = ga * vload(wr + j); gb = gb * vload(wr + j + L); }
      s1a += ga; s1b += gb;
      s2a += ga * xa; s2b += gb * xb;
    }
    if (j + L <= n) {
      vec<A> xa = (vload(xr + j) - vm) * vr, ga = vload(dyr + j);
      if (wr != nullptr) ga = ga * vload(wr + j);
      s1a += ga; s2a += ga * xa;
      j += L;
    }
    A sum_g = hsum<A>(s1a + s1b), sum_gx = hsum<A>(s2a + s2b);
    for (; j < n; ++j) {
      A xh = (to_acc(xr[j]) - m) * rs, g = to_acc(dyr[j]);
      if (wr != nullptr) g = g * to_acc(wr[j]);
      sum_g += g;
      sum_gx += g * xh;
    }
    const A mean_g = center ? over_n(sum_g, n) : A(0);  // term 2
    const A mean_gx = over_n(sum_gx, n);                // term 3's factor
    const vec<A> vg = vset1<A>(mean_g), vgx = vset1<A>(mean_gx);
    j = 0;
    for (; j + L <= n; j += L) {
      vec<A> xh = (vload(xr + j) - vm) * vr, dyv = vload(dyr + j), g = dyv;
      if (wr != nullptr) g = g * vload(wr + j);
      vec<A> d = vr * ((g - vg) - xh * vgx);
      if (dhr != nullptr) d = d + vload(dhr + j);
      vstore(dxr + j, d);
      if (pw != nullptr) {
        vec<A> seen = cast ? vround<S>(xh) : xh;
        vstore(pw + j, vload(pw + j) + dyv * seen);
        if (pb != nullptr) vstore(pb + j, vload(pb + j) + dyv);
      }
    }
    for (; j < n; ++j) {
      A xh = (to_acc(xr[j]) - m) * rs, dyv = to_acc(dyr[j]), g = dyv;
      if (wr != nullptr) g = g * to_acc(wr[j]);
      A d = rs * ((g - mean_g) - xh * mean_gx);
      if (dhr != nullptr) d = d + to_acc(dhr[j]);
      dxr[j] = from_acc<S>(d);
      if (pw != nullptr) {
        A seen = cast ? round_as<S>(xh) : xh;
        pw[j] = pw[j] + dyv * seen;
        if (pb != nullptr) pb[j] = pb[j] + dyv;
      }
    }
  }
}

// dw / db over fixed chunks of rows (each weight row's rows cut into chunks of their own),
// the chunks' partials merged in chunk order in float64: the same bits for any thread count.
template <class S, class W> void bwd_t(const BwdArgs& a);

template <class S, class W> void bwd(const BwdArgs& a) {
  if constexpr (sizeof(W) == 2) {
    if (a.n_rows >= kWidenRows && a.w != nullptr) {
      std::vector<float> w = widened<W>(a.w, a.n_w * a.n_cols);
      BwdArgs f = a;
      f.w = w.data();
      return bwd_t<S, float>(f);
    }
  }
  bwd_t<S, W>(a);
}

// Sum k of dw or db: in the accumulation dtype, or rounded on to storage S.
template <class S> void put_sum(void* out, bool storage, int64_t k, acc_t<S> v) {
  if (storage) static_cast<S*>(out)[k] = from_acc<S>(v);
  else static_cast<acc_t<S>*>(out)[k] = v;
}

template <class S, class W> void bwd_t(const BwdArgs& a) {
  using A = acc_t<S>;
  const int64_t n = a.n_cols, n_w = a.n_w > 0 ? a.n_w : 1;
  if (a.dw == nullptr) {
    for_rows(a.n_rows, n, [&](int64_t lo, int64_t hi) { bwd_rows<S, W>(a, lo, hi, nullptr, nullptr); });
    return;
  }
  const int64_t rpw = a.n_rows / n_w;
  const int64_t rows = bwd_rows_per_chunk(rpw, n);
  const int64_t per_w = (rpw + rows - 1) / rows;  // chunks per weight row
  const int64_t n_chunks = n_w * per_w;
  if (n_chunks == 1) {  // one chunk: its partials are the sums
    // summed in place, else in a row of the accumulation dtype first
    const bool direct = !a.dw_storage && (a.db == nullptr || !a.db_storage);
    std::unique_ptr<A[]> sums(direct ? nullptr : new A[2 * n]);
    A* sw = direct ? static_cast<A*>(a.dw) : sums.get();
    A* sb = direct ? static_cast<A*>(a.db) : sums.get() + n;
    const bool with_b = a.center && a.db != nullptr;
    for (int64_t j = 0; j < n; ++j) sw[j] = A(0);
    if (with_b) for (int64_t j = 0; j < n; ++j) sb[j] = A(0);
    bwd_rows<S, W>(a, 0, a.n_rows, sw, with_b ? sb : nullptr);
    if (!direct) {
      for (int64_t j = 0; j < n; ++j) {
        put_sum<S>(a.dw, a.dw_storage, j, sw[j]);
        if (a.db != nullptr) put_sum<S>(a.db, a.db_storage, j, sb[j]);
      }
    }
    return;
  }
  std::unique_ptr<A[]> part(new A[2 * n_chunks * n]);  // per chunk: dw's partial row, then db's
  for_rows(n_chunks, rows * n, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      A* pw = part.get() + 2 * c * n;
      A* pb = pw + n;
      for (int64_t j = 0; j < (a.center ? 2 * n : n); ++j) pw[j] = A(0);
      const int64_t gw = c / per_w;
      const int64_t lo = gw * rpw + (c - gw * per_w) * rows;
      const int64_t hi = std::min(lo + rows, (gw + 1) * rpw);
      bwd_rows<S, W>(a, lo, hi, pw, a.center ? pb : nullptr);
    }
  });
  constexpr int64_t B = 256;  // columns per merge task
  const int64_t n_blk = (n + B - 1) / B;
  for_rows(n_w * n_blk, B * per_w, [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      const int64_t gw = t / n_blk, j0 = (t - gw * n_blk) * B, j1 = std::min(n, j0 + B);
      double sw[B] = {}, sb[B] = {};
      for (int64_t c = gw * per_w; c < (gw + 1) * per_w; ++c) {
        const A* pw = part.get() + 2 * c * n;
        const A* pb = pw + n;
        for (int64_t j = j0; j < j1; ++j) {
          sw[j - j0] += double(pw[j]);
          if (a.center) sb[j - j0] += double(pb[j]);
        }
      }
      for (int64_t j = j0; j < j1; ++j) {
        put_sum<S>(a.dw, a.dw_storage, gw * n + j, A(sw[j - j0]));
        if (a.db != nullptr) put_sum<S>(a.db, a.db_storage, gw * n + j, A(sb[j - j0]));
      }
    }
  });
}

}  // namespace

int64_t bwd_rows_per_chunk(int64_t n_rows, int64_t n_cols) {
  // about 65536 values a chunk, but no more than an eighth of the rows (two to eight threads
  // get even shares of a mid-sized tensor: 3 chunks of 128, 128 and 64 rows gave 2 threads
  // 256 and 64), and at least 16 rows; enlarged up to 256 rows while at least 32 chunks remain
  // (fewer partial rows to write and merge for long tensors)
  const int64_t cols = std::max<int64_t>(n_cols, 1);
  int64_t rows = std::min((65536 + cols - 1) / cols, (n_rows + 7) / 8);
  rows = std::max<int64_t>(1, std::min(std::max<int64_t>(16, rows), n_rows));
  return std::max(rows, std::min<int64_t>(256, n_rows / 32));
}

void norm_fwd(Dtype x, Dtype w, const FwdArgs& a) {
  if (a.n_rows <= 0 || a.n_cols <= 0) return;
  switch (x) {
    case Dtype::f32: return fwd<float, float>(a);
    case Dtype::f64: return fwd<double, double>(a);
    case Dtype::bf16: return w == Dtype::bf16 ? fwd<bf16, bf16>(a) : fwd<bf16, float>(a);
    case Dtype::f16: return w == Dtype::f16 ? fwd<f16, f16>(a) : fwd<f16, float>(a);
  }
}

void norm_bwd(Dtype x, Dtype w, const BwdArgs& a) {
  if (a.n_rows <= 0 || a.n_cols <= 0) return;
  switch (x) {
    case Dtype::f32: return bwd<float, float>(a);
    case Dtype::f64: return bwd<double, double>(a);
    case Dtype::bf16: return w == Dtype::bf16 ? bwd<bf16, bf16>(a) : bwd<bf16, float>(a);
    case Dtype::f16: return w == Dtype::f16 ? bwd<f16, f16>(a) : bwd<f16, float>(a);
  }
}

}  // namespace normlab::ln
