"""LayerNorm, RMSNorm, their fused residual adds and LayerNorm2d as functions
(``normlab.functional``; the math: ``normlab.ops.layer_norm``)."""

from __future__ import annotations

import torch

from .._backend import EAGER, route
from .._checks import (check_eps, check_input, check_param, cpu_params_fit, normalized_shape_tuple, plain_eps,
                       rms_variant)
from ..ops import extension as _extension
from ..ops.layer_norm import op as _op
from ..ops.layer_norm import op_2d as _op_2d
from ..ops.numerics import acc_dtype
from .checks import (check_channels_input, check_normalized_shape, check_per_channel, check_residual, residual_fits,
                     rows_fit)

_C = _extension.load()


def layer_norm(
    input: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dims: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    Twin: ``torch.nn.functional.layer_norm`` -- same signature; also takes an int
    ``normalized_shape``; ``weight``/``bias`` must have exactly ``normalized_shape`` (nothing
    broadcast), the input's dtype or float32 for float16/bfloat16 input.

    Shapes: input ``(*, *normalized_shape)``, output the same; ``weight``, ``bias``:
    ``normalized_shape`` or None.

    Numerics: mean and biased variance per row, accumulated in float32 for
    float16/bfloat16/float32 input and float64 for float64 (shifted two-pass); output cast
    to the input's dtype once.

    >>> import torch, normlab.functional as NF
    >>> NF.layer_norm(torch.tensor([[1.0, 2.0, 3.0]]), 3)
    tensor([[-1.2247,  0.0000,  1.2247]])
    """
    path = route(input, "layer_norm")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        try:
            y = _C.layer_norm_fast(input, normalized_shape, weight, bias, eps)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    fn = "layer_norm"
    shape = normalized_shape
    if eps is None or not rows_fit(input, shape, eps, weight, bias):
        check_input(fn, input)
        shape = normalized_shape_tuple(fn, normalized_shape)
        check_normalized_shape(fn, input, shape)
        check_param(fn, "weight", weight, input, shape, "normalized_shape")
        check_param(fn, "bias", bias, input, shape, "normalized_shape")
        check_eps(fn, eps, none_ok=False)
    return _op.layer_norm(path, input, shape, weight, bias, float(eps))


def _other_float_dtype(weight, input) -> bool:
    return (isinstance(weight, torch.Tensor) and isinstance(input, torch.Tensor) and weight.dtype != input.dtype
            and weight.is_floating_point() and input.is_floating_point())


def rms_norm(
    input: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> torch.Tensor:
    """RMSNorm over the trailing ``normalized_shape`` dims: ``y = x / sqrt(mean(x^2) + eps) * weight``.

    Twin: ``torch.nn.functional.rms_norm`` -- same signature and results (``casting="torch"``,
    ``offset=0``). ``eps=None`` uses the machine epsilon of the accumulation dtype
    (``torch.finfo(torch.float32).eps`` for float16/bfloat16/float32 input).

    Shapes: input ``(*, *normalized_shape)``, output the same; ``weight``: ``normalized_shape`` or None.

    Numerics: ``mean(x^2)`` accumulated in float32 for float16/bfloat16/float32 input and
    float64 for float64. The variants of the models that use RMSNorm differ only in where the
    result is rounded:

    - ``casting="torch"`` (default): ``(x_hat * w).to(dtype)``, torch's ``rms_norm``;
      with a weight of another float dtype, ``(x_hat.to(dtype) * w).to(dtype)`` as torch.
    - ``casting="llama"``: ``w * x_hat.to(dtype)``: ``x_hat`` rounded to the input's dtype
      first; with a weight of another float dtype the output has the promoted dtype.
    - ``casting="gemma"``: ``(x_hat * w.float()).to(dtype)``: the weight of any float
      dtype taken in the accumulation dtype, one rounding at the end.
    - ``offset``: the weight is applied as ``w + offset`` (Gemma: ``offset=1.0``), the
      sum taken in the accumulation dtype.

    >>> import torch, normlab.functional as NF
    >>> NF.rms_norm(torch.tensor([[3.0, 4.0]]), (2,))
    tensor([[0.8485, 1.1314]])
    >>> x, w = torch.randn(4, 8).bfloat16(), torch.randn(8).bfloat16()
    >>> x_hat = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    >>> torch.equal(NF.rms_norm(x, (8,), w, 1e-6, casting="llama"), w * x_hat)
    True
    """
    path = route(input, "rms_norm")
    if path == EAGER and casting == "torch" and offset == 0.0:
        try:
            y = _C.rms_norm_fast(input, normalized_shape, weight, eps)
        except TypeError:
            y = None
        if y is not None:
            return y
    fn = "rms_norm"
    shape = normalized_shape
    cast_x_hat, offset = rms_variant(fn, casting, offset, weight)
    if _other_float_dtype(weight, input):
        if casting != "gemma":
            return _rms_norm_other_weight(input, normalized_shape, weight, eps, casting, offset)
        weight = weight.to(acc_dtype(input.dtype))  # gemma: the weight in float32 (float64), whatever its dtype
    if not rows_fit(input, shape, eps, weight):
        check_input(fn, input)
        shape = normalized_shape_tuple(fn, normalized_shape)
        check_normalized_shape(fn, input, shape)
        check_param(fn, "weight", weight, input, shape, "normalized_shape")
        check_eps(fn, eps, none_ok=True)
    eps = None if eps is None else float(eps)
    return _op.rms_norm(path, input, shape, weight, eps, offset, cast_x_hat)


def _rms_norm_other_weight(input, normalized_shape, weight, eps, casting="torch", offset=0.0):
    """RMSNorm with a weight in another float dtype than the input: the normalised rows in the
    input's dtype times ``weight + offset`` in the promoted dtype -- rounded back to the input's
    dtype as torch does (``casting="torch"``: ``(x_hat.to(x.dtype) * w).to(x.dtype)``), or left in
    the promoted dtype (``"llama"``: ``w * x_hat.to(x.dtype)``)."""
    fn = "rms_norm"
    check_input(fn, input)
    shape = normalized_shape_tuple(fn, normalized_shape)
    check_normalized_shape(fn, input, shape)
    check_param(fn, "weight", weight.detach().to(input.dtype), input, shape, "normalized_shape")
    w = weight + offset if offset != 0.0 else weight
    y = rms_norm(input, shape, None, eps) * w
    return y if casting == "llama" else y.to(input.dtype)


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then LayerNorm, fused: returns ``(y, h)`` with ``h = x + residual``
    and ``y = layer_norm(h, normalized_shape, weight, bias, eps)``.

    No torch twin: ``torch.add`` then ``torch.nn.functional.layer_norm``, the pre-norm
    transformer step, in one pass over memory on the ``"cpu"`` backend.

    Shapes: ``x``, ``residual``: the same shape ``(*, *normalized_shape)``, dtype and device
    (nothing broadcast); ``y`` and ``h`` as ``x``.

    Numerics: ``h`` is rounded to the input dtype before it is normalised, exactly as
    ``torch.add`` followed by the norm; then :func:`layer_norm`'s numerics. Gradients reach
    ``x`` and ``residual`` through both outputs.

    >>> import torch, normlab.functional as NF
    >>> x, r = torch.randn(4, 6), torch.randn(4, 6)
    >>> y, h = NF.add_layer_norm(x, r, (6,))
    >>> torch.equal(h, x + r), torch.allclose(y, torch.nn.functional.layer_norm(x + r, (6,)), atol=1e-6)
    (True, True)
    """
    path = route(x, "add_layer_norm")
    if path == EAGER and eps is not None:  # (None is RMSNorm's default eps, not LayerNorm's)
        try:
            yh = _C.add_norm_fast(x, residual, normalized_shape, weight, bias, eps, True)
        except TypeError:
            yh = None
        if yh is not None:
            return yh
    fn = "add_layer_norm"
    shape = normalized_shape
    if eps is None or not (rows_fit(x, shape, eps, weight, bias) and residual_fits(x, residual)):
        check_input(fn, x)
        check_residual(fn, x, residual)
        shape = normalized_shape_tuple(fn, normalized_shape)
        check_normalized_shape(fn, x, shape)
        check_param(fn, "weight", weight, x, shape, "normalized_shape")
        check_param(fn, "bias", bias, x, shape, "normalized_shape")
        check_eps(fn, eps, none_ok=False)
    return _op.add_layer_norm(path, x, residual, shape, weight, bias, float(eps))


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm, fused: returns ``(y, h)`` with ``h = x + residual``
    and ``y = rms_norm(h, normalized_shape, weight, eps, casting=casting, offset=offset)``.

    No torch twin: ``torch.add`` then ``torch.nn.functional.rms_norm``, in one pass over memory
    on the ``"cpu"`` backend.

    Shapes: ``x``, ``residual``: the same shape ``(*, *normalized_shape)``, dtype and device
    (nothing broadcast); ``y`` and ``h`` as ``x``.

    Numerics: ``h`` is rounded to the input dtype first; then :func:`rms_norm`'s numerics
    (``eps=None``, ``casting`` and ``offset`` as there).

    >>> import torch, normlab.functional as NF
    >>> x, r = torch.randn(4, 6), torch.randn(4, 6)
    >>> y, h = NF.add_rms_norm(x, r, (6,), eps=1e-6)
    >>> torch.allclose(y, torch.nn.functional.rms_norm(x + r, (6,), eps=1e-6), atol=1e-6)
    True
    """
    path = route(x, "add_rms_norm")
    if path == EAGER and casting == "torch" and offset == 0.0:
        try:
            yh = _C.add_norm_fast(x, residual, normalized_shape, weight, None, eps, False)
        except TypeError:
            yh = None
        if yh is not None:
            return yh
    fn = "add_rms_norm"
    shape = normalized_shape
    cast_x_hat, offset = rms_variant(fn, casting, offset, weight)
    if _other_float_dtype(weight, x):
        if casting == "llama":  # the normalised h in x's dtype, times the weight in the promoted dtype
            shape = normalized_shape_tuple(fn, normalized_shape)
            check_normalized_shape(fn, x, shape)
            check_param(fn, "weight", weight.detach().to(x.dtype), x, shape, "normalized_shape")
            y, h = add_rms_norm(x, residual, shape, None, eps)
            return y * (weight + offset if offset != 0.0 else weight), h
        if casting == "gemma":
            weight = weight.to(acc_dtype(x.dtype))
    if not (rows_fit(x, shape, eps, weight) and residual_fits(x, residual)):
        check_input(fn, x)
        check_residual(fn, x, residual)
        shape = normalized_shape_tuple(fn, normalized_shape)
        check_normalized_shape(fn, x, shape)
        check_param(fn, "weight", weight, x, shape, "normalized_shape")
        check_eps(fn, eps, none_ok=True)
    eps = None if eps is None else float(eps)
    return _op.add_rms_norm(path, x, residual, shape, weight, eps, offset, cast_x_hat)


def layer_norm2d(
    input: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """LayerNorm over the channel dim 1 of an ``(N, C, *)`` input, at every position:
    ``y[n, :, h, w] = (x[n, :, h, w] - mean) / sqrt(var + eps) * weight + bias``.

    No torch twin: ``torch.nn.functional.layer_norm`` of ``x.permute(0, 2, 3, 1)`` over ``(C,)``,
    permuted back -- without the copies. A ``channels_last`` input is already ``(N * H * W, C)``
    rows in memory: LayerNorm's row kernel runs on it and the output is ``channels_last`` too; a
    contiguous (NCHW) input runs on kernels of its own and gives a contiguous output.

    Shapes: input ``(N, C, *)``, output the same; ``weight``, ``bias``: ``(C,)`` or None.

    Numerics: mean and biased variance over the ``C`` values of one position, accumulated in
    float32 for float16/bfloat16/float32 input and float64 for float64; output cast once.

    >>> import torch, normlab.functional as NF
    >>> x = torch.randn(2, 3, 4, 5)
    >>> ref = torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), (3,), eps=1e-6).permute(0, 3, 1, 2)
    >>> torch.allclose(NF.layer_norm2d(x), ref, atol=1e-6)
    True
    """
    path = route(input, "layer_norm2d")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        try:
            y = _C.layer_norm2d_fast(input, weight, bias, eps)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    fn = "layer_norm2d"
    if not (  # the fast test first: a few attribute reads, then the checks that raise
        isinstance(input, torch.Tensor)
        and input.dim() >= 2
        and cpu_params_fit(input, input.shape[1:2], weight, bias)
        and eps is not None
        and plain_eps(eps)
    ):
        check_input(fn, input)
        check_channels_input(fn, input)
        check_per_channel(fn, input, weight=weight, bias=bias)
        check_eps(fn, eps, none_ok=False)
    return _op_2d.layer_norm2d(path, input, weight, bias, float(eps))
