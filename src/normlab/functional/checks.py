"""The argument checks of ``normlab.functional``'s signatures (those that ``normlab.nn`` shares
are in ``normlab._checks``).

Each check raises the exception class torch raises for the same mistake, with what was expected
and what was given. The ``*_fit``/``plain_*`` functions are fast tests, written so that True
implies that every check of the argument passes (``tests/functional/test_functional_checks.py``
holds each to that): a function runs its checks one by one only when the fast test fails, so the
common call costs a few attribute reads.
"""

from __future__ import annotations

import math
import numbers

import torch

from .._checks import check_momentum as _check_momentum
from .._checks import check_param, cpu_params_fit, plain_eps


def check_normalized_shape(fn: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
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


def rows_fit(x, shape, eps, *params) -> bool:
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


def residual_fits(x, residual) -> bool:
    """Fast test of :func:`check_residual` (``x`` already known to be a CPU tensor)."""
    return (
        isinstance(residual, torch.Tensor)
        and residual.is_cpu
        and residual.dtype == x.dtype
        and residual.shape == x.shape
    )


def check_residual(fn: str, x: torch.Tensor, residual) -> None:
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


def plain_momentum(momentum) -> bool:
    """Fast path of :func:`check_momentum`: a Python float in [0, 1] (so not NaN)."""
    return type(momentum) is float and 0.0 <= momentum <= 1.0


def check_momentum(fn: str, momentum) -> None:
    """``momentum`` in [0, 1] (``normlab._checks.check_momentum``, the modules' judgement too), or a
    0-dim floating-point tensor."""
    if _scalar_tensor(momentum):  # normlab.nn's momentum=None factor under torch.compile
        return
    _check_momentum(fn, momentum)


def _scalar_tensor(v) -> bool:
    """A 0-dim floating-point tensor: a momentum that is read when the update runs (the
    cumulative factor of ``momentum=None``, computed from ``num_batches_tracked`` in a
    traced graph)."""
    return isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point()


def momentum_value(v):
    return v if isinstance(v, torch.Tensor) else float(v)


def values_per_channel(x: torch.Tensor) -> int:
    """``N * prod(spatial)``: the values of one channel (as torch counts them, even for 0 channels)."""
    return x.shape[0] * math.prod(x.shape[2:])


_PER_CHANNEL = "one value per channel, C = input.shape[1]"


def check_channels_input(fn: str, x: torch.Tensor) -> None:
    """``x`` has a channel dim: shape ``(N, C, *)``."""
    if x.dim() < 2:
        raise RuntimeError(
            f"{fn}: expected an input of shape (N, C, *) with at least 2 dims, "
            f"got input of shape {list(x.shape)}"
        )


def check_virtual_batch_size(fn: str, virtual_batch_size) -> None:
    """GhostBatchNorm's ``virtual_batch_size``: a positive int (not a bool)."""
    if not isinstance(virtual_batch_size, numbers.Integral) or isinstance(virtual_batch_size, bool):
        raise TypeError(f"{fn}: expected virtual_batch_size to be a positive int (samples per virtual batch), "
                        f"got {virtual_batch_size!r}")
    if virtual_batch_size < 1:
        raise ValueError(f"{fn}: expected virtual_batch_size to be a positive int (samples per virtual batch), "
                         f"got {virtual_batch_size!r}")


def check_running_pair(fn: str, running_mean, running_var) -> None:
    if (running_mean is None) != (running_var is None):
        raise ValueError(
            f"{fn}: running_mean and running_var must either both be None or neither be None"
        )


def check_running_not_recorded(fn: str, running_mean, running_var) -> None:
    """Running statistics are buffers updated in place, never differentiated: with grad mode on,
    one that requires grad is refused, as torch refuses it (RuntimeError)."""
    if not torch.is_grad_enabled():
        return
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(
                f"{fn}: expected {name} not to require grad (running statistics are updated in place, "
                f"not differentiated), got a tensor with requires_grad=True; pass {name}.detach()"
            )


def check_per_channel(fn: str, x: torch.Tensor, **tensors) -> None:
    """Each of ``tensors`` (or None) holds one value per channel of ``x``."""
    for name, p in tensors.items():
        check_param(fn, name, p, x, (x.shape[1],), _PER_CHANNEL)


def check_limit(fn: str, name: str, value, least: float, why: str) -> None:
    if isinstance(value, torch.Tensor):  # a module's warm-up value, computed in a traced graph
        return
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{fn}: expected {name} to be a float, got {value!r}")
    if not value >= least or math.isinf(value):
        raise ValueError(f"{fn}: expected {name} >= {least:g} and finite, got {value!r}; {why}")
