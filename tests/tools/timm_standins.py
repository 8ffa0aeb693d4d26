"""Faithful stand-ins of timm's RmsNorm2d, SimpleNorm, SimpleNorm2d (``timm/layers/norm.py`` and
``fast_norm.py``), EvoNorm2dB0, EvoNorm2dS0 (``evo_norm.py``), FilterResponseNormTlu2d and
FilterResponseNormAct2d (``filter_response_norm.py``, ``create_act.py``): the oracle of the tests
of normlab's twins, and the classes ``normlab.convert`` must recognise.

timm cannot be imported beside this torch (its torchvision dependency is built for another
release), so these are minimal copies of timm 1.0's constructors, attributes and forwards (the
non-``_fast_norm`` path, the default ``create_act_layer`` table), written from its source, with
``__module__`` set to the module timm defines each class in.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

# timm.layers.create_act: the name -> layer table (the torch-native entries)
_ACT_LAYER_DEFAULT = dict(
    silu=nn.SiLU, swish=nn.SiLU, mish=nn.Mish, relu=nn.ReLU, relu6=nn.ReLU6, leaky_relu=nn.LeakyReLU,
    elu=nn.ELU, celu=nn.CELU, selu=nn.SELU, gelu=nn.GELU, sigmoid=nn.Sigmoid, tanh=nn.Tanh,
    hard_sigmoid=nn.Hardsigmoid, hard_swish=nn.Hardswish, identity=nn.Identity,
)


def create_act_layer(name, inplace=None, **kwargs):
    act_layer = _ACT_LAYER_DEFAULT[name.lower()] if isinstance(name, str) else name
    if act_layer is None:
        return None
    if inplace is None:
        return act_layer(**kwargs)
    try:
        return act_layer(inplace=inplace, **kwargs)
    except TypeError:
        return act_layer(**kwargs)


# -- timm.layers.fast_norm ------------------------------------------------------------------------


def rms_norm2d(x, normalized_shape, weight=None, eps: float = 1e-5):
    assert len(normalized_shape) == 1
    v = x.pow(2)
    v = torch.mean(v, dim=1, keepdim=True)
    x = x * torch.rsqrt(v + eps)
    if weight is not None:
        x = x * weight.reshape(1, -1, 1, 1)
    return x


def simple_norm(x, normalized_shape, weight=None, eps: float = 1e-5):
    norm_ndim = len(normalized_shape)
    dims = tuple(range(-1, -norm_ndim - 1, -1))
    v = torch.var(x, dim=dims, keepdim=True)
    x = x * torch.rsqrt(v + eps)
    if weight is not None:
        x = x * weight
    return x


# -- timm.layers.norm -----------------------------------------------------------------------------


def _norm_init(self, channels, eps, affine, device, dtype):
    """The constructor the three share in timm (each class writes it out)."""
    nn.Module.__init__(self)
    normalized_shape = (channels,) if isinstance(channels, int) else channels
    self.normalized_shape = tuple(normalized_shape)
    self.eps = eps
    self.elementwise_affine = affine
    self._fast_norm = False
    if self.elementwise_affine:
        self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
    else:
        self.register_parameter("weight", None)
    if self.elementwise_affine:
        nn.init.ones_(self.weight)


class RmsNorm2d(nn.Module):
    def __init__(self, channels, eps: float = 1e-6, affine: bool = True, device=None, dtype=None):
        _norm_init(self, channels, eps, affine, device, dtype)

    def forward(self, x):
        return rms_norm2d(x, self.normalized_shape, self.weight, self.eps)


class SimpleNorm(nn.Module):
    def __init__(self, channels, eps: float = 1e-6, affine: bool = True, device=None, dtype=None):
        _norm_init(self, channels, eps, affine, device, dtype)

    def forward(self, x):
        return simple_norm(x, self.normalized_shape, self.weight, self.eps)


class SimpleNorm2d(nn.Module):
    def __init__(self, channels, eps: float = 1e-6, affine: bool = True, device=None, dtype=None):
        _norm_init(self, channels, eps, affine, device, dtype)

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = simple_norm(x, self.normalized_shape, self.weight, self.eps)
        return x.permute(0, 3, 1, 2)


# -- timm.layers.evo_norm -------------------------------------------------------------------------


def instance_std(x, eps: float = 1e-5):
    std = x.float().var(dim=(2, 3), unbiased=False, keepdim=True).add(eps).sqrt().to(x.dtype)
    return std.expand(x.shape)


def group_std(x, groups: int = 32, eps: float = 1e-5):
    B, C, H, W = x.shape
    x_dtype = x.dtype
    assert C % groups == 0
    x = x.reshape(B, groups, C // groups, H, W)
    std = x.float().var(dim=(2, 3, 4), unbiased=False, keepdim=True).add(eps).sqrt().to(x_dtype)
    return std.expand(x.shape).reshape(B, C, H, W)


class EvoNorm2dB0(nn.Module):
    def __init__(self, num_features, apply_act=True, momentum=0.1, eps=1e-3, device=None, dtype=None, **_):
        dd = {"device": device, "dtype": dtype}
        super().__init__()
        self.apply_act = apply_act
        self.momentum = momentum
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(num_features, **dd))
        self.bias = nn.Parameter(torch.empty(num_features, **dd))
        self.v = nn.Parameter(torch.empty(num_features, **dd)) if apply_act else None
        self.register_buffer("running_var", torch.ones(num_features, **dd))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        if self.v is not None:
            nn.init.ones_(self.v)

    def forward(self, x):
        assert x.dim() == 4, "expected 4D input"
        x_dtype = x.dtype
        v_shape = (1, -1, 1, 1)
        if self.v is not None:
            if self.training:
                var = x.float().var(dim=(0, 2, 3), unbiased=False)
                n = x.numel() / x.shape[1]
                self.running_var.copy_(
                    self.running_var * (1 - self.momentum) + var.detach() * self.momentum * (n / (n - 1)))
            else:
                var = self.running_var
            left = var.add(self.eps).sqrt_().to(x_dtype).view(v_shape).expand_as(x)
            v = self.v.to(x_dtype).view(v_shape)
            right = x * v + instance_std(x, self.eps)
            x = x / left.max(right)
        return x * self.weight.to(x_dtype).view(v_shape) + self.bias.to(x_dtype).view(v_shape)


class EvoNorm2dS0(nn.Module):
    def __init__(self, num_features, groups=32, group_size: Optional[int] = None, apply_act=True, eps=1e-5,
                 device=None, dtype=None, **_):
        dd = {"device": device, "dtype": dtype}
        super().__init__()
        self.apply_act = apply_act
        if group_size:
            assert num_features % group_size == 0
            self.groups = num_features // group_size
        else:
            self.groups = groups
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(num_features, **dd))
        self.bias = nn.Parameter(torch.empty(num_features, **dd))
        self.v = nn.Parameter(torch.empty(num_features, **dd)) if apply_act else None
        self.reset_parameters()

    reset_parameters = EvoNorm2dB0.reset_parameters

    def forward(self, x):
        assert x.dim() == 4, "expected 4D input"
        x_dtype = x.dtype
        v_shape = (1, -1, 1, 1)
        if self.v is not None:
            v = self.v.view(v_shape).to(x_dtype)
            x = x * (x * v).sigmoid() / group_std(x, self.groups, self.eps)
        return x * self.weight.view(v_shape).to(x_dtype) + self.bias.view(v_shape).to(x_dtype)


# -- timm.layers.filter_response_norm -------------------------------------------------------------


def inv_instance_rms(x, eps: float = 1e-5):
    rms = x.square().float().mean(dim=(2, 3), keepdim=True).add(eps).rsqrt().to(x.dtype)
    return rms.expand(x.shape)


class FilterResponseNormTlu2d(nn.Module):
    def __init__(self, num_features, apply_act=True, eps=1e-5, rms=True, device=None, dtype=None, **_):
        dd = {"device": device, "dtype": dtype}
        super().__init__()
        self.apply_act = apply_act
        self.rms = rms
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(num_features, **dd))
        self.bias = nn.Parameter(torch.empty(num_features, **dd))
        self.tau = nn.Parameter(torch.empty(num_features, **dd)) if apply_act else None
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        if self.tau is not None:
            nn.init.zeros_(self.tau)

    def forward(self, x):
        assert x.dim() == 4, "expected 4D input"
        x_dtype = x.dtype
        v_shape = (1, -1, 1, 1)
        x = x * inv_instance_rms(x, self.eps)
        x = x * self.weight.view(v_shape).to(dtype=x_dtype) + self.bias.view(v_shape).to(dtype=x_dtype)
        return torch.maximum(x, self.tau.reshape(v_shape).to(dtype=x_dtype)) if self.tau is not None else x


class FilterResponseNormAct2d(nn.Module):
    def __init__(self, num_features, apply_act=True, act_layer=nn.ReLU, inplace=None, rms=True, eps=1e-5,
                 device=None, dtype=None, **_):
        dd = {"device": device, "dtype": dtype}
        super().__init__()
        if act_layer is not None and apply_act:
            self.act = create_act_layer(act_layer, inplace=inplace)
        else:
            self.act = nn.Identity()
        self.rms = rms
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(num_features, **dd))
        self.bias = nn.Parameter(torch.empty(num_features, **dd))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x):
        assert x.dim() == 4, "expected 4D input"
        x_dtype = x.dtype
        v_shape = (1, -1, 1, 1)
        x = x * inv_instance_rms(x, self.eps)
        x = x * self.weight.view(v_shape).to(dtype=x_dtype) + self.bias.view(v_shape).to(dtype=x_dtype)
        return self.act(x)


for _cls, _mod in ((RmsNorm2d, "norm"), (SimpleNorm, "norm"), (SimpleNorm2d, "norm"),
                   (EvoNorm2dB0, "evo_norm"), (EvoNorm2dS0, "evo_norm"),
                   (FilterResponseNormTlu2d, "filter_response_norm"), (FilterResponseNormAct2d, "filter_response_norm")):
    _cls.__module__ = f"timm.layers.{_mod}"
    _cls.__qualname__ = _cls.__name__

CLASSES = {c.__name__: c for c in (RmsNorm2d, SimpleNorm, SimpleNorm2d, EvoNorm2dB0, EvoNorm2dS0,
                                   FilterResponseNormTlu2d, FilterResponseNormAct2d)}
