"""Normalization + activation Modules with timm's constructors and ``state_dict`` keys:
``BatchNormAct2d``, ``FrozenBatchNormAct2d``, ``GroupNormAct``, ``LayerNormAct``,
``LayerNormAct2d``.

Each is normlab's norm of the same kind (a subclass: the same parameters, buffers, train/eval
behaviour and ``state_dict``) followed by an activation, held as ``.act`` (and an optional
dropout, ``.drop``, applied between the two, where timm applies it). The activation is given as
timm gives it (``act_layer``: a name, a Module class or instance; ``act_kwargs``; ``apply_act``;
``inplace``), resolved by ``normlab.nn._activations``; without a dropout the norm and the
activation run as one call of ``normlab.functional``'s ``*_act`` functions (on the eager
``"cpu"`` path the activation runs inside the norm's kernels each way, LayerNormAct2d's in
both layouts). A timm checkpoint loads
with ``strict=True``, and these modules' checkpoints load into timm's classes.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ._activations import act_of, make_act
from ._base import timm_layout
from .batch_norm import BatchNorm2d
from .frozen_batch_norm import FrozenBatchNorm2d
from .group_norm import GroupNorm
from .layer_norm import LayerNorm, LayerNorm2d

__all__ = ["BatchNormAct2d", "FrozenBatchNormAct2d", "GroupNormAct", "LayerNormAct", "LayerNormAct2d"]


def _attach(m: nn.Module, owner: str, apply_act, act_layer, act_kwargs, inplace, drop_layer) -> None:
    m.drop = drop_layer() if drop_layer is not None else nn.Identity()
    m.act = make_act(owner, act_layer, act_kwargs, inplace, apply_act)


def _fused(m: nn.Module):
    """``(name, slope)`` of the activation to fuse, or None when it must run after the norm (a
    dropout between the two, or an activation the kernels do not know put on ``.act`` later)."""
    if type(m.drop) is not nn.Identity:
        return None
    a = act_of(m.act)
    return a


def _finish(m: nn.Module, z: torch.Tensor) -> torch.Tensor:
    return m.act(m.drop(z))


class BatchNormAct2d(BatchNorm2d):
    """``act(BatchNorm2d(x))``: timm's ``BatchNormAct2d`` (the same arguments and defaults:
    ``act_layer=nn.ReLU``, ``inplace=True``; ``state_dict`` keys ``weight``, ``bias``,
    ``running_mean``, ``running_var``, ``num_batches_tracked``) on normlab's ``BatchNorm2d``.

    Shapes: input ``(N, C, H, W)`` (contiguous or channels_last), output the same.

    Numerics: ``BatchNorm2d``'s; the activation is applied to the pre-activation value in the
    accumulation dtype, the output rounded once.

    >>> import torch, normlab
    >>> m = normlab.nn.BatchNormAct2d(4, act_layer="silu")
    >>> m(torch.randn(2, 4, 3, 3)).shape
    torch.Size([2, 4, 3, 3])
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, apply_act: bool = True, act_layer=nn.ReLU, act_kwargs=None,
                 inplace: bool = True, drop_layer=None, device=None, dtype=None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        _attach(self, "BatchNormAct2d", apply_act, act_layer, act_kwargs, inplace, drop_layer)

    def _normalize(self, input, running_mean, running_var, weight, bias, use_batch_stats, factor):
        a = _fused(self)
        if a is not None:
            return F.batch_norm_act(input, running_mean, running_var, weight, bias, use_batch_stats, factor,
                                    self.eps, a[0], a[1])
        return _finish(self, F.batch_norm(input, running_mean, running_var, weight, bias, use_batch_stats, factor,
                                          self.eps))


class FrozenBatchNormAct2d(FrozenBatchNorm2d):
    """``act(FrozenBatchNorm2d(x))``: timm's ``FrozenBatchNormAct2d`` (buffers ``weight``, ``bias``,
    ``running_mean``, ``running_var``; a checkpoint's ``num_batches_tracked`` is dropped on load):
    ``y = act((x - running_mean) / sqrt(running_var + eps) * weight + bias)``, one elementwise pass.

    >>> import torch, normlab
    >>> m = normlab.nn.FrozenBatchNormAct2d(2)
    >>> m(torch.tensor([[[[-1.0]], [[2.0]]]])).flatten()
    tensor([0.0000, 2.0000])
    """

    def __init__(self, num_features: int, eps: float = 1e-5, apply_act: bool = True, act_layer=nn.ReLU,
                 act_kwargs=None, inplace: bool = True, drop_layer=None, device=None, dtype=None) -> None:
        super().__init__(num_features, eps, device, dtype)
        _attach(self, "FrozenBatchNormAct2d", apply_act, act_layer, act_kwargs, inplace, drop_layer)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        a = _fused(self)
        if a is None:
            return _finish(self, super().forward(input))
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            return super().forward(input)  # raises its error
        return F.batch_norm_act(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps, a[0], a[1])


