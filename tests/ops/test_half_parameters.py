"""float16 parameters reach the kernels exactly: every one of the 65536 float16 bit patterns as a
weight comes out of a GroupNorm whose normalised values are exactly +1 and -1 as itself.

The entry code that reads parameters (and the baseline-level kernels) is compiled without F16C;
its float16 -> float32 conversion moves the bits itself (``numerics/half.h``) instead of calling
libgcc once a value. The oracle is the weight itself: with one channel a group, the values +1
and -1 in each, and eps = 0, the mean is 0, the variance 1, rstd 1, so y = +-weight, which float16
holds exactly (subnormals included); a NaN weight gives NaN. (An infinite weight meets the
bias term's 0 * inf, NaN or not by layout, as torch.nn's is NaN: not a test of the conversion.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import normlab
from normlab.ops import extension

pytestmark = pytest.mark.skipif(not extension.available(), reason="needs the C++ extension")

HOME = str(Path(normlab.__file__).resolve().parents[1])

_CHECK = r"""
import torch, normlab
w = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)  # every pattern
c = w.numel()
x = torch.tensor([1.0, -1.0], dtype=torch.float16).repeat(c).reshape(1, c, 2)
for fmt in ("rows", "channels_last"):
    xi = x if fmt == "rows" else x.reshape(1, c, 2, 1).contiguous(memory_format=torch.channels_last)
    with normlab.use_backend("cpu"):
        y = normlab.functional.group_norm(xi, c, w, torch.zeros(c, dtype=torch.float16), eps=0.0)
    y = y.reshape(1, c, 2)
    fin = w.isfinite()  # the 63488 finite patterns: y = +-w exactly
    torch.testing.assert_close(y[0, fin, 0], w[fin], rtol=0, atol=0)
    torch.testing.assert_close(y[0, fin, 1], -w[fin], rtol=0, atol=0)
    assert w.isnan().sum() == 2046 and y[0, w.isnan()].isnan().all()  # NaN weights: NaN
    # among the finite ones, the subnormals: where a bit-moving conversion goes wrong first
    assert ((w != 0) & (w.abs() < 2 ** -14)).sum() == 2 * 1023
print("ok")
"""


def test_every_float16_weight_reaches_the_output_exactly():
    exec(compile(_CHECK, "<half-parameters>", "exec"), {})


def test_every_float16_weight_reaches_the_output_exactly_at_the_baseline_level():
    """The same in a child bound to the baseline level (v1: no F16C anywhere, the kernels' own
    conversions too)."""
    if extension.build_info().get("level") != "dispatch":
        pytest.skip("needs the dispatched build of the C++ extension")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["NORMLAB_CPU_LEVEL"] = "v1"
    env["PYTHONPATH"] = os.pathsep.join([HOME, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")
