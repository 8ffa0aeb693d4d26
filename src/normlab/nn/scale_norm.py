"""timm's scale-only norms: RmsNorm2d, SimpleNorm, SimpleNorm2d (``y = x / sqrt(s + eps) * weight``)."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from ._base import _NotScriptable, check_dtype, check_eps, check_shape, check_size

__all__ = ["RmsNorm2d", "SimpleNorm", "SimpleNorm2d"]


class _ScaleNorm(_NotScriptable, nn.Module):
    """What the three share: timm's constructor ``(channels, eps=1e-6, affine=True)``, its attributes
    (``normalized_shape``, ``eps``, ``elementwise_affine``) and its one parameter, ``weight``."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]
    _channels_first = False

    def __init__(self, channels, eps: float = 1e-6, affine: bool = True, device=None, dtype=None) -> None:
        cls = type(self).__name__
        if self._channels_first:
            shape = (check_size(cls, "channels", channels, "the input's dim 1"),)
        else:
            shape = check_shape(cls, channels)
        check_eps(cls, eps)
        if not isinstance(affine, bool):
            raise TypeError(f"{cls}: expected affine to be a bool, got {affine!r}")
        check_dtype(cls, dtype)
        super().__init__()
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = affine
        if affine:
            self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` to ones."""
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, affine={self.elementwise_affine}"


class RmsNorm2d(_ScaleNorm):
    """RMSNorm over the channels of an (N, C, H, W) input (timm's ``RmsNorm2d``):
    ``y = x / sqrt(mean_C(x^2) + eps) * weight`` at every position.

    timm's constructor, defaults (``eps=1e-6``) and ``state_dict`` keys (``weight``); the output in
    the input's memory format. Numerics: the mean square in float32 for half-precision and float32
    input and float64 for float64 (timm's is in the input's dtype); the output is rounded once.

    >>> import torch, normlab
    >>> m = normlab.nn.RmsNorm2d(2, eps=0.0)
    >>> m(torch.tensor([[[[3.0]], [[-4.0]]]])).flatten()
    tensor([ 0.8485, -1.1314], grad_fn=<...>)
    """

    _channels_first = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.rms_norm2d(input, self.weight, self.eps)


class SimpleNorm(_ScaleNorm):
    """SimpleNorm over the trailing ``channels`` dims (timm's ``SimpleNorm``):
    ``y = x / sqrt(var(x) + eps) * weight``, ``var`` unbiased and ``x`` not centred.

    timm's constructor (``channels``: an int or a shape), defaults (``eps=1e-6``) and
    ``state_dict`` keys (``weight``). A row of one value gives NaN (no unbiased variance), as timm.
    Numerics: the variance by the shifted two passes in float32 (float64 for float64 input).

    >>> import torch, normlab
    >>> normlab.nn.SimpleNorm(2, eps=0.0)(torch.tensor([[1.0, 3.0]]))
    tensor([[0.7071, 2.1213]], grad_fn=<...>)
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.simple_norm(input, self.normalized_shape, self.weight, self.eps)


class SimpleNorm2d(_ScaleNorm):
    """SimpleNorm over the channels of an (N, C, H, W) input (timm's ``SimpleNorm2d``):
    ``y = x / sqrt(var_C(x) + eps) * weight`` at every position (unbiased variance, not centred).

    timm's constructor, defaults and ``state_dict`` keys; the output in the input's memory format,
    as timm's (elementwise ops on the permuted view, permuted back).

    >>> import torch, normlab
    >>> normlab.nn.SimpleNorm2d(2, eps=0.0)(torch.tensor([[[[1.0]], [[3.0]]]])).flatten()
    tensor([0.7071, 2.1213], grad_fn=<...>)
    """

    _channels_first = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.simple_norm2d(input, self.weight, self.eps)