class GroupNormAct(GroupNorm):
    """``act(GroupNorm(x))``: timm's ``GroupNormAct`` (``num_channels`` first, then ``num_groups=32``
    or ``group_size``; ``state_dict`` keys ``weight``, ``bias``).

    >>> import torch, normlab
    >>> normlab.nn.GroupNormAct(8, 2)(torch.randn(2, 8, 3, 3)).shape
    torch.Size([2, 8, 3, 3])
    """

    def __init__(self, num_channels: int, num_groups: int = 32, eps: float = 1e-5, affine: bool = True,
                 group_size: int | None = None, apply_act: bool = True, act_layer=nn.ReLU, act_kwargs=None,
                 inplace: bool = True, drop_layer=None, device=None, dtype=None) -> None:
        if group_size:
            if not isinstance(group_size, int) or num_channels % group_size != 0:
                raise ValueError(f"GroupNormAct: expected group_size to divide num_channels ({num_channels}), "
                                 f"got group_size={group_size!r}")
            num_groups = num_channels // group_size
        super().__init__(num_groups, num_channels, eps, affine, device, dtype)
        _attach(self, "GroupNormAct", apply_act, act_layer, act_kwargs, inplace, drop_layer)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        a = _fused(self)
        if a is None:
            return _finish(self, super().forward(input))
        return F.group_norm_act(input, self.num_groups, self.weight, self.bias, self.eps, a[0], a[1])


class LayerNormAct(LayerNorm):
    """``act(LayerNorm(x))`` over the trailing dims: timm's ``LayerNormAct`` (``normalization_shape``,
    ``eps=1e-5``, ``affine``; ``state_dict`` keys ``weight``, ``bias``).

    >>> import torch, normlab
    >>> normlab.nn.LayerNormAct(4, act_layer="gelu")(torch.randn(3, 4)).shape
    torch.Size([3, 4])
    """

    def __init__(self, normalization_shape, eps: float = 1e-5, affine: bool = True, apply_act: bool = True,
                 act_layer=nn.ReLU, act_kwargs=None, inplace: bool = True, drop_layer=None, **kwargs) -> None:
        super().__init__(normalization_shape, eps=eps, elementwise_affine=affine, **kwargs)
        _attach(self, "LayerNormAct", apply_act, act_layer, act_kwargs, inplace, drop_layer)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        a = _fused(self)
        if a is None:
            return _finish(self, super().forward(input))
        return F.layer_norm_act(input, self.normalized_shape, self.weight, self.bias, self.eps, a[0], a[1])


class LayerNormAct2d(LayerNorm2d):
    """``act(LayerNorm2d(x))``, LayerNorm over the channels of ``(N, C, H, W)``: timm's
    ``LayerNormAct2d`` (``num_channels``, ``eps=1e-5``, ``affine``; ``state_dict`` keys ``weight``, ``bias``).

    >>> import torch, normlab
    >>> normlab.nn.LayerNormAct2d(4)(torch.randn(2, 4, 3, 3)).shape
    torch.Size([2, 4, 3, 3])
    """

    def __init__(self, num_channels: int, eps: float = 1e-5, affine: bool = True, apply_act: bool = True,
                 act_layer=nn.ReLU, act_kwargs=None, inplace: bool = True, drop_layer=None, device=None,
                 dtype=None) -> None:
        super().__init__(num_channels, eps, affine, device, dtype)
        _attach(self, "LayerNormAct2d", apply_act, act_layer, act_kwargs, inplace, drop_layer)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        a = _fused(self)
        if a is None or input.dim() != 4 or input.shape[1] != self.num_channels:
            return _finish(self, super().forward(input))  # (a wrong input: its error)
        return F.layer_norm_act2d(timm_layout(self, input), self.weight, self.bias, self.eps, a[0], a[1])
