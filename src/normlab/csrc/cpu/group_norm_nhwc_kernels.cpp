// GroupNorm over NHWC samples: x as (N, S, C), channels fastest -- channels_last inputs with S > 1,
// and the backward of every S == 1 input. A task takes whole samples and keeps per-channel vectors
// (sums, shifts, scales) of length C, so every inner loop runs over contiguous channels; per-group
// values are spread to their channels, per-channel sums added per group in channel order.
// Layouts and conventions: group_norm_kernels.h; the math: docs/derivations/group_norm.md.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/group_norm_kernels.h"
#include "cpu/group_norm_sums.h"
#include "numerics/chunks.h"
#include "numerics/vec.h"

namespace normlab::group_norm {

namespace {

// f(j) on vectors of L channels at j, then fs(j) on the remaining channels one at a time.
template <int64_t L, class F, class G> inline void over_channels(int64_t c, const F& f, const G& fs) {
  int64_t j = 0;
  for (; j + L <= c; j += L) f(j);
  for (; j < c; ++j) fs(j);
}

// out[gi*cg + k] = v[gi]: a per-group value on each of its group's channels.
template <class A> inline void spread(const A* v, int64_t g, int64_t cg, A* out) {
  for (int64_t gi = 0; gi < g; ++gi)
    for (int64_t k = 0; k < cg; ++k) out[gi * cg + k] = v[gi];
}

// out[gi] = sum_k a[gi*cg + k], in channel order.
template <class A> inline void group_sums(const A* a, int64_t g, int64_t cg, A* out) {
  for (int64_t gi = 0; gi < g; ++gi) {
    A s = a[gi * cg];
    for (int64_t k = 1; k < cg; ++k) s += a[gi * cg + k];
    out[gi] = s;
  }
}

// Samples per row of the backward's dw/db partials: a run's terms are added in float32 (half types,
// float32) in sample order, the rows then in float64 -- short float32 chains.
constexpr int64_t kRun = 16;

}  // namespace

int64_t nhwc_samples_per_chunk(int64_t n, int64_t ns, int64_t c) {
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(std::max<int64_t>(16, (65536 + c - 1) / std::max<int64_t>(c, 1)), n * ns));
  return std::max<int64_t>(1, std::min<int64_t>(n, (rows + ns - 1) / std::max<int64_t>(ns, 1)));
}

// x, y (N, S, C); w, b (C,); mean, var, rstd (N*G,) out or null.
// docs/derivations/group_norm.md, "The grouped view" and "Numerics" -- per sample, three passes
// over its S rows of C channels (the second and third from cache):
//   pass 1   acc[c] = sum_s (x - shift)                  -> md = mean(x - shift) per group
//   pass 2   acc[c] = sum_s ((x - shift) - md)^2         -> var, rstd per group
//   output   y = ((x - shift) - md) * (rstd * w[c]) + b[c]
// shift: the group's first value; the per-channel sums run over s in order.
template <class S>
void fwd_nhwc(const S* x, const acc_t<S>* w, const acc_t<S>* b, S* y, acc_t<S>* mean, acc_t<S>* var,
              acc_t<S>* rstd, int64_t n, int64_t c, int64_t g, int64_t ns, double eps) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t cg = c / g, m_grp = cg * ns;
  const A aeps = A(eps);
  for_rows(n, ns * c, [&](int64_t i0, int64_t i1) {
    std::vector<A> buf(4 * c + 3 * g);
    A *sh = buf.data(), *mdc = sh + c, *ac = mdc + c, *acc = ac + c;  // per channel
    A *gsh = acc + c, *gmd = gsh + g, *gv = gmd + g;                    // per group
    for (int64_t i = i0; i < i1; ++i) {
      const S* xi = x + i * ns * c;
      S* yi = y + i * ns * c;
      for (int64_t gi = 0; gi < g; ++gi) gsh[gi] = to_acc(xi[gi * cg]);
      spread(gsh, g, cg, sh);
      over_channels<L>(c, [&](int64_t j) { vstore(acc + j, vload(xi + j) - vload(sh + j)); },  // pass 1
                       [&](int64_t j) { acc[j] = to_acc(xi[j]) - sh[j]; });
      for (int64_t s = 1; s < ns; ++s) {
        const S* xs = xi + s * c;
        over_channels<L>(c, [&](int64_t j) { vstore(acc + j, vload(acc + j) + (vload(xs + j) - vload(sh + j))); },
                         [&](int64_t j) { acc[j] += to_acc(xs[j]) - sh[j]; });
      }
      group_sums(acc, g, cg, gv);
      for (int64_t gi = 0; gi < g; ++gi) gmd[gi] = over_count(gv[gi], m_grp);
      spread(gmd, g, cg, mdc);
      for (int64_t s = 0; s < ns; ++s) {  // pass 2
        const S* xs = xi + s * c;
        over_channels<L>(c,
                         [&](int64_t j) {
                           vec<A> e = (vload(xs + j) - vload(sh + j)) - vload(mdc + j);
                           vstore(acc + j, s == 0 ? e * e : vload(acc + j) + e * e);
                         },
                         [&](int64_t j) {
                           A e = (to_acc(xs[j]) - sh[j]) - mdc[j];
                           acc[j] = s == 0 ? e * e : acc[j] + e * e;
                         });
      }
      group_sums(acc, g, cg, gv);
      for (int64_t gi = 0; gi < g; ++gi) {
        A v = over_count(gv[gi], m_grp);
        A rs = A(1) / std::sqrt(v + aeps);
        if (mean != nullptr) {
          A m = gsh[gi] + gmd[gi];
          if (m != m) m = torch_mean(m, inf_mask(xi + gi * cg, ns, c, cg));
          mean[i * g + gi] = m;
          var[i * g + gi] = v;
          rstd[i * g + gi] = rs;
        }
        gv[gi] = rs;
      }
      spread(gv, g, cg, ac);
      for (int64_t j = 0; j < c; ++j) ac[j] = ac[j] * w[j];
      for (int64_t s = 0; s < ns; ++s) {  // output
        const S* xs = xi + s * c;
        S* ys = yi + s * c;
        over_channels<L>(
            c,
            [&](int64_t j) {
              vstore(ys + j, ((vload(xs + j) - vload(sh + j)) - vload(mdc + j)) * vload(ac + j) + vload(b + j));
            },
            [&](int64_t j) { ys[j] = from_acc<S>(((to_acc(xs[j]) - sh[j]) - mdc[j]) * ac[j] + b[j]); });
      }
    }
  });
}

