"""The accuracy of DyT's float32 tanh and of its derivative 1 - tanh^2 in the C++ kernels, in
ulp of the exact value (float64 torch.tanh, rounded to nothing), over every float32 in a range
(docs/derivations/dyt.md, "Accuracy"): DyT with alpha = 1 and no affine gives tanh(x), and its
backward with dy = 1 gives dx = 1 - tanh(x)^2.

    python scripts/dyt-tanh-ulp.py                 # every float in [2^-20, 44], both signs (1 - tanh^2: |x| < 43.5)
    python scripts/dyt-tanh-ulp.py --step 64       # every 64th
"""
import argparse

import numpy as np
import torch

import normlab.functional as F


def ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|got - exact| in units of the float32 spacing at |exact| (2^(e-23) for exact in [2^e, 2^(e+1)))."""
    e = torch.frexp(exact.abs())[1].double()
    return (got.double() - exact).abs() / torch.ldexp(torch.ones_like(exact), (e - 24).int())


def scan(lo: float, hi: float, step: int, chunk: int = 1 << 22):
    a = int(np.array(lo, np.float32).view(np.int32))
    b = int(np.array(hi, np.float32).view(np.int32))
    worst_t = worst_s = (0.0, 0.0)
    one = torch.ones(1)
    for start in range(a, b + 1, chunk * step):
        bits = np.arange(start, min(b + 1, start + chunk * step), step, dtype=np.int32)
        x = torch.from_numpy(bits.view(np.float32).copy())
        for sign in (1.0, -1.0):
            xs = (sign * x).requires_grad_()
            t = F.dyt(xs, (xs.shape[0],), one, None, None)
            (dx,) = torch.autograd.grad(t, xs, torch.ones_like(t))
            x64 = xs.detach().double()
            t64 = torch.tanh(x64)
            s64 = 1.0 / torch.cosh(x64) ** 2
            et = ulps(t.detach(), t64)
            normal = x64.abs() < 43.5  # 1 - tanh^2 < 2^-123 past it (0 past 2|x| = 88, near float32's subnormals)
            es = torch.where(normal, ulps(dx, s64), torch.zeros_like(s64))
            i, j = int(et.argmax()), int(es.argmax())
            if et[i] > worst_t[0]:
                worst_t = (float(et[i]), float(x64[i]))
            if es[j] > worst_s[0]:
                worst_s = (float(es[j]), float(x64[j]))
    return worst_t, worst_s


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lo", type=float, default=2.0 ** -20)
    p.add_argument("--hi", type=float, default=44.0)
    p.add_argument("--step", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    (t, tx), (s, sx) = scan(a.lo, a.hi, a.step)
    print(f"every {a.step}th float32 in +-[{a.lo:g}, {a.hi:g}]: tanh max {t:.3f} ulp (at x = {tx:.9g}); "
          f"1 - tanh^2 max {s:.3f} ulp (at x = {sx:.9g})")


if __name__ == "__main__":
    main()
