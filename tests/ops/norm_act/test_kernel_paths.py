"""The fused norm+act kernels along every path of the norm kernels they ride on (csrc/norm_act.cpp):
GroupNorm's row kernels (short, scratch and long group rows, S == 1 packed and not) and NHWC
kernels (whole samples and chunked) with the activation inside their output pass; BatchNorm's and
GroupNorm's backwards reading dz = dy * act'(z) from dx's own buffer and writing dx over it.

Oracles: normlab's unfused path (the norm's own op, then torch's activation) -- the same bits for
the piecewise-linear activations, whose result torch computes exactly from the norm's rounded
output; the float64 reference for the others (tests/oracle.assert_accurate_vs_unfused); and, for
the backward's in-place dz, the identity activation, where dz = dy * 1 = dy exactly, so the fused
gradients must be the norm's own gradients, bit for bit, on every kernel path."""

from __future__ import annotations

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.ops import activation as A
from normlab.ops.norm_act.op import HAS_FUSED
from tests.oracle import assert_accurate_vs_unfused

pytestmark = pytest.mark.skipif(not HAS_FUSED, reason="the fused C++ ops are not built")

EXACT = ("identity", "relu", "leaky_relu", "hardswish")
SMOOTH = ("silu", "gelu", "gelu_tanh", "tanh")
CL = torch.channels_last

# (shape, groups, memory format): the GroupNorm kernel path each reaches
GN_PATHS = {
    "rows short (Cg*S <= 256)": ((3, 16, 5, 7), 4, None),
    "rows in scratch (256 < Cg*S <= 16384)": ((2, 32, 24, 20), 8, None),
    "rows long (Cg*S > 16384)": ((2, 4, 96, 100), 2, None),
    "S == 1, groups packed in a vector": ((37, 16), 8, None),
    "S == 1, wide groups": ((9, 96), 2, None),
    "NHWC, whole samples a task": ((16, 24, 6, 5), 6, CL),
    "NHWC, chunks of a sample": ((1, 32, 70, 66), 4, CL),
    "NHWC, short rows of the view": ((2, 3, 9, 11), 3, CL),
}


def _x(shape, dtype, seed=0, fmt=None):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.3).to(dtype)
    return t.contiguous(memory_format=fmt) if fmt is not None else t


def _params(c, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    b = (torch.randn(c, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    return w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("path", list(GN_PATHS))
def test_group_norm_act_forward_on_every_kernel_path(path, dtype):
    shape, g, fmt = GN_PATHS[path]
    x = _x(shape, dtype, fmt=fmt)
    w, b = _params(shape[1], dtype)
    z = NF.group_norm(x, g, w, b, 1e-5)
    for act in EXACT:
        y = NF.group_norm_act(x, g, w, b, 1e-5, act, 0.2)
        assert y.is_contiguous(memory_format=fmt or torch.contiguous_format), (path, act)
        assert torch.equal(y, A.act_forward(z, A.ID[act], 0.2)), (path, act)
    with normlab.use_backend("ref"):
        z64 = NF.group_norm(x.double(), g, w.double(), b.double(), 1e-5)
    for act in SMOOTH:
        y = NF.group_norm_act(x, g, w, b, 1e-5, act)
        assert_accurate_vs_unfused(y, A.act_forward(z, A.ID[act]), A.act_forward(z64, A.ID[act]), f"{path} {act}")


def _grads(fn, x, w, b, dy):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = fn(x, w, b)
    return (y, *torch.autograd.grad(y, (x, w, b), dy))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", list(GN_PATHS))
def test_group_norm_act_backward_in_place_dz_is_group_norms_backward(path, dtype):
    """identity: dz = dy exactly, so the gradients are GroupNorm's own bits (dz read and dx written
    in one buffer on every path of GroupNorm's backward)."""
    shape, g, fmt = GN_PATHS[path]
    x, dy = _x(shape, dtype, fmt=fmt), _x(shape, dtype, seed=3, fmt=fmt)
    w, b = _params(shape[1], dtype)
    fused = _grads(lambda x, w, b: NF.group_norm_act(x, g, w, b, 1e-5, "identity"), x, w, b, dy)
    plain = _grads(lambda x, w, b: NF.group_norm(x, g, w, b, 1e-5), x, w, b, dy)
    for i, (u, v) in enumerate(zip(fused, plain)):
        assert torch.equal(u, v), (path, i)


# BatchNorm: (shape, memory format): planes in one part per channel (local), planes in several
# parts, short planes (the rows view), channels-last rows, (N, C)
BN_PATHS = {
    "planes, local": ((4, 8, 32, 32), None),
    "planes, parts": ((2, 3, 200, 200), None),
    "short planes": ((6, 16, 5, 7), None),
    "channels_last rows": ((4, 24, 9, 10), CL),
    "(N, C)": ((300, 20), None),
}


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", list(BN_PATHS))
def test_batch_norm_act_backward_in_place_dz_is_batch_norms_backward(path, dtype, training):
    shape, fmt = BN_PATHS[path]
    x, dy = _x(shape, dtype, fmt=fmt), _x(shape, dtype, seed=3, fmt=fmt)
    c = shape[1]
    w, b = _params(c, torch.float32)
    rm, rv = torch.randn(c) * 0.1, torch.rand(c) + 0.5

    def fused(x, w, b):
        return NF.batch_norm_act(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5, "identity")

    def plain(x, w, b):
        return NF.batch_norm(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5)

    for i, (u, v) in enumerate(zip(_grads(fused, x, w, b, dy), _grads(plain, x, w, b, dy))):
        assert torch.equal(u, v), (path, i)


@pytest.mark.parametrize("act", ["relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("path", ["planes, parts", "channels_last rows"])
def test_batch_norm_act_gradients_with_an_activation(path, act):
    """The in-place dz with a real activation: gradients within the rule of the float64 reference."""
    shape, fmt = BN_PATHS[path]
    x, dy = _x(shape, torch.float32, fmt=fmt), _x(shape, torch.float32, seed=3, fmt=fmt)
    w, b = _params(shape[1], torch.float32)

    def run(x, w, b):
        return NF.batch_norm_act(x, None, None, w, b, True, 0.1, 1e-5, act)

    got = _grads(run, x, w, b, dy)
    with normlab.use_backend("ref"):
        ref = _grads(run, x.double(), w.double(), b.double(), dy.double())
        unfused = _grads(lambda x, w, b: A.act_forward(NF.batch_norm(x, None, None, w, b, True, 0.1, 1e-5),
                                                       A.ID[act]), x, w, b, dy)
    for i, (u, r, t) in enumerate(zip(got, ref, unfused)):
        assert_accurate_vs_unfused(u, t, r, f"{path} {act} {i}")
