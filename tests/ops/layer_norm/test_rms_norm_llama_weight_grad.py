"""RMSNorm with ``casting="llama"``: the weight multiplies ``x_hat`` rounded to the input's dtype, so
its gradient is ``sum over rows of dy * round(x_hat)`` -- the value the weight saw, not the
unrounded ``x_hat``. Oracle: the float64 formula, ``x_hat`` rounded to the input's dtype there."""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF

EPS = 1e-6


def _dw_oracle(x: torch.Tensor, dy: torch.Tensor, rounded: bool) -> torch.Tensor:
    """``sum over rows of dy * x_hat`` in float64 (``x_hat`` rounded to ``x``'s dtype if ``rounded``),
    then rounded once to ``x``'s dtype."""
    x64 = x.double()
    x_hat = x64 * torch.rsqrt(x64.square().mean(dim=-1, keepdim=True) + EPS)
    if rounded:
        x_hat = x_hat.to(x.dtype).double()
    return (dy.double() * x_hat).sum(dim=0).to(x.dtype)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_llama_weight_gradient_sums_dy_times_the_rounded_x_hat(backend, dtype):
    g = torch.Generator().manual_seed(7)
    rows, cols = 64, 256
    x = torch.randn(rows, cols, generator=g).to(dtype)
    dy = torch.randn(rows, cols, generator=g).to(dtype)
    w = (torch.rand(cols, generator=g) + 0.5).to(dtype).requires_grad_(True)
    want = _dw_oracle(x, dy, rounded=True)
    unrounded = _dw_oracle(x, dy, rounded=False)
    # the two readings of the formula differ in many columns at this size, so the test can tell them apart
    assert (want != unrounded).float().mean() > 0.1
    with normlab.use_backend(backend):
        y = NF.rms_norm(x, (cols,), w, EPS, casting="llama")
    y.backward(dy)
    # the float32 sums round to the float64 oracle's value but for (rare) near-ties
    mismatched = (w.grad != want).float().mean().item()
    assert mismatched <= 0.01, mismatched
