"""GroupNorm and InstanceNorm modules: drop-ins for ``torch.nn.GroupNorm`` and
``torch.nn.InstanceNorm1d/2d/3d``."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from .. import functional as F
from .._checks import check_num_groups
from ._base import _NormBase, _NotScriptable, check_dtype, check_eps, check_size, register_affine, reset_affine


def _indivisible(num_groups: int, num_channels: int) -> str:
    """GroupNorm's message for ``num_channels % num_groups != 0``, with the fix."""
    msg = f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"
    if num_channels > 0 and num_groups % num_channels == 0:  # GroupNorm(32, 8): the arguments swapped?
        return msg + (f"; the arguments are num_groups, then num_channels: did you mean "
                      f"GroupNorm({num_channels}, {num_groups})?")
    small = [g for g in range(1, math.isqrt(num_channels) + 1) if num_channels % g == 0]
    divisors = sorted(set(small + [num_channels // g for g in small]))
    return msg + f"; num_groups that divide {num_channels}: {', '.join(map(str, divisors))}"


class GroupNorm(_NotScriptable, nn.Module):
    """Group normalization: the ``C`` channels split into ``num_groups`` groups of ``C / num_groups``,
    ``y = (x - mean_g) / sqrt(var_g + eps) * weight + bias``, each group of each sample with its own
    statistics, then a per-channel affine.

    Twin: ``torch.nn.GroupNorm`` -- same arguments, defaults, parameters and ``state_dict`` keys;
    bad arguments raise ``ValueError``/``TypeError``/``RuntimeError`` with the fix before anything
    is allocated (torch: ``ZeroDivisionError`` for ``num_groups=0``, nothing for negative ones).

    Shapes: input ``(N, C, *)``, output the same (in the input's memory format); ``weight``,
    ``bias``: ``(C,)``. ``num_groups=1`` normalises each sample over all of ``C, *`` (LayerNorm
    over every dim but the batch); ``num_groups=C`` is InstanceNorm with a per-channel affine.

    Numerics: mean and biased variance per (sample, group), accumulated in float32 for
    float16/bfloat16/float32 input and float64 for float64; output cast once. No running
    statistics: train and eval are the same, batch size 1 works.

    >>> import torch, normlab
    >>> gn = normlab.nn.GroupNorm(2, 4)
    >>> gn(torch.tensor([[1.0, 3.0, 10.0, 30.0]]))  # groups (1, 3) and (10, 30)
    tensor([[-1.0000,  1.0000, -1.0000,  1.0000]], grad_fn=<...>)
    """

    __constants__ = ["num_groups", "num_channels", "eps", "affine"]

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        num_groups = check_num_groups("GroupNorm", num_groups)
        num_channels = check_size("GroupNorm", "num_channels", num_channels, "the number of channels C")
        if num_channels % num_groups != 0:
            raise ValueError(_indivisible(num_groups, num_channels))
        check_eps("GroupNorm", eps)
        check_dtype("GroupNorm", dtype)
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        register_affine(self, num_channels, affine, bias, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """gamma (``weight``) to ones, beta (``bias``) to zeros: the identity affine."""
        reset_affine(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, "
            f"affine={self.affine}, bias={self.bias is not None}"
        )


class _InstanceNorm(_NormBase):
    """Shared body of InstanceNorm1d/2d/3d (torch's ``_NormBase`` + ``_InstanceNorm``).

    Normalises with the input's own statistics when ``self.training or not
    self.track_running_stats``; otherwise with ``running_mean``/``running_var``.
    """

    _dims: int  # number of dims of an unbatched input: (C, *spatial)

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() not in (self._dims, self._dims + 1):
            raise ValueError(
                f"expected {self._dims}D or {self._dims + 1}D input (got {input.dim()}D input)"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        feature_dim = input.dim() - self._dims
        if input.size(feature_dim) != self.num_features:
            if self.affine:
                raise ValueError(
                    f"expected input's size at dim={feature_dim} to match num_features"
                    f" ({self.num_features}), but got: {input.size(feature_dim)}."
                )
            warnings.warn(
                f"input's size at dim={feature_dim} does not match num_features. "
                "You can silence this warning by not passing in num_features, "
                "which is not used because affine=False",
                stacklevel=2,
            )
        unbatched = input.dim() == self._dims
        x = input.unsqueeze(0) if unbatched else input  # (N, C, *spatial)
        y = F.instance_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            self.momentum if self.momentum is not None else 0.0,
            self.eps,
        )
        return y.squeeze(0) if unbatched else y

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        version = local_metadata.get("version", None)
        # Before version 1 InstanceNorm always stored running statistics; since
        # then it only does with track_running_stats=True.
        if version is None and not self.track_running_stats:
            keys = [prefix + n for n in ("running_mean", "running_var") if prefix + n in state_dict]
            if keys:
                klass = self.__class__.__name__
                error_msgs.append(
                    "Unexpected running stats buffer(s) {names} for {klass} with "
                    "track_running_stats=False. If state_dict is a checkpoint saved before "
                    "0.4.0, this may be expected because {klass} does not track running "
                    "stats by default since 0.4.0. Please remove these keys from state_dict. "
                    "If the running stats are actually needed, instead set "
                    "track_running_stats=True in {klass} to enable them. See the "
                    "documentation of {klass} for details.".format(
                        names=" and ".join(f'"{k}"' for k in keys), klass=klass
                    )
                )
                for key in keys:
                    state_dict.pop(key)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of ``(N, C, L)`` input: ``y = (x - mean) / sqrt(var + eps)``, each channel
    of each sample over its ``L`` values (then ``* weight + bias`` when ``affine``).

    Twin: ``torch.nn.InstanceNorm1d`` -- same arguments and defaults (``affine=False``,
    ``track_running_stats=False``), parameters, buffers, ``state_dict`` keys and warnings.

    Shapes: input ``(N, C, L)`` or unbatched ``(C, L)``, output the same; ``weight``,
    ``bias``, ``running_mean``, ``running_var``: ``(C,)``.

    Numerics: mean and biased variance of each (sample, channel) over ``L``, accumulated in
    float32 for float16/bfloat16/float32 input and float64 for float64; output cast once. With
    ``track_running_stats=True``, training updates ``running = (1 - momentum) * running +
    momentum * stat`` with the batch average of the per-instance means and *unbiased* variances,
    and eval normalises with the running statistics; ``momentum=None`` means 0 (as torch), and
    ``num_batches_tracked`` is kept for ``state_dict`` compatibility but never incremented.

    >>> import torch, normlab
    >>> normlab.nn.InstanceNorm1d(1)(torch.tensor([[[1.0, 2.0, 3.0]]]))
    tensor([[[-1.2247,  0.0000,  1.2247]]])
    """

    _dims = 2


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of ``(N, C, H, W)`` input: ``y = (x - mean) / sqrt(var + eps)``, each
    channel of each sample over its ``H, W`` values (then ``* weight + bias`` when ``affine``).

    Twin: ``torch.nn.InstanceNorm2d`` -- same arguments and defaults (``affine=False``,
    ``track_running_stats=False``), parameters, buffers, ``state_dict`` keys and warnings.

    Shapes: input ``(N, C, H, W)`` or unbatched ``(C, H, W)``, output the same; ``weight``,
    ``bias``, ``running_mean``, ``running_var``: ``(C,)``.

    Numerics: mean and biased variance of each (sample, channel) over ``H, W``, accumulated in
    float32 for float16/bfloat16/float32 input and float64 for float64; output cast once. With
    ``track_running_stats=True``, training updates ``running = (1 - momentum) * running +
    momentum * stat`` with the batch average of the per-instance means and *unbiased* variances,
    and eval normalises with the running statistics; ``momentum=None`` means 0 (as torch), and
    ``num_batches_tracked`` is kept for ``state_dict`` compatibility but never incremented.

    >>> import torch, normlab
    >>> y = normlab.nn.InstanceNorm2d(3)(torch.randn(2, 3, 8, 8) * 5 + 2)
    >>> bool(y.mean(dim=(2, 3)).abs().max() < 1e-5), bool((y.var(dim=(2, 3), unbiased=False) - 1).abs().max() < 1e-3)
    (True, True)
    """

    _dims = 3


class InstanceNorm3d(_InstanceNorm):
    """Instance normalization of ``(N, C, D, H, W)`` input: ``y = (x - mean) / sqrt(var + eps)``, each
    channel of each sample over its ``D, H, W`` values (then ``* weight + bias`` when ``affine``).

    Twin: ``torch.nn.InstanceNorm3d`` -- same arguments and defaults (``affine=False``,
    ``track_running_stats=False``), parameters, buffers, ``state_dict`` keys and warnings.

    Shapes: input ``(N, C, D, H, W)`` or unbatched ``(C, D, H, W)``, output the same; ``weight``,
    ``bias``, ``running_mean``, ``running_var``: ``(C,)``.

    Numerics: mean and biased variance of each (sample, channel) over ``D, H, W``, accumulated in
    float32 for float16/bfloat16/float32 input and float64 for float64; output cast once. With
    ``track_running_stats=True``, training updates ``running = (1 - momentum) * running +
    momentum * stat`` with the batch average of the per-instance means and *unbiased* variances,
    and eval normalises with the running statistics; ``momentum=None`` means 0 (as torch), and
    ``num_batches_tracked`` is kept for ``state_dict`` compatibility but never incremented.

    >>> import torch, normlab
    >>> m = normlab.nn.InstanceNorm3d(2, track_running_stats=True)
    >>> m(torch.randn(1, 2, 4, 4, 4)).shape, m.running_mean.shape
    (torch.Size([1, 2, 4, 4, 4]), torch.Size([2]))
    """

    _dims = 4
