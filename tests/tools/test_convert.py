"""normlab.convert / normlab.revert: model surgery that changes no output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab


def _model():
    torch.manual_seed(0)
    return nn.ModuleDict({
        "mlp": nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8, momentum=None), nn.Tanh(),
                             nn.Linear(8, 8), nn.LayerNorm(8, bias=False), nn.RMSNorm(8, eps=1e-6)),
        "cnn": nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GroupNorm(2, 4),
                             nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
                             nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4, affine=False)),
        "seq": nn.Sequential(nn.Conv1d(2, 2, 1), nn.InstanceNorm1d(2), nn.BatchNorm1d(2)),
        "vol": nn.Sequential(nn.BatchNorm3d(2, track_running_stats=False), nn.InstanceNorm3d(2)),
    })


def _forward(m, xs):
    return [m["mlp"](xs[0]), m["cnn"](xs[1]), m["seq"](xs[2]), m["vol"](xs[3])]


def _inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(5, 6, generator=g), torch.randn(2, 3, 6, 6, generator=g),
            torch.randn(3, 2, 7, generator=g), torch.randn(2, 2, 3, 3, 3, generator=g)]


TORCH_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm,
               nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


@pytest.mark.parametrize("training", [True, False])
def test_convert_keeps_parameters_buffers_mode_and_outputs(training):
    ref, model = _model(), _model()
    # make statistics and parameters non-trivial first
    for m in (ref, model):
        m.train()
        _forward(m, _inputs())
        m.train(training)
    params_before = {n: p for n, p in model.named_parameters()}
    buffers_before = {n: b for n, b in model.named_buffers()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    out = normlab.convert(model)
    assert out is model
    norms = [m for m in model.modules() if type(m).__module__.startswith("normlab")]
    assert len(norms) == 11
    assert not any(type(m) in TORCH_NORMS for m in model.modules())
    for n, p in model.named_parameters():
        assert p is params_before[n]  # the very same Parameter objects
    for n, b in model.named_buffers():
        assert b is buffers_before[n]
    assert all(m.training == training for m in model.modules())

    xs = _inputs()
    for a, b in zip(_forward(model, xs), _forward(ref, xs)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if training:  # running stats moved the same way
        for (n, a), (_, b) in zip(model.named_buffers(), ref.named_buffers()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=n)
    # the optimizer built before the swap still updates the model's parameters
    sum(o.sum() for o in _forward(model, xs)).backward()
    before = model["mlp"][0].weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model["mlp"][0].weight)


def test_revert_restores_torch_modules_and_outputs():
    ref, model = _model(), _model()
    model.eval()
    ref.eval()
    normlab.convert(model)
    normlab.revert(model)
    assert sorted(type(m).__name__ for m in model.modules()) == sorted(type(m).__name__ for m in ref.modules())
    assert all(type(m).__module__.startswith("torch") for m in model.modules())
    xs = _inputs()
    for a, b in zip(_forward(model, xs), _forward(ref, xs)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert model.state_dict().keys() == ref.state_dict().keys()


def test_convert_a_bare_norm_layer_returns_its_twin():
    ln = nn.LayerNorm(4)
    twin = normlab.convert(ln)
    assert isinstance(twin, normlab.nn.LayerNorm) and twin.weight is ln.weight


def test_convert_leaves_subclasses_and_unknown_modules_alone():
    class MyNorm(nn.LayerNorm):
        pass

    m = nn.Sequential(MyNorm(4), nn.Linear(4, 4), nn.SyncBatchNorm(4))
    normlab.convert(m)
    assert type(m[0]) is MyNorm and type(m[2]) is nn.SyncBatchNorm


def test_convert_keeps_hooks():
    m = nn.Sequential(nn.LayerNorm(4))
    seen = []
    m[0].register_forward_hook(lambda mod, inp, out: seen.append(type(mod).__name__))
    normlab.convert(m)
    m(torch.randn(2, 4))
    assert seen == ["LayerNorm"] and isinstance(m[0], normlab.nn.LayerNorm)


def test_convert_rejects_non_modules():
    with pytest.raises(TypeError, match=r"^convert: expected model to be a torch.nn.Module, got list$"):
        normlab.convert([nn.LayerNorm(3)])
    with pytest.raises(TypeError, match=r"^revert: expected model to be a torch.nn.Module, got NoneType$"):
        normlab.revert(None)


# ----------------------------------------------------------------------------
# register_conversion: norm classes of one's own
# ----------------------------------------------------------------------------


class ScaleNorm(nn.Module):
    """An RMSNorm written by hand (the oracle: its own forward)."""

    def __init__(self, d, eps=1e-6, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, device=device))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@pytest.fixture
def scale_norm_registered():
    from normlab.tools import conversion as conv

    normlab.register_conversion(
        ScaleNorm,
        lambda m: conv.adopt(m, normlab.nn.RMSNorm, normalized_shape=tuple(m.weight.shape), eps=m.eps),
        lambda n: conv.adopt(n, ScaleNorm, d=n.normalized_shape[0], eps=n.eps),
    )
    yield
    conv._REGISTERED.pop(ScaleNorm, None)


def test_register_conversion_converts_and_reverts_a_class_of_ones_own(scale_norm_registered):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), ScaleNorm(6, eps=1e-3))
    with torch.no_grad():
        model[1].weight.normal_()
    x = torch.randn(4, 6)
    want = model(x)
    weight = model[1].weight
    seen = []
    model[1].register_forward_hook(lambda mod, inp, out: seen.append(type(mod).__name__))
    normlab.convert(model)
    assert type(model[1]) is normlab.nn.RMSNorm and model[1].weight is weight and model[1].eps == 1e-3
    torch.testing.assert_close(model(x), want, rtol=1e-6, atol=1e-6)
    assert seen == ["RMSNorm"]  # the hook came along
    normlab.revert(model)
    assert type(model[1]) is ScaleNorm and model[1].weight is weight
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)


def test_to_normlab_may_decline(scale_norm_registered):
    from normlab.tools import conversion as conv

    conv._REGISTERED[ScaleNorm] = (lambda m: None, lambda n: None)
    m = nn.Sequential(ScaleNorm(4))
    normlab.convert(m)
    assert type(m[0]) is ScaleNorm


def test_register_conversion_errors():
    with pytest.raises(TypeError, match="cls to be a torch.nn.Module subclass, got 'LayerNorm'"):
        normlab.register_conversion("LayerNorm", lambda m: m, lambda m: m)
    with pytest.raises(TypeError, match="to_normlab to be callable"):
        normlab.register_conversion(ScaleNorm, None, lambda m: m)
    with pytest.raises(TypeError, match="from_normlab to be callable"):
        normlab.register_conversion(ScaleNorm, lambda m: m, 3)


def test_a_conversion_that_returns_no_module_is_an_error(scale_norm_registered):
    from normlab.tools import conversion as conv

    conv._REGISTERED[ScaleNorm] = (lambda m: "twin", lambda n: n)
    with pytest.raises(TypeError, match="to_normlab for ScaleNorm returned str"):
        normlab.convert(nn.Sequential(ScaleNorm(4)))


def test_revert_leaves_rms_norm_variants_that_torch_cannot_express():
    m = nn.Sequential(normlab.nn.RMSNorm(4, casting="gemma", offset=1.0), normlab.nn.RMSNorm(4, eps=1e-6))
    normlab.revert(m)
    assert type(m[0]) is normlab.nn.RMSNorm and type(m[1]) is nn.RMSNorm
