"""LayerNorm2d's C++ kernels (``csrc/cpu/layer_norm2d_kernels.cpp``): contiguous (NCHW) inputs
on the plane kernels, channels_last on the row kernels, no copy of either.

Oracles: torch's permute -> layer_norm -> permute in float64 (and torch's own rounding in
the half dtypes, ``tests/oracle.assert_within_rounding``), gradcheck, and the kernels
against themselves for the bits (1 vs 2 threads; a pixel's values whatever its block).
"""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.ops import extension
from tests.oracle import assert_close_to_float64, rel_err

pytestmark = pytest.mark.skipif(not extension.available(), reason="the C++ extension is not built")

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _torch64(x, w, b, eps=1e-6):
    """torch's permute -> layer_norm -> permute, in float64."""
    c = x.shape[1]
    return torch.nn.functional.layer_norm(x.movedim(1, -1), (c,), w, b, eps).movedim(-1, 1)


def _data(shape, dtype, seed=0, offset=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + offset).to(dtype)
    w = (torch.randn(shape[1], generator=g, dtype=torch.float64) * 0.5 + 1).to(dtype)
    b = torch.randn(shape[1], generator=g, dtype=torch.float64).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, w, b, dy


def _run(x, w, b, dy):
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    with normlab.use_backend("cpu"):
        y = NF.layer_norm2d(xs, ws, bs)
    y.backward(dy)
    return [y.detach(), xs.grad, ws.grad, bs.grad]


