// The norm+act elementwise passes (cpu/norm_act_kernels.h): one loop per layout, the activation a
// template parameter (numerics/activation.h), the constants rounded to the accumulation type once.
#include "cpu/norm_act_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/batch_norm_kernels.h"
#include "numerics/activation.h"
#include "numerics/stream.h"
#include "numerics/vec.h"

namespace normlab::nact {

namespace {

constexpr int64_t kTaskValues = 32768;

// (always inlined: GCC kept store_n<bf16> a call per vector, a fifth of BatchNormAct2d's time)
template <class S> [[gnu::always_inline]] inline vacc<S> load_n(const S* p, int64_t n) {
  return n == vlanes<S> ? vload(p) : vload_n(p, n);
}
template <class S> [[gnu::always_inline]] inline void store_n(S* p, vacc<S> v, int64_t n) {
  if (n == vlanes<S>) vstore(p, v); else vstore_n(p, v, n);
}
template <class A> inline vec<A> loadc_n(const A* p, int64_t n) {
  if (n == lanes<A>) return vload(p);
  vec<A> v = vzero<A>();
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}

// act::dz_of for a bfloat16 pair (even and odd values apart, as vload_eo reads them), into dz (which
// may alias dy). relu (dy where z > 0 or z is NaN, +0 where z <= 0): a mask on dy's stored words,
// its bits kept -- no widening, product or rounding; the others dy * act'(z), rounded once.
template <int Act> inline void dz_of_eo(const bf16* dy, bf16* dz, vec<float> ze, vec<float> zo, float p) {
  if constexpr (Act == act::kRelu) {
    detail::u32v w;
    std::memcpy(&w, dy, sizeof w);
    const detail::i32v ne = ze <= 0.0f, no = zo <= 0.0f;  // -1 where dz is +0
    w &= ((detail::u32v)~ne & 0xFFFFu) | ((detail::u32v)~no & 0xFFFF0000u);
    std::memcpy(dz, &w, sizeof w);
  } else {
    vec<float> de, dq;
    vload_eo(dy, de, dq);
    vstore_eo(dz, de * act::grad<Act, bf16>(ze, p), dq * act::grad<Act, bf16>(zo, p));
  }
}

// The constants in the accumulation type (hi = mean rounded, a = rstd * w rounded, b2 = b minus
// what the rounding of hi moved, rounded: the norm's own forms)
template <class A> struct Consts {
  std::vector<A> hi, a, b2;
  Consts(const double* h, const double* f, const double* b, int64_t n) : hi(n), a(n), b2(n) {
    for (int64_t i = 0; i < n; ++i) { hi[i] = A(h[i]); a[i] = A(f[i]); b2[i] = A(b[i]); }
  }
  // Each row of w constants (the rows layout) with its first pairs(w) values in eo_order (vec.h),
  // the rest in order: what over's bfloat16 rows read beside vload_eo.
  static int64_t pairs(int64_t w) { return w / (2 * lanes<A>) * (2 * lanes<A>); }
  // v's first n2 values (a multiple of 2 * lanes) put in eo_order in place; t: n2 values of scratch
  static void eo_in_place(A* v, int64_t n2, A* t) {
    eo_order(v, n2, t);
    std::copy(t, t + n2, v);
  }
  void eo_rows(int64_t w) {
    const int64_t n2 = pairs(w);
    if (n2 == 0) return;
    std::vector<A> t(n2);
    for (std::vector<A>* v : {&hi, &a, &b2})
      for (int64_t r0 = 0; r0 + w <= int64_t(v->size()); r0 += w) eo_in_place(v->data() + r0, n2, t.data());
  }
};

// body(p0, p1) over planes or rows in tasks of about kTaskValues values
template <class F> void tasks(const Layout& l, const F& body) {
  const int64_t per = std::max<int64_t>(1, kTaskValues / std::max<int64_t>(1, l.n_inner));
  at::parallel_for(0, l.n_outer, per, [&](int64_t p0, int64_t p1) { body(p0, p1); });
}

// g(z, t, k) (g_pair(ze, zo, t) as over's) for the run of len values at x + base, constant c
template <class S, class G, class GP>
inline void plane_run(const S* x, const Consts<acc_t<S>>& k, int64_t c, int64_t base, int64_t len, const G& g,
                      const GP& g_pair) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  const vec<A> h = vset1(k.hi[c]), a = vset1(k.a[c]), b = vset1(k.b2[c]);
  int64_t t = 0;
  if constexpr (std::is_same_v<S, bf16>) {
    for (; t + 2 * L <= len; t += 2 * L) {
      vec<A> e, o;
      vload_eo(x + base + t, e, o);
      g_pair((e - h) * a + b, (o - h) * a + b, base + t);
    }
  }
  for (; t < len; t += L) {
    const int64_t n = std::min(L, len - t);
    g((load_n(x + base + t, n) - h) * a + b, base + t, n);
  }
}

// g(z, t, k) for every vector of z values: t = offset, k = lanes used; planes or rows alike.
// bfloat16 planes and rows go two vectors at a time first, even and odd values apart:
// g_pair(ze, zo, t) (vec.h vload_eo; the caller stores by vstore_eo: no widening or packing of
// halves), then g for the rest of the plane or row (rows: k's constants in eo_rows' order, each
// row's pairs reading them beside vload_eo). g_pair is called only for bfloat16 (a generic lambda).
template <class S, class G, class GP>
inline void over(const Layout& l, const S* x, const Consts<acc_t<S>>& k, int64_t p0, int64_t p1, const G& g,
                 const GP& g_pair) {
  using A = acc_t<S>;
  constexpr int64_t L = vlanes<S>;
  if (l.planes) {
    for (int64_t p = p0; p < p1; ++p) plane_run<S>(x, k, p % l.n_const, p * l.n_inner, l.n_inner, g, g_pair);
  } else {
    // (the block of rows tracked rather than divided for: one integer division a row of 64 values
    // was a visible share of BatchNorm's channels_last pass; the constants' pointers held in locals)
    const int64_t w = l.n_inner;
    const A *hi = k.hi.data(), *av = k.a.data(), *bv = k.b2.data();
    int64_t blk = p0 / l.block_rows, next = (blk + 1) * l.block_rows;
    for (int64_t r = p0; r < p1; ++r) {
      if (r == next) {
        ++blk;
        next += l.block_rows;
      }
      const int64_t c0 = blk * w, base = r * w;
      auto z_at = [&](int64_t t, int64_t n) {  // (inlined: n = L a constant for the whole vectors)
        g((load_n(x + base + t, n) - loadc_n(hi + c0 + t, n)) * loadc_n(av + c0 + t, n) + loadc_n(bv + c0 + t, n),
          base + t, n);
      };
      int64_t t = 0;
      if constexpr (std::is_same_v<S, bf16>) {
        const int64_t n2 = Consts<A>::pairs(w);
        for (; t < n2; t += 2 * L) {
          vec<A> e, o;
          vload_eo(x + base + t, e, o);
          const int64_t j = c0 + t;
          g_pair((e - vload(hi + j)) * vload(av + j) + vload(bv + j),
                 (o - vload(hi + j + L)) * vload(av + j + L) + vload(bv + j + L), base + t);
        }
      }
      for (; t + L <= w; t += L) z_at(t, L);
      if (t < w) z_at(t, w - t);
    }
  }
}

// dz = dy * act'(z) stored at offset t (over's g), and for a bfloat16 pair (over's g_pair)
template <int Act, class S> struct DzWrite {
  using A = acc_t<S>;
  const S* dy;
  S* dz;
  A p;
  void operator()(vec<A> z, int64_t t, int64_t n) const { store_n(dz + t, act::dz_of<Act, S>(load_n(dy + t, n), z, p), n); }
  template <class V> void pair(V ze, V zo, int64_t t) const {
    dz_of_eo<Act>(dy + t, dz + t, ze, zo, p);  // (dependent: compiled only for bfloat16, where over calls it)
  }
};

// The constants of a call (bfloat16 rows: in eo_rows' order)
template <class S>
Consts<acc_t<S>> consts(const double* hi, const double* a, const double* b2, int64_t n, const Layout& l) {
  Consts<acc_t<S>> k(hi, a, b2, n);
  if (std::is_same_v<S, bf16> && !l.planes) k.eo_rows(l.n_inner);
  return k;
}

template <class F> void by_dtype(Dtype dt, const F& f) {
  switch (dt) {
    case Dtype::f32: f(float{}); break;
    case Dtype::f64: f(double{}); break;
    case Dtype::bf16: f(bf16{}); break;
    case Dtype::f16: f(f16{}); break;
  }
}

}  // namespace

