"""The accuracy of numerics/vmath.h's float32 erf (GELU's, docs/derivations/norm_act.md) and tanh
(DyT's forward, docs/derivations/dyt.md), in ulp of the exact value, over every float32 in a
range, at each x86-64 level the kernels are built for; and whether two levels give the same bits.

The header is compiled on its own (no torch) into a small scanner, once per level (``g++
-march=x86-64-vN``, the extension's flags: -O3 -ffp-contract=off -fno-math-errno), which runs the
vector function over every float32 of +-[lo, hi] and compares it with the C library's float64
erf/tanh (within 1 ulp of float64: 2^-29 of a float32 ulp), in units of the float32 spacing at the
exact value (2^(e-24) for |exact| in [2^(e-1), 2^e)); and hashes the results' bits.

    python scripts/erf-ulp.py                          # erf, every float32 in +-[2^-30, 5], v1 v3 v4
    python scripts/erf-ulp.py --fn tanh --hi 12        # DyT's forward tanh
    python scripts/erf-ulp.py --levels v4 --step 64    # every 64th, one level
    python scripts/erf-ulp.py --time                   # ns a value, one thread, 16384 values in cache

``--time`` times the function over 16384 values of [-2, 2) (DyT's ``tanh(0.5 x)``: the scale
included), the least of 15 rounds of CPU time, and for tanh also the exp form (the header built
with -DNORMLAB_VMATH_NO_TABLE, as the baseline level computes it) and the backward's tanh with
1 - tanh^2 (``vtanh<true>``).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import tempfile

CSRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "normlab" / "csrc"
MARCH = {"v1": "x86-64", "v3": "x86-64-v3", "v4": "x86-64-v4"}

SOURCE = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "numerics/vmath.h"
using namespace normlab;
using vf = vec<float>;
constexpr int L = lanes<float>;
int main(int argc, char** argv) {
  const bool is_erf = argv[1][0] == 'e';
  float lo = std::strtof(argv[2], nullptr), hi = std::strtof(argv[3], nullptr);
  const unsigned step = unsigned(std::atoi(argv[4]));
  uint32_t a, b;
  std::memcpy(&a, &lo, 4);
  std::memcpy(&b, &hi, 4);
  double worst = 0, worst_x = 0;
  uint64_t hash = 1469598103934665603ull;
  float in[L], out[L];
  for (int sign = 0; sign < 2; ++sign)
    for (uint64_t i = a; i <= b; i += uint64_t(step) * L) {
      for (int k = 0; k < L; ++k) {
        uint64_t v = i + uint64_t(k) * step;
        uint32_t u = uint32_t(v > b ? b : v) | (sign ? 0x80000000u : 0u);
        std::memcpy(&in[k], &u, 4);
      }
      vf x, y;
      std::memcpy(&x, in, sizeof x);
#if NORMLAB_VMATH_TANH_TABLE
      y = is_erf ? vmath::verf(x) : vmath::vtanh_by_table(x);
#else
      y = is_erf ? vmath::verf(x) : vmath::vtanh<false>(x);
#endif
      std::memcpy(out, &y, sizeof y);
      for (int k = 0; k < L; ++k) {
        if (i + uint64_t(k) * step > b) break;  // (the last vector's repeats of b: not counted)
        uint32_t u;
        std::memcpy(&u, &out[k], 4);
        hash = (hash ^ u) * 1099511628211ull;
        const double e = is_erf ? std::erf(double(in[k])) : std::tanh(double(in[k]));
        int ex;
        std::frexp(std::fabs(e), &ex);
        const double err = std::fabs(double(out[k]) - e) / std::ldexp(1.0, ex - 24);
        if (err > worst) worst = err, worst_x = in[k];
      }
    }
  std::printf("%.4f %.9g %016llx\n", worst, worst_x, (unsigned long long)hash);
}
"""


