// GroupNorm with S == 1 (e.g. a 2-D (N, C) input) and small groups, 2 <= Cg <= a vector's lanes. Cg a
// power of two: packed, below; any other Cg: blocks of lanes groups read transposed (fwd_s1_odd).
// Packed: each group's Cg values are contiguous, so a vector holds lanes / Cg whole groups; every step
// runs on whole vectors (a block of values vectorised across channels, the groups' sums by pairwise
// halvings, each group's values spread to its channels), here inside registers:
//   group_sum   a butterfly: v += v with lanes swapped at distance 1, 2, ..., Cg / 2: every lane
//               ends with its group's sum, a pairwise tree (additions commute: the lanes of a group
//               hold the same bits);
//   spread      a group's first value (the shift) broadcast to its lanes by one shuffle.
// A task takes whole samples (at::parallel_for via for_rows / for_chunks), a sample as C / lanes
// vectors and a tail of whole groups; the statistics of a group depend on its values alone, and
// dw/db take bwd_nhwc's per-run partials (runs of kRun samples, merged in run order in float64):
// the same bits for any number of threads. Layouts and conventions: group_norm_kernels.h.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/group_norm_kernels.h"
#include "cpu/group_norm_sums.h"
#include "numerics/chunks.h"
#include "numerics/vec.h"

namespace normlab::group_norm {

namespace {

template <class A> struct ivec_of;
template <> struct ivec_of<float> { typedef int32_t type __attribute__((vector_size(NORMLAB_VEC_BYTES))); };
template <> struct ivec_of<double> { typedef int64_t type __attribute__((vector_size(NORMLAB_VEC_BYTES))); };
template <class A> using ivec = typename ivec_of<A>::type;

template <class A, int H> inline ivec<A> xor_mask() {
  ivec<A> m;
  for (int k = 0; k < int(lanes<A>); ++k) m[k] = k ^ H;
  return m;
}
template <class A, int CG> inline ivec<A> first_mask() {
  ivec<A> m;
  for (int k = 0; k < int(lanes<A>); ++k) m[k] = k & ~(CG - 1);
  return m;
}
template <class A, int CG> inline ivec<A> group_mask() {  // lane k -> k / CG (a vector of group values)
  ivec<A> m;
  for (int k = 0; k < int(lanes<A>); ++k) m[k] = k / CG;
  return m;
}

// Every lane: the sum of its group's CG lanes, as the pairwise tree ((v0 + v1) + (v2 + v3)) + ...
template <class A, int CG> inline vec<A> group_sum(vec<A> v) {
  if constexpr (CG >= 2) v = v + __builtin_shuffle(v, xor_mask<A, 1>());
  if constexpr (CG >= 4) v = v + __builtin_shuffle(v, xor_mask<A, 2>());
  if constexpr (CG >= 8) v = v + __builtin_shuffle(v, xor_mask<A, 4>());
  if constexpr (CG >= 16) v = v + __builtin_shuffle(v, xor_mask<A, 8>());
  return v;
}

// sqrt lane by lane (IEEE, as std::sqrt), one instruction where the vector width has one.
template <class A> inline vec<A> vsqrt(vec<A> v) {
#if defined(__AVX512F__) && NORMLAB_VEC_BYTES == 64
  if constexpr (std::is_same_v<A, float>) return (vec<A>)_mm512_sqrt_ps((__m512)v);
  else return (vec<A>)_mm512_sqrt_pd((__m512d)v);
#elif defined(__AVX__) && NORMLAB_VEC_BYTES == 32
  if constexpr (std::is_same_v<A, float>) return (vec<A>)_mm256_sqrt_ps((__m256)v);
  else return (vec<A>)_mm256_sqrt_pd((__m256d)v);
#else
  for (int k = 0; k < int(lanes<A>); ++k) v[k] = std::sqrt(v[k]);
  return v;
#endif
}

template <class A> inline vec<A> vrsqrt_eps(vec<A> v, A eps) {  // 1 / sqrt(v + eps), lane by lane
  return vset1<A>(A(1)) / vsqrt<A>(v + eps);
}

// x, y (N, C); w, b (C,); mean, var, rstd (N*G,) out or null. docs/derivations/group_norm.md, "The
// grouped view" and "Numerics": per group shift = its first value, md = mean(x - shift),
// var = mean(((x - shift) - md)^2), rstd = 1 / sqrt(var + eps), y = ((x - shift) - md) * (rstd * w) + b.
template <class S, int CG>
void fwd_s1(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var, acc_t<S>* rstd,
            int64_t n, int64_t c, double eps) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const A aeps = A(eps);
  const vec<A> inv = vset1<A>(A(1) / A(CG));  // / CG as * (1 / CG): a power of two, the same bits
  for_rows(n, c, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const S* xi = x + i * c;
      S* yi = y + i * c;
      for (int64_t j = 0; j < c; j += L) {
        const int64_t nv = std::min<int64_t>(L, c - j);  // a multiple of CG
        const vec<A> v = nv == L ? vload(xi + j) : vload_n(xi + j, nv);
        const vec<A> sh = __builtin_shuffle(v, first_mask<A, CG>());
        const vec<A> d = v - sh;
        const vec<A> md = group_sum<A, CG>(d) * inv;  // = over_count
        const vec<A> e = d - md;
        const vec<A> va = group_sum<A, CG>(e * e) * inv;
        const vec<A> rs = vrsqrt_eps<A>(va, aeps);
        const vec<A> out = e * (rs * vload(w + j)) + vload(b + j);  // w, b: C + L values (padded)
        if (nv == L) vstore(yi + j, out);
        else vstore_n(yi + j, out, nv);
        if (mean != nullptr) {
          const int64_t g0 = (i * c + j) / CG;
          for (int64_t k = 0; k < nv / CG; ++k) {
            A m = sh[k * CG] + md[k * CG];
            if (m != m) m = torch_mean(m, inf_mask(xi + j + k * CG, 1, 0, CG));
            mean[g0 + k] = m;
            var[g0 + k] = va[k * CG];
            rstd[g0 + k] = rs[k * CG];
          }
        }
      }
    }
  });
}