void forward_out(Dtype dt, const void* xv, void* yv, const double* hi, const double* a, const double* b2,
                 int64_t n_consts, Layout l, int act_id, double param, bool stats_of_x) {
  by_dtype(dt, [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    const S* x = static_cast<const S*>(xv);
    S* y = static_cast<S*>(yv);
    const Consts<A> k = consts<S>(hi, a, b2, n_consts, l);
    const A p = A(param);
    // planes: y's whole lines streamed where BatchNorm's own output pass streams them
    // (bn::streams_planes), each plane's ends plain; without, the plain stores read y's lines from
    // memory first (float32 BatchNormAct2d relu 16x64x56x56 training forward, one thread: 1.09-1.2
    // ms against BatchNorm2d's 0.97)
    const bool stream = l.planes && bn::streams_planes(dt, l.n_outer, l.n_inner);
    act::visit(act_id, [&]<int Act>() {
      auto run = [&]<bool NoNaN>() {
        auto g = [&](vec<A> z, int64_t t, int64_t n) { store_n(y + t, act::apply<Act, S>(z, p), n); };
        auto g_pair = [&](auto ze, auto zo, int64_t t) {
          vstore_eo<NoNaN>(y + t, act::apply_nan_free<Act, S, NoNaN>(ze, p), act::apply_nan_free<Act, S, NoNaN>(zo, p));
        };
        tasks(l, [&](int64_t p0, int64_t p1) {
          if (!stream) return over<S>(l, x, k, p0, p1, g, g_pair);
          const int64_t s = l.n_inner;
          for (int64_t q = p0; q < p1; ++q) {
            const int64_t c = q % l.n_const, base = q * s;
            const Span sp = whole_lines(y + base, s);
            plane_run<S>(x, k, c, base, sp.k, g, g_pair);
            plane_run<S>(x, k, c, base + sp.k, sp.e - sp.k,
                         [&](vec<A> z, int64_t t, int64_t) { vstream(y + t, act::apply<Act, S>(z, p)); }, g_pair);
            plane_run<S>(x, k, c, base + sp.e, s - sp.e, g, g_pair);
          }
          fence_streams();
        });
      };
      // bfloat16: the store's NaN test left out where no output can be NaN -- the statistics x's
      // own (a mean is finite only where every value it holds is), an activation that keeps
      // NaN-free values so (act::keeps_nan_free) and every constant nan_free_affine (vec.h)
      if constexpr (std::is_same_v<S, bf16>) {
        if (stats_of_x && act::keeps_nan_free<Act>(p) &&
            nan_free_affines(k.hi.data(), k.a.data(), k.b2.data(), int64_t(k.hi.size())))
          return run.template operator()<true>();
      }
      run.template operator()<false>();
    });
  });
}

