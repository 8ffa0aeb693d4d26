"""RmsNorm2d's and SimpleNorm2d's "cpu" kernels: outputs and gradients within twice the rounding
error of the float64 result (the reference in float64 on the same rounded inputs), both memory
formats; the registered ops pass torch.library.opcheck; torch.compile(fullgraph=True) traces them."""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from tests.oracle import assert_accurate_vs_unfused as _assert_accurate


pytestmark = pytest.mark.skipif("cpu" not in normlab.available_backends(), reason="no cpu backend")


def _inputs(shape, dtype, fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 2 + 0.7).to(dtype).contiguous(memory_format=fmt)
    return x, (torch.randn(shape[1], generator=g) * 0.5 + 1).to(dtype)


@pytest.mark.parametrize("fn", ["rms_norm2d", "simple_norm2d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (3, 70, 6, 6), (1, 3, 40, 40)])
def test_within_twice_the_rounding_of_float64(fn, dtype, fmt, shape):
    x, w = _inputs(shape, dtype, fmt)
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    with normlab.use_backend("cpu"):
        y = getattr(NF, fn)(*leaves)
    refs = [t.detach().double().requires_grad_() for t in (x, w)]
    same = [t.detach().clone().requires_grad_() for t in (x, w)]
    with normlab.use_backend("ref"):
        y64 = getattr(NF, fn)(*refs)
        yt = getattr(NF, fn)(*same)
    assert y.dtype == dtype and y.is_contiguous(memory_format=fmt)
    _assert_accurate(y, yt.detach(), y64.detach(), "y")
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    for name, g, gt, g64 in zip("xw", torch.autograd.grad(y, leaves, dy), torch.autograd.grad(yt, same, dy),
                                torch.autograd.grad(y64, refs, dy.double())):
        _assert_accurate(g, gt, g64, f"d{name}")


@pytest.mark.parametrize("fn", ["rms_norm2d", "simple_norm2d"])
def test_double_backward_through_the_kernel(fn):
    x, w = (t.double().requires_grad_() for t in _inputs((2, 3, 3, 4), torch.float64, torch.contiguous_format))
    with normlab.use_backend("cpu"):
        assert torch.autograd.gradgradcheck(lambda *a: getattr(NF, fn)(*a, eps=1e-3), (x, w))


@pytest.mark.parametrize("simple", [False, True])
def test_opcheck(simple):
    x, w = _inputs((2, 3, 4, 5), torch.float32, torch.channels_last)
    y, rstd, mean = torch.ops.normlab.scale_norm2d_fwd(x, w, simple, 1e-6)
    torch.library.opcheck(torch.ops.normlab.scale_norm2d_fwd, (x, w, simple, 1e-6))
    torch.library.opcheck(torch.ops.normlab.scale_norm2d_bwd, (torch.randn_like(y), x, w, rstd, mean, simple, True, True))


def test_torch_compile_fullgraph():
    m = normlab.nn.RmsNorm2d(4)
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    with normlab.use_backend("cpu"):
        y = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
        y.sum().backward()
    x64 = x.detach().double().requires_grad_()
    with normlab.use_backend("ref"):
        y64 = m.double()(x64)
    y64.sum().backward()
    torch.testing.assert_close(y, y64.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1e-5, atol=1e-5)