// Half a float vector (lanes 0 .. H-1 or H .. 2H-1) and back.
template <size_t... I> inline auto half_lo(vec<float> v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, I...);
}
template <size_t... I> inline auto half_hi(vec<float> v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, (I + sizeof...(I))...);
}
template <class H, size_t... I> inline vec<float> join(H lo, H hi, std::index_sequence<I...>) {
  return __builtin_shufflevector(lo, hi, I...);
}

// t2 = rstd * sg / CG and t3 = (sgx * rstd) / CG * rstd^2 in float64, rounded once to A (bwd_nhwc's
// formula; / CG as * (1 / CG): a power of two, the same bits), lane by lane: a float vector as two
// float64 vectors.
template <class A, int CG>
inline void terms23(vec<A> sg, vec<A> sgxr, vec<A> vr, vec<A> vr2, vec<A>& t2, vec<A>& t3) {
  constexpr double inv = 1.0 / CG;
  if constexpr (std::is_same_v<A, double>) {
    t2 = sg * inv * vr;
    t3 = sgxr * inv * vr2;
  } else {
    constexpr size_t H = lanes<float> / 2;
    using idx = std::make_index_sequence<H>;
    auto f = [&](vec<float> a, vec<float> m) {
      const vec<double> lo = __builtin_convertvector(half_lo(a, idx{}), vec<double>) * inv *
                             __builtin_convertvector(half_lo(m, idx{}), vec<double>);
      const vec<double> hi = __builtin_convertvector(half_hi(a, idx{}), vec<double>) * inv *
                             __builtin_convertvector(half_hi(m, idx{}), vec<double>);
      using half_t = decltype(half_lo(a, idx{}));
      return join(__builtin_convertvector(lo, half_t), __builtin_convertvector(hi, half_t),
                  std::make_index_sequence<2 * H>{});
    };
    t2 = f(sg, vr);
    t3 = f(sgxr, vr2);
  }
}

