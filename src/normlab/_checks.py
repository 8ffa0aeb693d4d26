"""Argument checks shared by ``normlab.functional`` and ``normlab.nn``.

Every check runs before any computation and raises the exception class that
``torch.nn`` raises for the same mistake, with a message that says what was
expected, what was given and, where there is one, the fix.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_LOW_PRECISION = (torch.float16, torch.bfloat16)
# input dtype -> the dtypes check_param accepts for its parameters
_PARAM_DTYPES = {
    torch.float32: (torch.float32,),
    torch.float64: (torch.float64,),
    torch.float16: (torch.float16, torch.float32),
    torch.bfloat16: (torch.bfloat16, torch.float32),
}


def cpu_params_fit(x, shape: tuple[int, ...], *params) -> bool:
    """The fast path of the checks: True when ``x`` is a floating-point CPU tensor and each
    of ``params`` is None or a CPU tensor of exactly ``shape`` in a dtype :func:`check_param`
    accepts for ``x``.

    True promises that :func:`check_input` and :func:`check_param` would pass;
    False promises nothing (the caller then runs them, and they raise with the
    message). A handful of attribute reads: the checks run before every call,
    often with the caches cold after the previous kernel, so each Python object
    they touch counts.
    """
    if not isinstance(x, torch.Tensor) or not x.is_cpu:
        return False
    allowed = _PARAM_DTYPES.get(x.dtype)
    if allowed is None:
        return False
    for p in params:
        if p is not None and not (
            isinstance(p, torch.Tensor) and p.is_cpu and p.dtype in allowed and p.shape == shape
        ):
            return False
    return True


def plain_eps(eps) -> bool:
    """Fast path of :func:`check_eps`: ``eps`` is a non-negative Python float (or None)."""
    return eps is None or (type(eps) is float and eps >= 0)


def normalized_shape_tuple(fn: str, normalized_shape) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of ints (an int ``n`` means ``(n,)``)."""
    if type(normalized_shape) is tuple and all(type(d) is int for d in normalized_shape):
        return normalized_shape  # the modules' own (already checked) tuple: the fast path
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        return (int(normalized_shape),)
    if isinstance(normalized_shape, torch.Size) or isinstance(normalized_shape, Sequence):
        dims = tuple(normalized_shape)
        if all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims):
            return tuple(int(d) for d in dims)
    raise TypeError(
        f"{fn}: expected normalized_shape to be an int or a sequence of ints, "
        f"got {normalized_shape!r}"
    )


