"""normlab.freeze_batch_norm / unfreeze_batch_norm: in place, values kept, train() changes nothing."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import normlab
from normlab.nn import FrozenBatchNorm1d, FrozenBatchNorm2d, FrozenBatchNorm3d


def _model():
    """torch's and normlab's BatchNorm of every rank, affine or not, among other layers."""
    torch.manual_seed(0)
    return nn.ModuleDict({
        "cnn": nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.Conv2d(4, 4, 1), normlab.nn.BatchNorm2d(4, affine=False)),
        "mlp": nn.Sequential(nn.Linear(5, 6), normlab.nn.BatchNorm1d(6, momentum=None), nn.Tanh()),
        "vol": nn.Sequential(nn.Conv3d(2, 2, 1), nn.BatchNorm3d(2)),
    })


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, 6, 6, generator=g), torch.randn(6, 5, generator=g),
            torch.randn(2, 2, 3, 3, 3, generator=g)]


def _forward(m, xs):
    return [m["cnn"](xs[0]), m["mlp"](xs[1]), m["vol"](xs[2])]


def _trained():
    """Running statistics and affine parameters far from their initial values."""
    model = _model().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for seed in range(3):
        sum(o.square().mean() for o in _forward(model, _inputs(seed))).backward()
        opt.step()
        opt.zero_grad()
    return model


def test_freeze_keeps_eval_outputs_and_train_changes_nothing():
    model = _trained().eval()
    ref = copy.deepcopy(model)  # the unfrozen model in eval mode is the oracle
    xs = _inputs(7)
    out = normlab.freeze_batch_norm(model)
    assert out is model
    kinds = [type(m) for m in model.modules() if "BatchNorm" in type(m).__name__]
    assert kinds == [FrozenBatchNorm2d, FrozenBatchNorm2d, FrozenBatchNorm1d, FrozenBatchNorm3d]
    # nothing left to train in them: only the Conv/Linear parameters remain
    assert {n.rsplit(".", 1)[0] for n, _ in model.named_parameters()} == {"cnn.0", "cnn.3", "mlp.0", "vol.0"}
    y_eval = _forward(model, xs)
    for a, b in zip(y_eval, _forward(ref, xs)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.train()
    y_train = _forward(model, xs)
    for a, b in zip(y_train, y_eval):
        assert torch.equal(a, b)  # bitwise: train mode computes exactly the eval formula
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), f"{n} moved in a train-mode forward"


def test_frozen_values_are_the_batch_norm_values():
    model = _trained()
    bn = model["cnn"][1]
    weight, mean = bn.weight.detach().clone(), bn.running_mean
    normlab.freeze_batch_norm(model)
    frozen = model["cnn"][1]
    assert torch.equal(frozen.weight, weight)
    assert frozen.running_mean is mean  # the very same buffer object
    affine_free = model["cnn"][4]  # affine=False: identity weight and bias
    assert torch.equal(affine_free.weight, torch.ones(4)) and torch.equal(affine_free.bias, torch.zeros(4))


def test_gradient_reaches_layers_before_a_frozen_batch_norm():
    model = normlab.freeze_batch_norm(_trained()).train()
    x = _inputs()[0].requires_grad_()
    model["cnn"](x).sum().backward()
    assert model["cnn"][0].weight.grad is not None and x.grad.abs().sum() > 0


def test_only_selects_by_name_and_by_prefix():
    model = normlab.freeze_batch_norm(_trained(), only=["cnn.1", "vol"])
    assert isinstance(model["cnn"][1], FrozenBatchNorm2d)
    assert isinstance(model["vol"][1], FrozenBatchNorm3d)
    assert type(model["cnn"][4]) is normlab.nn.BatchNorm2d
    assert type(model["mlp"][1]) is normlab.nn.BatchNorm1d
    model = normlab.freeze_batch_norm(_trained(), only="mlp.1")
    assert isinstance(model["mlp"][1], FrozenBatchNorm1d)


def test_bad_only_and_unfreezable_layers_raise_or_warn_before_any_change():
    model = _trained()
    with pytest.raises(ValueError, match=r"no module named \['cnn\.9'\].*'cnn\.1'"):
        normlab.freeze_batch_norm(model, only=["cnn.1", "cnn.9"])
    assert type(model["cnn"][1]) is nn.BatchNorm2d  # untouched: checked before any swap
    with pytest.raises(TypeError, match="module name"):
        normlab.freeze_batch_norm(model, only=[1])
    with pytest.raises(TypeError, match="torch.nn.Module"):
        normlab.freeze_batch_norm("model")

    model = nn.Sequential(nn.BatchNorm1d(3, track_running_stats=False), nn.BatchNorm1d(3))
    with pytest.raises(ValueError, match="'0'.*track_running_stats=False"):
        normlab.freeze_batch_norm(model, only="0")
    with pytest.warns(UserWarning, match="left 1 BatchNorm.*0: track_running_stats=False"):
        normlab.freeze_batch_norm(model)
    assert type(model[0]) is nn.BatchNorm1d and isinstance(model[1], FrozenBatchNorm1d)

    with pytest.warns(UserWarning, match="no BatchNorm"):
        normlab.freeze_batch_norm(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)))


def test_unfreeze_brings_back_the_same_modules_parameters_and_counts():
    model = _trained()
    originals = {n: m for n, m in model.named_modules() if "BatchNorm" in type(m).__name__}
    params = {n: p for n, p in model.named_parameters()}
    counts = {n: b.clone() for n, b in model.named_buffers() if n.endswith("num_batches_tracked")}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    normlab.freeze_batch_norm(model)
    model.eval()  # the mode set while frozen is the mode after thawing
    assert normlab.unfreeze_batch_norm(model) is model
    for n, m in model.named_modules():
        if n in originals:
            assert m is originals[n]
            assert not m.training
    for n, p in model.named_parameters():
        assert p is params[n]
    for n, b in model.named_buffers():
        if n in counts:
            assert torch.equal(b, counts[n])
    # the optimizer built before freezing still trains the BatchNorm's Parameters
    model.train()
    sum(o.square().mean() for o in _forward(model, _inputs())).backward()
    before = model["cnn"][1].weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model["cnn"][1].weight)


def test_values_loaded_or_cast_while_frozen_come_back():
    model = _trained()
    w = model["cnn"][1].weight
    normlab.freeze_batch_norm(model)
    sd = {k: v + 1 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    model.load_state_dict(sd)  # e.g. a torchvision-format checkpoint loaded into the frozen model
    model.double()
    with pytest.warns(UserWarning, match=r"affine=False.*cnn\.4: weight and bias"):
        normlab.unfreeze_batch_norm(model)  # cnn.4 has no affine to take the loaded +1
    bn = model["cnn"][1]
    assert bn.weight is w and bn.weight.dtype == torch.float64
    assert torch.equal(bn.weight, sd["cnn.1.weight"].double())
    assert torch.equal(bn.running_var, sd["cnn.1.running_var"].double())


def test_shared_module_root_module_hooks_and_direct_frozen_layers():
    bn = nn.BatchNorm1d(3)
    calls = []
    bn.register_forward_hook(lambda m, i, o: calls.append(type(m).__name__))
    model = nn.Sequential(bn, nn.ReLU(), bn)  # the same layer twice
    normlab.freeze_batch_norm(model)
    assert model[0] is model[2] and isinstance(model[0], FrozenBatchNorm1d)
    model(torch.randn(2, 3))
    assert calls == ["FrozenBatchNorm1d", "FrozenBatchNorm1d"]
    assert normlab.unfreeze_batch_norm(model)[0] is bn and model[2] is bn

    frozen = normlab.freeze_batch_norm(nn.BatchNorm2d(2))
    assert isinstance(frozen, FrozenBatchNorm2d)

    direct = FrozenBatchNorm2d(2)
    direct.running_mean.fill_(3.0)
    thawed = normlab.unfreeze_batch_norm(nn.Sequential(direct))[0]
    assert type(thawed) is normlab.nn.BatchNorm2d
    assert torch.equal(thawed.running_mean, torch.full((2,), 3.0)) and int(thawed.num_batches_tracked) == 0
    assert [n for n, _ in thawed.named_parameters()] == ["weight", "bias"]


def test_freezing_twice_is_harmless():
    model = normlab.freeze_batch_norm(_trained())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frozen = [m for m in model.modules() if isinstance(m, FrozenBatchNorm2d)]
        with pytest.warns(UserWarning, match="no BatchNorm"):
            normlab.freeze_batch_norm(model)
    assert frozen == [m for m in model.modules() if isinstance(m, FrozenBatchNorm2d)]
