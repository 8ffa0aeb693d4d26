"""The float32 activations of the fused kernels value by value (numerics/activation.h; on AVX-512 SiLU's
and GELU's-derivative exp is vmath::vexp_t16, a table of 2^(j/16)): BatchNormAct2d in evaluation
mode with running mean 0, running variance 1, weight 1, bias 0 and eps 1e-10 makes z = x exactly
(its constants rounded to float32 are 1 and 0: checked first, with the identity activation, bit for
bit, forward and backward), so y = act(x) and dx = dy * act'(x) on a dense grid of x.

Oracles: the float64 formulas (torch.sigmoid, erf and exp in float64) and torch's own float32 ops
(F.silu, aten.silu_backward, F.gelu, aten.gelu_backward) for the accuracy rule: the error in the
Frobenius norm at most twice torch's own or the rounding of the float64 result, whichever is larger
(tests/oracle.assert_accurate_vs_unfused). SiLU also value by value: within 4 ulp of the float64
value wherever |y| >= 2^-100 (3.1 ulp is the worst over every float32 in [-80, 80] on AVX-512,
2.3 through vmath::vexp at the other levels: docs/performance.md, "Norm + activation"); and at
+-inf, NaN, 0 and far from 0 the same values as torch's F.silu."""

from __future__ import annotations

import math

import pytest
import torch

import normlab
from normlab.ops.norm_act.op import HAS_FUSED
from tests.oracle import assert_accurate_vs_unfused

pytestmark = pytest.mark.skipif(not HAS_FUSED, reason="the fused C++ ops are not built")

C = 4


def _exact_z_layer(act: str) -> torch.nn.Module:
    m = normlab.nn.BatchNormAct2d(C, eps=1e-10, act_layer=act).eval()
    return m


def _grid(lo: float, hi: float, n: int) -> torch.Tensor:
    return torch.linspace(lo, hi, C * n, dtype=torch.float32).reshape(1, C, n // 64, 64)


def _run(act: str, x: torch.Tensor, dy: torch.Tensor):
    xg = x.clone().requires_grad_()
    with normlab.use_backend("cpu"):
        y = _exact_z_layer(act)(xg)
        y.backward(dy)
    return y.detach(), xg.grad


def test_the_grid_reaches_the_activation_exactly():
    x = _grid(-90, 90, 4096)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    y, dx = _run("identity", x, dy)
    assert torch.equal(y, x)
    assert torch.equal(dx, dy)


def _ulp(v: torch.Tensor) -> torch.Tensor:
    """float32's spacing at |v| (float64), 2^(e-24) for |v| in [2^(e-1), 2^e)."""
    _, e = torch.frexp(v.abs())
    return torch.ldexp(torch.ones_like(v), e - 24)


@pytest.mark.parametrize("lo,hi", [(-90.0, 90.0), (-20.0, 20.0), (-3.0, 3.0)])
def test_silu_value_by_value_and_the_accuracy_rule(lo, hi):
    x = _grid(lo, hi, 16384)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    y, dx = _run("silu", x, dy)
    xd = x.double()
    s = torch.sigmoid(xd)
    ref = xd * s
    gref = dy.double() * (s * (1 + xd * (1 - s)))
    assert_accurate_vs_unfused(y, torch.nn.functional.silu(x), ref, "silu")
    assert_accurate_vs_unfused(dx, torch.ops.aten.silu_backward(dy, x), gref, "silu'")
    big = ref.abs() >= 2.0**-100
    ulps = ((y.double() - ref).abs() / _ulp(ref))[big]
    assert ulps.max().item() <= 4.0, f"silu: {ulps.max().item():.2f} ulp at x = {xd[big][ulps.argmax()].item()}"


def test_silu_special_values_as_torch():
    # (no -0: the layer's z = (x - 0) * 1 + 0 is +0 there, before the activation)
    vals = [math.inf, -math.inf, math.nan, 0.0, -1e-30, 89.0, -89.0, 200.0, -200.0, 1e30, -1e30, 1.0, -1.0, 87.0,
            30.0, -30.0]
    x = torch.tensor(vals * 4, dtype=torch.float32).reshape(1, C, 4, 4)
    y, _ = _run("silu", x, torch.ones_like(x))
    want = torch.nn.functional.silu(x)
    torch.testing.assert_close(y, want, equal_nan=True, rtol=2**-22, atol=0)
    assert torch.equal(torch.signbit(y[~y.isnan()]), torch.signbit(want[~want.isnan()]))


@pytest.mark.parametrize("lo,hi", [(-12.0, 12.0), (-3.0, 3.0)])
def test_gelu_derivative_accuracy_rule(lo, hi):
    x = _grid(lo, hi, 16384)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    y, dx = _run("gelu", x, dy)
    xd = x.double()
    cdf = 0.5 * (1 + torch.erf(xd / math.sqrt(2)))
    gref = dy.double() * (cdf + xd * torch.exp(-0.5 * xd * xd) / math.sqrt(2 * math.pi))
    assert_accurate_vs_unfused(y, torch.nn.functional.gelu(x), xd * cdf, "gelu")
    assert_accurate_vs_unfused(dx, torch.ops.aten.gelu_backward(dy, x), gref, "gelu'")
