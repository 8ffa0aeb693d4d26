"""GroupNorm's "cpu" kernels on inputs with a large mean (1e4, std 1), in every kernel path.

Each case runs one path of the GroupNorm kernels (``cpu/group_norm_kernels.cpp``: short group rows
a block at a time, rows of 256-16384 values one at a time, long rows in parts, the S == 1 view;
``cpu/group_norm_nhwc_kernels.cpp``: channels-last; InstanceNorm as G == C), and every output --
y, dx, dweight, dbias -- is checked against float64 math written from the derivation (tests/oracle.group_norm_f64)
(docs/derivations/group_norm.md), not a kernel's output. Bounds as BatchNorm's
(tests/ops/batch_norm/test_batch_norm_large_mean.py):

- bfloat16 / float16: within 2x the error of rounding the exact result to the dtype;
- float32: y and dx within 6x that error. y = (x - hi) * a + b2: x - hi is exact, but a = rstd *
  w, b2, the product and the sum are four roundings of terms as large as y, and the statistics'
  float32 sums a fifth (over six seeds the contiguous and channels-last kernels gave 1.7x-5.1x;
  torch's own float32 GroupNorm here 1e7x-1e10x). dx = (dy * a - (x - m) * t3) - t2 rounds a,
  the two products, t3, t2 and the two differences: seven roundings of terms as large as dx
  (4.04x at the baseline level's lane width, 2-4x at v4). dweight and dbias within 32x (their
  products are rounded to float32 before they are summed);
- float64: within 1e-9 relative.

Why the large mean: the kernels centre x on the mean rounded to float32 (off by up to ulp(1e4) / 2
= 5e-4 at 1e4); a backward that centres on that rounded mean without correcting for the rest
puts dweight off by 5e-4 * sum(dy) -- ~1e-3 relative here -- and dx's third term with it.
"""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from tests.oracle import group_norm_f64, HALF, assert_within_rounding, rel_err

SHIFT = 1e4
SHIFT_HALF = 8.0  # bfloat16 has 3 digits: a mean of 1e4 would leave every value the same
EPS = 1e-5

# name -> (shape, groups, memory format): one per kernel path
CASES = {
    "rows_short": ((8, 6, 5, 5), 3, torch.contiguous_format),             # rows of 50: blocks of 8 rows
    "rows_long": ((3, 8, 40, 40), 2, torch.contiguous_format),            # rows of 6400 values
    "rows_parts": ((1, 4, 200, 200), 2, torch.contiguous_format),         # rows of 80000: parts
    "instance": ((2, 3, 30, 31), 3, torch.contiguous_format),             # G == C
    "s1": ((64, 48), 4, torch.contiguous_format),                         # (N, C): S == 1
    "s1_wide_groups": ((32, 96), 2, torch.contiguous_format),             # S == 1, groups wider than a vector
    "rows_streamed": ((12, 128, 56, 56), 32, torch.contiguous_format),    # x and y over a 32 MB cache (y streams)
    "channels_last": ((4, 32, 9, 9), 8, torch.channels_last),
    "channels_last_one_group": ((2, 64, 12, 12), 1, torch.channels_last),
    "channels_last_instance": ((2, 16, 20, 20), 16, torch.channels_last),
    "channels_last_3d": ((2, 8, 4, 5, 6), 2, torch.channels_last_3d),
    # C off a multiple of the lanes: the rows read as virtual rows of lcm(C, lanes) values where a
    # sample holds at least that many rows (C = 3), each row's last channels a partial vector where not
    "channels_last_view": ((2, 3, 8, 8), 1, torch.channels_last),
    "channels_last_no_view": ((3, 45, 7, 7), 1, torch.channels_last),
}


def _data(shape, fmt, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    shift = SHIFT_HALF if dtype in HALF else SHIFT
    x = (torch.randn(shape, generator=g, dtype=torch.float64) + shift).to(dtype).contiguous(memory_format=fmt)
    dy = (torch.randn(shape, generator=g, dtype=torch.float64) + 0.3).to(dtype).contiguous(memory_format=fmt)
    w = (1 + 0.5 * torch.randn(c, generator=g, dtype=torch.float64)).to(dtype)
    b = torch.randn(c, generator=g, dtype=torch.float64).to(dtype)
    return x, dy, w, b


def _normlab(x, dy, w, b, groups):
    xl = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
    with normlab.use_backend("cpu"):
        y = NF.group_norm(xl, groups, wl, bl, EPS)
        y.backward(dy)
    return y.detach(), xl.grad, wl.grad, bl.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_every_output_within_twice_rounding_at_mean_1e4(case, dtype):
    shape, groups, fmt = CASES[case]
    x, dy, w, b = _data(shape, fmt, dtype, seed=list(CASES).index(case))
    got = _normlab(x, dy, w, b, groups)
    exact = group_norm_f64(x, w, b, dy, groups, SHIFT_HALF if dtype in HALF else SHIFT, EPS)
    assert got[1].stride() == x.stride(), "dx keeps the input's layout"
    for name, a, r in zip(["y", "dx", "dw", "db"], got, exact):
        what = f"{case} {name}"
        if dtype == torch.float64:
            assert rel_err(a, r) < 1e-9, (what, rel_err(a, r))
        elif dtype in HALF:
            assert_within_rounding(a, r, 2.0, what)
        else:
            assert_within_rounding(a, r, 6.0 if name in ("y", "dx") else 32.0, what)