# (N, C, H, W): pixels fewer than a block, C large (blocks of 16 pixels), a last block
# shorter than the others, a 3-D (N, C, L) input, many channels with few pixels
SHAPES = [(3, 24, 5, 7), (2, 600, 9, 5), (2, 8, 33, 31), (4, 40, 130), (1, 2048, 3, 3)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_against_float64_torch(shape, dtype):
    x, w, b, dy = _data(shape, dtype)
    got = _run(x, w, b, dy)
    assert got[0].is_contiguous() and got[0].dtype == dtype
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    y64 = _torch64(x64, w64, b64)
    y64.backward(dy.double())
    assert_close_to_float64(got, [y64, x64.grad, w64.grad, b64.grad], dtype,
                            {torch.float32: 5e-6, torch.float64: 1e-12}, ["y", "dx", "dw", "db"])


def test_large_mean_against_the_spread_keeps_its_digits():
    """Pixels whose mean is 1e4 times their spread: the shifted two-pass statistics keep float32 close
    to float64 (E[x^2] - E[x]^2 would lose every digit here)."""
    x, w, b, _ = _data((2, 64, 6, 6), torch.float64, offset=0.0)
    x = (x * 1e-2 + 100.0).float()
    with normlab.use_backend("cpu"):
        y = NF.layer_norm2d(x, w.float(), b.float())
    y64 = _torch64(x.double(), w, b)
    assert rel_err(y, y64) < 1e-4


def test_constant_pixel_gives_the_bias_exactly():
    x = torch.full((2, 5, 4, 4), 3.25)
    b = torch.arange(5, dtype=torch.float32)
    with normlab.use_backend("cpu"):
        y = NF.layer_norm2d(x, torch.full((5,), 2.0), b)
    assert torch.equal(y, b.view(1, 5, 1, 1).expand_as(y))


_COPIES = ("aten::copy_", "aten::clone", "aten::contiguous", "aten::to", "aten::_to_copy")


def _copies(fn):
    """The copying aten ops that ``fn()`` ran (the profiler sees those called from C++ too)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name in _COPIES]


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels_last"])
def test_input_reaches_the_kernel_without_a_copy(fmt):
    x, w, b, dy = _data((2, 6, 4, 5), torch.float32)
    x, dy = x.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt)
    xs = x.clone().requires_grad_()
    with normlab.use_backend("cpu"):
        assert _copies(lambda: NF.layer_norm2d(x, w, b)) == []
        y = NF.layer_norm2d(xs, w, b)
    assert y.is_contiguous(memory_format=fmt)
    assert _copies(lambda: y.backward(dy)) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels_last"])
def test_same_bits_at_1_and_2_threads(dtype, fmt):
    x, w, b, dy = _data((4, 48, 40, 40), dtype)  # 307200 values: several tasks at 2 threads
    x, dy = x.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(x, w, b, dy)
        torch.set_num_threads(2)
        two = _run(x, w, b, dy)
    finally:
        torch.set_num_threads(threads)
    for a, r in zip(two, one):
        assert torch.equal(a, r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_pixel_gets_the_same_bits_whatever_its_block_and_prefetches(dtype):
    """Each pixel's sums run over its channels in order, one pixel per vector lane: y and dx of a
    sample are the same bits alone (small: other blocks, no prefetches) as in a batch of 8 MB or
    more (read with prefetches, other blocks), including a last block and a partial vector."""
    x, w, b, dy = _data((14, 40, 97, 41), dtype)  # 8.9 MB of float32
    if x.numel() * x.element_size() < (8 << 20):  # bfloat16: twice the samples
        x, dy = torch.cat([x, x]), torch.cat([dy, dy])
    big = _run(x, w, b, dy)
    one = _run(x[1:2], w, b, dy[1:2])
    assert torch.equal(big[0][1:2], one[0]) and torch.equal(big[1][1:2], one[1])


def test_gradcheck_and_double_backward():
    x, w, b, _ = _data((2, 5, 3, 4), torch.float64)
    inputs = tuple(t.clone().requires_grad_() for t in (x, w, b))
    with normlab.use_backend("cpu"):
        assert torch.autograd.gradcheck(lambda x, w, b: NF.layer_norm2d(x, w, b), inputs)
        assert torch.autograd.gradgradcheck(lambda x, w, b: NF.layer_norm2d(x, w, b), inputs)


def test_without_weight_and_bias_and_with_weight_only():
    x, w, _, dy = _data((2, 7, 3, 5), torch.float64)
    for wt in (None, w):
        xs = x.clone().requires_grad_()
        ws = None if wt is None else wt.clone().requires_grad_()
        with normlab.use_backend("cpu"):
            y = NF.layer_norm2d(xs, ws, None)
        y.backward(dy)
        x64 = x.clone().requires_grad_()
        w64 = None if wt is None else wt.clone().requires_grad_()
        y64 = _torch64(x64, w64, None)
        y64.backward(dy)
        torch.testing.assert_close(y, y64, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(xs.grad, x64.grad, rtol=1e-12, atol=1e-12)
        if wt is not None:
            torch.testing.assert_close(ws.grad, w64.grad, rtol=1e-12, atol=1e-12)


def test_torch_compile_fullgraph_on_nchw():
    m = normlab.nn.LayerNorm2d(8)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    x = torch.randn(2, 8, 4, 4, requires_grad=True)
    with normlab.use_backend("cpu"):
        y = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    y.sum().backward()
    x64 = x.detach().double().requires_grad_()
    y64 = _torch64(x64, m.weight.double(), m.bias.double())
    y64.sum().backward()
    torch.testing.assert_close(y, y64.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, x64.grad.float(), rtol=1e-5, atol=1e-5)


def test_vmap_falls_back_to_the_rows():
    _, w, b, _ = _data((2, 6, 4, 4), torch.float32)
    x = torch.randn(3, 2, 6, 4, 4)
    with normlab.use_backend("cpu"):
        y = torch.func.vmap(lambda t: NF.layer_norm2d(t, w, b))(x)
    ref = torch.stack([_torch64(t.double(), w.double(), b.double()) for t in x])
    torch.testing.assert_close(y, ref.float(), rtol=1e-5, atol=1e-5)


def test_forward_mode_falls_back_to_the_rows():
    x, w, b, t = _data((2, 6, 3, 5), torch.float64)
    with normlab.use_backend("cpu"):
        y, yt = torch.func.jvp(lambda x: NF.layer_norm2d(x, w, b), (x,), (t,))
    y64, yt64 = torch.func.jvp(lambda x: _torch64(x, w, b), (x,), (t,))
    torch.testing.assert_close(y, y64, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(yt, yt64, rtol=1e-10, atol=1e-10)
