"""Batch Renormalization modules (Ioffe, 2017): ``BatchRenorm1d`` / ``2d`` / ``3d``.

BatchNorm's parameters, buffers and ``state_dict`` keys (``weight``, ``bias``,
``running_mean``, ``running_var``, ``num_batches_tracked``), always with running
statistics: the training output is corrected towards them. The math is in
``normlab.functional.batch_renorm`` (``ops/batch_norm/renorm.py``).
"""

from __future__ import annotations

import numbers

import torch

from .. import functional as F
from ._base import _NormBase

__all__ = ["BatchRenorm1d", "BatchRenorm2d", "BatchRenorm3d"]


class _BatchRenorm(_NormBase):
    """Shared body of ``BatchRenorm1d/2d/3d``.

    ``r_max``, ``d_max``: the clipping limits of ``r`` (to ``[1 / r_max, r_max]``) and
    ``d`` (to ``[-d_max, d_max]``); the paper's final values, 3 and 5, by default.
    ``warmup_steps``: the limits move linearly from ``(1, 0)`` -- BatchNorm -- at step 0
    to ``(r_max, d_max)`` at step ``warmup_steps`` (the paper relaxes them over tens of
    thousands of steps; 0: the final limits from the first step). The step is
    ``num_batches_tracked``, counted per training batch and saved in the ``state_dict``.
    Evaluation normalises with the running statistics, as BatchNorm.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        r_max: float = 3.0,
        d_max: float = 5.0,
        warmup_steps: int = 0,
        device=None,
        dtype=None,
        *,
        bias: bool = True,
    ) -> None:
        name = type(self).__name__
        for arg, value in (("r_max", r_max), ("d_max", d_max)):
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise TypeError(f"{name}: expected {arg} to be a float, got {value!r}")
        if not 1 <= r_max < float("inf"):
            raise ValueError(f"{name}: expected r_max >= 1 (r is clipped to [1 / r_max, r_max]), got {r_max!r}")
        if not 0 <= d_max < float("inf"):
            raise ValueError(f"{name}: expected d_max >= 0 (d is clipped to [-d_max, d_max]), got {d_max!r}")
        if not isinstance(warmup_steps, numbers.Integral) or isinstance(warmup_steps, bool):
            raise TypeError(f"{name}: expected warmup_steps to be an int >= 0, got {warmup_steps!r}")
        if warmup_steps < 0:
            raise ValueError(f"{name}: expected warmup_steps to be an int >= 0, got {warmup_steps!r}")
        super().__init__(num_features, eps, momentum, affine, True, device, dtype, bias=bias)
        self.r_max = float(r_max)
        self.d_max = float(d_max)
        self.warmup_steps = int(warmup_steps)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        raise NotImplementedError

    def limits(self):
        """``(r_max, d_max)`` at the current step (floats; 0-dim tensors inside torch.compile)."""
        if self.warmup_steps == 0:
            return self.r_max, self.d_max
        step = self.num_batches_tracked
        if torch.compiler.is_compiling():
            t = (step.to(torch.float64) / self.warmup_steps).clamp(max=1.0)
        else:
            t = min(1.0, float(step) / self.warmup_steps)
        return 1.0 + (self.r_max - 1.0) * t, self.d_max * t

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        self._check_num_channels(input)
        count = self.num_batches_tracked
        factor = self._momentum_factor(count if self.training else None)  # as BatchNorm's
        r_max, d_max = self.limits() if self.training else (self.r_max, self.d_max)
        y = F.batch_renorm(input, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                           factor, self.eps, r_max, d_max)
        if self.training:
            count.add_(1)
        return y

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, r_max={self.r_max}, d_max={self.d_max}, "
                f"warmup_steps={self.warmup_steps}")


class BatchRenorm1d(_BatchRenorm):
    """Batch Renormalization (Ioffe, 2017) of an ``(N, C)`` or ``(N, C, L)`` input: BatchNorm whose training output is
    corrected towards the running statistics, ``y = ((x - mean_B) / sigma_B * r + d) * weight + bias``
    with ``r = clip(sigma_B / sigma, 1 / r_max, r_max)``, ``d = clip((mean_B - running_mean) / sigma,
    -d_max, d_max)``, ``sigma = sqrt(running_var + eps)``.

    No torch.nn twin: ``torch.nn.BatchNorm1d``'s arguments (without ``track_running_stats``: there are
    always running statistics), parameters, buffers and ``state_dict`` keys, plus ``r_max``,
    ``d_max`` (the clipping limits; the paper's 3 and 5 by default) and ``warmup_steps`` (the limits
    move linearly from ``(1, 0)`` -- plain BatchNorm -- to ``(r_max, d_max)`` over that many
    training batches, counted in ``num_batches_tracked``). Eval is BatchNorm's eval.

    Shapes: input ``(N, C)`` or ``(N, C, L)``, output the same; per-channel tensors ``(C,)``.

    Numerics: as BatchNorm (batch statistics in float32 for float16/bfloat16/float32 input,
    float64 for float64; biased variance to normalise, unbiased into ``running_var``; the
    same ``momentum`` rule); ``r`` and ``d`` are constants for the backward.

    >>> import torch, normlab
    >>> bn = normlab.nn.BatchRenorm1d(3, r_max=3.0, d_max=5.0)
    >>> bn(torch.randn(8, 3)).shape, int(bn.num_batches_tracked)
    (torch.Size([8, 3]), 1)
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 2 and input.dim() != 3:
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class BatchRenorm2d(_BatchRenorm):
    """Batch Renormalization (Ioffe, 2017) of an ``(N, C, H, W)`` input: BatchNorm whose training output is
    corrected towards the running statistics, ``y = ((x - mean_B) / sigma_B * r + d) * weight + bias``
    with ``r = clip(sigma_B / sigma, 1 / r_max, r_max)``, ``d = clip((mean_B - running_mean) / sigma,
    -d_max, d_max)``, ``sigma = sqrt(running_var + eps)``.

    No torch.nn twin: ``torch.nn.BatchNorm2d``'s arguments (without ``track_running_stats``: there are
    always running statistics), parameters, buffers and ``state_dict`` keys, plus ``r_max``,
    ``d_max`` (the clipping limits; the paper's 3 and 5 by default) and ``warmup_steps`` (the limits
    move linearly from ``(1, 0)`` -- plain BatchNorm -- to ``(r_max, d_max)`` over that many
    training batches, counted in ``num_batches_tracked``). Eval is BatchNorm's eval.

    Shapes: input ``(N, C, H, W)``, output the same; per-channel tensors ``(C,)``.

    Numerics: as BatchNorm (batch statistics in float32 for float16/bfloat16/float32 input,
    float64 for float64; biased variance to normalise, unbiased into ``running_var``; the
    same ``momentum`` rule); ``r`` and ``d`` are constants for the backward.

    >>> import torch, normlab
    >>> bn = normlab.nn.BatchRenorm2d(2, warmup_steps=100)
    >>> y = bn(torch.randn(4, 2, 3, 3))
    >>> bn.limits()  # (r_max, d_max) after 1 of 100 warm-up steps
    (1.02, 0.05)
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


class BatchRenorm3d(_BatchRenorm):
    """Batch Renormalization (Ioffe, 2017) of an ``(N, C, D, H, W)`` input: BatchNorm whose training output is
    corrected towards the running statistics, ``y = ((x - mean_B) / sigma_B * r + d) * weight + bias``
    with ``r = clip(sigma_B / sigma, 1 / r_max, r_max)``, ``d = clip((mean_B - running_mean) / sigma,
    -d_max, d_max)``, ``sigma = sqrt(running_var + eps)``.

    No torch.nn twin: ``torch.nn.BatchNorm3d``'s arguments (without ``track_running_stats``: there are
    always running statistics), parameters, buffers and ``state_dict`` keys, plus ``r_max``,
    ``d_max`` (the clipping limits; the paper's 3 and 5 by default) and ``warmup_steps`` (the limits
    move linearly from ``(1, 0)`` -- plain BatchNorm -- to ``(r_max, d_max)`` over that many
    training batches, counted in ``num_batches_tracked``). Eval is BatchNorm's eval.

    Shapes: input ``(N, C, D, H, W)``, output the same; per-channel tensors ``(C,)``.

    Numerics: as BatchNorm (batch statistics in float32 for float16/bfloat16/float32 input,
    float64 for float64; biased variance to normalise, unbiased into ``running_var``; the
    same ``momentum`` rule); ``r`` and ``d`` are constants for the backward.

    >>> import torch, normlab
    >>> bn = normlab.nn.BatchRenorm3d(2, r_max=1.0, d_max=0.0)  # r = 1, d = 0: BatchNorm exactly
    >>> x = torch.randn(2, 2, 3, 3, 3)
    >>> torch.allclose(bn(x), torch.nn.BatchNorm3d(2)(x), atol=1e-5)
    True
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 5:
            raise ValueError(f"expected 5D input (got {input.dim()}D input)")
