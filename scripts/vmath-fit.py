"""The coefficient tables of numerics/vmath.h's float32 tanh (DyT's forward) and erf (GELU's),
printed as the header holds them (docs/derivations/dyt.md and norm_act.md, "Accuracy").

Both functions are evaluated by intervals of |x|: interval 0 in z = x^2 near 0, the others as
c0 + y R(y), y = |x| - c, on the quarters of binades (tanh: [0.625, 1), [1, 2), [2, 4), [4, 7) by
units, and [7, 10]; erf: [0.625, 1), [1, 2), [2, 4)). Per interval:

- c, a float32 in the interval such that c0 = f(c) rounded to float32 is within 0.001 ulp of f(c)
  (found among the floats next to f^-1 of the floats next to f(midpoint), and next to the
  midpoint), so that the constant term carries no rounding of its own; y = |x| - c is exact
  (|x| and c in one interval: Sterbenz);
- R of degree 4 (tanh) or 5 (erf), fitted to (f(c + y) - c0) / y by least squares on Chebyshev
  nodes, weighted by 1 / ulp(f), its coefficients rounded to float32 one at a time from the
  highest, the lower ones refitted after each (mpmath's f at 40 digits).

Interval 0: tanh keeps Cephes' tanhf polynomial (a + a^3 Q(a^2), Q of degree 4); erf fits
erf(a) / a - 1 in a^2 (degree 5) the same way, weighted by a / ulp(erf(a)).

    python scripts/vmath-fit.py          # both tables, about two minutes
"""
from __future__ import annotations

import mpmath as mp
import numpy as np

mp.mp.dps = 40
f32 = np.float32
CEPHES_TANH_Q = [-3.33332819422e-1, 1.33314422036e-1, -5.37397155531e-2, 2.06390887954e-2, -5.70498872745e-3]


def ulp(v):
    """The float32 spacing at |v| (float64 values)."""
    return np.ldexp(1.0, np.frexp(np.abs(v))[1] - 24)


def f32_neighbours(v: float, k: int):
    b = int(np.array([f32(v)], f32).view(np.int32)[0])
    return [float(np.array([b + i], np.int32).view(f32)[0]) for i in range(-k, k + 1)]


def rounded_fit(a_mat, target, weight, n):
    """Least-squares coefficients of the columns of a_mat, rounded to float32 from the last."""
    fixed = {}
    for j in range(n - 1, -1, -1):
        free = [i for i in range(n) if i not in fixed]
        rhs = target - sum(fixed[i] * a_mat[:, i] for i in fixed)
        sol = np.linalg.lstsq(a_mat[:, free] * weight[:, None], rhs * weight, rcond=None)[0]
        fixed[j] = float(f32(sol[free.index(j)]))
    return [fixed[i] for i in range(n)]


def fit_interval(f, finv, lo, hi, deg, nodes=400):
    mid = (lo + hi) / 2
    cands = [float(f32(float(finv(t)))) for t in f32_neighbours(float(f(mid)), 40) if t < 1]
    cands += f32_neighbours(mid, 2000)
    best = None
    for c in cands:
        if not lo <= c <= hi:
            continue
        fc = f(mp.mpf(c))
        score = abs(float(fc - mp.mpf(float(f32(float(fc)))))) / ulp(float(fc)) + 0.02 * abs(c - mid) / (hi - lo)
        if best is None or score < best[0]:
            best = (score, c)
    c = best[1]
    c0 = float(f32(float(f(mp.mpf(c)))))
    k = np.arange(nodes)
    ys = (lo - c) + (hi - lo) * (0.5 - 0.5 * np.cos(np.pi * (k + 0.5) / nodes))
    exact = np.array([float(f(mp.mpf(c) + mp.mpf(y))) for y in ys])
    a_mat = np.vander(ys, deg + 1, increasing=True)[:, 1:]  # y, y^2, ..., y^deg
    return c, c0, rounded_fit(a_mat, exact - c0, 1 / ulp(exact), deg)


def quarters(e0, e1):
    return [(2.0 ** e * (1 + q / 4), 2.0 ** e * (1 + (q + 1) / 4)) for e in range(e0, e1) for q in range(4)]


def erf_interval0(deg=6, nodes=600):
    xs = 0.625 * (0.5 - 0.5 * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes))
    xs = xs[xs > 1e-4]
    exact = np.array([float(mp.erf(mp.mpf(x))) for x in xs])
    target = np.array([float(mp.erf(mp.mpf(x)) / mp.mpf(x) - 1) for x in xs])
    return rounded_fit(np.vander(xs * xs, deg, increasing=True), target, xs / ulp(exact), deg)


def literal(v: float) -> str:
    s = repr(f32(v)).replace("np.float32(", "").rstrip(")")
    return (s if ("e" in s or "." in s) else s + ".0") + "f"


def table(name, values, size=16):
    values = values + [values[-1]] * (size - len(values))
    rows = [", ".join(literal(v) for v in values[i:i + 8]) for i in range(0, size, 8)]
    return f"alignas(64) inline constexpr float {name}[{size}] = {{\n" + "".join(f"    {r},\n" for r in rows) + "};"


def emit(title, intervals, first_r):
    print(f"// {title}")
    cs = [0.0] + [c for c, _, _ in intervals]
    c0s = [0.0] + [c0 for _, c0, _ in intervals]
    print(table("kC", cs))
    print(table("kC0", c0s))
    for k in range(len(first_r)):
        print(table(f"kR{k}", [first_r[k]] + [r[k] for _, _, r in intervals]))


def main():
    tanh_iv = [(0.625, 0.75), (0.75, 0.875), (0.875, 1.0)] + quarters(0, 2) + [(4.0, 5.0), (5.0, 6.0), (6.0, 7.0),
                                                                               (7.0, 10.0)]
    emit("tanh_table", [fit_interval(mp.tanh, mp.atanh, lo, hi, 5) for lo, hi in tanh_iv], CEPHES_TANH_Q)
    erf_iv = [(0.625, 0.75), (0.75, 0.875), (0.875, 1.0)] + quarters(0, 2)
    emit("erf_table", [fit_interval(mp.erf, mp.erfinv, lo, hi, 6) for lo, hi in erf_iv], erf_interval0())


if __name__ == "__main__":
    main()
