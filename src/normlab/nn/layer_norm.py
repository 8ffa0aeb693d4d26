"""LayerNorm and RMSNorm modules: drop-ins for ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm``."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from .._checks import normalized_shape_tuple
from ._base import register_affine, reset_affine


class LayerNorm(nn.Module):
    """Layer normalization over the trailing ``normalized_shape`` dims of the input.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and the
    biased variance of each sample (each row of trailing dims) alone, so the
    output of a sample never depends on the rest of its batch, and batch size 1
    works. Same arguments, parameters and ``state_dict`` keys as
    ``torch.nn.LayerNorm``.

    >>> import torch, normlab
    >>> ln = normlab.nn.LayerNorm(512)
    >>> ln(torch.randn(32, 10, 512)).shape
    torch.Size([32, 10, 512])
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.normalized_shape = normalized_shape_tuple("LayerNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        register_affine(self, self.normalized_shape, elementwise_affine, bias, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """gamma (``weight``) to ones, beta (``bias``) to zeros: the identity affine."""
        reset_affine(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}"
        )


class RMSNorm(nn.Module):
    """Root-mean-square normalization: ``y = x / sqrt(mean(x^2) + eps) * weight``.

    No centring and no bias. ``eps=None`` uses ``torch.finfo`` of the
    accumulation dtype (float32 for float16/bfloat16/float32 input). Same
    arguments, parameters and ``state_dict`` keys as ``torch.nn.RMSNorm``.

    >>> import torch, normlab
    >>> normlab.nn.RMSNorm(8)(torch.randn(2, 8)).shape
    torch.Size([2, 8])
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.normalized_shape = normalized_shape_tuple("RMSNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        register_affine(self, self.normalized_shape, elementwise_affine, False, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``weight`` to ones."""
        reset_affine(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
