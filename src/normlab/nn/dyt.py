"""DyT, Dynamic Tanh: the norm-free layer that takes a LayerNorm's place."""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .. import functional as F
from ._base import _NotScriptable, check_dtype, check_shape, register_affine, reset_affine

__all__ = ["DyT"]


class DyT(_NotScriptable, nn.Module):
    """Dynamic Tanh (Zhu, Chen, He, LeCun and Liu, "Transformers without Normalization",
    CVPR 2025): ``y = tanh(alpha * x) * weight + bias``, with ``alpha`` one learned scalar and the
    affine along the trailing ``normalized_shape`` dims.

    No torch.nn twin: the layer the paper puts where a LayerNorm (or RMSNorm) was, with the
    paper's parameters and ``state_dict`` keys (``alpha`` of shape ``(1,)``, ``weight``, ``bias``)
    and its default ``alpha_init=0.5``. No statistic is computed: train and eval are the same, and
    each value's output depends on that value alone. ``normlab.convert(model, to="dyt")`` swaps a
    model's LayerNorms and RMSNorms for it.

    Shapes: input ``(*, *normalized_shape)``, output the same (contiguous); ``weight``, ``bias``:
    ``normalized_shape`` (``elementwise_affine=False``: neither; ``bias=False``: no bias).

    Numerics: ``alpha * x``, ``tanh`` and the affine in float32 for float16/bfloat16/float32 input
    and float64 for float64; the output is rounded to the input's dtype once.

    >>> import torch, normlab
    >>> dyt = normlab.nn.DyT(3)
    >>> dyt(torch.tensor([[0.0, 1.0, -2.0]]))
    tensor([[ 0.0000,  0.4621, -0.7616]], grad_fn=<...>)
    """

    __constants__ = ["normalized_shape", "alpha_init", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape,
        alpha_init: float = 0.5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        normalized_shape = check_shape("DyT", normalized_shape)
        if not isinstance(alpha_init, numbers.Real) or isinstance(alpha_init, bool):
            raise TypeError(f"DyT: expected alpha_init to be a float, got {alpha_init!r}")
        if not math.isfinite(alpha_init):
            raise ValueError(f"DyT: expected alpha_init to be finite, got {alpha_init!r}; the paper's "
                             f"default is 0.5")
        check_dtype("DyT", dtype)
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.normalized_shape = normalized_shape
        self.alpha_init = float(alpha_init)
        self.elementwise_affine = elementwise_affine
        self.alpha = nn.Parameter(torch.empty(1, **factory_kwargs))
        register_affine(self, self.normalized_shape, elementwise_affine, bias, factory_kwargs)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``alpha`` to ``alpha_init``, ``weight`` to ones, ``bias`` to zeros."""
        nn.init.constant_(self.alpha, self.alpha_init)
        reset_affine(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.dyt(input, self.normalized_shape, self.alpha, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, alpha_init={self.alpha_init}, "
                f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}")