// dy, x, dx (N, C); w (C + L, padded); mean, rstd (N*G,); dw, db (C,) out. docs/derivations/group_norm.md,
// "The input" and "The parameters" (the terms as bwd_nhwc writes them):
//   dx = dy * (rstd * w) - (x - mean) * t3 - t2,  t2 = rstd * mean_grp(dy * w),
//   t3 = rstd^3 * mean_grp(dy * w * (x - mean)) -- t2, t3 in float64 from the group sums, as bwd_nhwc;
//   dw/db partials per run of kRun samples: tw[c] += dy * (x - mean) * rstd, tb[c] += dy, in sample order.
template <class S, int CG>
void bwd_s1(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
            acc_t<S>* pw, acc_t<S>* pb, int64_t n, int64_t c, int64_t spc, int64_t run) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t n_stats = n * (c / CG);
  for_chunks(n, spc, 2 * c, [&](int64_t, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      A* tw = pw + (i / run) * c;
      A* tb = pb + (i / run) * c;
      const S* xi = x + i * c;
      const S* dyi = dy + i * c;
      for (int64_t j = 0; j < c; j += L) {
        const int64_t nv = std::min<int64_t>(L, c - j), g0 = (i * c + j) / CG;
        const bool full = nv == L;
        // the vector's groups' statistics: a whole vector from g0 where the array holds one (lanes past
        // nv / CG unused), else the nv / CG values alone
        const bool whole = g0 + L <= n_stats;
        const vec<A> vm =
            __builtin_shuffle(whole ? vload(mean + g0) : vload_n(mean + g0, nv / CG), group_mask<A, CG>());
        const vec<A> vr =
            __builtin_shuffle(whole ? vload(rstd + g0) : vload_n(rstd + g0, nv / CG), group_mask<A, CG>());
        const vec<A> g = full ? vload(dyi + j) : vload_n(dyi + j, nv);
        // x - mean, with the part of the mean its rounding to A left out (mean(x - m) over the
        // group: a power of two's reciprocal, exact) taken away: at a mean of 1e4 dx and dw were
        // ~1e-4 relative off without it (tests/ops/group_norm/test_group_norm_large_mean.py)
        const vec<A> xm0 = (full ? vload(xi + j) : vload_n(xi + j, nv)) - vm;
        const vec<A> xm = xm0 - group_sum<A, CG>(xm0) * A(1.0 / CG);
        const vec<A> d = g * xm;
        const vec<A> wv = vload(w + j);
        if (full) {
          vstore(tw + j, vload(tw + j) + d * vr);
          vstore(tb + j, vload(tb + j) + g);
        } else {
          vstore_n(tw + j, vload_n(tw + j, nv) + d * vr, nv);
          vstore_n(tb + j, vload_n(tb + j, nv) + g, nv);
        }
        if (dx == nullptr) continue;
        const vec<A> sg = group_sum<A, CG>(wv * g), sgx = group_sum<A, CG>(wv * d);
        vec<A> t2, t3;
        terms23<A, CG>(sg, sgx * vr, vr, vr * vr, t2, t3);
        const vec<A> out = (g * (vr * wv) - xm * t3) - t2;
        if (full) vstore(dx + i * c + j, out);
        else vstore_n(dx + i * c + j, out, nv);
      }
    }
  });
}

template <class A> std::vector<A> padded(const A* p, int64_t c) {  // (C,) and L zeros: whole-vector loads
  std::vector<A> out(c + lanes<A>, A(0));
  std::copy(p, p + c, out.begin());
  return out;
}

// ---- Cg not a power of two (3 <= Cg < lanes): a block of L = lanes groups (Cg vectors of values) at
// a time, copied to float scratch and read back transposed (lane l: group l, one gather per channel
// k of the group), so that every step runs on vectors of L groups; the sums run over k in order,
// from zero, as the scalar loops of the row kernels (group_norm_kernels.cpp) and of bwd_nhwc: the
// same bits as they give. The groups' values are spread back to the block's Cg value vectors by
// one permute each (lane l of value vector q: group (q * L + l) / Cg). Groups past the last whole
// block of a task: the scalar loops.

template <class A> inline vec<A> vgather(const A* base, ivec<A> idx) {  // base[idx[l]] lane by lane
#if defined(__AVX512F__) && NORMLAB_VEC_BYTES == 64
  if constexpr (std::is_same_v<A, float>) return (vec<A>)_mm512_i32gather_ps((__m512i)idx, base, 4);
#endif
  vec<A> v;
  for (int l = 0; l < int(lanes<A>); ++l) v[l] = base[idx[l]];
  return v;
}

