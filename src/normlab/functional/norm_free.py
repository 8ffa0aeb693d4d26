"""DyT (Dynamic Tanh) as a function (``normlab.functional``; the math: ``normlab.ops.dyt``): the
public entry, which judges the arguments and runs the path ``normlab._backend.route`` decided.

- ``REF``, ``TRANSFORM`` (torch.func transforms, forward-mode AD): the reference Function
  (``ops.dyt.reference.ref_dyt``), whose torch ops carry their own vmap rule and its hand-derived
  jvp -- DyT is elementwise, so the reference is already one pass of torch ops;
- ``EAGER``: the C++ entry ``normlab._C.dyt_fast`` (the ``dyt_fwd`` op with its autograd node,
  without the dispatcher's Python layer), tried first on the arguments as given and again on
  them as judged; arguments it does not take (a tensor subclass) go through
  ``torch.ops.normlab.dyt_fwd``;
- ``COMPILE``: ``torch.ops.normlab.dyt_fwd`` (traced as one node; its Meta kernel gives the shape).
"""

from __future__ import annotations

import math
import numbers

import torch

from .._backend import EAGER, REF, TRANSFORM, route
from .._checks import check_input, check_param, normalized_shape_tuple
from ..ops import extension as _extension
from ..ops.dyt.reference import ref_dyt
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
    if path == REF or path == TRANSFORM:
        return ref_dyt(input, shape, alpha, weight, bias)
    if path == EAGER:  # the arguments in their judged form (a float alpha now a tensor)
        y = _C.dyt_fast(input, shape, alpha, weight, bias)
        if y is not None:
            return y
    return torch.ops.normlab.dyt_fwd(input, weight, bias, shape, alpha)


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
