"""normlab.convert / revert on timm's norm+act classes (faithful stand-ins:
tests/tools/timm_norm_act_standins.py) and on four blocks built from them: every norm replaced,
outputs and gradients equal to the original within the accuracy rule, revert restores, the
checkpoint loads both ways."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import normlab
import normlab.nn as NN
from normlab.tools import timm as nl_timm
from tests.oracle import rel_err, rounding_err
from tests.tools import timm_norm_act_standins as T

TWIN = {T.BatchNormAct2d: NN.BatchNormAct2d, T.FrozenBatchNormAct2d: NN.FrozenBatchNormAct2d,
        T.GroupNormAct: NN.GroupNormAct, T.LayerNormAct: NN.LayerNormAct, T.LayerNormAct2d: NN.LayerNormAct2d}


def _gn_layer(c, **kw):
    return T.GroupNormAct(c, group_size=4, **kw)


def _frozen_stage():
    stage = T.resnet_d_stage()
    for name, m in list(stage.named_modules()):  # timm's freeze_batch_norm_2d, by hand
        for cname, child in list(m.named_children()):
            if type(child) is T.BatchNormAct2d:
                f = T.FrozenBatchNormAct2d(child.num_features)
                f.weight.copy_(child.weight.detach()), f.bias.copy_(child.bias.detach())
                f.running_mean.copy_(child.running_mean), f.running_var.copy_(child.running_var)
                f.act = child.act
                setattr(m, cname, f)
    return stage


BLOCKS = {
    "resnet_d_stage": lambda: T.resnet_d_stage(),
    "resnet_d_stage frozen": _frozen_stage,
    "mbconv": lambda: T.MBConv(),
    "regnet_y": lambda: T.RegNetBottleneck(),
    "regnet_x groupnorm": lambda: T.RegNetBottleneck(se_ratio=0.0, norm_layer=_gn_layer, act_layer=nn.LeakyReLU),
    "convnext": lambda: T.ConvNeXtBlock(),
    "convnext conv_mlp": lambda: T.ConvNeXtBlock(conv_mlp=True),
}


def _randomise(model):
    torch.manual_seed(7)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                if "running_var" in k or k.endswith("weight") and v.dim() == 1:
                    v.copy_(torch.rand_like(v) + 0.5)
                elif "running_mean" in k or k.endswith("bias"):
                    v.copy_(torch.randn_like(v) * 0.2)
    return model


def _norms(model):
    return [m for m in model.modules() if nl_timm.norm_act_kind_of(type(m))]


def _run(model, x, g):
    x = x.detach().clone().requires_grad_()
    y = model(x)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad((y * g).sum(), [x] + params)
    return y, grads


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("fmt", [None, torch.channels_last])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_converts_and_reverts(name, fmt, training):
    torch.manual_seed(0)
    block = _randomise(BLOCKS[name]()).train(training)
    originals = _norms(block)
    assert originals
    x = torch.randn(4, 16, 12, 12)
    if fmt is not None:
        x = x.contiguous(memory_format=fmt)
    with torch.no_grad():
        g = torch.randn(copy.deepcopy(block)(x).shape)
    ref64 = copy.deepcopy(block).double()
    y64, g64 = _run(ref64, x.double(), g.double())
    yt, gt = _run(copy.deepcopy(block), x, g)
    state = copy.deepcopy(block.state_dict())

    converted = normlab.convert(block)
    assert _norms(converted) == []  # every timm norm replaced ...
    twins = [m for m in converted.modules() if type(m) in TWIN.values()]
    assert [type(m) for m in twins] == [TWIN[type(m)] for m in originals]  # ... by its twin, in order
    for o, t in zip(originals, twins):
        assert t.act is o.act and t.drop is o.drop
    assert list(converted.state_dict()) == list(state)  # the same keys
    y, gr = _run(converted, x, g)
    for a, b, c, what in [(y, y64, yt, "output")] + [(a, b, c, f"grad {i}") for i, (a, b, c) in
                                                      enumerate(zip(gr, g64, gt))]:
        bound = max(2 * rel_err(c, b), 2 * rounding_err(b, a.dtype), 1e-5)
        assert rel_err(a, b) <= bound, (name, what, rel_err(a, b), bound)

    # the checkpoint loads both ways
    fresh = BLOCKS[name]()
    fresh.load_state_dict(converted.state_dict(), strict=True)
    fresh_twin = normlab.convert(BLOCKS[name]())
    fresh_twin.load_state_dict(state, strict=True)
    assert all(torch.equal(fresh_twin.state_dict()[k], v) for k, v in state.items())

    reverted = normlab.revert(converted)
    assert _norms(reverted) == originals  # the very modules back
    assert [type(m) for m in twins] and all(type(m) not in TWIN.values() for m in reverted.modules())


def test_layer_norm_act2d_twin_lays_out_its_output_as_timm():
    """timm's LayerNormAct2d permutes: its output has channels_last strides for an NCHW input, and
    so has the twin's."""
    m = T.LayerNormAct2d(8, act_layer=nn.GELU)
    x = torch.randn(2, 8, 5, 3)
    want = m(x)
    twin = normlab.convert(m)
    assert twin.channels_last_output
    y = twin(x)
    assert y.stride() == want.stride() and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


def test_unknown_activation_left_alone():
    m = T.BatchNormAct2d(4, act_layer=nn.ReLU6)
    assert normlab.convert(nn.Sequential(m))[0] is m


def test_fast_norm_left_alone():
    m = T.GroupNormAct(8, 2)
    m._fast_norm = True
    assert normlab.convert(nn.Sequential(m))[0] is m


def test_not_a_timm_class():
    class BatchNormAct2d(nn.BatchNorm2d):  # same name, another module
        pass

    assert nl_timm.norm_act_kind_of(BatchNormAct2d) is None
    assert nl_timm.norm_act_kind_of(T.BatchNormAct2d) == "BatchNormAct2d"


def test_revert_carries_the_twins_changes():
    m = T.BatchNormAct2d(4, act_layer="silu")
    twin = normlab.convert(nn.Sequential(m))[0]
    assert type(twin) is NN.BatchNormAct2d
    twin(torch.randn(3, 4, 5, 5))  # running statistics move
    twin.eps = 1e-3
    back = normlab.revert(nn.Sequential(twin))[0]
    assert back is m and back.eps == 1e-3 and int(back.num_batches_tracked) == 1
    assert torch.equal(back.running_mean, twin.running_mean)