// f(dy, x, dz) with the pointers as the storage type of dt (S = the type dz points to)
template <class F> void typed_dz(Dtype dt, const void* dyv, const void* xv, void* dzv, const F& f) {
  by_dtype(dt, [&](auto s) {
    using S = decltype(s);
    f(static_cast<const S*>(dyv), static_cast<const S*>(xv), static_cast<S*>(dzv));
  });
}

void grad_z(Dtype dt, const void* dyv, const void* xv, void* dzv, const double* hi, const double* a, const double* b2,
            int64_t n_consts, Layout l, int act_id, double param, bool parallel) {
  typed_dz(dt, dyv, xv, dzv, [&](const auto* dy, const auto* x, auto* dz) {
    using S = std::remove_pointer_t<decltype(dz)>;
    using A = acc_t<S>;
    const Consts<A> k = consts<S>(hi, a, b2, n_consts, l);
    const A p = A(param);
    act::visit(act_id, [&]<int Act>() {
      const DzWrite<Act, S> w{dy, dz, p};
      auto body = [&](int64_t p0, int64_t p1) {
        over<S>(l, x, k, p0, p1, w, [&](auto ze, auto zo, int64_t t) { w.pair(ze, zo, t); });
      };
      if (parallel) tasks(l, body);
      else body(0, l.n_outer);
    });
  });
}

