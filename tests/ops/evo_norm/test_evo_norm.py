"""EvoNorm B0 and S0: the hand-derived backward against float64 finite differences (gradcheck,
gradgradcheck) and against autograd of the paper's expressions in float64; the running variance."""

from __future__ import annotations

import pytest
import torch

import normlab.functional as NF
from normlab.ops.evo_norm import EvoB0Function, EvoS0Function

F64 = torch.float64


def _b0(x, rv, w, b, v, training, eps):
    var = x.var((0, 2, 3), unbiased=False) if training else rv
    left = torch.sqrt(var + eps)[:, None, None]
    right = x * v[:, None, None] + torch.sqrt(x.var((2, 3), unbiased=False, keepdim=True) + eps)
    return x / torch.maximum(left.expand_as(x), right) * w[:, None, None] + b[:, None, None]


def _s0(x, groups, w, b, v, eps):
    n, c, h, ww = x.shape
    std = torch.sqrt(x.reshape(n, groups, -1).var(2, unbiased=False) + eps)[:, :, None].expand(n, groups, c // groups * h * ww)
    return x * torch.sigmoid(x * v[:, None, None]) / std.reshape(x.shape) * w[:, None, None] + b[:, None, None]


def _params(c, k):
    return [torch.randn(c, dtype=F64, requires_grad=True) for _ in range(k)]


@pytest.mark.parametrize("training", [True, False])
def test_b0_gradcheck_and_gradgradcheck(training):
    x = torch.randn(3, 2, 5, dtype=F64, requires_grad=True)
    v, w, b = _params(2, 3)
    rv = torch.rand(2, dtype=F64) + 0.5
    fn = lambda x, v, w, b: EvoB0Function.apply(x, v, w, b, rv, 1e-3, training)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, v, w, b))
    assert torch.autograd.gradgradcheck(fn, (x, v, w, b))


def test_s0_gradcheck_and_gradgradcheck():
    x = torch.randn(2, 2, 2, 3, dtype=F64, requires_grad=True)  # (N, G, Cg, S)
    v, w, b = _params(4, 3)
    fn = lambda x, v, w, b: EvoS0Function.apply(x, v, w, b, 2, 1e-3)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, v, w, b))
    assert torch.autograd.gradgradcheck(fn, (x, v, w, b))


@pytest.mark.parametrize("training", [True, False])
def test_b0_equals_the_definition(training):
    x = torch.randn(4, 3, 3, 2, dtype=F64, requires_grad=True)
    v, w, b = _params(3, 3)
    rv = torch.rand(3, dtype=F64) + 0.5
    dy = torch.randn_like(x)
    want = _b0(x, rv, w, b, v, training, 1e-3)
    got = NF.evo_norm2d_b0(x, rv.clone(), w, b, v, training=training, eps=1e-3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, e in zip(torch.autograd.grad(got, (x, v, w, b), dy), torch.autograd.grad(want, (x, v, w, b), dy)):
        torch.testing.assert_close(g, e, rtol=1e-11, atol=1e-11)


def test_s0_equals_the_definition():
    x = torch.randn(2, 6, 3, 2, dtype=F64, requires_grad=True)
    v, w, b = _params(6, 3)
    dy = torch.randn_like(x)
    want = _s0(x, 3, w, b, v, 1e-5)
    got = NF.evo_norm2d_s0(x, 3, w, b, v)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, e in zip(torch.autograd.grad(got, (x, v, w, b), dy), torch.autograd.grad(want, (x, v, w, b), dy)):
        torch.testing.assert_close(g, e, rtol=1e-11, atol=1e-11)


def test_b0_running_var_takes_the_unbiased_batch_variance():
    x = torch.randn(4, 3, 2, 2, dtype=F64)
    rv = torch.full((3,), 2.0, dtype=F64)
    NF.evo_norm2d_b0(x, rv, v=torch.ones(3, dtype=F64), training=True, momentum=0.25)
    torch.testing.assert_close(rv, 0.75 * 2.0 + 0.25 * x.var((0, 2, 3), unbiased=True))
    rv2 = torch.ones(3, dtype=F64)
    NF.evo_norm2d_b0(x, rv2, training=True)  # no v: the affine alone, nothing updated (as timm)
    assert torch.equal(rv2, torch.ones(3, dtype=F64))


def test_torch_func():
    x = torch.randn(2, 4, 2, 2, dtype=F64)
    v = torch.randn(4, dtype=F64)
    f = lambda t: NF.evo_norm2d_s0(t, 2, v=v)  # noqa: E731
    torch.testing.assert_close(torch.func.jacfwd(f)(x), torch.func.jacrev(f)(x))
    g = lambda t: NF.evo_norm2d_b0(t, torch.ones(4, dtype=F64), v=v)  # noqa: E731
    torch.testing.assert_close(torch.func.jacfwd(g)(x), torch.func.jacrev(g)(x))