// The block's Cg value vectors widened to A in scratch (Cg * L values).
template <class S> inline void to_scratch(const S* p, int64_t cg, acc_t<S>* buf) {
  constexpr int64_t L = vlanes<S>;
  for (int64_t q = 0; q < cg; ++q) vstore(buf + q * L, vload(p + q * L));
}

template <class A> struct Spread {  // the permutes of one Cg: lane l of value vector q -> group (q * L + l) / Cg
  ivec<A> idx[lanes<A>], gat;
  explicit Spread(int64_t cg) {
    for (int64_t q = 0; q < cg; ++q)
      for (int l = 0; l < int(lanes<A>); ++l) idx[q][l] = (q * lanes<A> + l) / cg;
    for (int l = 0; l < int(lanes<A>); ++l) gat[l] = l * cg;
  }
};

template <class A> std::vector<A> tiled(const A* p, int64_t c, int64_t extra) {  // p[k % C], C + extra values
  std::vector<A> out(c + extra);
  for (int64_t k = 0; k < c + extra; ++k) out[k] = p[k % c];
  return out;
}

template <class S>
void fwd_s1_odd(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var, acc_t<S>* rstd,
                int64_t n, int64_t c, int64_t g, double eps) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t cg = c / g;
  const A aeps = A(eps);
  const Spread<A> sp(cg);
  const auto wt = tiled(w, c, L * cg), bt = tiled(b, c, L * cg);
  const vec<A> count = vset1<A>(A(cg));
  for_rows(n, c, [&](int64_t i0, int64_t i1) {
    alignas(64) A buf[L * L];
    vec<A> v[L];
    int64_t gb = i0 * g;
    const int64_t ge = i1 * g;
    for (; gb + L <= ge; gb += L) {
      const int64_t j0 = gb * cg, jc = j0 % c;
      to_scratch(x + j0, cg, buf);
      for (int64_t k = 0; k < cg; ++k) v[k] = vgather<A>(buf + k, sp.gat);
      const vec<A> sh = v[0];
      vec<A> sum = vzero<A>();
      for (int64_t k = 0; k < cg; ++k) sum += v[k] - sh;
      const vec<A> md = sum / count;  // = over_count (for float: one rounding, Cg exact)
      vec<A> sq = vzero<A>();
      for (int64_t k = 0; k < cg; ++k) {
        const vec<A> e = (v[k] - sh) - md;
        sq += e * e;
      }
      const vec<A> va = sq / count;
      const vec<A> rs = vrsqrt_eps<A>(va, aeps);
      if (mean != nullptr) {
        vstore(var + gb, va);
        vstore(rstd + gb, rs);
        vec<A> m = sh + md;
        for (int l = 0; l < int(L); ++l)
          if (m[l] != m[l]) m[l] = torch_mean(m[l], inf_mask(x + j0 + l * cg, 1, 0, cg));
        vstore(mean + gb, m);
      }
      for (int64_t q = 0; q < cg; ++q) {
        const vec<A> shq = __builtin_shuffle(sh, sp.idx[q]), mdq = __builtin_shuffle(md, sp.idx[q]);
        const vec<A> rsq = __builtin_shuffle(rs, sp.idx[q]);
        const vec<A> wq = vload(wt.data() + jc + q * L), bq = vload(bt.data() + jc + q * L);
        vstore(y + j0 + q * L, ((vload(buf + q * L) - shq) - mdq) * (rsq * wq) + bq);
      }
    }
    for (; gb < ge; ++gb) {  // the last groups of the task, one at a time
      const int64_t j0 = gb * cg, jc = j0 % c;
      const S* xr = x + j0;
      const A shift = to_acc(xr[0]);
      A sum = A(0);
      for (int64_t k = 0; k < cg; ++k) sum += to_acc(xr[k]) - shift;
      const A md = over_count(sum, cg);
      A sq = A(0);
      for (int64_t k = 0; k < cg; ++k) {
        const A e = (to_acc(xr[k]) - shift) - md;
        sq += e * e;
      }
      const A va = over_count(sq, cg), rs = A(1) / std::sqrt(va + aeps);
      if (mean != nullptr) {
        A m = shift + md;
        if (m != m) m = torch_mean(m, inf_mask(xr, 1, 0, cg));
        mean[gb] = m;
        var[gb] = va;
        rstd[gb] = rs;
      }
      for (int64_t k = 0; k < cg; ++k)
        y[j0 + k] = from_acc<S>(((to_acc(xr[k]) - shift) - md) * (rs * wt[jc + k]) + bt[jc + k]);
    }
  });
}

