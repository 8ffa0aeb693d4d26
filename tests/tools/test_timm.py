"""normlab.convert on timm's norm classes, and on the channels-first LayerNorm2d that detectron2 and
segment-anything define (a user class: taught with ``normlab.register_conversion``).

timm 1.0 cannot be imported beside torch 2.13 (its torchvision dependency is built for
another torch), so the timm classes here are written fresh from their documented math and
placed in the module timm defines them in (``timm.layers.norm``); the oracle is their own
forward (and float64 torch). The last tests build real timm models where timm imports (for
example beside torch 2.14.1 and torchvision 0.29.1) and skip elsewhere.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import normlab
from normlab.tools import timm as nl_timm

MODULE = "timm.layers.norm"


# -- timm's classes, as documented: the same attributes, the same math -------------------------


class LayerNorm(nn.LayerNorm):
    """timm.layers.norm.LayerNorm: torch's LayerNorm with eps 1e-6."""

    def __init__(self, num_channels, eps=1e-6, affine=True):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)
        self._fast_norm = False

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class LayerNorm2d(nn.LayerNorm):
    """timm.layers.norm.LayerNorm2d: LayerNorm over dim 1 of (N, C, H, W), by permuting."""

    def __init__(self, num_channels, eps=1e-6, affine=True):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)
        self._fast_norm = False

    def forward(self, x):
        y = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return y.permute(0, 3, 1, 2)


class RmsNorm(nn.Module):
    """timm.layers.norm.RmsNorm: x / sqrt(mean(x^2) + eps) * weight over the trailing dims."""

    def __init__(self, channels, eps=1e-6, affine=True):
        super().__init__()
        self.normalized_shape = (channels,)
        self.eps = eps
        self.elementwise_affine = affine
        self._fast_norm = False
        if affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


for _cls in (LayerNorm, LayerNorm2d, RmsNorm):
    _cls.__module__ = "timm.layers.norm"
    _cls.__qualname__ = _cls.__name__


class Net(nn.Module):
    """A small convnet with timm-style norms: stem, LayerNorm2d, 1x1 conv, pooled, LayerNorm, RmsNorm."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.norm2d = LayerNorm2d(8)
        self.proj = nn.Conv2d(8, 8, 1)
        self.norm = LayerNorm(8)
        self.rms = RmsNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.proj(self.norm2d(self.stem(x))).mean((2, 3))
        return self.head(self.rms(self.norm(h)))


def _net():
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name or "rms" in name:
                p.add_(0.3 * torch.randn_like(p))
    return net


def test_timm_classes_convert_with_the_same_parameters_outputs_and_gradients():
    ref, net = _net(), _net()
    params = dict(net.named_parameters())
    keys = list(net.state_dict())
    x = torch.randn(2, 3, 6, 5)
    normlab.convert(net)
    assert type(net.norm2d) is normlab.nn.LayerNorm2d
    assert type(net.norm) is normlab.nn.LayerNorm
    assert type(net.rms) is normlab.nn.RMSNorm
    assert net.norm2d.eps == net.norm.eps == net.rms.eps == 1e-6
    assert all(p is params[n] for n, p in net.named_parameters())
    assert list(net.state_dict()) == keys
    for backend in ("ref", "cpu"):
        with normlab.use_backend(backend):
            y, y_ref = net(x), ref(x)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
        y.sum().backward()
        y_ref.sum().backward()
        for (n, p), p_ref in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-5, atol=1e-6, msg=n)
            p.grad = p_ref.grad = None


def test_revert_gives_the_timm_modules_back():
    net = _net()
    originals = {n: m for n, m in net.named_modules() if n in ("norm2d", "norm", "rms")}
    x = torch.randn(2, 3, 4, 4)
    want = net(x)
    normlab.convert(net)
    with torch.no_grad():
        net.norm2d.eps = 1e-3  # a change made on the twin comes back
    normlab.revert(net)
    for n, m in originals.items():
        assert getattr(net, n) is m
    assert net.norm2d.eps == 1e-3 and net.norm2d.weight is originals["norm2d"].weight
    net.norm2d.eps = 1e-6
    torch.testing.assert_close(net(x), want, rtol=0, atol=0)


def test_timm_layer_norm2d_matches_float64_torch():
    m = LayerNorm2d(5)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    twin = normlab.convert(m)
    want = F.layer_norm(x.permute(0, 2, 3, 1), (5,), m.weight.double(), m.bias.double(), 1e-6).permute(0, 3, 1, 2)
    torch.testing.assert_close(twin.double()(x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_timm_layer_norm2d_twin_lays_out_its_output_as_timm(fmt, dtype):
    """timm's LayerNorm2d returns its permuted result: channels_last strides whatever the input's
    format. The twin returns the same strides (so the 1x1 convolutions after it run the kernels
    they ran before), the same values, and its gradient in the input's own layout."""
    m = LayerNorm2d(6).to(dtype)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    x = torch.randn(2, 6, 5, 4).to(dtype).contiguous(memory_format=fmt)
    want = m(x)
    twin = normlab.convert(m)
    assert twin.channels_last_output and "channels_last_output=True" in repr(twin)
    for backend in ("ref", "cpu"):
        xg = x.clone().requires_grad_()
        with normlab.use_backend(backend):
            y = twin(xg)
        assert y.stride() == want.stride(), backend
        torch.testing.assert_close(y, want, rtol=1e-5 if dtype == torch.float32 else 2e-2, atol=1e-5)
        y.sum().backward()
        assert xg.grad.stride() == xg.stride()
    assert normlab.nn.LayerNorm2d(6)(x).is_contiguous(memory_format=fmt)  # normlab's own: the input's