// dy, x, dx (N, S, C); w (C,); mean, rstd (N*G,); dw, db (C,) out.
// docs/derivations/group_norm.md, "The input" and "The parameters" (the terms as in bwd_rows):
//   dx = dy * (rstd * w[c]) - (x - mean) * t3 - t2,  t2 = rstd * mean_grp(g),
//   t3 = rstd^3 * mean_grp(g * (x - mean)),  g = dy * w[c];
// from the per-channel sums sdy[c] = sum_s dy, sdx[c] = sum_s dy * (x - mean), which also make
// dw/db: each run of kRun samples adds its samples' terms in order into its own (C,) partials; the
// (runs, C) partials are merged in run order in float64. A task takes whole runs (about
// nhwc_samples_per_chunk samples), so the bits do not depend on the number of threads.
// S == 1: the sums over s are single values and each group's Cg channels are contiguous, so a
// group's sums run as one vector loop over its channels.
template <class S>
void bwd_nhwc(const S* dy, const S* x, const acc_t<S>* w, const acc_t<S>* mean, const acc_t<S>* rstd, S* dx,
              acc_t<S>* dw, acc_t<S>* db, int64_t n, int64_t c, int64_t g, int64_t ns) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const int64_t cg = c / g, m_grp = cg * ns;
  // dw/db partials: one row per kRun samples (a task's chunk is whole runs), merged in float64
  const int64_t spc = (nhwc_samples_per_chunk(n, ns, c) + kRun - 1) / kRun * kRun;
  const int64_t nrun = n_chunks(n, kRun);
  std::vector<A> pw(nrun * c, A(0)), pb(nrun * c, A(0));  // per run: sums of dy * x_hat, of dy
  if (ns == 1 && s1_packed<S>(c, g)) {  // small groups packed in vectors (group_norm_s1_kernels.cpp)
    bwd_s1_packed<S>(dy, x, w, mean, rstd, dx, pw.data(), pb.data(), n, c, g, spc, kRun);
    merge_partials(pw.data(), pb.data(), nrun, c, dw, db);
    return;
  }
  for_chunks(n, spc, 2 * ns * c, [&](int64_t, int64_t i0, int64_t i1) {
    std::vector<A> buf(7 * c + 2 * g);
    A *mc = buf.data(), *rsc = mc + c, *ac = rsc + c, *sdy = ac + c, *sdx = sdy + c, *t2 = sdx + c, *t3 = t2 + c;
    A *gp = t3 + c, *gq = gp + g;
    for (int64_t i = i0; i < i1; ++i) {
      A* tw = pw.data() + (i / kRun) * c;
      A* tb = pb.data() + (i / kRun) * c;
      const S* xi = x + i * ns * c;
      const S* dyi = dy + i * ns * c;
      S* dxi = dx == nullptr ? nullptr : dx + i * ns * c;
      const A* mi = mean + i * g;
      const A* ri = rstd + i * g;
      if (ns == 1) {
        for (int64_t gi = 0; gi < g; ++gi) {
          const int64_t c0 = gi * cg;
          const A m = mi[gi], rs = ri[gi];
          vec<A> vm = vset1<A>(m), vr = vset1<A>(rs), vsg = vzero<A>(), vsgx = vzero<A>();
          int64_t k = 0;
          for (; k + L <= cg; k += L) {
            const int64_t j = c0 + k;
            vec<A> g0 = vload(dyi + j), d0 = g0 * (vload(xi + j) - vm), w0 = vload(w + j);
            vstore(tw + j, vload(tw + j) + d0 * vr);
            vstore(tb + j, vload(tb + j) + g0);
            vsg += w0 * g0;
            vsgx += w0 * d0;
          }
          A sg = hsum<A>(vsg), sgx = hsum<A>(vsgx);
          for (; k < cg; ++k) {
            const int64_t j = c0 + k;
            A g0 = to_acc(dyi[j]), d0 = g0 * (to_acc(xi[j]) - m);
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
            vstore(dxi + j, (vload(dyi + j) * (vr * vload(w + j)) - (vload(xi + j) - vm) * v3) - v2);
          }
          for (; k < cg; ++k) {
            const int64_t j = c0 + k;
            dxi[j] = from_acc<S>((to_acc(dyi[j]) * (rs * w[j]) - (to_acc(xi[j]) - m) * t3g) - t2g);
          }
        }
        continue;
      }
      spread(mi, g, cg, mc);
      spread(ri, g, cg, rsc);
      for (int64_t s = 0; s < ns; ++s) {
        const S* xs = xi + s * c;
        const S* gs = dyi + s * c;
        over_channels<L>(
            c,
            [&](int64_t j) {
              vec<A> g0 = vload(gs + j), d0 = g0 * (vload(xs + j) - vload(mc + j));
              vstore(sdy + j, s == 0 ? g0 : vload(sdy + j) + g0);
              vstore(sdx + j, s == 0 ? d0 : vload(sdx + j) + d0);
            },
            [&](int64_t j) {
              A g0 = to_acc(gs[j]), d0 = g0 * (to_acc(xs[j]) - mc[j]);
              sdy[j] = s == 0 ? g0 : sdy[j] + g0;
              sdx[j] = s == 0 ? d0 : sdx[j] + d0;
            });
      }
      over_channels<L>(
          c,
          [&](int64_t j) {
            vstore(tw + j, vload(tw + j) + vload(sdx + j) * vload(rsc + j));
            vstore(tb + j, vload(tb + j) + vload(sdy + j));
          },
          [&](int64_t j) {
            tw[j] += sdx[j] * rsc[j];
            tb[j] += sdy[j];
          });
      if (dxi == nullptr) continue;
      for (int64_t gi = 0; gi < g; ++gi) {  // per group: sum of dy * w, of dy * w * (x - mean)
        A sp = w[gi * cg] * sdy[gi * cg], sq = w[gi * cg] * sdx[gi * cg];
        for (int64_t k = 1; k < cg; ++k) {
          sp += w[gi * cg + k] * sdy[gi * cg + k];
          sq += w[gi * cg + k] * sdx[gi * cg + k];
        }
        const A rs = ri[gi];
        gp[gi] = A(double(sp) / double(m_grp) * double(rs));          // t2 = rstd * mean_grp(g)
        gq[gi] = A(double(sq * rs) / double(m_grp) * double(rs * rs));  // t3
      }
      spread(gp, g, cg, t2);
      spread(gq, g, cg, t3);
      for (int64_t j = 0; j < c; ++j) ac[j] = rsc[j] * w[j];
      for (int64_t s = 0; s < ns; ++s) {  // dx = dy * (rstd * w[c]) - (x - mean) * t3 - t2
        const S* xs = xi + s * c;
        const S* gs = dyi + s * c;
        S* ds = dxi + s * c;
        over_channels<L>(
            c,
            [&](int64_t j) {
              vstore(ds + j, (vload(gs + j) * vload(ac + j) - (vload(xs + j) - vload(mc + j)) * vload(t3 + j)) -
                                 vload(t2 + j));
            },
            [&](int64_t j) {
              ds[j] = from_acc<S>((to_acc(gs[j]) * ac[j] - (to_acc(xs[j]) - mc[j]) * t3[j]) - t2[j]);
            });
      }
    }
  });
  merge_partials(pw.data(), pb.data(), nrun, c, dw, db);
}

#define NORMLAB_GN_NHWC(S)                                                                                      \
  template void fwd_nhwc<S>(const S*, const acc_t<S>*, const acc_t<S>*, S*, acc_t<S>*, acc_t<S>*, acc_t<S>*, \
                            int64_t, int64_t, int64_t, int64_t, double);                                     \
  template void bwd_nhwc<S>(const S*, const S*, const acc_t<S>*, const acc_t<S>*, const acc_t<S>*, S*,       \
                            acc_t<S>*, acc_t<S>*, int64_t, int64_t, int64_t, int64_t);
NORMLAB_GN_NHWC(float)
NORMLAB_GN_NHWC(double)
NORMLAB_GN_NHWC(bf16)
NORMLAB_GN_NHWC(f16)
#undef NORMLAB_GN_NHWC

}  // namespace normlab::group_norm
