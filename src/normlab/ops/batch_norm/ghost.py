"""Ghost BatchNorm (Hoffer et al., 2017): BatchNorm over virtual sub-batches, in one kernel call
(``docs/derivations/batch_norm_variants.md``).

A batch of ``N`` samples is cut, in order, into virtual batches of
``v = virtual_batch_size`` samples (the last one holds the ``N mod v`` left over,
if any), and each is normalised with its own mean and biased variance -- the
same as BatchNorm applied chunk by chunk.

One call instead of a loop: the ``k`` full virtual batches of ``x`` (``k * v``
samples, shape ``(k * v, C, *)``) become the ``k * C`` channels of one batch of ``v``
samples::

    (k * v, C, *) -> view (k, v, C, *) -> (v, k, C, *) -> (v, k * C, *)

(the middle step moves whole samples: one copy of ``x``, and one of ``y`` back), and
BatchNorm's kernel normalises each of the ``k * C`` channels with its own
statistics; ``weight`` and ``bias`` are repeated ``k`` times. A left-over virtual
batch is a second call. (A plain ``reshape(v, k * C, *)`` would cost no copy but
would put samples ``i, i + k, i + 2k, ...`` into one virtual batch, not ``v``
consecutive ones.)

Running statistics: the virtual batches update them one after the other, in
order, as chunk-by-chunk BatchNorm would -- ``k`` updates of weight ``momentum``
each (``num_batches_tracked`` grows by the number of virtual batches). The kernel
call returns every virtual batch's mean and unbiased variance (temporary
buffers, ``momentum = 1``), and the ``k`` updates are applied at once in their
closed form, in float64::

    running <- (1 - m)^k * running + sum_i m * (1 - m)^(k - 1 - i) * stat_i

and for ``momentum=None`` (the cumulative average over ``c`` batches seen so far)
``running <- (c * running + sum_i stat_i) / (c + k)``.
"""

from __future__ import annotations

import math

import torch


def split(n: int, v: int) -> tuple[int, int]:
    """``(k, rest)``: the number of full virtual batches of ``v`` in ``n`` samples, and the samples left."""
    return n // v, n % v


def to_channels(x: torch.Tensor, k: int) -> torch.Tensor:
    """``(k * v, C, *)`` -> ``(v, k * C, *)``: virtual batch ``i``'s channel ``c`` becomes channel ``i * C + c``."""
    v, c = x.shape[0] // k, x.shape[1]
    if k == 1:
        return x
    return x.reshape(k, v, *x.shape[1:]).transpose(0, 1).reshape(v, k * c, *x.shape[2:])


def from_channels(y: torch.Tensor, k: int, c: int) -> torch.Tensor:
    """The inverse of :func:`to_channels`."""
    if k == 1:
        return y
    v = y.shape[0]
    return y.reshape(v, k, c, *y.shape[2:]).transpose(0, 1).reshape(k * v, c, *y.shape[2:])


def stat_buffers(x: torch.Tensor, n_channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed (n_channels,) buffers for the kernel to write a call's batch statistics into."""
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_zeros(n_channels, dtype=dt), x.new_zeros(n_channels, dtype=dt)


@torch.no_grad()
def update_running(running_mean, running_var, means, variances, momentum, count=None) -> None:
    """Apply the updates of the virtual batches' ``means``/``variances`` (each (k, C): mean,
    unbiased variance) to the running statistics, in order, in float64, in place."""
    k = means.shape[0]
    m64, v64 = means.to(torch.float64), variances.to(torch.float64)
    if momentum is None:  # cumulative average: the c batches so far, then these k
        c = float(count)
        new_mean = (c * running_mean.to(torch.float64) + m64.sum(0)) / (c + k)
        new_var = (c * running_var.to(torch.float64) + v64.sum(0)) / (c + k)
    else:
        m = float(momentum)
        weights = torch.tensor([m * (1.0 - m) ** (k - 1 - i) for i in range(k)], dtype=torch.float64,
                               device=means.device).unsqueeze(1)  # (k, 1)
        keep = (1.0 - m) ** k
        new_mean = keep * running_mean.to(torch.float64) + (weights * m64).sum(0)
        new_var = keep * running_var.to(torch.float64) + (weights * v64).sum(0)
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)


def values_per_channel(n: int, x: torch.Tensor) -> int:
    return n * math.prod(x.shape[2:])
