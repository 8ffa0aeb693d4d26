"""The float32 activations of the fused kernels value by value (numerics/activation.h; on AVX-512 SiLU's
and GELU's-derivative exp is vmath::vexp_table, a table of 2^(j/16)): BatchNormAct2d in evaluation
mode with running mean 0, running variance 1, weight 1, bias 0 and eps 1e-10 makes z = x exactly
(its constants rounded to float32 are 1 and 0: checked first, with the identity activation, bit for
bit, forward and backward), so y = act(x) and dx = dy * act'(x) on a dense grid of x.

Oracles: the float64 formulas (torch.sigmoid, erf and exp in float64) and torch's own float32 ops
(F.silu, aten.silu_backward, F.gelu, aten.gelu_backward) for the accuracy rule: the error in the
Frobenius norm at most twice torch's own or the rounding of the float64 result, whichever is larger
(tests/oracle.assert_accurate_vs_unfused). SiLU also value by value: within 4 ulp of the float64
value wherever |y| >= 2^-100 (3.1 ulp is the worst over every float32 in [-80, 80] on AVX-512,
2.6 over 2^22 points of each of [-88, -20], [-20, -3], [-3, 3], [3, 20], [20, 88] by AVX2's table
of 8, 2.3 through vmath::vexp on the baseline: docs/performance.md, "Norm + activation"); and at
+-inf, NaN, 0 and far from 0 the same values as torch's F.silu.

SiLU stored as bfloat16 / float16 (on AVX-512 computed only to the stored type's precision:
numerics/activation.h, detail::sigmoid_low): every finite value of the type in [-200, 200] through
the same exact-z layer (float32 parameters), value by value against float64 -- each result one of
the two neighbours of the exact value in the stored type; the derivative within a unit in the last
place plus 2^-10 / 2^-12 of its terms' size -- and the accuracy rule against torch's ops in the same
dtype."""

from __future__ import annotations

import math

import pytest
import torch

import normlab
from normlab.ops.extension import cpu_level
from tests.oracle import assert_accurate_vs_unfused

HAS_FUSED = "cpu" in normlab.available_backends()  # (the fused ops come with the C++ extension)

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


# --- SiLU stored as bfloat16 / float16 (numerics/activation.h: on AVX-512 computed only as precisely as
# the stored type keeps, detail::sigmoid_low; elsewhere the float32 formula, then the rounding).

HALF_BITS = {torch.bfloat16: (8, -133), torch.float16: (11, -24)}  # significant bits, log2 of the least subnormal
# silu at the stored precision runs at the AVX-512 level only; the others keep the float32 formula
# z / (1 + exp(-z)), whose exp overflows past z = -88 (there it gives -0, as torch's formula does past
# -88.7, where z exp(z) is still a normal bfloat16): the value-by-value checks start at -88 there.
LOW_SILU = (cpu_level() or {}).get("level") == "v4"