std::function<void(int64_t, int64_t, int64_t, void*)> grad_z_runs(Dtype dt, const void* dyv, const void* xv,
                                                                  void* dzv, const double* hi, const double* a,
                                                                  const double* b2, int64_t n_consts, int act_id,
                                                                  double param) {
  std::function<void(int64_t, int64_t, int64_t, void*)> run;
  typed_dz(dt, dyv, xv, dzv, [&](const auto* dy, const auto* x, auto* dz) {
    using S = std::remove_pointer_t<decltype(dz)>;
    using A = acc_t<S>;
    auto k = std::make_shared<const Consts<A>>(hi, a, b2, n_consts);  // (planes: in order)
    act::visit(act_id, [&]<int Act>() {
      run = [x, dy, dz, k, p = A(param)](int64_t c, int64_t off, int64_t len, void* dst) {
        const DzWrite<Act, S> w{dy + off, dst ? static_cast<S*>(dst) : dz + off, p};
        plane_run<S>(x + off, *k, c, 0, len, w, [&](auto ze, auto zo, int64_t t) { w.pair(ze, zo, t); });
      };
    });
  });
  return run;
}

void grad_z_rows(Dtype dt, const void* dyv, const void* xv, void* dzv, const double* mean, const double* rstd,
                 const double* w, const double* b, int64_t n_rows, int64_t n_cols, int act_id, double param) {
  by_dtype(dt, [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    constexpr int64_t L = vlanes<S>;
    const S* x = static_cast<const S*>(xv);
    const S* dy = static_cast<const S*>(dyv);
    S* dz = static_cast<S*>(dzv);
    // (a plain array: a std::vector<float>(n) here left GCC's clone of its constructor, compiled for
    // this file's level, outside the level's namespace -- scripts/check-isa.py)
    const std::unique_ptr<A[]> wb(new A[2 * n_cols]);
    A *wa = wb.get(), *ba = wa + n_cols;
    for (int64_t c = 0; c < n_cols; ++c) { wa[c] = A(w ? w[c] : 1.0); ba[c] = A(b ? b[c] : 0.0); }
    // bfloat16: each row's first n2 values by pairs, even and odd apart (w and b in eo_order there)
    const int64_t n2 = std::is_same_v<S, bf16> ? Consts<A>::pairs(n_cols) : 0;
    if (n2) {
      const std::unique_ptr<A[]> t(new A[n2]);
      for (A* v : {wa, ba}) Consts<A>::eo_in_place(v, n2, t.get());
    }
    const A p = A(param);
    const Layout l{false, n_rows, n_cols, 0, 1};
    act::visit(act_id, [&]<int Act>() {
      tasks(l, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const vec<A> m = vset1(A(mean[r])), rs = vset1(A(rstd[r]));
          const int64_t base = r * n_cols;
          if constexpr (std::is_same_v<S, bf16>) {
            for (int64_t t = 0; t < n2; t += 2 * L) {
              vec<A> e, o;
              vload_eo(x + base + t, e, o);
              const vec<A> ze = ((e - m) * rs) * vload(&wa[t]) + vload(&ba[t]);
              const vec<A> zo = ((o - m) * rs) * vload(&wa[t + L]) + vload(&ba[t + L]);
              dz_of_eo<Act>(dy + base + t, dz + base + t, ze, zo, p);
            }
          }
          for (int64_t t = n2; t < n_cols; t += L) {
            const int64_t n = std::min(L, n_cols - t);
            const vec<A> z = ((load_n(x + base + t, n) - m) * rs) * loadc_n(&wa[t], n) + loadc_n(&ba[t], n);
            store_n(dz + base + t, act::dz_of<Act, S>(load_n(dy + base + t, n), z, p), n);
          }
        }
      });
    });
  });
}

void apply_inplace(Dtype dt, void* yv, int64_t n, int act_id, double param) {
  by_dtype(dt, [&](auto s) {
    using S = decltype(s);
    using A = acc_t<S>;
    constexpr int64_t L = vlanes<S>;
    S* y = static_cast<S*>(yv);
    const A p = A(param);
    act::visit(act_id, [&]<int Act>() {
      if constexpr (Act != act::kIdentity) {
        at::parallel_for(0, n, kTaskValues, [&](int64_t i0, int64_t i1) {
          const auto f = [&](vec<A> z) { return act::apply<Act, S>(z, p); };
          int64_t t = i0;
          if constexpr (std::is_same_v<S, bf16>) t += eo_map(y + i0, y + i0, i1 - i0, f);  // (pairs, in place)
          for (; t + L <= i1; t += L) vstore(y + t, f(vload(y + t)));
          if (t < i1) vstore_n(y + t, f(vload_n(y + t, i1 - t)), i1 - t);
        });
      }
    });
  });
}

}  // namespace normlab::nact
