"""GroupNorm and InstanceNorm modules: drop-ins for ``torch.nn.GroupNorm`` and
``torch.nn.InstanceNorm1d/2d/3d``."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .. import functional as F
from ._base import _NormBase, register_affine, reset_affine


class GroupNorm(nn.Module):
    """Group normalization: the channels split into ``num_groups`` groups, each group
    of each sample normalised with its own mean and biased variance, then a
    per-channel affine ``weight``/``bias``.

    Uses the input's statistics in training and in eval alike (no running
    statistics), so batch size 1 works. Same arguments, parameters and
    ``state_dict`` keys as ``torch.nn.GroupNorm``.

    >>> import torch, normlab
    >>> gn = normlab.nn.GroupNorm(2, 6)
    >>> gn(torch.randn(4, 6, 8, 8)).shape
    torch.Size([4, 6, 8, 8])
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
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError(
                f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"
            )
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
    With ``track_running_stats=True`` the training forward updates the running
    statistics (``normlab.functional.instance_norm`` does the math);
    ``num_batches_tracked`` is kept for ``state_dict`` compatibility but, as in
    torch, never incremented, and ``momentum=None`` means ``momentum=0``.
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
    """Instance normalization of ``(N, C, L)`` or unbatched ``(C, L)`` input: each channel
    of each sample normalised over ``L``. Drop-in for ``torch.nn.InstanceNorm1d``.

    >>> import torch, normlab
    >>> normlab.nn.InstanceNorm1d(3)(torch.randn(2, 3, 10)).shape
    torch.Size([2, 3, 10])
    """

    _dims = 2


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of ``(N, C, H, W)`` or unbatched ``(C, H, W)`` input: each
    channel of each sample normalised over ``H, W``. Drop-in for ``torch.nn.InstanceNorm2d``.

    >>> import torch, normlab
    >>> normlab.nn.InstanceNorm2d(3, affine=True)(torch.randn(2, 3, 8, 8)).shape
    torch.Size([2, 3, 8, 8])
    """

    _dims = 3


class InstanceNorm3d(_InstanceNorm):
    """Instance normalization of ``(N, C, D, H, W)`` or unbatched ``(C, D, H, W)`` input:
    each channel of each sample normalised over ``D, H, W``. Drop-in for
    ``torch.nn.InstanceNorm3d``.

    >>> import torch, normlab
    >>> normlab.nn.InstanceNorm3d(2)(torch.randn(1, 2, 4, 4, 4)).shape
    torch.Size([1, 2, 4, 4, 4])
    """

    _dims = 4