def test_instances_normlab_cannot_express_are_left_alone():
    fast = LayerNorm2d(4)
    fast._fast_norm = True  # timm.layers.set_fast_norm(): another precision under autocast
    weight_only = LayerNorm2d(4)
    weight_only.bias = None
    rms_biased = RmsNorm(4)
    rms_biased.bias = nn.Parameter(torch.zeros(4))
    model = nn.Sequential(fast, weight_only, rms_biased)
    normlab.convert(model)
    assert list(model) == [fast, weight_only, rms_biased]


def test_only_timm_classes_are_recognised():
    class Elsewhere(LayerNorm2d):
        pass

    assert nl_timm.kind_of(LayerNorm2d) == "LayerNorm2d"
    assert nl_timm.kind_of(Elsewhere) is None  # a subclass: its forward may differ
    assert nl_timm.kind_of(nn.LayerNorm) is None


# -- detectron2 / segment-anything's LayerNorm2d: a class of the user's -----------------------


class UserLayerNorm2d(nn.Module):
    """The channels-first LayerNorm as detectron2 and segment-anything write it."""

    def __init__(self, num_channels, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


def _user_to_normlab(m):
    return normlab.tools.conversion.adopt(m, normlab.nn.LayerNorm2d, num_channels=m.weight.shape[0], eps=m.eps)


def _user_from_normlab(n):
    old = UserLayerNorm2d(n.num_channels, eps=n.eps)
    old.weight, old.bias = n.weight, n.bias  # the twin's own Parameters
    return old


@pytest.fixture
def user_registered():
    from normlab.tools import conversion as conv

    normlab.register_conversion(UserLayerNorm2d, _user_to_normlab, _user_from_normlab)
    yield
    conv._REGISTERED.pop(UserLayerNorm2d, None)


def test_register_conversion_handles_a_detectron2_style_layer_norm2d(user_registered):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), UserLayerNorm2d(6), nn.GELU())
    with torch.no_grad():
        model[1].weight.normal_()
        model[1].bias.normal_()
    ref = UserLayerNorm2d(6)
    ref.load_state_dict(model[1].state_dict())
    weight, keys = model[1].weight, list(model.state_dict())
    x = torch.randn(2, 3, 7, 7, requires_grad=True)
    want = model(x)
    (gx_want,) = torch.autograd.grad(want.sum(), x)
    normlab.convert(model)
    assert type(model[1]) is normlab.nn.LayerNorm2d and model[1].weight is weight
    assert list(model.state_dict()) == keys
    got = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    (gx,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(gx, gx_want, rtol=1e-5, atol=1e-6)
    normlab.revert(model)
    assert type(model[1]) is UserLayerNorm2d and model[1].weight is weight
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)


# -- real timm models, where timm imports (it needs a torchvision built for the installed torch) --


@pytest.mark.parametrize("name, kwargs, norm", [
    ("convnext_atto", {}, "LayerNorm2d"),
    ("vit_tiny_patch16_224", {"img_size": 32}, "LayerNorm"),
])
def test_real_timm_models_train_the_same_after_convert(name, kwargs, norm):
    timm = pytest.importorskip("timm", reason="timm (and a torchvision for this torch) not installed")
    torch.manual_seed(0)
    ref = timm.create_model(name, pretrained=False, num_classes=5, **kwargs)
    torch.manual_seed(0)
    net = timm.create_model(name, pretrained=False, num_classes=5, **kwargs)
    keys = list(net.state_dict())
    n_norms = sum(type(m).__qualname__ == norm and type(m).__module__ == MODULE for m in ref.modules())
    normlab.convert(net)
    assert n_norms > 0
    assert sum(type(m) is getattr(normlab.nn, norm) for m in net.modules()) == n_norms
    assert list(net.state_dict()) == keys
    x = torch.randn(2, 3, 32, 32)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ref, net)]
    for _ in range(3):  # a few training steps: outputs and every gradient within float32 rounding
        y_ref, y = ref(x), net(x)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        for y_m, opt in zip((y_ref, y), opts):
            opt.zero_grad()
            y_m.square().mean().backward()
        for (n, p_ref), p in zip(ref.named_parameters(), net.parameters()):
            scale = p_ref.grad.abs().max().item()
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-5, atol=1e-5 * scale, msg=n)
        for opt in opts:
            opt.step()
    normlab.revert(net)
    assert sum(type(m).__qualname__ == norm and type(m).__module__ == MODULE for m in net.modules()) == n_norms

