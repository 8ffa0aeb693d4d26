"""normlab.functional: the normalizations as functions, with torch.nn.functional's signatures.

Each function checks its arguments first (raising the exception class torch
raises for the same mistake, with what was expected and what was given), then
picks a backend (``normlab.set_backend``) and calls the family's op in
``normlab.ops``. Nothing is broadcast silently: a weight must have exactly the
shape the op expects.

>>> import torch, normlab.functional as NF
>>> x = torch.randn(4, 6)
>>> y = NF.layer_norm(x, (6,))
>>> torch.allclose(y, torch.nn.functional.layer_norm(x, (6,)), atol=1e-6)
True
"""

from __future__ import annotations

import math
import numbers

import torch

from . import _backend
from ._checks import (check_eps, check_input, check_param, cpu_params_fit, normalized_shape_tuple, plain_eps,
                      rms_variant)
# importing a family enters its ops in the backend table (_backend.implementation)
from .ops import batch_norm as _bn  # noqa: F401
from .ops import group_norm as _gn  # noqa: F401
from .ops import layer_norm as _ln  # noqa: F401
from .ops import extension as _extension
from .ops._common import acc_dtype

_C = _extension.load()
_eager_cpu = _backend.eager_cpu
# BatchNorm's C++ entry (a module global: one lookup a call; tests spy on it)
_batch_norm_fast = _C.batch_norm_fast if _C is not None else None

__all__ = [
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "batch_norm",
    "group_norm",
    "instance_norm",
    "layer_norm2d",
    "batch_renorm",
    "ghost_batch_norm",
]


