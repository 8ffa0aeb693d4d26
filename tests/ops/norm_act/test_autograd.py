"""The norm+act autograd nodes (csrc/autograd/norm_act.cpp): double backward through every norm
with every activation (float64 gradgradcheck: numerical differentiation of the backward is the
oracle), the backward taken with create_graph=True (the nodes' reference in ATen ops) equal to the
kernels' backward within float64 rounding."""

from __future__ import annotations

import warnings

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.ops import activation as A
from tests.oracle import ops_dispatched

pytestmark = pytest.mark.skipif("cpu" not in normlab.available_backends(), reason="no C++ extension")

ACTS = list(A.NAMES)
CL = torch.channels_last
C = 4
_RM = torch.linspace(-0.2, 0.3, C, dtype=torch.float64)
_RV = torch.linspace(0.6, 1.4, C, dtype=torch.float64)


def _bn(x, w, b, act):
    return NF.batch_norm_act(x, None, None, w, b, True, 0.1, 1e-5, act, 0.2)


def _bn_eval(x, w, b, act):
    return NF.batch_norm_act(x, _RM, _RV, w, b, False, 0.1, 1e-5, act, 0.2)


def _gn(x, w, b, act):
    return NF.group_norm_act(x, 2, w, b, 1e-5, act, 0.2)


def _ln(x, w, b, act):
    return NF.layer_norm_act(x, (C,), w, b, 1e-5, act, 0.2)


def _ln_2x2(x, w, b, act):
    return NF.layer_norm_act(x, (2, 2), w.reshape(2, 2), b.reshape(2, 2), 1e-5, act, 0.2)


def _ln2d(x, w, b, act):
    return NF.layer_norm_act2d(x, w, b, 1e-5, act, 0.2)


# name -> (the call on (x, w, b, act), x's shape, x's memory format, the fused op it runs)
NORMS = {
    "batch_norm_act": (_bn, (2, C, 2, 1), None, "batch_norm_act_fwd"),
    "batch_norm_act channels_last": (_bn, (2, C, 1, 2), CL, "batch_norm_act_fwd"),
    "batch_norm_act eval": (_bn_eval, (2, C, 2, 1), None, "batch_norm_act_fwd"),
    "group_norm_act": (_gn, (2, C, 2, 1), None, "group_norm_act_fwd"),
    "group_norm_act channels_last": (_gn, (2, C, 1, 2), CL, "group_norm_act_fwd"),
    "layer_norm_act": (_ln, (2, 2, C), None, "layer_norm_act_fwd"),
    "layer_norm_act (2, 2)": (_ln_2x2, (3, 2, 2), None, "layer_norm_act_fwd"),
    "layer_norm_act2d": (_ln2d, (2, C, 1, 2), None, "layer_norm_act2d_fwd"),
    "layer_norm_act2d channels_last": (_ln2d, (2, C, 1, 2), CL, "layer_norm_act_fwd"),
}


def _leaves(shape, fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.3
    if fmt is not None:
        x = x.contiguous(memory_format=fmt)
    w = torch.rand(C, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(C, generator=g, dtype=torch.float64) * 0.5
    return [t.requires_grad_() for t in (x, w, b)]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("norm", list(NORMS))
def test_double_backward(norm, act):
    call, shape, fmt, op = NORMS[norm]
    x, w, b = _leaves(shape, fmt)
    ops, err = ops_dispatched(lambda: call(x, w, b, act))
    assert err is None and f"normlab.{op}.default" in ops, ops
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "autograd kernel was not registered")
        assert torch.autograd.gradgradcheck(lambda x, w, b: call(x, w, b, act), (x, w, b))


@pytest.mark.parametrize("act", ["relu", "silu", "gelu_tanh", "hardswish"])
@pytest.mark.parametrize("norm", list(NORMS))
def test_create_graph_gradients_are_the_kernels(norm, act):
    """The gradients the node's reference gives (create_graph=True) and the fused backward op's
    (without): the same values to float64 rounding."""
    call, shape, fmt, _ = NORMS[norm]
    x, w, b = _leaves(shape, fmt)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    y = call(x, w, b, act)
    plain = torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)
    graphed = torch.autograd.grad(y, (x, w, b), dy, create_graph=True)
    assert all(g.requires_grad for g in graphed)
    for i, (u, v) in enumerate(zip(graphed, plain)):
        assert u.shape == v.shape and u.dtype == v.dtype, (norm, act, i)
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12, msg=f"{norm} {act} input {i}")


def test_batch_norm_act2d_module_double_backward():
    """BatchNormAct2d(4, act_layer="silu") in float64 training: a gradient of the first gradient,
    against the unfused reference path's."""
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def second(backend):
        with normlab.use_backend(backend):
            m = normlab.nn.BatchNormAct2d(4, act_layer="silu").double()
            xg = x.clone().requires_grad_()
            (g,) = torch.autograd.grad(m(xg).square().sum(), xg, create_graph=True)
            return torch.autograd.grad(g.square().sum(), xg)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = second("cpu")
    torch.testing.assert_close(got, second("ref"), rtol=1e-9, atol=1e-11)
