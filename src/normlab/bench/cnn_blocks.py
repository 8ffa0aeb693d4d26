"""The convolutional blocks of ``normlab bench --suite blocks``, built as timm builds them, in
torch Modules: the norm+act layer of timm's CNNs (``BatchNormAct2d``: ``F.batch_norm``, then the
activation Module, in place) and its channels-first LayerNorm (``LayerNorm2d``: permute,
``F.layer_norm``, permute back), each taught to :func:`normlab.convert` with
:func:`normlab.register_conversion` (``normlab.nn.BatchNormAct2d``, ``normlab.nn.LayerNorm2d``:
the same tensors, the fused kernels).

- ``CNNStage``: a CNN stem and stage, conv 3x3 (stride 2) -> BatchNormAct2d(SiLU) -> conv 3x3
  -> BatchNormAct2d(SiLU), the convolutions without bias (timm's ``ConvNormAct``);
- ``ConvNeXtBlock``: depthwise conv 7x7 -> LayerNorm2d -> conv 1x1 (4x) -> GELU -> conv 1x1
  -> layer scale, + shortcut (timm's ConvNeXt block with ``conv_mlp=True``; the layer scale 0.1,
  a trained block's size rather than the 1e-6 of a fresh one, so that the MLP shows in the output);
- ``MBConv``: EfficientNet's inverted residual: conv 1x1 (6x) -> BatchNormAct2d(SiLU) ->
  depthwise conv 3x3 -> BatchNormAct2d(SiLU) -> squeeze-excite -> conv 1x1 -> BatchNorm (no
  activation), + shortcut;
- ``RegNetBlock``: RegNetY's bottleneck: conv 1x1 -> BatchNormAct2d(ReLU) -> grouped conv 3x3
  (groups of 8 channels) -> BatchNormAct2d(ReLU) -> squeeze-excite -> conv 1x1 -> BatchNorm (no
  activation), + shortcut, ReLU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import normlab.nn
from normlab.tools.conversion import adopt, register_conversion

__all__ = ["BatchNormAct2d", "LayerNorm2d", "CNNStage", "ConvNeXtBlock", "MBConv", "RegNetBlock", "BLOCKS"]


class BatchNormAct2d(nn.BatchNorm2d):
    """BatchNorm2d, then an activation Module (``act``, in place), as timm's norm+act layer."""

    def __init__(self, num_features: int, act_layer=nn.ReLU, apply_act: bool = True, dtype=None):
        super().__init__(num_features, dtype=dtype)
        self.drop = nn.Identity()
        self.act = act_layer(inplace=True) if apply_act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        training = self.training
        if training:
            self.num_batches_tracked.add_(1)
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, training, self.momentum,
                         self.eps)
        return self.act(self.drop(x))


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of (N, C, H, W): permute to channels-last, ``F.layer_norm``, back."""

    def __init__(self, num_channels: int, eps: float = 1e-6, dtype=None):
        super().__init__(num_channels, eps=eps, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


def _bn_act_to_normlab(m: BatchNormAct2d) -> nn.Module:
    twin = adopt(m, normlab.nn.BatchNormAct2d, num_features=m.num_features, eps=m.eps, momentum=m.momentum,
                 act_layer=m.act)
    twin.drop = m.drop
    return twin


def _bn_act_from_normlab(twin: nn.Module) -> BatchNormAct2d:
    old = adopt(twin, BatchNormAct2d, num_features=twin.num_features)
    old.eps, old.momentum, old.act, old.drop = twin.eps, twin.momentum, twin.act, twin.drop
    return old


register_conversion(BatchNormAct2d, _bn_act_to_normlab, _bn_act_from_normlab)
def _ln2d_to_normlab(m: LayerNorm2d) -> nn.Module:
    twin = adopt(m, normlab.nn.LayerNorm2d, num_channels=m.normalized_shape[0], eps=m.eps)
    twin.channels_last_output = True  # timm's permuted result, as normlab.tools.timm's twin
    return twin


register_conversion(LayerNorm2d, _ln2d_to_normlab,
                    lambda n: adopt(n, LayerNorm2d, num_channels=n.num_channels, eps=n.eps))


class SqueezeExcite(nn.Module):
    """Pooled, reduce (1x1), act, expand (1x1), sigmoid gate."""

    def __init__(self, chs: int, rd_chs: int, act_layer=nn.ReLU, dtype=None):
        super().__init__()
        self.conv_reduce = nn.Conv2d(chs, rd_chs, 1, dtype=dtype)
        self.act1 = act_layer(inplace=True)
        self.conv_expand = nn.Conv2d(rd_chs, chs, 1, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.act1(self.conv_reduce(x.mean((2, 3), keepdim=True)))
        return x * self.conv_expand(s).sigmoid()


class CNNStage(nn.Module):
    def __init__(self, in_chs: int = 3, chs: int = 32, dtype=None):
        super().__init__()
        self.conv1 = nn.Conv2d(in_chs, chs, 3, stride=2, padding=1, bias=False, dtype=dtype)
        self.bn1 = BatchNormAct2d(chs, act_layer=nn.SiLU, dtype=dtype)
        self.conv2 = nn.Conv2d(chs, chs, 3, padding=1, bias=False, dtype=dtype)
        self.bn2 = BatchNormAct2d(chs, act_layer=nn.SiLU, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(self.bn1(self.conv1(x))))


class ConvNeXtBlock(nn.Module):
    def __init__(self, chs: int = 96, mlp_ratio: int = 4, ls_init_value: float = 0.1, dtype=None):
        super().__init__()
        self.conv_dw = nn.Conv2d(chs, chs, 7, padding=3, groups=chs, dtype=dtype)
        self.norm = LayerNorm2d(chs, eps=1e-6, dtype=dtype)
        self.fc1 = nn.Conv2d(chs, mlp_ratio * chs, 1, dtype=dtype)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(mlp_ratio * chs, chs, 1, dtype=dtype)
        self.gamma = nn.Parameter(torch.full((chs,), ls_init_value, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(self.act(self.fc1(self.norm(self.conv_dw(x)))))
        return x + y * self.gamma.reshape(1, -1, 1, 1)


class MBConv(nn.Module):
    def __init__(self, chs: int = 24, exp_ratio: int = 6, dtype=None):
        super().__init__()
        mid = chs * exp_ratio
        self.conv_pw = nn.Conv2d(chs, mid, 1, bias=False, dtype=dtype)
        self.bn1 = BatchNormAct2d(mid, act_layer=nn.SiLU, dtype=dtype)
        self.conv_dw = nn.Conv2d(mid, mid, 3, padding=1, groups=mid, bias=False, dtype=dtype)
        self.bn2 = BatchNormAct2d(mid, act_layer=nn.SiLU, dtype=dtype)
        self.se = SqueezeExcite(mid, max(1, chs // 4), nn.SiLU, dtype=dtype)
        self.conv_pwl = nn.Conv2d(mid, chs, 1, bias=False, dtype=dtype)
        self.bn3 = BatchNormAct2d(chs, apply_act=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv_dw(self.bn1(self.conv_pw(x))))
        return x + self.bn3(self.conv_pwl(self.se(y)))


class RegNetBlock(nn.Module):
    def __init__(self, chs: int = 48, group_size: int = 8, dtype=None):
        super().__init__()
        self.conv1 = nn.Conv2d(chs, chs, 1, bias=False, dtype=dtype)
        self.bn1 = BatchNormAct2d(chs, dtype=dtype)
        self.conv2 = nn.Conv2d(chs, chs, 3, padding=1, groups=chs // group_size, bias=False, dtype=dtype)
        self.bn2 = BatchNormAct2d(chs, dtype=dtype)
        self.se = SqueezeExcite(chs, max(1, chs // 4), dtype=dtype)
        self.conv3 = nn.Conv2d(chs, chs, 1, bias=False, dtype=dtype)
        self.bn3 = BatchNormAct2d(chs, apply_act=False, dtype=dtype)
        self.act3 = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn3(self.conv3(self.se(self.bn2(self.conv2(self.bn1(self.conv1(x)))))))
        return self.act3(x + y)


#: name -> (class, constructor args, input shape at batch 8), (... --quick)
BLOCKS = {
    "CNNStage": ((CNNStage, (3, 32), (8, 3, 224, 224)), (CNNStage, (3, 16), (2, 3, 64, 64))),
    "ConvNeXtBlock": ((ConvNeXtBlock, (96,), (8, 96, 56, 56)), (ConvNeXtBlock, (32,), (2, 32, 28, 28))),
    "MBConv": ((MBConv, (24,), (8, 24, 112, 112)), (MBConv, (16,), (2, 16, 32, 32))),
    "RegNetBlock": ((RegNetBlock, (48,), (8, 48, 56, 56)), (RegNetBlock, (32,), (2, 32, 28, 28))),
}


def perturb(m: nn.Module, gen: torch.Generator) -> nn.Module:
    """Seeded, non-trivial norm parameters and running statistics (eval outputs that are not the
    identity of the convolution's), in place; returns ``m``."""
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, (nn.BatchNorm2d, nn.LayerNorm)):
                c = mod.weight.shape[0]
                mod.weight.copy_(1.0 + 0.2 * torch.randn(c, generator=gen))
                mod.bias.copy_(0.2 * torch.randn(c, generator=gen))
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(0.1 * torch.randn(c, generator=gen))
                mod.running_var.copy_(0.5 + torch.rand(c, generator=gen))
    return m
