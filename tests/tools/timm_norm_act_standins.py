"""Stand-ins for timm's norm+act classes and four blocks built from them: the oracle of the
norm+act tests (tests/nn/test_norm_act.py, tests/tools/test_timm_norm_act.py).

timm cannot be installed beside torch 2.13 here (its torchvision is built for another torch), so
these are written from timm 1.0's source (``timm/layers/norm_act.py``, ``create_act.py``,
``activations.py``, and the blocks of ``resnet.py``, ``efficientnet_blocks.py``, ``regnet.py``,
``convnext.py``): the same constructor arguments and defaults, attributes, ``state_dict`` and
``forward`` (norm, then ``drop``, then ``act``), with ``__module__`` set to where timm defines
them, as ``normlab.tools.timm`` recognises classes by it. ``is_fast_norm()`` is False (timm's
default), so the forwards take torch's functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# -- timm.layers.activations: the classes get_act_layer gives for these names --------------------


class GELU(nn.Module):
    def __init__(self, inplace: bool = False):
        super().__init__()

    def forward(self, input):
        return F.gelu(input)


class GELUTanh(nn.Module):
    def __init__(self, inplace: bool = False):
        super().__init__()

    def forward(self, input):
        return F.gelu(input, approximate="tanh")


class Tanh(nn.Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return x.tanh_() if self.inplace else x.tanh()


for _cls in (GELU, GELUTanh, Tanh):
    _cls.__module__ = "timm.layers.activations"
    _cls.__qualname__ = _cls.__name__

# timm.layers.create_act._ACT_LAYER_DEFAULT, the entries the norm+act tests use
_ACT_LAYERS = dict(silu=nn.SiLU, swish=nn.SiLU, relu=nn.ReLU, leaky_relu=nn.LeakyReLU, gelu=GELU,
                   gelu_tanh=GELUTanh, tanh=Tanh, hard_swish=nn.Hardswish, hardswish=nn.Hardswish,
                   identity=nn.Identity)


def get_act_layer(name):
    if name is None:
        return None
    if not isinstance(name, str):
        return name
    if not name:
        return None
    return _ACT_LAYERS[name.lower()]


def create_act_layer(name, inplace=None, **kwargs):
    act_layer = get_act_layer(name)
    if act_layer is None:
        return None
    if inplace is None:
        return act_layer(**kwargs)
    try:
        return act_layer(inplace=inplace, **kwargs)
    except TypeError:
        return act_layer(**kwargs)


# -- timm.layers.norm_act ---------------------------------------------------------------------------


def _create_act(act_layer, act_kwargs=None, inplace=False, apply_act=True):
    act_kwargs = act_kwargs or {}
    act_kwargs.setdefault("inplace", inplace)
    act = None
    if apply_act:
        act = create_act_layer(act_layer, **act_kwargs)
    return nn.Identity() if act is None else act


class BatchNormAct2d(nn.BatchNorm2d):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, apply_act=True,
                 act_layer=nn.ReLU, act_kwargs=None, inplace=True, drop_layer=None, device=None, dtype=None):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, device=device, dtype=dtype)
        self.drop = drop_layer() if drop_layer is not None else nn.Identity()
        self.act = _create_act(act_layer, act_kwargs=act_kwargs, inplace=inplace, apply_act=apply_act)

    def forward(self, x):
        assert x.ndim == 4, f"expected 4D input (got {x.ndim}D input)"
        exponential_average_factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                if self.momentum is None:
                    exponential_average_factor = 1.0 / float(self.num_batches_tracked)
                else:
                    exponential_average_factor = self.momentum
        if self.training:
            bn_training = True
        else:
            bn_training = (self.running_mean is None) and (self.running_var is None)
        x = F.batch_norm(
            x,
            self.running_mean if not self.training or self.track_running_stats else None,
            self.running_var if not self.training or self.track_running_stats else None,
            self.weight, self.bias, bn_training, exponential_average_factor, self.eps)
        x = self.drop(x)
        x = self.act(x)
        return x


class FrozenBatchNormAct2d(nn.Module):
    def __init__(self, num_features, eps=1e-5, apply_act=True, act_layer=nn.ReLU, act_kwargs=None, inplace=True,
                 drop_layer=None, device=None, dtype=None):
        dd = {"device": device, "dtype": dtype}
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features, **dd))
        self.register_buffer("bias", torch.zeros(num_features, **dd))
        self.register_buffer("running_mean", torch.zeros(num_features, **dd))
        self.register_buffer("running_var", torch.ones(num_features, **dd))
        self.drop = drop_layer() if drop_layer is not None else nn.Identity()
        self.act = _create_act(act_layer, act_kwargs=act_kwargs, inplace=inplace, apply_act=apply_act)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        num_batches_tracked_key = prefix + "num_batches_tracked"
        if num_batches_tracked_key in state_dict:
            del state_dict[num_batches_tracked_key]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, x):
        w = self.weight.reshape(1, -1, 1, 1)
        b = self.bias.reshape(1, -1, 1, 1)
        rv = self.running_var.reshape(1, -1, 1, 1)
        rm = self.running_mean.reshape(1, -1, 1, 1)
        scale = w * (rv + self.eps).rsqrt()
        bias = b - rm * scale
        x = x * scale + bias
        x = self.act(self.drop(x))
        return x


def _num_groups(num_channels, num_groups, group_size):
    if group_size:
        assert num_channels % group_size == 0
        return num_channels // group_size
    return num_groups


class GroupNormAct(nn.GroupNorm):
    def __init__(self, num_channels, num_groups=32, eps=1e-5, affine=True, group_size=None, apply_act=True,
                 act_layer=nn.ReLU, act_kwargs=None, inplace=True, drop_layer=None, device=None, dtype=None):
        super().__init__(_num_groups(num_channels, num_groups, group_size), num_channels, eps=eps, affine=affine,
                         device=device, dtype=dtype)
        self.drop = drop_layer() if drop_layer is not None else nn.Identity()
        self.act = _create_act(act_layer, act_kwargs=act_kwargs, inplace=inplace, apply_act=apply_act)
        self._fast_norm = False

    def forward(self, x):
        x = F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        x = self.drop(x)
        x = self.act(x)
        return x


class LayerNormAct(nn.LayerNorm):
    def __init__(self, normalization_shape, eps=1e-5, affine=True, apply_act=True, act_layer=nn.ReLU,
                 act_kwargs=None, inplace=True, drop_layer=None, **kwargs):
        super().__init__(normalization_shape, eps=eps, elementwise_affine=affine, **kwargs)
        self.drop = drop_layer() if drop_layer is not None else nn.Identity()
        self.act = _create_act(act_layer, act_kwargs=act_kwargs, inplace=inplace, apply_act=apply_act)
        self._fast_norm = False

    def forward(self, x):
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = self.drop(x)
        x = self.act(x)
        return x


class LayerNormAct2d(nn.LayerNorm):
    def __init__(self, num_channels, eps=1e-5, affine=True, apply_act=True, act_layer=nn.ReLU, act_kwargs=None,
                 inplace=True, drop_layer=None, **kwargs):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine, **kwargs)
        self.drop = drop_layer() if drop_layer is not None else nn.Identity()
        self.act = _create_act(act_layer, act_kwargs=act_kwargs, inplace=inplace, apply_act=apply_act)
        self._fast_norm = False

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x.permute(0, 3, 1, 2)
        x = self.drop(x)
        x = self.act(x)
        return x


CLASSES = (BatchNormAct2d, FrozenBatchNormAct2d, GroupNormAct, LayerNormAct, LayerNormAct2d)
for _cls in CLASSES:
    _cls.__module__ = "timm.layers.norm_act"
    _cls.__qualname__ = _cls.__name__


# -- blocks built from them (timm's block code, the norm layers being the classes above) -------------


class SqueezeExcite(nn.Module):
    """timm's efficientnet_blocks.SqueezeExcite / regnet's SE: pooled, reduce, act, expand, gate."""

    def __init__(self, in_chs, rd_chs, act_layer=nn.ReLU):
        super().__init__()
        self.conv_reduce = nn.Conv2d(in_chs, rd_chs, 1, bias=True)
        self.act1 = act_layer(inplace=True)
        self.conv_expand = nn.Conv2d(rd_chs, in_chs, 1, bias=True)

    def forward(self, x):
        x_se = x.mean((2, 3), keepdim=True)
        x_se = self.act1(self.conv_reduce(x_se))
        return x * self.conv_expand(x_se).sigmoid()


class ResNetDBottleneck(nn.Module):
    """A ResNet-D bottleneck (timm resnet.py's Bottleneck, avg-pool downsample: ``avg_down=True``)
    with norm+act layers: 1x1 -> BNAct, 3x3 (stride) -> BNAct, 1x1 -> BN (no act), + shortcut, ReLU."""

    def __init__(self, inplanes, planes, stride=1, norm_layer=BatchNormAct2d):
        super().__init__()
        outplanes = planes * 4
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = norm_layer(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = norm_layer(planes)
        self.conv3 = nn.Conv2d(planes, outplanes, 1, bias=False)
        self.bn3 = norm_layer(outplanes, apply_act=False)
        self.act3 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != outplanes:
            pool = nn.AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False) if stride != 1 else nn.Identity()
            self.downsample = nn.Sequential(pool, nn.Conv2d(inplanes, outplanes, 1, bias=False),
                                            norm_layer(outplanes, apply_act=False))

    def forward(self, x):
        shortcut = x
        x = self.bn1(self.conv1(x))
        x = self.bn2(self.conv2(x))
        x = self.bn3(self.conv3(x))
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        return self.act3(x + shortcut)


def resnet_d_stage(inplanes=16, planes=8, blocks=2, stride=2, norm_layer=BatchNormAct2d):
    layers = [ResNetDBottleneck(inplanes, planes, stride, norm_layer)]
    layers += [ResNetDBottleneck(planes * 4, planes, 1, norm_layer) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


class MBConv(nn.Module):
    """EfficientNet's InvertedResidual (timm efficientnet_blocks.py): pw expand -> BNAct(SiLU),
    dw -> BNAct(SiLU), SE, pw linear -> BN (no act), + shortcut."""

    def __init__(self, in_chs=16, out_chs=16, exp_ratio=4.0, stride=1, act_layer=nn.SiLU):
        super().__init__()
        mid = int(in_chs * exp_ratio)
        self.has_skip = in_chs == out_chs and stride == 1
        self.conv_pw = nn.Conv2d(in_chs, mid, 1, bias=False)
        self.bn1 = BatchNormAct2d(mid, act_layer=act_layer)
        self.conv_dw = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, groups=mid, bias=False)
        self.bn2 = BatchNormAct2d(mid, act_layer=act_layer)
        self.se = SqueezeExcite(mid, max(1, in_chs // 4), act_layer=act_layer)
        self.conv_pwl = nn.Conv2d(mid, out_chs, 1, bias=False)
        self.bn3 = BatchNormAct2d(out_chs, apply_act=False)

    def forward(self, x):
        shortcut = x
        x = self.bn1(self.conv_pw(x))
        x = self.bn2(self.conv_dw(x))
        x = self.se(x)
        x = self.bn3(self.conv_pwl(x))
        return x + shortcut if self.has_skip else x


class RegNetBottleneck(nn.Module):
    """RegNet's X/Y block (timm regnet.py's Bottleneck, ConvNormAct layers): 1x1 -> NormAct,
    3x3 grouped (group width) -> NormAct, SE (Y), 1x1 -> Norm (no act), + shortcut, act."""

    def __init__(self, in_chs=16, out_chs=32, stride=2, group_size=8, se_ratio=0.25,
                 norm_layer=BatchNormAct2d, act_layer=nn.ReLU):
        super().__init__()
        groups = out_chs // group_size
        self.conv1 = nn.Conv2d(in_chs, out_chs, 1, bias=False)
        self.bn1 = norm_layer(out_chs, act_layer=act_layer)
        self.conv2 = nn.Conv2d(out_chs, out_chs, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = norm_layer(out_chs, act_layer=act_layer)
        self.se = SqueezeExcite(out_chs, max(1, int(round(in_chs * se_ratio))), act_layer) if se_ratio else None
        self.conv3 = nn.Conv2d(out_chs, out_chs, 1, bias=False)
        self.bn3 = norm_layer(out_chs, apply_act=False)
        self.downsample = nn.Sequential(nn.Conv2d(in_chs, out_chs, 1, stride=stride, bias=False),
                                        norm_layer(out_chs, apply_act=False))
        self.act3 = act_layer()

    def forward(self, x):
        shortcut = x
        x = self.bn1(self.conv1(x))
        x = self.bn2(self.conv2(x))
        if self.se is not None:
            x = self.se(x)
        x = self.bn3(self.conv3(x))
        return self.act3(x + self.downsample(shortcut))


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block (timm convnext.py), its norm a LayerNormAct: dw 7x7 -> norm (channels last,
    ``LayerNormAct`` with ``apply_act=False``, or the conv-mlp form: ``LayerNormAct2d``) -> pw
    expand -> GELU -> pw -> layer scale, + shortcut. ``conv_mlp=True``: the norm a ``LayerNormAct2d``
    carrying the GELU itself (norm then act), 1x1 convolutions."""

    def __init__(self, chs=16, mlp_ratio=4, conv_mlp=False, ls_init_value=1e-1):
        super().__init__()
        self.conv_mlp = conv_mlp
        self.conv_dw = nn.Conv2d(chs, chs, 7, padding=3, groups=chs, bias=True)
        hidden = chs * mlp_ratio
        if conv_mlp:
            self.norm = LayerNormAct2d(chs, eps=1e-6, apply_act=False)
            self.fc1 = nn.Conv2d(chs, hidden, 1)
            self.norm_act = LayerNormAct2d(hidden, eps=1e-6, act_layer="gelu")
            self.fc2 = nn.Conv2d(hidden, chs, 1)
        else:
            self.norm = LayerNormAct(chs, eps=1e-6, apply_act=False)
            self.fc1 = nn.Linear(chs, hidden)
            self.norm_act = LayerNormAct(hidden, eps=1e-6, act_layer="gelu_tanh")
            self.fc2 = nn.Linear(hidden, chs)
        self.gamma = nn.Parameter(ls_init_value * torch.ones(chs))

    def forward(self, x):
        shortcut = x
        x = self.conv_dw(x)
        if self.conv_mlp:
            x = self.fc2(self.norm_act(self.fc1(self.norm(x))))
            x = x * self.gamma.reshape(1, -1, 1, 1)
        else:
            x = x.permute(0, 2, 3, 1)
            x = self.fc2(self.norm_act(self.fc1(self.norm(x))))
            x = (x * self.gamma).permute(0, 3, 1, 2)
        return x + shortcut
