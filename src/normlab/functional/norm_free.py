"""DyT (Dynamic Tanh) as a function (``normlab.functional``; the math: ``normlab.ops.dyt``)."""

from __future__ import annotations

import math
import numbers

import torch

from .._backend import EAGER, route
from .._checks import check_input, check_param, normalized_shape_tuple
from ..ops import extension as _extension
from ..ops.dyt import op as _op
from .checks import check_normalized_shape

_C = _extension.load()


def dyt(
    input: torch.Tensor,
    normalized_shape,
    alpha,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """DyT, Dynamic Tanh (Zhu et al., "Transformers without Normalization", CVPR 2025):
    ``y = tanh(alpha * x) * weight + bias``, the affine along the trailing ``normalized_shape`` dims.

    No torch twin: the layer the paper puts where a LayerNorm was. No statistic is computed;
    ``alpha`` is one learned scalar.

    Shapes: input ``(*, *normalized_shape)``, output the same (contiguous); ``alpha``: a tensor
    of shape ``(1,)`` (the module's parameter) or ``()``, or a finite Python float (a constant);
    ``weight``, ``bias``: ``normalized_shape`` or None.

    Numerics: ``alpha * x``, ``tanh`` and the affine in float32 for float16/bfloat16/float32 input
    and float64 for float64; the output is rounded to the input's dtype once.

    >>> import torch, normlab.functional as NF
    >>> NF.dyt(torch.tensor([[0.0, 1.0, -2.0]]), 3, torch.tensor([0.5]))
    tensor([[ 0.0000,  0.4621, -0.7616]])
    """
    fn = "dyt"
    path = route(input, fn)
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        try:
            y = _C.dyt_fast(input, normalized_shape, alpha, weight, bias)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    check_input(fn, input)
    shape = normalized_shape_tuple(fn, normalized_shape)
    check_normalized_shape(fn, input, shape)
    check_param(fn, "weight", weight, input, shape, "normalized_shape")
    check_param(fn, "bias", bias, input, shape, "normalized_shape")
    alpha = _alpha(fn, alpha, input)
    return _op.dyt(path, input, shape, alpha, weight, bias)


def _alpha(fn: str, alpha, x: torch.Tensor) -> torch.Tensor:
    """``alpha`` as a (1,) tensor: a one-value tensor of shape (1,) or () fitting ``x`` (dtype,
    device, as a weight), or a finite float (a constant in ``x``'s accumulation dtype)."""
    if isinstance(alpha, torch.Tensor):
        if alpha.shape not in ((1,), ()):
            raise RuntimeError(f"{fn}: expected alpha of shape [1] (one scalar per layer) or [], "
                               f"got alpha of shape {list(alpha.shape)}")
        check_param(fn, "alpha", alpha, x, tuple(alpha.shape), "one scalar")
        return alpha.reshape(1)
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, bool):
        if not math.isfinite(alpha):
            raise ValueError(f"{fn}: expected alpha to be finite, got {alpha!r}")
        return torch.full((1,), float(alpha), dtype=x.dtype, device=x.device)
    raise TypeError(f"{fn}: expected alpha to be a torch.Tensor of shape [1] or a float, got {type(alpha).__name__}")
