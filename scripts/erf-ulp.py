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
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for level in a.levels.split(","):
            worst, where, bits = scan(a.fn, a.lo, a.hi, a.step, level, d)
            print(f"{level}: {a.fn}, every {a.step}th float32 in +-[{a.lo:g}, {a.hi:g}]: max {worst:.3f} ulp "
                  f"(at x = {where:.9g}); bits {bits}")


if __name__ == "__main__":
    main()
