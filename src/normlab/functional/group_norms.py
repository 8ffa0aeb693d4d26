"""GroupNorm and InstanceNorm as functions (``normlab.functional``; the math:
``normlab.ops.group_norm``)."""

from __future__ import annotations

import math
import numbers

import torch

from .._backend import EAGER, route
from .._checks import check_eps, check_input, check_num_groups, cpu_params_fit, plain_eps
from ..ops import extension as _extension
from ..ops.group_norm import op as _op
from .checks import (check_channels_input, check_momentum, check_per_channel, check_running_not_recorded,
                     check_running_pair, plain_momentum)

_C = _extension.load()


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
    path = route(input, "group_norm")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
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
        and eps is not None
        and plain_eps(eps)
        and input.numel() != num_groups  # N * (C / G) * S == 1: one value per group
    ):
        check_input(fn, input)
        check_channels_input(fn, input)
        num_groups = check_num_groups(fn, num_groups)
        c = input.shape[1]
        if c % num_groups != 0:
            raise RuntimeError(
                f"{fn}: expected the number of channels ({c}, input.shape[1] of input shape "
                f"{list(input.shape)}) to be divisible by num_groups ({num_groups})"
            )
        check_per_channel(fn, input, weight=weight, bias=bias)
        check_eps(fn, eps, none_ok=False)
        if input.shape[0] * (c // num_groups) * math.prod(input.shape[2:]) == 1:
            raise ValueError(  # each group would hold a single value: its variance is 0
                f"Expected more than 1 value per channel when training, got input size "
                f"{[input.shape[0] * c // num_groups, num_groups, *input.shape[2:]]}"
            )
    return _op.group_norm(path, input, int(num_groups), weight, bias, float(eps))


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
    path = route(input, "instance_norm")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        y = _C.instance_norm_fast(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
        if y is not None:
            return y
    fn = "instance_norm"
    check_running_not_recorded(fn, running_mean, running_var)
    if not (
        isinstance(input, torch.Tensor)
        and input.dim() >= (3 if use_input_stats else 2)
        and cpu_params_fit(input, input.shape[1:2], running_mean, running_var, weight, bias)
        and (running_mean is None) == (running_var is None)
        and (running_mean is not None or use_input_stats)
        and plain_momentum(momentum)
        and eps is not None
        and plain_eps(eps)
        and (not use_input_stats or input.numel() != input.shape[0] * input.shape[1])  # S == 1
    ):
        check_input(fn, input)
        if input.dim() < 2 or (use_input_stats and input.dim() < 3):
            raise ValueError(
                f"{fn}: expected an input of shape (N, C, *spatial) with at least 3 dims, "
                f"got input of shape {list(input.shape)}; add a batch dim with x.unsqueeze(0)"
            )
        check_running_pair(fn, running_mean, running_var)
        if not use_input_stats and running_mean is None:
            raise RuntimeError(
                f"{fn}: expected running_mean and running_var when use_input_stats=False, got None"
            )
        check_per_channel(fn, input, running_mean=running_mean, running_var=running_var,
                           weight=weight, bias=bias)
        check_momentum(fn, momentum)
        check_eps(fn, eps, none_ok=False)
        if use_input_stats and math.prod(input.shape[2:]) == 1:
            raise ValueError(
                f"Expected more than 1 spatial element when training, got input size {input.size()}"
            )
    return _op.instance_norm(
        path, input, running_mean, running_var, weight, bias, bool(use_input_stats), float(momentum), float(eps)
    )