def check_input(fn: str, x) -> None:
    """``x`` is a floating-point tensor (torch raises NotImplementedError for integer input)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: expected input to be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise NotImplementedError(
            f"{fn}: expected a floating-point input (float16, bfloat16, float32 or "
            f"float64), got {x.dtype}; convert it first, e.g. x.float()"
        )


def check_param(
    fn: str, name: str, p, x: torch.Tensor, shape: tuple[int, ...], shape_hint: str
) -> None:
    """A parameter/statistic tensor ``p`` (or None) fits input ``x``.

    Shape must equal ``shape`` exactly (nothing is broadcast); dtype must equal
    ``x``'s, or be float32 when ``x`` is float16/bfloat16 (torch's mixed-precision
    rule); the device must be ``x``'s.
    """
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{fn}: expected {name} to be a torch.Tensor or None, got {type(p).__name__}")
    if tuple(p.shape) != tuple(shape):
        raise RuntimeError(
            f"{fn}: expected {name} of shape {list(shape)} ({shape_hint}), "
            f"got {name} of shape {list(p.shape)}"
        )
    if p.device != x.device:
        raise RuntimeError(
            f"{fn}: expected {name} on the input's device ({x.device}), got {p.device}; "
            f"move the module or tensor with .to({str(x.device)!r})"
        )
    if p.dtype != x.dtype and not (x.dtype in _LOW_PRECISION and p.dtype == torch.float32):
        allowed = f"{x.dtype}" + (" or torch.float32" if x.dtype in _LOW_PRECISION else "")
        raise RuntimeError(
            f"{fn}: mixed dtypes: expected {name} of dtype {allowed} to match the "
            f"input ({x.dtype}), got {p.dtype}; cast the module with .to({x.dtype}) "
            f"or the input with .to({p.dtype})"
        )


def check_min_dim(fn: str, x: torch.Tensor, n: int, what: str) -> None:
    if x.dim() < n:
        raise RuntimeError(
            f"{fn}: expected an input with at least {n} dims {what}, got input of shape {list(x.shape)}"
        )


def check_eps(fn: str, eps, none_ok: bool | None = None) -> None:
    """``eps`` is a number >= 0 -- ``inf`` included, as torch (the output is then 0, or the
    bias) -- or None unless ``none_ok`` is False (``True``: None is RMSNorm's machine epsilon, and
    the message says so; the default, None: passed through, for ``normlab.functional``'s code to
    turn into a float).

    The one judgement of ``eps`` for ``normlab.functional`` and ``normlab.nn``'s constructors:
    ``TypeError`` for what is not a real number (torch's class for a str or None), a bool
    included (torch takes ``True`` as 1.0; here it is refused: ``LayerNorm(8, False)`` sets eps,
    not ``elementwise_affine``); ``ValueError`` for a negative or NaN ``eps``, which torch
    accepts and turns into NaN outputs."""
    if eps is None and none_ok is not False:
        return
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        hint = ("; a bool here is usually a flag passed by position: pass eps as a number and the flag "
                "by name" if isinstance(eps, bool) else "")
        raise TypeError(f"{fn}: expected eps to be a float{' or None' if none_ok else ''}, got {eps!r}{hint}")
    if not eps >= 0:
        raise ValueError(f"{fn}: expected eps to be a non-negative number, got {eps!r}")


def check_momentum(fn: str, momentum, none_ok: bool = False) -> None:
    """``momentum`` is a number in [0, 1] (or None where ``none_ok``: the modules' cumulative average).

    The one judgement of ``momentum`` for ``normlab.functional`` and ``normlab.nn``'s constructors,
    checked whether or not a call updates running statistics: ``TypeError`` for what is not a real
    number (a bool included; torch takes ``True`` as 1.0), ``ValueError`` outside [0, 1] or NaN
    (torch accepts those and extrapolates the running statistics, or makes them NaN)."""
    if momentum is None and none_ok:
        return
    if not isinstance(momentum, numbers.Real) or isinstance(momentum, bool):
        raise TypeError(f"{fn}: expected momentum to be a float in [0, 1]{' or None' if none_ok else ''}, "
                        f"got {momentum!r}")
    if not 0 <= momentum <= 1:
        raise ValueError(f"{fn}: expected momentum in [0, 1] (the weight of the new batch statistic in the running "
                         f"ones{'; None: a cumulative average' if none_ok else ''}), got {momentum!r}")


def check_num_groups(fn: str, num_groups) -> int:
    """GroupNorm's ``num_groups`` is a positive int (not a bool); returns it as an int.

    ``TypeError`` for another type (torch's class: ``group_norm(): argument 'num_groups' must be
    int``), ``ValueError`` for 0 or a negative number (torch: ZeroDivisionError for 0, a
    RuntimeError at the first forward for a negative one)."""
    if not isinstance(num_groups, numbers.Integral) or isinstance(num_groups, bool):
        raise TypeError(f"{fn}: expected num_groups to be an int, got {num_groups!r}")
    if num_groups < 1:
        raise ValueError(f"{fn}: expected num_groups to be a positive int, got {num_groups!r}")
    return int(num_groups)


# RMSNorm's casting variants -> whether x_hat is rounded to the input's dtype before the weight
_CAST_X_HAT = {"torch": False, "llama": True, "gemma": False}


def rms_variant(fn: str, casting, offset, weight) -> tuple[bool, float]:
    """``(cast_x_hat, offset)`` of an RMSNorm variant, after checking ``casting`` and ``offset``."""
    cast = _CAST_X_HAT.get(casting) if type(casting) is str else None
    # (offset - offset == 0 is math.isfinite in arithmetic, which torch.compile traces without a break)
    if cast is not None and type(offset) is float and (
            offset == 0.0 or (weight is not None and offset - offset == 0.0)):
        return cast, offset
    if cast is None:
        raise ValueError(
            f"{fn}: expected casting to be one of 'torch', 'llama', 'gemma', got {casting!r} "
            f"('torch': one rounding at the end; 'llama': x_hat rounded to the input's dtype, then "
            f"times the weight; 'gemma': everything in float32, the weight of any dtype)"
        )
    if not isinstance(offset, numbers.Real) or isinstance(offset, bool) or not math.isfinite(offset):
        raise TypeError(f"{fn}: expected offset to be a finite float (the weight is applied as "
                        f"weight + offset), got {offset!r}")
    if offset != 0 and weight is None:
        raise ValueError(
            f"{fn}: offset={offset!r} shifts the weight, but weight is None; pass the weight "
            f"(it is applied as weight + offset) or leave offset at 0.0"
        )
    return cast, float(offset)