template <class S>
void bwd_s1_odd(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
                acc_t<S>* pw, acc_t<S>* pb, int64_t n, int64_t c, int64_t g, int64_t spc, int64_t run) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t cg = c / g;
  const Spread<A> sp(cg);
  const auto wt = tiled(w, c, L * cg);
  for_chunks(n, spc, 2 * c, [&](int64_t, int64_t i0, int64_t i1) {
    alignas(64) A bx[L * L], bg[L * L], bw[L * L];
    int64_t gb = i0 * g;
    const int64_t ge = i1 * g;
    for (; gb + L <= ge; gb += L) {
      const int64_t j0 = gb * cg, jc = j0 % c;
      to_scratch(x + j0, cg, bx);
      to_scratch(dy + j0, cg, bg);
      for (int64_t q = 0; q < cg; ++q) vstore(bw + q * L, vload(wt.data() + jc + q * L));
      const vec<A> m = vload(mean + gb), rs = vload(rstd + gb);
      // e = mean(x - m) over each group: what the mean's rounding to A left out, taken from every
      // x - m below (at a mean of 1e4 dx and dw were ~1e-4 relative off without it)
      vec<A> sx = vzero<A>();
      for (int64_t k = 0; k < cg; ++k) sx += vgather<A>(bx + k, sp.gat) - m;
      const vec<A> e = sx / vset1<A>(A(cg));
      vec<A> sg = vzero<A>(), sgx = vzero<A>();
      for (int64_t k = 0; k < cg; ++k) {
        const vec<A> g0 = vgather<A>(bg + k, sp.gat), w0 = vgather<A>(bw + k, sp.gat);
        sg += w0 * g0;
        sgx += w0 * (g0 * ((vgather<A>(bx + k, sp.gat) - m) - e));
      }
      // t2 = rstd * sg / Cg, t3 = (sgx * rstd) / Cg * rstd^2 in float64 (bwd_nhwc's), lane by lane
      alignas(64) A t2a[L], t3a[L];
      for (int l = 0; l < int(L); ++l) {
        t2a[l] = A(double(sg[l]) / double(cg) * double(rs[l]));
        t3a[l] = A(double(sgx[l] * rs[l]) / double(cg) * double(rs[l] * rs[l]));
      }
      const vec<A> t2 = vload(t2a), t3 = vload(t3a);
      for (int64_t q = 0; q < cg; ++q) {
        const int64_t j = j0 + q * L;
        const vec<A> mq = __builtin_shuffle(m, sp.idx[q]), rq = __builtin_shuffle(rs, sp.idx[q]);
        const vec<A> eq = __builtin_shuffle(e, sp.idx[q]);
        const vec<A> gq = vload(bg + q * L), xq = (vload(bx + q * L) - mq) - eq, wq = vload(bw + q * L);
        const vec<A> d = gq * xq;
        // dw/db partials of the run of each value's sample, channel by channel in sample order
        const int64_t i = j / c, c0 = j - i * c;
        if (c0 + L <= c) {
          A* tw = pw + (i / run) * c + c0;
          A* tb = pb + (i / run) * c + c0;
          vstore(tw, vload(tw) + d * rq);
          vstore(tb, vload(tb) + gq);
        } else {  // the vector spans two samples
          const vec<A> dr = d * rq;
          for (int l = 0; l < int(L); ++l) {
            const int64_t jl = j + l, il = jl / c, cl = jl - il * c;
            pw[(il / run) * c + cl] += dr[l];
            pb[(il / run) * c + cl] += gq[l];
          }
        }
        if (dx == nullptr) continue;
        const vec<A> t2q = __builtin_shuffle(t2, sp.idx[q]), t3q = __builtin_shuffle(t3, sp.idx[q]);
        vstore(dx + j, (gq * (rq * wq) - xq * t3q) - t2q);
      }
    }
    for (; gb < ge; ++gb) {  // the last groups of the task, one at a time (bwd_nhwc's scalar loop)
      const int64_t j0 = gb * cg, i = j0 / c, c0 = j0 - i * c;
      A* tw = pw + (i / run) * c;
      A* tb = pb + (i / run) * c;
      const A m = mean[gb], rs = rstd[gb];
      A sx = A(0);
      for (int64_t k = 0; k < cg; ++k) sx += to_acc(x[j0 + k]) - m;
      const A e = sx / A(cg);
      A sg = A(0), sgx = A(0);
      for (int64_t k = 0; k < cg; ++k) {
        const A g0 = to_acc(dy[j0 + k]), d0 = g0 * ((to_acc(x[j0 + k]) - m) - e);
        tw[c0 + k] += d0 * rs;
        tb[c0 + k] += g0;
        sg += w[c0 + k] * g0;
        sgx += w[c0 + k] * d0;
      }
      if (dx == nullptr) continue;
      const A t2 = A(double(sg) / double(cg) * double(rs));
      const A t3 = A(double(sgx * rs) / double(cg) * double(rs * rs));
      for (int64_t k = 0; k < cg; ++k)
        dx[j0 + k] = from_acc<S>((to_acc(dy[j0 + k]) * (rs * w[c0 + k]) - ((to_acc(x[j0 + k]) - m) - e) * t3) - t2);
    }
  });
}

}  // namespace

