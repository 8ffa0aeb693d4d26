"""The "cpu" kernels give the same bits on 1 and 2 threads, on both sides of the size at which
work is split (torch's grain, 32768 values), for every family: rows are independent, and every
reduction across rows or samples is cut at fixed chunk boundaries merged in a fixed order.

The oracle is the kernels themselves on one thread: no tolerance, bit for bit."""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as F

pytestmark = pytest.mark.skipif("cpu" not in normlab.available_backends(), reason="no cpu backend")

DTYPES = [torch.float32, torch.bfloat16, torch.float64]


def _leaf(t):
    return t.detach().clone().requires_grad_()


def _run(fn, inputs, threads):
    """Outputs, then the gradient of every input, with ``threads`` torch threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        leaves = [_leaf(t) if t is not None and t.is_floating_point() else t for t in inputs]
        with normlab.use_backend("cpu"):
            out = fn(*leaves)
            outs = out if isinstance(out, tuple) else (out,)
            g = torch.Generator().manual_seed(1)
            dys = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
            torch.autograd.backward(outs, dys)
        return [o.detach() for o in outs] + [t.grad for t in leaves if t is not None and t.requires_grad]
    finally:
        torch.set_num_threads(old)


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same_bits(fn, inputs):
    one, two = _run(fn, inputs, 1), _run(fn, inputs, 2)
    for i, (a, b) in enumerate(zip(one, two)):
        assert a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(_bits(a), _bits(b)), f"result {i} differs between 1 and 2 threads"


def _randn(*shape, dtype, scale=1.0, shift=0.0, memory_format=torch.contiguous_format):
    g = torch.Generator().manual_seed(sum(shape))
    return (torch.randn(*shape, generator=g) * scale + shift).to(dtype).contiguous(memory_format=memory_format)


# rows x cols around the split: below the grain, at it, and several tasks of it
ROW_SHAPES = [(31, 1024), (33, 1024), (700, 96), (4096, 64), (9, 5000)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
def test_layer_norm_and_rms_norm(shape, dtype):
    n = shape[-1]
    x, w, b = _randn(*shape, dtype=dtype, shift=3.0), _randn(n, dtype=dtype), _randn(n, dtype=dtype)
    _same_bits(lambda x, w, b: F.layer_norm(x, (n,), w, b), [x, w, b])
    _same_bits(lambda x, w: F.rms_norm(x, (n,), w), [x, w])
    r = _randn(*shape, dtype=dtype, scale=0.5)
    _same_bits(lambda x, r, w, b: F.add_layer_norm(x, r, (n,), w, b), [x, r, w, b])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4, 8, 30, 30), (64, 16, 6, 6), (300, 64), (2, 3, 4, 4), (8, 32, 16, 16)], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_batch_norm_train_and_its_running_statistics(shape, dtype, layout):
    if layout == torch.channels_last and len(shape) != 4:
        pytest.skip("channels_last is 4-D")
    c = shape[1]
    x = _randn(*shape, dtype=dtype, shift=2.0, memory_format=layout)
    w, b = _randn(c, dtype=dtype), _randn(c, dtype=dtype)
    stats = []

    def fn(x, w, b):
        rm, rv = torch.zeros(c, dtype=dtype), torch.ones(c, dtype=dtype)
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
        stats.append((rm, rv))
        return y

    _same_bits(fn, [x, w, b])
    (m1, v1), (m2, v2) = stats
    assert torch.equal(m1, m2) and torch.equal(v1, v2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(4, 368, 6, 13, 13), (2, 256, 28, 28)], ids=str)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_channels_last_backward_few_row_groups(shape, training, dtype):
    """Channels-last BatchNorm whose backward sums take few row groups (3 and 1 groups of
    1424 / 1568 rows): on 2 threads each group's rows are cut into pieces, the pieces' chunk sums
    kept and added a group at a time in chunk order (batch_norm_kernels.cpp, backward_impl,
    `by_chunks`) -- dx, dweight and dbias the same bits as one thread doing each group. (A merge
    that leaves a group's last chunk out, built and run, fails all eight; one that adds the chunks
    in reverse order passes: a few dozen float32 chunk sums add exactly in float64.)"""
    c = shape[1]
    fmt = torch.channels_last_3d if len(shape) == 5 else torch.channels_last
    x = _randn(*shape, dtype=dtype, shift=2.0, memory_format=fmt)
    w, b = _randn(c, dtype=dtype), _randn(c, dtype=dtype)
    rm, rv = _randn(c, dtype=dtype, scale=0.1), _randn(c, dtype=dtype, scale=0.1, shift=1.0)

    def fn(x, w, b):
        return F.batch_norm(x, rm.clone(), rv.clone(), w, b, training=training, momentum=0.1)

    _same_bits(fn, [x, w, b])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,groups", [((4, 8, 30, 30), 4), ((64, 32, 6, 6), 8), ((16, 64, 9, 9), 32),
                                          ((4096, 16), 4)], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_group_norm(shape, groups, dtype, layout):
    if layout == torch.channels_last and len(shape) != 4:
        pytest.skip("channels_last is 4-D")
    c = shape[1]
    x = _randn(*shape, dtype=dtype, shift=1.0, memory_format=layout)
    w, b = _randn(c, dtype=dtype), _randn(c, dtype=dtype)
    _same_bits(lambda x, w, b: F.group_norm(x, groups, w, b), [x, w, b])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4, 8, 30, 30), (64, 32, 6, 6)], ids=str)
def test_instance_norm(shape, dtype):
    c = shape[1]
    x, w, b = _randn(*shape, dtype=dtype, shift=1.0), _randn(c, dtype=dtype), _randn(c, dtype=dtype)
    _same_bits(lambda x, w, b: F.instance_norm(x, None, None, w, b), [x, w, b])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 64, 16, 16), (4, 96, 30, 30), (1, 768, 7, 7)], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_layer_norm2d(shape, dtype, layout):
    c = shape[1]
    x = _randn(*shape, dtype=dtype, shift=1.0, memory_format=layout)
    w, b = _randn(c, dtype=dtype), _randn(c, dtype=dtype)
    _same_bits(lambda x, w, b: F.layer_norm2d(x, w, b), [x, w, b])


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 64, 16, 16), (4, 96, 30, 30), (1, 768, 7, 7)], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_layer_norm_act2d(shape, dtype, layout, act):
    """LayerNormAct2d fused in both layouts (NCHW: the activation in LayerNorm2d's NCHW kernels)."""
    c = shape[1]
    x = _randn(*shape, dtype=dtype, shift=1.0, memory_format=layout)
    w, b = _randn(c, dtype=dtype), _randn(c, dtype=dtype)
    _same_bits(lambda x, w, b: F.layer_norm_act2d(x, w, b, 1e-6, act), [x, w, b])


# DyT: elementwise forward; the backward's sums over fixed (row chunk, column block) tasks
DYT_SHAPES = [(31, 1024), (700, 96), (4096, 64), (9, 5000), (3000, 40)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", DYT_SHAPES, ids=str)
def test_dyt(shape, dtype):
    n = shape[-1]
    x = _randn(*shape, dtype=dtype, scale=2.0)
    pdt = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    alpha, w, b = torch.tensor([0.7], dtype=pdt), _randn(n, dtype=pdt), _randn(n, dtype=pdt, shift=1.0)
    _same_bits(lambda x, a, w, b: F.dyt(x, (n,), a, w, b), (x, alpha, w, b))


# FRN: (sample, channel) rows (NCHW) or (sample, channel block) tasks (NHWC); dw, db, dtau merged
# over samples in order
@pytest.mark.parametrize("shape", [(2, 8, 7, 9), (4, 64, 24, 24), (3, 300, 10, 12)])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("dtype", DTYPES)
def test_filter_response_norm(shape, fmt, dtype):
    c = shape[1]
    x = _randn(*shape, dtype=dtype, memory_format=fmt)
    w, b, tau = (_randn(c, dtype=dtype, shift=s) for s in (1.0, 0.0, -0.2))
    _same_bits(F.filter_response_norm, (x, w, b, tau))


# RmsNorm2d, SimpleNorm2d: (sample, position block) tasks; dw merged over tasks in order
@pytest.mark.parametrize("fn", ["rms_norm2d", "simple_norm2d"])
@pytest.mark.parametrize("shape", [(2, 8, 7, 9), (4, 64, 24, 24), (3, 300, 10, 12)])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_norm2d(fn, shape, fmt, dtype):
    x = _randn(*shape, dtype=dtype, memory_format=fmt, shift=0.5)
    w = _randn(shape[1], dtype=dtype, shift=1.0)
    _same_bits(getattr(F, fn), (x, w))