TIMING = r"""
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>
#include "numerics/vmath.h"
using namespace normlab;
using vf = vec<float>;
constexpr int L = lanes<float>;
template <int Which> __attribute__((noinline)) void run(const float* x, float* y, int n) {
  for (int i = 0; i < n; i += L) {
    vf v, s;
    std::memcpy(&v, x + i, sizeof v);
    if constexpr (Which == 0) v = vmath::verf(v);
    else if constexpr (Which == 1) v = vmath::vtanh<false>(v * 0.5f);
    else v = vmath::vtanh<true>(v * 0.5f, &s) + s;
    std::memcpy(y + i, &v, sizeof v);
  }
}
static double now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(int argc, char** argv) {
  const int which = argv[1][0] - '0', n = 1 << 14;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = -2.0f + 4.0f * float((i * 7919) % n) / float(n);
  double best = 1e30;
  for (int r = 0; r < 15; ++r) {
    const double t0 = now();
    for (int k = 0; k < 100; ++k) {
      if (which == 0) run<0>(x.data(), y.data(), n);
      else if (which == 1) run<1>(x.data(), y.data(), n);
      else run<2>(x.data(), y.data(), n);
    }
    best = std::min(best, (now() - t0) / (100.0 * n));
  }
  std::printf("%.3f\n", best + 0.0 * y[1]);
}
"""


def time_ns(what: int, level: str, workdir: str, no_table: bool = False) -> float:
    """ns a value of erf (0), the forward's tanh (1) or tanh with 1 - tanh^2 (2) at ``level``."""
    src = os.path.join(workdir, "time.cpp")
    exe = os.path.join(workdir, f"time_{level}{'_exp' if no_table else ''}")
    if not os.path.exists(exe):
        pathlib.Path(src).write_text(TIMING)
        subprocess.run(["g++", "-O3", "-std=c++20", "-ffp-contract=off", "-fno-math-errno", f"-march={MARCH[level]}",
                        f"-I{CSRC}", src, "-o", exe] + (["-DNORMLAB_VMATH_NO_TABLE"] if no_table else []), check=True)
    return float(subprocess.run([exe, str(what)], check=True, capture_output=True, text=True).stdout)


def scan(fn: str, lo: float, hi: float, step: int, level: str, workdir: str) -> tuple[float, float, str]:
    """(worst ulp, where, a hash of the results' bits) of vmath's ``fn`` at ``level``."""
    src = os.path.join(workdir, "scan.cpp")
    exe = os.path.join(workdir, f"scan_{level}")
    if not os.path.exists(exe):
        pathlib.Path(src).write_text(SOURCE)
        subprocess.run(["g++", "-O3", "-std=c++20", "-ffp-contract=off", "-fno-math-errno", f"-march={MARCH[level]}",
                        f"-I{CSRC}", src, "-o", exe], check=True)
    out = subprocess.run([exe, fn, repr(lo), repr(hi), str(step)], check=True, capture_output=True, text=True).stdout
    worst, where, bits = out.split()
    return float(worst), float(where), bits


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fn", choices=("erf", "tanh"), default="erf")
    p.add_argument("--lo", type=float, default=2.0 ** -30)
    p.add_argument("--hi", type=float, default=5.0)
    p.add_argument("--step", type=int, default=1)
    p.add_argument("--levels", default="v1,v3,v4")
    p.add_argument("--time", action="store_true", help="time the functions instead of scanning them")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if a.time:
            for level in a.levels.split(","):
                print(f"{level}: erf {time_ns(0, level, d):.3f} ns/value; tanh {time_ns(1, level, d):.3f} "
                      f"(through exp: {time_ns(1, level, d, True):.3f}); tanh with 1 - tanh^2 {time_ns(2, level, d):.3f}")
            return
        for level in a.levels.split(","):
            worst, where, bits = scan(a.fn, a.lo, a.hi, a.step, level, d)
            print(f"{level}: {a.fn}, every {a.step}th float32 in +-[{a.lo:g}, {a.hi:g}]: max {worst:.3f} ulp "
                  f"(at x = {where:.9g}); bits {bits}")


if __name__ == "__main__":
    main()
