"""EvoNorm B0 and S0 as functions (``normlab.functional``; the math: ``normlab.ops.evo_norm``)."""

from __future__ import annotations


import torch

from .._backend import TRANSFORM, route
from .._checks import check_eps, check_input, check_momentum, check_num_groups, check_param
from ..ops import _transforms
from ..ops.evo_norm.reference import batch_var, ref_evo_b0, ref_evo_s0
from .frn import check_4d

_PER_CHANNEL = "num_features, the input's dim 1"


def evo_norm2d_b0(
    input: torch.Tensor,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-3,
) -> torch.Tensor:
    """EvoNorm-B0 (Liu et al., NeurIPS 2020; timm's ``EvoNorm2dB0``):
    ``y = x / max(sqrt(var + eps), x * v + sqrt(var_HW(x) + eps)) * weight + bias``, with ``var`` the
    batch's biased variance per channel in training and ``running_var`` in eval; ``v`` None:
    ``y = x * weight + bias``.

    No torch twin. In training with ``v`` and ``running_var``, ``running_var`` is updated in place
    with the batch's unbiased variance: ``(1 - momentum) * running_var + momentum * var * n / (n - 1)``.

    Shapes: input ``(N, C, H, W)``, output the same (in the input's memory format);
    ``running_var``, ``weight``, ``bias``, ``v``: ``(C,)`` or None (``running_var`` is needed in eval
    with ``v``).

    Numerics: the variances by the shifted two passes in float32 for float16/bfloat16/float32 input
    and float64 for float64; the output is rounded to the input's dtype once.

    >>> import torch, normlab.functional as NF
    >>> NF.evo_norm2d_b0(torch.tensor([[[[3.0]]]]), torch.ones(1), v=torch.ones(1), eps=0.0)
    tensor([[[[1.]]]])
    """
    fn = "evo_norm2d_b0"
    path = route(input, fn)
    check_input(fn, input)
    check_4d(fn, input)
    shape = tuple(input.shape[1:2])
    for name, p in (("running_var", running_var), ("weight", weight), ("bias", bias), ("v", v)):
        check_param(fn, name, p, input, shape, _PER_CHANNEL)
    if not isinstance(training, bool):
        raise TypeError(f"{fn}: expected training to be a bool, got {training!r}")
    check_momentum(fn, momentum)
    check_eps(fn, eps, none_ok=False)
    if v is not None:
        if not training and running_var is None:
            raise ValueError(f"{fn}: expected running_var in eval (training=False) with v: B0 divides by "
                             f"sqrt(running_var + eps) there; pass the module's running_var, or training=True")
        if training and running_var is not None and input.numel() > 0 and input.numel() == input.shape[1]:
            raise ValueError(f"{fn}: expected more than 1 value per channel when training (the running "
                             f"variance takes the unbiased variance), got input of shape {list(input.shape)}")
    momentum, eps = float(momentum), float(eps)
    # the running variance updated in place first (its new value is not what this call reads), as
    # torch's batch_norm updates its own: with the batch's unbiased variance
    if training and v is not None and running_var is not None and input.numel() > 0:
        with torch.no_grad():
            n = input.numel() / input.shape[1]
            var = batch_var(input.detach())
            running_var.copy_(running_var * (1 - momentum) + var.to(running_var.dtype) * (momentum * (n / (n - 1))))
    return ref_evo_b0(input, v, weight, bias, running_var, eps, training, plain=_plain(path))


def evo_norm2d_s0(
    input: torch.Tensor,
    groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """EvoNorm-S0 (Liu et al., NeurIPS 2020; timm's ``EvoNorm2dS0``):
    ``y = x * sigmoid(v * x) / sqrt(var_group(x) + eps) * weight + bias``, the biased variance over
    each group of ``C / groups`` channels of a sample; ``v`` None: ``y = x * weight + bias``.

    No torch twin. Train and eval are the same (no running statistic).

    Shapes: input ``(N, C, H, W)`` with ``C`` divisible by ``groups`` (with ``v``), output the same (in the
    input's memory format); ``weight``, ``bias``, ``v``: ``(C,)`` or None.

    Numerics: the group variance by the shifted two passes in float32 for float16/bfloat16/float32
    input and float64 for float64; the output is rounded to the input's dtype once.

    >>> import torch, normlab.functional as NF
    >>> NF.evo_norm2d_s0(torch.tensor([[[[1.0, -1.0]]]]), 1, v=torch.zeros(1), eps=0.0)
    tensor([[[[ 0.5000, -0.5000]]]])
    """
    fn = "evo_norm2d_s0"
    path = route(input, fn)
    check_input(fn, input)
    check_4d(fn, input)
    groups = check_num_groups(fn, groups)
    if v is not None and input.shape[1] % groups:
        raise ValueError(f"{fn}: expected the input's channels ({input.shape[1]}) to be divisible by groups "
                         f"({groups}); pass a groups that divides {input.shape[1]}")
    shape = tuple(input.shape[1:2])
    for name, p in (("weight", weight), ("bias", bias), ("v", v)):
        check_param(fn, name, p, input, shape, _PER_CHANNEL)
    check_eps(fn, eps, none_ok=False)
    return ref_evo_s0(input, v, weight, bias, groups, float(eps), plain=_plain(path))


def _plain(path) -> bool:
    """Under torch.func transforms and forward-mode AD (``TRANSFORM``, on any path): the reference
    forward in plain torch ops, which torch differentiates and batches itself; else the reference's
    autograd Functions with the hand-derived backward (every other path: EvoNorm has no kernel)."""
    return path == TRANSFORM or _transforms.active()


__all__ = ["evo_norm2d_b0", "evo_norm2d_s0"]