def _check_normalized_shape(fn: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if len(shape) == 0:
        raise RuntimeError(
            f"{fn}: expected normalized_shape to have at least one dim, got normalized_shape = []"
        )
    if any(d < 0 for d in shape):
        raise RuntimeError(f"{fn}: expected normalized_shape of sizes >= 0, got normalized_shape = {list(shape)}")
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise RuntimeError(
            f"{fn}: given normalized_shape={list(shape)}, expected input with shape "
            f"[*, {', '.join(map(str, shape))}], got input of shape {list(x.shape)}; "
            f"normalized_shape names the trailing dims of the input"
        )


# Each function below first tries a fast test of its arguments, written so that
# True implies that every one of its checks passes (tests/test_functional_checks.py
# holds each one to that); only when it fails do the checks run, one by one, to
# raise the error that names the problem. The fast tests keep the common call --
# a module's own parameters, CPU tensors, Python floats -- to a few attribute
# reads: they run before every kernel, usually with the caches cold after the
# previous one.


def _rows_fit(x, shape, eps, *params) -> bool:
    """Fast test of a row norm's arguments: ``shape`` a non-empty tuple of ints naming
    ``x``'s trailing dims, ``params`` fitting it (:func:`cpu_params_fit`), ``eps`` plain."""
    return (
        type(shape) is tuple
        and len(shape) > 0
        and cpu_params_fit(x, shape, *params)
        and plain_eps(eps)
        and x.shape[x.dim() - len(shape):] == shape
        and all(type(d) is int for d in shape)
    )


def _residual_fits(x, residual) -> bool:
    """Fast test of :func:`_check_residual` (``x`` already known to be a CPU tensor)."""
    return (
        isinstance(residual, torch.Tensor)
        and residual.is_cpu
        and residual.dtype == x.dtype
        and residual.shape == x.shape
    )


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
    if _C is not None and _eager_cpu():  # the C++ entry checks the arguments; None: not its case
        try:
            y = _C.layer_norm_fast(input, normalized_shape, weight, bias, eps)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    fn = "layer_norm"
    shape = normalized_shape
    if not _rows_fit(input, shape, eps, weight, bias):
        check_input(fn, input)
        shape = normalized_shape_tuple(fn, normalized_shape)
        _check_normalized_shape(fn, input, shape)
        check_param(fn, "weight", weight, input, shape, "normalized_shape")
        check_param(fn, "bias", bias, input, shape, "normalized_shape")
        check_eps(fn, eps)
    return _backend.implementation(input, fn)(input, shape, weight, bias, float(eps))


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
    if _C is not None and casting == "torch" and offset == 0.0 and _eager_cpu():
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
    if not _rows_fit(input, shape, eps, weight):
        check_input(fn, input)
        shape = normalized_shape_tuple(fn, normalized_shape)
        _check_normalized_shape(fn, input, shape)
        check_param(fn, "weight", weight, input, shape, "normalized_shape")
        check_eps(fn, eps)
    eps = None if eps is None else float(eps)
    return _backend.implementation(input, fn)(input, shape, weight, eps, offset, cast_x_hat)


def _rms_norm_other_weight(input, normalized_shape, weight, eps, casting="torch", offset=0.0):
    """RMSNorm with a weight in another float dtype than the input: the normalised rows in the
    input's dtype times ``weight + offset`` in the promoted dtype -- rounded back to the input's
    dtype as torch does (``casting="torch"``: ``(x_hat.to(x.dtype) * w).to(x.dtype)``), or left in
    the promoted dtype (``"llama"``: ``w * x_hat.to(x.dtype)``)."""
    fn = "rms_norm"
    check_input(fn, input)
    shape = normalized_shape_tuple(fn, normalized_shape)
    _check_normalized_shape(fn, input, shape)
    check_param(fn, "weight", weight.detach().to(input.dtype), input, shape, "normalized_shape")
    w = weight + offset if offset != 0.0 else weight
    y = rms_norm(input, shape, None, eps) * w
    return y if casting == "llama" else y.to(input.dtype)


def _check_residual(fn: str, x: torch.Tensor, residual) -> None:
    """``residual`` is added to ``x`` elementwise: same shape, dtype and device, nothing broadcast."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"{fn}: expected residual to be a torch.Tensor, got {type(residual).__name__}")
    if residual.shape != x.shape:
        raise RuntimeError(
            f"{fn}: expected residual of the input's shape {list(x.shape)}, got residual of "
            f"shape {list(residual.shape)}; residual is added elementwise, without broadcasting"
        )
    if residual.dtype != x.dtype:
        raise RuntimeError(
            f"{fn}: expected residual of the input's dtype {x.dtype}, got {residual.dtype}; "
            f"cast one of them, e.g. residual.to({x.dtype})"
        )
    if residual.device != x.device:
        raise RuntimeError(
            f"{fn}: expected residual on the input's device ({x.device}), got {residual.device}; "
            f"move it with residual.to({str(x.device)!r})"
        )


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
    if _C is not None and _eager_cpu():
        try:
            yh = _C.add_norm_fast(x, residual, normalized_shape, weight, bias, eps, True)
        except TypeError:
            yh = None
        if yh is not None:
            return yh
    fn = "add_layer_norm"
    shape = normalized_shape
    if not (_rows_fit(x, shape, eps, weight, bias) and _residual_fits(x, residual)):
        check_input(fn, x)
        _check_residual(fn, x, residual)
        shape = normalized_shape_tuple(fn, normalized_shape)
        _check_normalized_shape(fn, x, shape)
        check_param(fn, "weight", weight, x, shape, "normalized_shape")
        check_param(fn, "bias", bias, x, shape, "normalized_shape")
        check_eps(fn, eps)
    return _backend.implementation(x, fn)(x, residual, shape, weight, bias, float(eps))


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
    if _C is not None and casting == "torch" and offset == 0.0 and _eager_cpu():
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
            _check_normalized_shape(fn, x, shape)
            check_param(fn, "weight", weight.detach().to(x.dtype), x, shape, "normalized_shape")
            y, h = add_rms_norm(x, residual, shape, None, eps)
            return y * (weight + offset if offset != 0.0 else weight), h
        if casting == "gemma":
            weight = weight.to(acc_dtype(x.dtype))
    if not (_rows_fit(x, shape, eps, weight) and _residual_fits(x, residual)):
        check_input(fn, x)
        _check_residual(fn, x, residual)
        shape = normalized_shape_tuple(fn, normalized_shape)
        _check_normalized_shape(fn, x, shape)
        check_param(fn, "weight", weight, x, shape, "normalized_shape")
        check_eps(fn, eps)
    eps = None if eps is None else float(eps)
    return _backend.implementation(x, fn)(x, residual, shape, weight, eps, offset, cast_x_hat)


def _plain_momentum(momentum) -> bool:
    """Fast path of :func:`_check_momentum`: a Python float in [0, 1] (so not NaN)."""
    return type(momentum) is float and 0.0 <= momentum <= 1.0


def _check_momentum(fn: str, momentum) -> None:
    if _scalar_tensor(momentum):  # normlab.nn's momentum=None factor under torch.compile
        return
    if not isinstance(momentum, numbers.Real) or isinstance(momentum, bool):
        raise TypeError(f"{fn}: expected momentum to be a float in [0, 1], got {momentum!r}")
    if not 0 <= momentum <= 1:
        raise ValueError(f"{fn}: expected momentum in [0, 1] (the weight of the new batch statistic in the "
                         f"running ones), got {momentum!r}")


def _scalar_tensor(v) -> bool:
    """A 0-dim floating-point tensor: a momentum that is read when the update runs (the
    cumulative factor of ``momentum=None``, computed from ``num_batches_tracked`` in a
    traced graph)."""
    return isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point()


def _momentum(v):
    return v if isinstance(v, torch.Tensor) else float(v)


def _values_per_channel(x: torch.Tensor) -> int:
    """``N * prod(spatial)``: the values of one channel (as torch counts them, even for 0 channels)."""
    return x.shape[0] * math.prod(x.shape[2:])


_PER_CHANNEL = "one value per channel, C = input.shape[1]"


def _check_channels_input(fn: str, x: torch.Tensor) -> None:
    """``x`` has a channel dim: shape ``(N, C, *)``."""
    if x.dim() < 2:
        raise RuntimeError(
            f"{fn}: expected an input of shape (N, C, *) with at least 2 dims, "
            f"got input of shape {list(x.shape)}"
        )


def _check_running_pair(fn: str, running_mean, running_var) -> None:
    if (running_mean is None) != (running_var is None):
        raise ValueError(
            f"{fn}: running_mean and running_var must either both be None or neither be None"
        )


def _check_per_channel(fn: str, x: torch.Tensor, **tensors) -> None:
    """Each of ``tensors`` (or None) holds one value per channel of ``x``."""
    for name, p in tensors.items():
        check_param(fn, name, p, x, (x.shape[1],), _PER_CHANNEL)


def batch_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    """BatchNorm over every dim but the channel dim 1 of an ``(N, C, *)`` input:
    ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    Twin: ``torch.nn.functional.batch_norm`` -- same signature and results; ``momentum`` must
    be in ``[0, 1]``, and per-channel tensors must have exactly ``(C,)``.

    Shapes: input ``(N, C, *)``, output the same (in the input's memory format);
    ``running_mean``, ``running_var``, ``weight``, ``bias``: ``(C,)`` or None.

    Numerics: ``training=True`` normalises with the batch's mean and *biased* variance and,
    when running statistics are given, updates them in place::

        running_mean = (1 - momentum) * running_mean + momentum * batch_mean
        running_var  = (1 - momentum) * running_var  + momentum * batch_var * n / (n - 1)

    (the running variance takes the *unbiased* batch variance; ``n = N * prod(*)``).
    ``training=False`` normalises with ``running_mean``/``running_var``. Statistics are
    accumulated in float32 for float16/bfloat16/float32 input and float64 for float64, over
    fixed chunks merged in a fixed order (the same bits on any number of threads); the output
    is cast once.

    >>> import torch, normlab.functional as NF
    >>> rm, rv = torch.zeros(2), torch.ones(2)
    >>> NF.batch_norm(torch.tensor([[1.0, 10.0], [3.0, 30.0]]), rm, rv, training=True)
    tensor([[-1.0000, -1.0000],
            [ 1.0000,  1.0000]])
    >>> rm, rv
    (tensor([0.2000, 2.0000]), tensor([ 1.1000, 20.9000]))
    """
    if _batch_norm_fast is not None and _eager_cpu():  # the C++ entry checks the arguments; None: not its case
        try:
            y = _batch_norm_fast(input, running_mean, running_var, weight, bias, training, momentum, eps)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    fn = "batch_norm"
    if training and isinstance(eps, numbers.Real) and not eps > 0:
        raise ValueError(
            f"{fn}: expected eps > 0 in training, got {eps!r}; eps keeps 1 / sqrt(var + eps) finite "
            f"for a channel whose batch values are all equal (torch raises here too)"
        )
    if not (
        isinstance(input, torch.Tensor)
        and input.dim() >= 2
        and cpu_params_fit(input, input.shape[1:2], running_mean, running_var, weight, bias)
        and (running_mean is None) == (running_var is None)
        and (running_mean is not None or training)
        and _plain_momentum(momentum)
        and plain_eps(eps)
        and (not training or input.numel() > input.shape[1])
    ):
        check_input(fn, input)
        _check_channels_input(fn, input)
        _check_running_pair(fn, running_mean, running_var)
        if not training and running_mean is None and input.numel() > 0:  # (torch: empty in, empty out)
            raise RuntimeError(
                f"{fn}: running_mean must be defined in evaluation mode (training=False); "
                f"pass training=True to normalise with the batch's own statistics"
            )
        _check_per_channel(fn, input, running_mean=running_mean, running_var=running_var,
                           weight=weight, bias=bias)
        _check_momentum(fn, momentum)
        check_eps(fn, eps)
        if training and _values_per_channel(input) == 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {input.size()}"
            )
    return _backend.implementation(input, fn)(
        input, running_mean, running_var, weight, bias, bool(training), _momentum(momentum), float(eps)
    )


def group_norm(
    input: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """GroupNorm: the ``C`` channels of an ``(N, C, *)`` input split into ``num_groups`` groups,
    ``y = (x - mean_g) / sqrt(var_g + eps) * weight + bias`` with each group of each sample's
    own statistics, then a per-channel affine.

    Twin: ``torch.nn.functional.group_norm`` -- same signature and results; ``num_groups`` must
    be a positive int dividing ``C`` (``ValueError``/``RuntimeError`` with what was given).

    Shapes: input ``(N, C, *)``, output the same (in the input's memory format);
    ``weight``, ``bias``: ``(C,)`` or None.

    Numerics: mean and biased variance per (sample, group), accumulated in float32 for
    float16/bfloat16/float32 input and float64 for float64; output cast once.

    >>> import torch, normlab.functional as NF
    >>> NF.group_norm(torch.tensor([[1.0, 3.0, 10.0, 30.0]]), 2)
    tensor([[-1.0000,  1.0000, -1.0000,  1.0000]])
    """
    if _C is not None and _eager_cpu():  # the C++ entry checks the arguments; None: not its case
        y = _C.group_norm_fast(input, num_groups, weight, bias, eps)
        if y is not None:
            return y
    fn = "group_norm"
    if not (
        isinstance(input, torch.Tensor)
        and input.dim() >= 2
        and type(num_groups) is int
        and num_groups > 0
        and input.shape[1] % num_groups == 0
        and cpu_params_fit(input, input.shape[1:2], weight, bias)
        and plain_eps(eps)
        and input.numel() != num_groups  # N * (C / G) * S == 1: one value per group
    ):
        check_input(fn, input)
        _check_channels_input(fn, input)
        if not isinstance(num_groups, numbers.Integral) or isinstance(num_groups, bool) or num_groups <= 0:
            raise ValueError(f"{fn}: expected num_groups to be a positive int, got {num_groups!r}")
        c = input.shape[1]
        if c % num_groups != 0:
            raise RuntimeError(
                f"{fn}: expected the number of channels ({c}, input.shape[1] of input shape "
                f"{list(input.shape)}) to be divisible by num_groups ({num_groups})"
            )
        _check_per_channel(fn, input, weight=weight, bias=bias)
        check_eps(fn, eps)
        if input.shape[0] * (c // num_groups) * math.prod(input.shape[2:]) == 1:
            raise ValueError(  # each group would hold a single value: its variance is 0
                f"Expected more than 1 value per channel when training, got input size "
                f"{[input.shape[0] * c // num_groups, num_groups, *input.shape[2:]]}"
            )
    return _backend.implementation(input, fn)(input, int(num_groups), weight, bias, float(eps))


def instance_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None = None,
    running_var: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    """InstanceNorm: ``y = (x - mean) / sqrt(var + eps) * weight + bias``, each channel of each
    sample of an ``(N, C, *spatial)`` input over its spatial dims.

    Twin: ``torch.nn.functional.instance_norm`` -- same signature and results.

    Shapes: input ``(N, C, *spatial)`` (at least 3 dims with ``use_input_stats``), output the
    same; ``running_mean``, ``running_var``, ``weight``, ``bias``: ``(C,)`` or None.

    Numerics: mean and biased variance per (sample, channel), accumulated in float32 for
    float16/bfloat16/float32 input and float64 for float64; output cast once. With
    ``use_input_stats`` and running statistics given, these are updated in place with weight
    ``momentum`` (in ``[0, 1]``) towards the batch average of the per-instance means and
    *unbiased* variances; ``use_input_stats=False`` normalises with the running statistics.

    >>> import torch, normlab.functional as NF
    >>> NF.instance_norm(torch.tensor([[[1.0, 2.0, 3.0]]]))
    tensor([[[-1.2247,  0.0000,  1.2247]]])
    """
    if _C is not None and _eager_cpu():  # the C++ entry checks the arguments; None: not its case
        y = _C.instance_norm_fast(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
        if y is not None:
            return y
    fn = "instance_norm"
    if not (
        isinstance(input, torch.Tensor)
        and input.dim() >= (3 if use_input_stats else 2)
        and cpu_params_fit(input, input.shape[1:2], running_mean, running_var, weight, bias)
        and (running_mean is None) == (running_var is None)
        and (running_mean is not None or use_input_stats)
        and _plain_momentum(momentum)
        and plain_eps(eps)
        and (not use_input_stats or input.numel() != input.shape[0] * input.shape[1])  # S == 1
    ):
        check_input(fn, input)
        if input.dim() < 2 or (use_input_stats and input.dim() < 3):
            raise ValueError(
                f"{fn}: expected an input of shape (N, C, *spatial) with at least 3 dims, "
                f"got input of shape {list(input.shape)}; add a batch dim with x.unsqueeze(0)"
            )
        _check_running_pair(fn, running_mean, running_var)
        if not use_input_stats and running_mean is None:
            raise RuntimeError(
                f"{fn}: expected running_mean and running_var when use_input_stats=False, got None"
            )
        _check_per_channel(fn, input, running_mean=running_mean, running_var=running_var,
                           weight=weight, bias=bias)
        _check_momentum(fn, momentum)
        check_eps(fn, eps)
        if use_input_stats and math.prod(input.shape[2:]) == 1:
            raise ValueError(
                f"Expected more than 1 spatial element when training, got input size {input.size()}"
            )
    return _backend.implementation(input, fn)(
        input, running_mean, running_var, weight, bias, bool(use_input_stats), float(momentum), float(eps)
    )


# normlab's own layers (LayerNorm2d, BatchRenorm, GhostBatchNorm): their functions live apart
from ._functional_extra import batch_renorm, ghost_batch_norm, layer_norm2d  # noqa: E402
