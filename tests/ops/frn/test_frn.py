"""Filter Response Normalization: the hand-derived backward against float64 finite differences, the
definition in float64 (the paper's equations), torch.maximum's gradient at a tie, torch.func."""

from __future__ import annotations

import pytest
import torch

import normlab.functional as NF
from normlab.ops.frn import FRNFunction, frn_backward_ref

F64 = torch.float64


def _definition(x, w, b, tau, eps):
    """FRN as the paper writes it, in float64 autograd: nu2 = mean(x^2) over H, W; then the TLU."""
    nu2 = x.pow(2).mean((2, 3), keepdim=True)
    z = x / torch.sqrt(nu2 + eps) * w[:, None, None] + b[:, None, None]
    return z if tau is None else torch.maximum(z, tau[:, None, None])


@pytest.mark.parametrize("with_tau", [True, False])
def test_gradcheck_and_gradgradcheck(with_tau):
    x = torch.randn(2, 3, 6, dtype=F64, requires_grad=True)
    w, b = torch.randn(3, dtype=F64, requires_grad=True), torch.randn(3, dtype=F64, requires_grad=True)
    tau = torch.randn(3, dtype=F64, requires_grad=True) if with_tau else None
    fn = lambda *a: FRNFunction.apply(*a, 1e-3)  # noqa: E731
    args = (x, w, b, tau)
    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


def test_forward_and_backward_equal_the_definition():
    x = torch.randn(3, 4, 5, 2, dtype=F64, requires_grad=True)
    ps = [torch.randn(4, dtype=F64, requires_grad=True) for _ in range(3)]
    dy = torch.randn(3, 4, 5, 2, dtype=F64)
    want = _definition(x, *ps, 1e-5)
    got = NF.filter_response_norm(x, *ps, eps=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    for g, e in zip(torch.autograd.grad(got, [x, *ps], dy), torch.autograd.grad(want, [x, *ps], dy)):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_a_tie_splits_the_gradient_as_torch_maximum():
    """A zero input with zero bias and tau (timm's initial values) sits exactly at z == tau."""
    x = torch.zeros(1, 2, 2, 2, dtype=F64)
    x[0, 0, 0, 0] = 1.0
    w, b, tau = torch.ones(2, dtype=F64), torch.zeros(2, dtype=F64), torch.zeros(2, dtype=F64)
    dy = torch.ones(1, 2, 2, 2, dtype=F64)
    want = torch.autograd.grad(_definition(x.requires_grad_(), w, b, tau.requires_grad_(), 1e-5), (x, tau), dy)
    dx, _, _, dtau = frn_backward_ref(dy.reshape(1, 2, 4), x.detach().reshape(1, 2, 4), w, b, tau, 1e-5,
                                      True, False, False, True)
    torch.testing.assert_close(dx.reshape(x.shape), want[0])
    torch.testing.assert_close(dtau, want[1])
    assert dtau[1] == 2.0  # four ties, half of each gradient to tau


def test_torch_func():
    x = torch.randn(2, 3, 2, 2, dtype=F64)
    tau = torch.randn(3, dtype=F64)
    f = lambda t: NF.filter_response_norm(t, tau=tau)  # noqa: E731
    torch.testing.assert_close(torch.func.jacfwd(f)(x), torch.func.jacrev(f)(x))
    torch.testing.assert_close(torch.func.vmap(f)(x[:, None]), torch.stack([f(t[None]) for t in x]))


def test_bad_input():
    with pytest.raises(RuntimeError, match=r"filter_response_norm: expected tau of shape \[3\]"):
        NF.filter_response_norm(torch.randn(1, 3, 2, 2), tau=torch.zeros(4))
    with pytest.raises(ValueError, match=r"expected eps to be a non-negative number, got -0.1"):
        NF.filter_response_norm(torch.randn(1, 3, 2, 2), eps=-0.1)
    with pytest.raises(ValueError, match=r"expected a 4-D input"):
        NF.filter_response_norm(torch.randn(1, 3, 2, 2, 2))