def _every_finite(dtype: torch.dtype, lo: float, hi: float) -> torch.Tensor:
    """Every finite value of the 16-bit ``dtype`` in [lo, hi] (both signs of 0), as a (1, C, *, 64) tensor."""
    v = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    v = v[torch.isfinite(v) & (v >= lo) & (v <= hi)]
    n = -(-v.numel() // (C * 64)) * C * 64
    v = torch.cat([v, torch.zeros(n - v.numel(), dtype=dtype)])
    return v.reshape(1, C, -1, 64)


def _ulp_of(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``dtype``'s spacing at |v| (v float64): 2^(e - p) for |v| in [2^(e-1), 2^e), p its significant
    bits, at least the least subnormal."""
    p, least = HALF_BITS[dtype]
    _, e = torch.frexp(v.abs())
    return torch.ldexp(torch.ones_like(v), (e - p).clamp(min=least))


def _run_half(act: str, x: torch.Tensor, dy: torch.Tensor):
    """BatchNormAct2d (float32 parameters, as timm keeps them) on a half-precision x: z = x exactly
    (float32 holds every bfloat16 and float16 value), y and dx in x's dtype."""
    xg = x.clone().requires_grad_()
    with normlab.use_backend("cpu"):
        y = _exact_z_layer(act)(xg)
        y.backward(dy)
    return y.detach(), xg.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_grid_reaches_the_activation_exactly(dtype):
    x = _every_finite(dtype, -200, 200)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    y, dx = _run_half("identity", x, dy)
    assert y.dtype == dtype and dx.dtype == dtype
    assert torch.equal(y, x) and torch.equal(dx, dy)


@pytest.mark.parametrize("lo,hi", [(-200.0, 200.0), (-3.0, 3.0)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_stored_as_half_value_by_value_and_the_accuracy_rule(dtype, lo, hi):
    """Every finite bfloat16 / float16 x in [lo, hi]. Forward: each y one of the two neighbours of
    the float64 silu(x) in the stored type (within one unit in its last place: faithfully rounded;
    float32's formula rounded once is within half a unit), and the accuracy rule against torch's
    F.silu in the same dtype. Backward: dx = dy * silu'(x) within a unit in the last place of the
    float64 value plus 2^-10 (bfloat16) / 2^-12 (float16) of |dy| (|s| + |x s (1 - s)|), the size
    of silu'(x)'s two terms (their sum cancels near x = -1.28, where the error of the terms, not of
    the sum, is what any float32-or-coarser evaluation has), and the accuracy rule against torch's
    aten.silu_backward in the same dtype."""
    x = _every_finite(dtype, lo, hi)
    dy = (torch.rand(x.shape, generator=torch.Generator().manual_seed(5)) * 4 - 2).to(dtype)
    y, dx = _run_half("silu", x, dy)
    xd = x.double()
    s = torch.sigmoid(xd)
    ref = xd * s
    gref = dy.double() * (s * (1 + xd * (1 - s)))
    assert_accurate_vs_unfused(y, torch.nn.functional.silu(x), ref, f"silu {dtype}")
    assert_accurate_vs_unfused(dx, torch.ops.aten.silu_backward(dy, x), gref, f"silu' {dtype}")
    err = (y.double() - ref).abs()
    scope = torch.ones_like(xd, dtype=torch.bool) if LOW_SILU else xd >= -88
    err = torch.where(scope, err, 0.0)
    over = err >= _ulp_of(ref, dtype)
    assert not over.any(), f"silu {dtype}: {int(over.sum())} values a unit or more off, x = {xd[over][:5].tolist()}"
    # The design's own budget (docs/derivations/norm_act.md, "SiLU at the stored precision"): sigma's
    # relative error under 1.5 e_exp + 2^-14 (vrcp14ps) + a few float32 roundings, e_exp the rest of
    # exp(r) = 1 + r (bfloat16) or 1 + r + r^2 / 2 (float16) on |r| <= ln 2 / 32; a value's unit in
    # the last place is at least 2^-p of it (p significant bits). So at most half a unit (the
    # rounding) plus 2^p times that budget: 0.61 ulp (bfloat16), 0.63 (float16). (The float32
    # formula, below AVX-512, is within half a unit and float32's error.)
    p = HALF_BITS[dtype][0]
    r = math.log(2) / 32 + 1e-6
    e_exp = (r * r / 2 if dtype == torch.bfloat16 else r**3 / 6) / math.exp(-r)
    budget = 0.5 + 2.0**p * (1.5 * e_exp + 2.0**-14 + 8 * 2.0**-24)
    worst = (err / _ulp_of(ref, dtype)).max().item()
    assert worst <= budget, f"silu {dtype}: {worst:.3f} ulp > the design's {budget:.3f}"
    terms = dy.double().abs() * (s.abs() + (xd * s * (1 - s)).abs())
    gbound = _ulp_of(gref, dtype) + terms * (2.0**-10 if dtype == torch.bfloat16 else 2.0**-12)
    gover = ((dx.double() - gref).abs() > gbound) & scope
    assert not gover.any(), f"silu' {dtype}: {int(gover.sum())} values off, x = {xd[gover][:5].tolist()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_stored_as_half_special_values_as_torch(dtype):
    vals = [math.inf, -math.inf, math.nan, 0.0, 1.0, -1.0, 30.0, -30.0, 60000.0, -60000.0, 1e-7, -1e-7, 5.0, -5.0,
            -17.0, 17.0]
    x = torch.tensor(vals * 4, dtype=torch.float32).to(dtype).reshape(1, C, 4, 4)
    y, dx = _run_half("silu", x, torch.ones_like(x))
    for got, want in ((y, torch.nn.functional.silu(x)), (dx, torch.ops.aten.silu_backward(torch.ones_like(x), x))):
        assert torch.equal(got.isnan(), want.isnan())
        ok = ~want.isnan()
        torch.testing.assert_close(got[ok].double(), want[ok].double(), rtol=2.0**-7, atol=0)
        assert torch.equal(torch.signbit(got[ok & (want != 0)]), torch.signbit(want[ok & (want != 0)]))
