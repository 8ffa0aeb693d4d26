"""FRN's "cpu" kernels: outputs and gradients within twice the rounding error of the float64
result (the reference math in float64 on the same rounded inputs), both memory formats; the
registered ops pass torch.library.opcheck; torch.compile(fullgraph=True) traces the op."""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from tests.oracle import assert_accurate_vs_unfused as _assert_accurate


pytestmark = pytest.mark.skipif("cpu" not in normlab.available_backends(), reason="no cpu backend")


def _inputs(shape, dtype, fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = (torch.randn(shape, generator=g) * 2 + 0.3).to(dtype).contiguous(memory_format=fmt)
    w, b, tau = ((torch.randn(c, generator=g) * 0.5 + s).to(dtype) for s in (1.0, 0.0, -0.3))
    return x, w, b, tau


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (3, 70, 6, 6)])
@pytest.mark.parametrize("with_tau", [True, False])
def test_within_twice_the_rounding_of_float64(dtype, fmt, shape, with_tau):
    x, w, b, tau = _inputs(shape, dtype, fmt)
    tau = tau if with_tau else None
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b, tau)]
    with normlab.use_backend("cpu"):
        y = NF.filter_response_norm(*leaves, eps=1e-5)
    refs = [t.detach().double().requires_grad_() if t is not None else None for t in (x, w, b, tau)]
    same = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b, tau)]
    with normlab.use_backend("ref"):
        y64 = NF.filter_response_norm(*refs, eps=1e-5)
        yt = NF.filter_response_norm(*same, eps=1e-5)
    assert y.dtype == dtype and y.is_contiguous(memory_format=fmt)
    _assert_accurate(y, yt.detach(), y64.detach(), "y")
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    keep = [i for i, t in enumerate(leaves) if t is not None]
    grads = [torch.autograd.grad(out, [ts[i] for i in keep], d)
             for out, ts, d in ((y, leaves, dy), (yt, same, dy), (y64, refs, dy.double()))]
    for i, g, gt, g64 in zip(keep, *grads):
        _assert_accurate(g, gt, g64, "d" + "x w b tau".split()[i])


def test_double_backward_through_the_kernel():
    x, w, b, tau = (t.double().requires_grad_() for t in _inputs((2, 3, 3, 4), torch.float64, torch.contiguous_format))
    with normlab.use_backend("cpu"):
        assert torch.autograd.gradgradcheck(lambda *a: NF.filter_response_norm(*a, eps=1e-3), (x, w, b, tau))


def test_opcheck():
    x, w, b, tau = _inputs((2, 3, 4, 5), torch.float32, torch.channels_last)
    y, rstd = torch.ops.normlab.frn_fwd(x, w, b, tau, 1e-5)
    torch.library.opcheck(torch.ops.normlab.frn_fwd, (x, w, b, tau, 1e-5))
    torch.library.opcheck(torch.ops.normlab.frn_bwd, (torch.randn_like(y), x, w, b, tau, rstd, True, True, True, True))


def test_torch_compile_fullgraph():
    m = normlab.nn.FilterResponseNormTlu2d(4)
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