template <class S> bool s1_packed(int64_t c, int64_t g) {
  const int64_t cg = c / g;
  return cg >= 2 && cg <= vlanes<S>;
}

template <class S>
void fwd_s1_packed(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var,
                   acc_t<S>* rstd, int64_t n, int64_t c, int64_t g, double eps) {
  if ((c / g) & (c / g - 1)) return fwd_s1_odd<S>(x, w, b, y, mean, var, rstd, n, c, g, eps);
  const auto wp = padded(w, c), bp = padded(b, c);
  switch (c / g) {
    case 2: fwd_s1<S, 2>(x, wp.data(), bp.data(), y, mean, var, rstd, n, c, eps); break;
    case 4: fwd_s1<S, 4>(x, wp.data(), bp.data(), y, mean, var, rstd, n, c, eps); break;
    case 8: fwd_s1<S, 8>(x, wp.data(), bp.data(), y, mean, var, rstd, n, c, eps); break;
    case 16:
      if constexpr (vlanes<S> >= 16) fwd_s1<S, 16>(x, wp.data(), bp.data(), y, mean, var, rstd, n, c, eps);
      break;
  }
}

template <class S>
void bwd_s1_packed(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
                   acc_t<S>* pw, acc_t<S>* pb, int64_t n, int64_t c, int64_t g, int64_t spc, int64_t run) {
  if ((c / g) & (c / g - 1)) return bwd_s1_odd<S>(dy, x, w, mean, rstd, dx, pw, pb, n, c, g, spc, run);
  const auto wp = padded(w, c);
  switch (c / g) {
    case 2: bwd_s1<S, 2>(dy, x, wp.data(), mean, rstd, dx, pw, pb, n, c, spc, run); break;
    case 4: bwd_s1<S, 4>(dy, x, wp.data(), mean, rstd, dx, pw, pb, n, c, spc, run); break;
    case 8: bwd_s1<S, 8>(dy, x, wp.data(), mean, rstd, dx, pw, pb, n, c, spc, run); break;
    case 16:
      if constexpr (vlanes<S> >= 16) bwd_s1<S, 16>(dy, x, wp.data(), mean, rstd, dx, pw, pb, n, c, spc, run);
      break;
  }
}

#define NORMLAB_GN_S1(S)                                                                                        \
  template bool s1_packed<S>(int64_t, int64_t);                                                               \
  template void fwd_s1_packed<S>(const S*, const acc_t<S>*, const acc_t<S>*, S*, acc_t<S>*, acc_t<S>*,        \
                                 acc_t<S>*, int64_t, int64_t, int64_t, double);                              \
  template void bwd_s1_packed<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*,   \
                                 acc_t<S>*, acc_t<S>*, int64_t, int64_t, int64_t, int64_t, int64_t);
NORMLAB_GN_S1(float)
NORMLAB_GN_S1(double)
NORMLAB_GN_S1(bf16)
NORMLAB_GN_S1(f16)
#undef NORMLAB_GN_S1

}  // namespace normlab::group_norm
