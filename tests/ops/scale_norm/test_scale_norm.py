"""Scale-only norms (RmsNorm2d, SimpleNorm, SimpleNorm2d): the hand-derived backward against
float64 finite differences (gradcheck, gradgradcheck), the definition in float64, torch.func."""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.ops.scale_norm import ScaleNormFunction, scale_norm_backward_ref, scale_norm_ref

F64 = torch.float64


def _definition(x, w, eps, kind):
    """The definition in float64 on rows: torch.var (unbiased) or the mean square."""
    s = x.var(1, keepdim=True) if kind == "simple" else x.pow(2).mean(1, keepdim=True)
    y = x / torch.sqrt(s + eps)
    return y if w is None else y * w


@pytest.mark.parametrize("kind", ["rms", "simple"])
@pytest.mark.parametrize("affine", [True, False])
def test_forward_is_the_definition(kind, affine):
    x = torch.randn(7, 5, dtype=F64) * 3 + 2
    w = torch.randn(5, dtype=F64) if affine else None
    torch.testing.assert_close(scale_norm_ref(x, w, 1e-5, kind), _definition(x, w, 1e-5, kind), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kind", ["rms", "simple"])
def test_hand_backward_gradcheck_and_gradgradcheck(kind):
    x = torch.randn(4, 5, dtype=F64, requires_grad=True)
    w = torch.randn(5, dtype=F64, requires_grad=True)
    fn = lambda x, w: ScaleNormFunction.apply(x, w, 1e-3, kind)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


@pytest.mark.parametrize("kind", ["rms", "simple"])
def test_hand_backward_equals_autograd_of_the_definition(kind):
    x = torch.randn(6, 8, dtype=F64, requires_grad=True)
    w = torch.randn(8, dtype=F64, requires_grad=True)
    dy = torch.randn(6, 8, dtype=F64)
    want = torch.autograd.grad(_definition(x, w, 1e-4, kind), (x, w), dy)
    got = scale_norm_backward_ref(dy, x.detach(), w.detach(), 1e-4, kind, True, True)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", ["rms_norm2d", "simple_norm2d"])
def test_channels_entries_gradcheck_both_layouts(fn):
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(2, 3, 2, 3, dtype=F64).contiguous(memory_format=fmt).requires_grad_()
        w = torch.randn(3, dtype=F64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x, w: getattr(NF, fn)(x, w, 1e-3), (x, w))


def test_torch_func_transforms():
    x = torch.randn(3, 2, 4, 2, 2, dtype=F64)
    w = torch.randn(4, dtype=F64)
    got = torch.func.vmap(lambda t: NF.rms_norm2d(t, w))(x)
    want = torch.stack([NF.rms_norm2d(t, w) for t in x])
    torch.testing.assert_close(got, want)
    f = lambda t: NF.simple_norm(t, 4, w)  # noqa: E731
    x1 = torch.randn(2, 4, dtype=F64)
    torch.testing.assert_close(torch.func.jacfwd(f)(x1), torch.func.jacrev(f)(x1))
    torch.testing.assert_close(torch.func.jacrev(f)(x1), torch.autograd.functional.jacobian(f, x1))


def test_functional_refuses_bad_input():
    with pytest.raises(ValueError, match=r"rms_norm2d: expected a 4-D input \(N, C, H, W\), got input of shape \[2, 3\]"):
        NF.rms_norm2d(torch.randn(2, 3))
    with pytest.raises(NotImplementedError, match=r"simple_norm2d: expected a floating-point input"):
        NF.simple_norm2d(torch.ones(1, 2, 2, 2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match=r"simple_norm: expected weight of shape \[4\] \(normalized_shape\), got"):
        NF.simple_norm(torch.randn(2, 4), 4, torch.ones(1))
    with pytest.raises(TypeError, match=r"rms_norm2d: expected eps to be a float, got None"):
        NF.rms_norm2d(torch.randn(1, 2, 2, 2), None, None)
    with pytest.raises(RuntimeError, match=r"mixed dtypes"):
        NF.rms_norm2d(torch.randn(1, 2, 2, 2), torch.ones(2, dtype=F64))


def test_empty_input_gives_an_empty_output_and_zero_gradients():
    w = torch.ones(3, requires_grad=True)
    y = NF.rms_norm2d(torch.randn(0, 3, 2, 2), w)
    assert y.shape == (0, 3, 2, 2)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(3))


@pytest.mark.parametrize("backend", ["ref"] + (["cpu"] if "cpu" in normlab.available_backends() else []))
def test_modules_train_on_every_backend(backend):
    m = normlab.nn.SimpleNorm2d(4)
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    with normlab.use_backend(backend):
        m(x).square().sum().backward()
    assert m.weight.grad is not None and x.grad is not None
