"""EvoNorm B0 and S0: the family's entries, running the path ``normlab._backend.route`` decided.

- ``REF``, ``EAGER``, ``COMPILE``: the reference (its autograd Functions with the hand-derived
  backward);
- ``TRANSFORM`` (torch.func transforms, forward-mode AD; on any path): the reference forward in plain torch ops,
  which torch differentiates and batches itself.

B0's running variance is updated here, in place, as torch's batch_norm updates its own: with the
batch's unbiased variance, ``running_var = (1 - momentum) * running_var + momentum * var * n / (n - 1)``.
"""

from __future__ import annotations

import torch

from ..._backend import TRANSFORM
from .. import _transforms
from .reference import batch_var, ref_evo_b0, ref_evo_s0


def evo_b0(path, x, running_var, v, w, b, training, momentum, eps):
    """EvoNorm B0 of an (N, C, H, W) ``x`` on ``path``; in training with ``v`` and a ``running_var``,
    the running variance is updated in place first (its new value is not what this call reads)."""
    if training and v is not None and running_var is not None and x.numel() > 0:
        with torch.no_grad():
            n = x.numel() / x.shape[1]
            var = batch_var(x.detach())
            running_var.copy_(running_var * (1 - momentum) + var.to(running_var.dtype) * (momentum * (n / (n - 1))))
    return ref_evo_b0(x, v, w, b, running_var, eps, training, plain=path == TRANSFORM or _transforms.active())


def evo_s0(path, x, v, w, b, groups, eps):
    """EvoNorm S0 of an (N, C, H, W) ``x`` over ``groups`` groups of channels on ``path``."""
    return ref_evo_s0(x, v, w, b, groups, eps, plain=path == TRANSFORM or _transforms.active())
