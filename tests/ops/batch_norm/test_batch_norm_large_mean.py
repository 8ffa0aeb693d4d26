"""BatchNorm's "cpu" kernels on inputs with a large mean (1e4, std 1), in every kernel path.

Each case runs one path of ``cpu/batch_norm_kernels.cpp`` (planes of one part or of several,
rows folded or not, in cache ("local") or not, channels-last, eval with and without the
parameters' gradients), and every output -- y, dx, dweight, dbias and the running statistics --
is checked against float64 math written out here from the derivation
(docs/derivations/batch_norm.md), not a kernel's output:

- bfloat16 / float16: within 2x the error of rounding the exact result to the dtype;
- float32: y, dx and the running statistics within 4x that error (dx is three float32 roundings
  of terms as large as itself); dweight and dbias within 32x (their products dy * x_hat are
  rounded to float32 before the float64 sum, and the sum cancels: sqrt(n) of them, ~1e-7
  relative at n = 1024 -- torch 2.13's own float32 dweight here is off by ~1e5x);
- float64: within 1e-9 relative (the float64 mean itself is rounded, by up to ulp(1e4) / 2 =
  9e-13, and dweight carries that rounding times sum(dy): ~1e-10 relative in the largest case).

Why the large mean: the kernels centre x on the mean rounded to the accumulation dtype (hi) and
correct for the rest (lo = mean - hi) in float64. Without that correction dx is ~50x less
accurate at a mean of 1e4 and nothing else notices.
"""

from __future__ import annotations

import math

import pytest
import torch

import normlab
import normlab.functional as NF
from tests.oracle import HALF, assert_within_rounding, rel_err

SHIFT = 1e4
SHIFT_HALF = 8.0  # bfloat16 has 3 digits: a mean of 1e4 would leave every value the same
EPS = 1e-5
MOMENTUM = 0.1

# name -> (shape, memory format): one per kernel path
CASES = {
    "planes_one_part": ((4, 3, 16, 16), torch.contiguous_format),        # S = 256, N*S = 1024: P = 1
    "planes_two_parts": ((2, 3, 256, 160), torch.contiguous_format),     # N*S = 81920: P = 2
    "planes_3d": ((2, 2, 8, 8, 8), torch.contiguous_format),             # S = 512
    "short_planes": ((8, 5, 7, 7), torch.contiguous_format),             # S = 49 < plane_min, < 8 N: rows
    "few_rows_planes": ((2, 6, 8, 8), torch.contiguous_format),          # S = 64 >= 8 N: planes
    "channels_last_narrow": ((8, 5, 7, 7), torch.channels_last),         # rows of 5: folded
    "channels_last_wide": ((4, 80, 6, 6), torch.channels_last),          # rows of 80: not folded
    "channels_last_3d": ((2, 4, 3, 5, 6), torch.channels_last_3d),
    "channels_last_fold_tail": ((1, 2, 23, 23), torch.channels_last),   # 529 rows of 2: 4 x 128 folded, 17 not
    "short_planes_fold_tail": ((257, 3, 4, 4), torch.contiguous_format),  # 257 rows of 48: 51 x 5 folded, 2 not
    "rows_fold_tail": ((1031, 7), torch.contiguous_format),              # 1031 rows of 7: 28 x 36 folded, 23 not
    "rows_many_groups": ((4096, 70), torch.contiguous_format),           # several row groups merged
    "rows_local": ((64, 1100), torch.contiguous_format),                 # whole channels in one task
}


