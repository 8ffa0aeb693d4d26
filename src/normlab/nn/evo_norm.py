"""timm's EvoNorm layers: EvoNorm2dB0 (batch) and EvoNorm2dS0 (sample, grouped)."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from .. import _checks
from .. import functional as F
from ._base import _NotScriptable, check_dtype, check_eps, check_size

__all__ = ["EvoNorm2dB0", "EvoNorm2dS0"]


def _flag(cls, name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{cls}: expected {name} to be a bool, got {value!r}")


class _Evo(_NotScriptable, nn.Module):
    def _params(self, num_features, apply_act, dd) -> None:
        self.apply_act = apply_act
        self.weight = nn.Parameter(torch.empty(num_features, **dd))
        self.bias = nn.Parameter(torch.empty(num_features, **dd))
        self.v = nn.Parameter(torch.empty(num_features, **dd)) if apply_act else None

    def reset_parameters(self) -> None:
        """``weight`` and ``v`` to ones, ``bias`` to zeros."""
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        if self.v is not None:
            nn.init.ones_(self.v)


class EvoNorm2dB0(_Evo):
    """EvoNorm-B0 (Liu, Brock, Simonyan and Le, NeurIPS 2020; timm's ``EvoNorm2dB0``):
    ``y = x / max(sqrt(var + eps), x * v + sqrt(var_HW(x) + eps)) * weight + bias``, ``var`` the
    batch's variance per channel in training and ``running_var`` in eval; ``apply_act=False``: no
    ``v``, ``y = x * weight + bias``.

    timm's constructor, defaults (``momentum=0.1``, ``eps=1e-3``) and ``state_dict`` keys
    (``weight``, ``bias``, ``v``, ``running_var``). In training ``running_var`` takes the batch's
    unbiased variance with weight ``momentum``, as timm. The output is in the input's memory format.

    >>> import torch, normlab
    >>> m = normlab.nn.EvoNorm2dB0(2).eval()
    >>> m(torch.zeros(1, 2, 2, 2)).shape
    torch.Size([1, 2, 2, 2])
    """

    def __init__(self, num_features: int, apply_act: bool = True, momentum: float = 0.1, eps: float = 1e-3,
                 device=None, dtype=None) -> None:
        cls = "EvoNorm2dB0"
        check_size(cls, "num_features", num_features, "the input's dim 1")
        _flag(cls, "apply_act", apply_act)
        _checks.check_momentum(cls, momentum)
        check_eps(cls, eps)
        check_dtype(cls, dtype)
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.momentum = momentum
        self.eps = eps
        self._params(num_features, apply_act, dd)
        self.register_buffer("running_var", torch.ones(num_features, **dd))
        self.reset_parameters()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.evo_norm2d_b0(input, self.running_var, self.weight, self.bias, self.v, self.training,
                               self.momentum, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, apply_act={self.apply_act}, momentum={self.momentum}, eps={self.eps}"


class EvoNorm2dS0(_Evo):
    """EvoNorm-S0 (Liu, Brock, Simonyan and Le, NeurIPS 2020; timm's ``EvoNorm2dS0``):
    ``y = x * sigmoid(v * x) / sqrt(var_group(x) + eps) * weight + bias`` over ``groups`` groups of
    channels per sample (``group_size``, when given, sets ``groups = num_features // group_size``);
    ``apply_act=False``: no ``v``, ``y = x * weight + bias``.

    timm's constructor, defaults (``groups=32``, ``eps=1e-5``) and ``state_dict`` keys (``weight``,
    ``bias``, ``v``). With ``apply_act``, the channels must divide into the groups: checked here, at
    construction (timm asserts it at the first forward).

    >>> import torch, normlab
    >>> normlab.nn.EvoNorm2dS0(4, groups=2)(torch.randn(1, 4, 3, 3)).shape
    torch.Size([1, 4, 3, 3])
    """

    def __init__(self, num_features: int, groups: int = 32, group_size: int | None = None, apply_act: bool = True,
                 eps: float = 1e-5, device=None, dtype=None) -> None:
        cls = "EvoNorm2dS0"
        num_features = check_size(cls, "num_features", num_features, "the input's dim 1")
        _flag(cls, "apply_act", apply_act)
        if group_size:
            if not isinstance(group_size, numbers.Integral) or isinstance(group_size, bool) or group_size < 0:
                raise TypeError(f"{cls}: expected group_size to be a positive int or None, got {group_size!r}")
            if num_features % group_size:
                raise ValueError(f"{cls}: expected num_features ({num_features}) to be divisible by group_size "
                                 f"({group_size}); pass a group_size that divides it, or groups=")
            groups = num_features // group_size
        groups = _checks.check_num_groups(cls, groups)
        if apply_act and num_features % groups:  # without v the groups are never used (timm: no check)
            raise ValueError(f"{cls}: expected num_features ({num_features}) to be divisible by groups ({groups}); "
                             f"pass groups= or group_size= that divides it")
        check_eps(cls, eps)
        check_dtype(cls, dtype)
        super().__init__()
        self.groups = groups
        self.eps = eps
        self._params(num_features, apply_act, {"device": device, "dtype": dtype})
        self.reset_parameters()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.evo_norm2d_s0(input, self.groups, self.weight, self.bias, self.v, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, groups={self.groups}, apply_act={self.apply_act}, eps={self.eps}"
