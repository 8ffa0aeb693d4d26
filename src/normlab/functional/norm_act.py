"""Normalization + activation as functions: ``batch_norm_act``, ``group_norm_act``,
``layer_norm_act``, ``layer_norm_act2d`` (``normlab.functional``; the activations' math:
``normlab.ops.activation``; the fused kernels: ``csrc/norm_act.h``).

Each is the norm of the same name followed by an activation, ``y = act(norm(x))``, with
``act`` one of ``ops.activation.NAMES`` (``"identity"``, ``"relu"``, ``"leaky_relu"`` with
``negative_slope``, ``"silu"``, ``"gelu"``, ``"gelu_tanh"``, ``"hardswish"``, ``"tanh"``). On
the ``"ref"`` path (and wherever no fused kernel serves the call) it is exactly that: the norm's
own function, then the activation's torch function. The eager ``"cpu"`` path applies the
activation inside the normalization's output pass (``batch_norm_act``, ``group_norm_act``) or to
each block of rows while it is in cache (``layer_norm_act``, and ``layer_norm_act2d`` on a
channels_last input; on an NCHW one inside LayerNorm2d's NCHW output pass), and its derivative in the backward
(docs/derivations/norm_act.md): the same values within the project's accuracy rule (the same
bits as the unfused path for the piecewise-linear activations, except BatchNorm's in half
precision), nothing saved but what the norm saves and the bias.

On the eager path the C++ entry (``normlab._C.<name>_fast``) takes the call where the fused
kernels take its arguments (plain CPU tensors of the served dtypes, parameters of exactly the
norm's shape, a momentum in [0, 1], a non-negative eps, ...: ``csrc/norm_act.h``) and records it
for autograd itself; anything else it declines (None), and the unfused composition runs, whose
checks word any error.
"""

from __future__ import annotations

import math
import numbers

import torch

from .._backend import EAGER, route
from ..ops import activation as _act
from ..ops import extension as _extension
from .batch_norms import batch_norm
from .group_norms import group_norm
from .row_norms import layer_norm, layer_norm2d

_C = _extension.load()


def act_id(fn: str, act, negative_slope) -> tuple[int, float]:
    """``(id, parameter)`` of the activation named ``act`` (``ValueError`` naming the known ones)."""
    if not isinstance(act, str):
        raise TypeError(f"{fn}: expected act to be an activation name (one of {', '.join(_act.NAMES)}), "
                        f"got {type(act).__name__}")
    i = _act.ID.get(act)
    if i is None:
        raise ValueError(f"{fn}: unknown activation {act!r}; expected one of: {', '.join(_act.NAMES)}")
    if not isinstance(negative_slope, numbers.Real) or isinstance(negative_slope, bool) \
            or not math.isfinite(negative_slope):
        raise ValueError(f"{fn}: expected negative_slope to be a finite float, got {negative_slope!r}")
    return i, float(negative_slope)


def batch_norm_act(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    act: str = "relu",
    negative_slope: float = 0.01,
) -> torch.Tensor:
    """``act(batch_norm(input, ...))``: ``normlab.functional.batch_norm`` (the same arguments,
    checks, running-statistics update and numerics) with the activation ``act`` applied to its
    output.

    No torch twin: ``torch.nn.functional.batch_norm`` followed by the activation's function
    (timm's ``BatchNormAct2d`` computes that). Shapes: input ``(N, C, *)``, output the same (in
    the input's memory format); per-channel tensors ``(C,)``.

    Numerics: the norm's statistics as ``batch_norm``'s; on the fused path the activation is
    applied to the pre-activation value in the accumulation dtype and the output rounded once.

    >>> import torch, normlab.functional as NF
    >>> NF.batch_norm_act(torch.tensor([[1.0, 10.0], [3.0, 30.0]]), None, None, training=True)
    tensor([[0.0000, 0.0000],
            [1.0000, 1.0000]])
    """
    fn = "batch_norm_act"
    path = route(input, fn)
    a, p = act_id(fn, act, negative_slope)
    if path == EAGER:
        y = _C.batch_norm_act_fast(input, running_mean, running_var, weight, bias, training, momentum, eps, a, p)
        if y is not None:
            return y
    y = batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    return _act.act_forward(y, a, p)


def group_norm_act(
    input: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    act: str = "relu",
    negative_slope: float = 0.01,
) -> torch.Tensor:
    """``act(group_norm(input, num_groups, weight, bias, eps))`` (``normlab.functional.group_norm``'s
    arguments, checks and numerics, then the activation ``act``).

    No torch twin (timm's ``GroupNormAct``). Shapes: input ``(N, C, *)``, output the same.

    >>> import torch, normlab.functional as NF
    >>> NF.group_norm_act(torch.tensor([[1.0, 3.0, 10.0, 30.0]]), 2)
    tensor([[0.0000, 1.0000, 0.0000, 1.0000]])
    """
    fn = "group_norm_act"
    path = route(input, fn)
    a, p = act_id(fn, act, negative_slope)
    if path == EAGER:
        y = _C.group_norm_act_fast(input, num_groups, weight, bias, eps, a, p)
        if y is not None:
            return y
    return _act.act_forward(group_norm(input, num_groups, weight, bias, eps), a, p)


def layer_norm_act(
    input: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    act: str = "relu",
    negative_slope: float = 0.01,
) -> torch.Tensor:
    """``act(layer_norm(input, normalized_shape, weight, bias, eps))`` over the trailing dims
    (``normlab.functional.layer_norm``'s arguments, checks and numerics, then ``act``).

    No torch twin (timm's ``LayerNormAct``). Shapes: input ``(*, *normalized_shape)``.

    >>> import torch, normlab.functional as NF
    >>> NF.layer_norm_act(torch.tensor([[1.0, 3.0]]), (2,), act="tanh")
    tensor([[-0.7616,  0.7616]])
    """
    fn = "layer_norm_act"
    path = route(input, fn)
    a, p = act_id(fn, act, negative_slope)
    if path == EAGER:
        y = _C.layer_norm_act_fast(input, normalized_shape, weight, bias, eps, a, p)
        if y is not None:
            return y
    return _act.act_forward(layer_norm(input, normalized_shape, weight, bias, eps), a, p)


def layer_norm_act2d(
    input: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    act: str = "relu",
    negative_slope: float = 0.01,
) -> torch.Tensor:
    """``act(layer_norm2d(input, weight, bias, eps))``: LayerNorm over the channel dim 1 of an
    ``(N, C, *)`` input (``normlab.functional.layer_norm2d``), then ``act``.

    No torch twin (timm's ``LayerNormAct2d``). Shapes: input ``(N, C, *)``, output the same.

    >>> import torch, normlab.functional as NF
    >>> NF.layer_norm_act2d(torch.tensor([[[[1.0]], [[3.0]]]]), act="identity").flatten()
    tensor([-1.0000,  1.0000])
    """
    fn = "layer_norm_act2d"
    path = route(input, fn)
    a, p = act_id(fn, act, negative_slope)
    if path == EAGER:
        y = _C.layer_norm_act2d_fast(input, weight, bias, eps, a, p)
        if y is not None:
            return y
    return _act.act_forward(layer_norm2d(input, weight, bias, eps), a, p)