def _data(shape, fmt, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    shift = SHIFT_HALF if dtype in HALF else SHIFT
    x = (torch.randn(shape, generator=g, dtype=torch.float64) + shift).to(dtype).contiguous(memory_format=fmt)
    dy = (torch.randn(shape, generator=g, dtype=torch.float64) + 0.3).to(dtype).contiguous(memory_format=fmt)
    w = (1 + 0.5 * torch.randn(c, generator=g, dtype=torch.float64)).to(dtype)
    b = torch.randn(c, generator=g, dtype=torch.float64).to(dtype)
    rm = (shift + 0.5 * torch.randn(c, generator=g, dtype=torch.float64)).to(dtype)
    rv = (0.5 + torch.rand(c, generator=g, dtype=torch.float64)).to(dtype)
    return x, dy, w, b, rm, rv


def _exact(x, dy, w, b, rm, rv, training, center):
    """y, dx, dw, db, running_mean, running_var in float64 from the (rounded) inputs, computed on
    x - center and rm - center (exact in float64 near the center: float64 itself loses ~1e-10 of
    dweight computing x - mean at a mean of 1e4; the shift changes none of the results but the
    running mean, which gets the center back)."""
    x, dy, w, b, rm, rv = (t.double() for t in (x, dy, w, b, rm, rv))
    x, rm = x - center, rm - center
    dims = [0] + list(range(2, x.dim()))
    per_c = [1, -1] + [1] * (x.dim() - 2)
    n = x.numel() // x.shape[1]
    if training:
        mean = x.mean(dims)
        var = ((x - mean.view(per_c)) ** 2).mean(dims)  # biased: the normalisation's
        rm = (1 - MOMENTUM) * rm + MOMENTUM * mean
        rv = (1 - MOMENTUM) * rv + MOMENTUM * var * n / (n - 1)  # unbiased: the running estimate's
    else:
        mean, var = rm, rv
    rstd = 1 / torch.sqrt(var + EPS)
    xhat = (x - mean.view(per_c)) * rstd.view(per_c)
    y = xhat * w.view(per_c) + b.view(per_c)
    db = dy.sum(dims)
    dw = (dy * xhat).sum(dims)
    if training:  # term 1 - term 2 - term 3
        dx = (w * rstd).view(per_c) * (dy - (db / n).view(per_c) - xhat * (dw / n).view(per_c))
    else:
        dx = dy * (w * rstd).view(per_c)
    return y, dx, dw, db, rm + center, rv


def _normlab(x, dy, w, b, rm, rv, training, params_grad):
    xl = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    wl, bl = w.clone().requires_grad_(params_grad), b.clone().requires_grad_(params_grad)
    rm, rv = rm.clone(), rv.clone()
    with normlab.use_backend("cpu"):
        y = NF.batch_norm(xl, rm, rv, wl, bl, training, MOMENTUM, EPS)
        y.backward(dy)
    return y.detach(), xl.grad, wl.grad, bl.grad, rm, rv


def _assert_accurate(got, exact, dtype, name, what):
    if dtype == torch.float64:
        assert rel_err(got, exact) < 1e-9, (what, rel_err(got, exact))
    elif dtype in HALF:
        assert_within_rounding(got, exact, 2.0, what)
    else:
        assert_within_rounding(got, exact, 32.0 if name in ("dw", "db") else 4.0, what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode", ["train", "eval", "eval_frozen_params"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_output_within_twice_rounding_at_mean_1e4(case, mode, dtype):
    shape, fmt = CASES[case]
    training, params_grad = mode == "train", mode != "eval_frozen_params"
    x, dy, w, b, rm, rv = _data(shape, fmt, dtype, seed=list(CASES).index(case))
    got = _normlab(x, dy, w, b, rm, rv, training, params_grad)
    exact = _exact(x, dy, w, b, rm, rv, training, SHIFT_HALF if dtype in HALF else SHIFT)
    assert got[1].stride() == x.stride(), "dx keeps the input's layout"
    names = ["y", "dx", "dw", "db", "running_mean", "running_var"]
    for name, a, r in zip(names, got, exact):
        if a is None:
            assert name in ("dw", "db") and not params_grad
            continue
        if not training and name.startswith("running"):
            assert torch.equal(a, (rm, rv)[name == "running_var"]), name  # eval leaves them as they were
            continue
        _assert_accurate(a, r, dtype, name, f"{case} {mode} {name}")


def test_cases_take_the_paths_they_name():
    """The shapes above sit on the sides of the kernels' thresholds they are named for."""
    from normlab.ops import extension

    k = extension.load().batch_norm_constants()
    n, c, *sp = CASES["planes_one_part"][0]
    assert math.prod(sp) >= k["plane_min"] and n * math.prod(sp) <= k["part_values"]
    n, c, *sp = CASES["planes_two_parts"][0]
    assert k["part_values"] < n * math.prod(sp) <= 2 * k["part_values"]
    n, c, *sp = CASES["short_planes"][0]
    assert math.prod(sp) < k["plane_min"] and math.prod(sp) < 8 * n  # rows, not the few-rows planes
    assert CASES["channels_last_narrow"][0][1] < k["fold_below"] <= CASES["channels_last_wide"][0][1]
    # rows whose count no fold near fold_width / width divides: the last R mod F rows unfolded
    for name, (rows, width, s_len) in {"channels_last_fold_tail": (529, 2, 1), "short_planes_fold_tail": (257, 48, 16),
                                       "rows_fold_tail": (1031, 7, 1)}.items():
        shape = CASES[name][0]
        assert rows * width == math.prod(shape) and width == shape[1] * s_len, name
        for backward in (False, True):
            fold, *_, tail = extension.load().batch_norm_geometry(rows, width, s_len, backward)
            assert fold == k["fold_width"] // width and tail == rows % fold and rows // fold > 1 and tail > 0, name
