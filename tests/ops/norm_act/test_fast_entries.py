"""Which calls the fused norm+act path takes (normlab._C.*_act_fast, csrc/norm_act.h): the plain
cases -- tensors of torch.Tensor itself (torch.nn.Parameter too, except BatchNorm's input), served
dtypes on the CPU, parameters of exactly the norm's shape, a Python real momentum in [0, 1] and
eps (> 0 for BatchNorm, >= 0 for the others), an int num_groups, normalized_shape an int or a
sequence of ints -- and nothing else: every other call runs the unfused composition, the norm's
own function then the activation, so that its checks word any error. Oracles: the rules above
(the fused op dispatched or not), and the norm's own function for the errors."""

from __future__ import annotations

import fractions

import numpy as np
import pytest
import torch

import normlab
import normlab.functional as NF
from tests.oracle import ops_dispatched

pytestmark = pytest.mark.skipif("cpu" not in normlab.available_backends(), reason="no C++ extension")

CL = torch.channels_last


class Sub(torch.Tensor):
    pass


def X(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.3).to(dtype)


def P(c, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(dtype)


x = X(4, 6, 3, 3)
w6, b6 = P(6), P(6, seed=2)
rm6, rv6 = P(6, seed=3) - 1, P(6, seed=4)


# name -> (arguments of batch_norm_act / batch_norm, fused)
BN = {
    "plain": ((x, None, None, w6, b6, True), True),
    "Parameter input": ((torch.nn.Parameter(x.clone()), None, None, w6, b6, True), False),
    "subclass input": ((x.as_subclass(Sub), None, None, w6, b6, True), False),
    "Parameter weight": ((x, None, None, torch.nn.Parameter(w6.clone()), b6, True), True),
    "subclass weight": ((x, None, None, w6.as_subclass(Sub), b6, True), False),
    "float64 weight": ((x, None, None, w6.double(), b6, True), True),
    "strided weight": ((x, None, None, P(12)[::2], b6, True), True),
    "(1, C) weight": ((x, None, None, w6.reshape(1, 6), b6, True), False),
    "int64 weight": ((x, None, None, torch.ones(6, dtype=torch.int64), b6, True), False),
    "running_mean alone": ((x, rm6.clone(), None, w6, b6, True), False),
    "evaluation": ((x, rm6.clone(), rv6.clone(), w6, b6, False), True),
    "evaluation without running statistics": ((x, None, None, w6, b6, False), False),
    "evaluation eps 0": ((x, rm6.clone(), rv6.clone(), w6, b6, False, 0.1, 0.0), False),
    "eps 0": ((x, None, None, w6, b6, True, 0.1, 0.0), False),
    "eps int": ((x, None, None, w6, b6, True, 0.1, 1), True),
    "eps bool": ((x, None, None, w6, b6, True, 0.1, True), False),
    "eps numpy float32": ((x, None, None, w6, b6, True, 0.1, np.float32(1e-5)), True),
    "eps Fraction": ((x, None, None, w6, b6, True, 0.1, fractions.Fraction(1, 1000)), True),
    "eps tensor": ((x, None, None, w6, b6, True, 0.1, torch.tensor(1e-5)), False),
    "eps nan": ((x, None, None, w6, b6, True, 0.1, float("nan")), False),
    "eps inf": ((x, None, None, w6, b6, True, 0.1, float("inf")), True),
    "momentum int 1": ((x, rm6.clone(), rv6.clone(), w6, b6, True, 1), True),
    "momentum 1.5": ((x, rm6.clone(), rv6.clone(), w6, b6, True, 1.5), False),
    "momentum None": ((x, rm6.clone(), rv6.clone(), w6, b6, True, None), False),
    "momentum numpy": ((x, rm6.clone(), rv6.clone(), w6, b6, True, np.float32(0.3)), True),
    "training int": ((x, None, None, w6, b6, 1), False),
    "running_mean requiring grad": ((x, rm6.clone().requires_grad_(), rv6.clone(), w6, b6, True), False),
    "one value per channel": ((X(1, 6), None, None, None, None, True), False),
    "one value per channel, evaluation": ((X(1, 6), rm6.clone(), rv6.clone(), None, None, False), False),
    "empty": ((X(0, 6, 2), None, None, None, None, True), False),
    "1-D": ((X(6), None, None, None, None, True), False),
    "int64 input": ((torch.ones(4, 6, 2, dtype=torch.int64), None, None, None, None, True), False),
    "non-contiguous input": ((x.transpose(2, 3), None, None, w6, b6, True), True),
    "float16 input, float32 weight": ((x.half(), None, None, w6, b6, True), True),
}

# name -> (arguments of group_norm_act / group_norm, fused)
GN = {
    "plain": ((x, 3, w6, b6), True),
    "Parameter input": ((torch.nn.Parameter(x.clone()), 3, w6, b6), True),
    "subclass input": ((x.as_subclass(Sub), 3, w6, b6), False),
    "num_groups bool": ((x, True, w6, b6), False),
    "num_groups numpy": ((x, np.int64(3), w6, b6), False),
    "num_groups float": ((x, 3.0, w6, b6), False),
    "num_groups 0": ((x, 0, w6, b6), False),
    "num_groups not dividing": ((x, 4, w6, b6), False),
    "num_groups huge": ((x, 10 ** 30, w6, b6), False),
    "one value a group": ((X(2, 6), 6), False),
    "two values a group": ((X(2, 6), 3), True),
    "float64 weight": ((x, 3, w6.double(), b6), False),
    "float16 input, float32 weight": ((x.half(), 3, w6, b6), True),
    "float16 input, bfloat16 weight": ((x.half(), 3, w6.bfloat16(), b6), False),
    "eps 0": ((x, 3, w6, b6, 0.0), True),
    "eps int 0": ((x, 3, w6, b6, 0), True),
    "eps negative": ((x, 3, w6, b6, -1.0), False),
    "(2, 3) weight": ((x, 3, w6.reshape(2, 3), b6), False),
    "channels_last": ((x.contiguous(memory_format=CL), 3, w6, b6), True),
    "empty": ((X(0, 6, 2), 3), False),
}

# name -> (arguments of layer_norm_act / layer_norm, fused)
LN = {
    "plain": ((X(4, 8), (8,), P(8), P(8, seed=2)), True),
    "int normalized_shape": ((X(4, 8), 8, P(8), P(8, seed=2)), True),
    "list normalized_shape": ((X(4, 8), [8], P(8), P(8, seed=2)), True),
    "torch.Size normalized_shape": ((X(4, 8), torch.Size([8]), P(8), P(8, seed=2)), True),
    "numpy ints": ((X(4, 8), (np.int64(8),), P(8), P(8, seed=2)), False),
    "bool normalized_shape": ((X(4, 8), True), False),
    "empty normalized_shape": ((X(4, 8), ()), False),
    "not the trailing dims": ((X(4, 8), (7,)), False),
    "longer than the input": ((X(4, 8), (2, 4, 8)), False),
    "bias without a weight": ((X(4, 8), (8,), None, P(8)), False),
    "weight alone": ((X(4, 8), (8,), P(8), None), True),
    "weight and bias of two dtypes": ((X(4, 8, dtype=torch.bfloat16), (8,), P(8), P(8).bfloat16()), False),
    "float64 weight": ((X(4, 8), (8,), P(8).double(), None), False),
    "flat weight of a (2, 4) shape": ((X(4, 2, 4), (2, 4), P(8), None), False),
    "non-contiguous (2, 4) weight": ((X(4, 2, 4), (2, 4), P(8).reshape(4, 2).t(), None), True),
    "non-contiguous input": ((X(8, 4).t(), (8,), P(8), None), True),
    "eps negative": ((X(4, 8), (8,), None, None, -1.0), False),
    "eps str": ((X(4, 8), (8,), None, None, "1e-5"), False),
    "empty": ((X(0, 8), (8,)), False),
    "Parameter input": ((torch.nn.Parameter(X(4, 8)), (8,)), True),
    "subclass input": ((X(4, 8).as_subclass(Sub), (8,)), False),
}

# name -> (arguments of layer_norm_act2d / layer_norm2d, the fused op or None)
LN2D = {
    "contiguous": ((x, w6, b6), "layer_norm_act2d_fwd"),
    "channels_last": ((x.contiguous(memory_format=CL), w6, b6), "layer_norm_act_fwd"),
    "one pixel": ((X(4, 6, 1, 1), w6, b6), "layer_norm_act_fwd"),
    "transposed": ((x.transpose(2, 3), w6, b6), None),
    "3-D": ((X(4, 6, 3), w6, b6), None),
    "5-D": ((X(2, 6, 3, 2, 2), w6, b6), None),
    "bias without a weight": ((x, None, b6), None),
    "no affine": ((x,), "layer_norm_act2d_fwd"),
    "(6, 1, 1) weight": ((x, w6.reshape(6, 1, 1), None), None),
    "eps int 0": ((x, w6, b6, 0), "layer_norm_act2d_fwd"),
    "eps negative": ((x, w6, b6, -0.5), None),
    "no channels": ((X(2, 0, 3, 3),), None),
    "float16 input, float32 weight": ((x.half(), w6, b6), "layer_norm_act2d_fwd"),
    "Parameter input": ((torch.nn.Parameter(x.clone()), w6, b6), "layer_norm_act2d_fwd"),
}

TABLE = {**{f"batch_norm_act {k}": (NF.batch_norm_act, NF.batch_norm, a, "batch_norm_act_fwd" if f else None)
            for k, (a, f) in BN.items()},
         **{f"group_norm_act {k}": (NF.group_norm_act, NF.group_norm, a, "group_norm_act_fwd" if f else None)
            for k, (a, f) in GN.items()},
         **{f"layer_norm_act {k}": (NF.layer_norm_act, NF.layer_norm, a, "layer_norm_act_fwd" if f else None)
            for k, (a, f) in LN.items()},
         **{f"layer_norm_act2d {k}": (NF.layer_norm_act2d, NF.layer_norm2d, a, op) for k, (a, op) in LN2D.items()}}


def _fresh(args):
    return [a.clone() if type(a) is torch.Tensor and not a.requires_grad else a for a in args]


@pytest.mark.parametrize("name", list(TABLE))
def test_fused_where_the_rules_say_and_the_norms_errors_elsewhere(name):
    fn, norm, args, op = TABLE[name]
    ops, err = ops_dispatched(lambda: fn(*_fresh(args), act="silu"))
    fused = sorted({o for o in ops if o.startswith("normlab.") and "_act" in o})
    if op is not None:
        assert err is None and fused == [f"normlab.{op}.default"], (fused, err)
        return
    assert fused == [], fused
    try:  # the unfused composition: the norm's own function, its error if it has one
        norm(*_fresh(args))
        want = None
    except Exception as e:  # noqa: BLE001 - compared below
        want = e
    assert (type(err), str(err)) == (type(want), str(want))
