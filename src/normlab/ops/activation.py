"""The activations a norm+act op applies to the norm's output: their ids, the math in torch ops
(the ``"ref"`` path and the oracle) and each one's derivative, written out by hand.

An activation is an id (the kernels' ``int``) and one float parameter (LeakyReLU's
``negative_slope``; unused by the others). ``act_forward`` is what torch computes
(``torch.nn.functional``'s function of the same name, so the ``"ref"`` path gives torch's bits);
``act_derivative`` is ``d act(z) / dz`` as the backward uses it (docs/derivations/norm_act.md):

==============  ==============================================  ==========================================
name            act(z)                                          act'(z)
==============  ==============================================  ==========================================
``identity``    z                                               1
``relu``        max(z, 0)                                       1 if z > 0 else 0 (torch: 0 at z = 0)
``leaky_relu``  z if z > 0 else slope * z                       1 if z > 0 else slope
``silu``        z * s, s = 1 / (1 + exp(-z))                    s * (1 + z * (1 - s))
``gelu``        z * Phi(z), Phi(z) = (1 + erf(z / sqrt 2)) / 2  Phi(z) + z * phi(z), phi the normal density
``gelu_tanh``   z / 2 * (1 + tanh(u)), u = k (z + 0.044715 z^3) (1 + t) / 2 + z / 2 * (1 - t^2) * du/dz
                k = sqrt(2 / pi)
``hardswish``   z * clamp(z + 3, 0, 6) / 6                      0 (z < -3), z / 3 + 1/2 (-3 <= z <= 3), 1
``tanh``        tanh(z)                                         1 - tanh(z)^2
==============  ==============================================  ==========================================
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

IDENTITY, RELU, LEAKY_RELU, SILU, GELU, GELU_TANH, HARDSWISH, TANH = range(8)
NAMES = ("identity", "relu", "leaky_relu", "silu", "gelu", "gelu_tanh", "hardswish", "tanh")
ID = {name: i for i, name in enumerate(NAMES)}


def act_forward(z: torch.Tensor, act: int, param: float = 0.01) -> torch.Tensor:
    """``act(z)`` as torch computes it (differentiable torch ops)."""
    if act == IDENTITY:
        return z
    if act == RELU:
        return F.relu(z)
    if act == LEAKY_RELU:
        return F.leaky_relu(z, param)
    if act == SILU:
        return F.silu(z)
    if act == GELU:
        return F.gelu(z)
    if act == GELU_TANH:
        return F.gelu(z, approximate="tanh")
    if act == HARDSWISH:
        return F.hardswish(z)
    if act == TANH:
        return torch.tanh(z)
    raise ValueError(f"normlab: unknown activation id {act!r}; expected 0..{len(NAMES) - 1} ({', '.join(NAMES)})")


def act_derivative(z: torch.Tensor, act: int, param: float = 0.01) -> torch.Tensor:
    """``act'(z)``, written out (torch ops, differentiable; the table in the module docstring)."""
    one = torch.ones_like(z)
    if act == IDENTITY:
        return one
    if act == RELU:
        return (z > 0).to(z.dtype)
    if act == LEAKY_RELU:
        return torch.where(z > 0, one, one * param)
    if act == SILU:
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    if act == GELU:
        cdf = 0.5 * (1 + torch.erf(z * (1 / math.sqrt(2))))
        pdf = torch.exp(-0.5 * z * z) * (1 / math.sqrt(2 * math.pi))
        return cdf + z * pdf
    if act == GELU_TANH:
        k = math.sqrt(2 / math.pi)
        t = torch.tanh(k * (z + 0.044715 * z * z * z))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z)
    if act == HARDSWISH:
        return torch.where(z < -3, 0 * one, torch.where(z <= 3, z / 3 + 0.5, one))
    if act == TANH:
        t = torch.tanh(z)
        return 1 - t * t
    raise ValueError(f"normlab: unknown activation id {act!r}; expected 0..{len(NAMES) - 1} ({', '.join(NAMES)})")
