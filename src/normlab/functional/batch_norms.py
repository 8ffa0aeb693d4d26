"""BatchNorm and its variants as functions: BatchNorm, BatchRenorm, GhostBatchNorm, and the
entry of SyncBatchNorm's synchronised step (``normlab.functional``; the math:
``normlab.ops.batch_norm``)."""

from __future__ import annotations

import numbers

import torch

from .._backend import EAGER, route
from .._checks import check_eps, check_input, cpu_params_fit, plain_eps
from ..ops import extension as _extension
from ..ops.batch_norm import op as _op
from ..ops.batch_norm import ghost as _ghost
from ..ops.batch_norm import renorm as _renorm
from ..ops.layouts import output_memory_format
from .checks import (check_channels_input, check_limit, check_momentum, check_per_channel,
                     check_running_not_recorded, check_running_pair, check_virtual_batch_size, momentum_value,
                     plain_momentum, values_per_channel)

_C = _extension.load()
# BatchNorm's C++ entry (a module global: one lookup a call)
_batch_norm_fast = _C.batch_norm_fast if _C is not None else None
# A BatchNorm module's whole eager forward in one C++ call (normlab.nn.BatchNorm*d's fast path)
batch_norm_module = _C.batch_norm_module if _C is not None else None


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
    path = route(input, "batch_norm")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        try:
            y = _batch_norm_fast(input, running_mean, running_var, weight, bias, training, momentum, eps)
        except TypeError:  # an argument of a type it does not take: the checks below say what
            y = None
        if y is not None:
            return y
    fn = "batch_norm"
    check_running_not_recorded(fn, running_mean, running_var)
    if training and isinstance(eps, numbers.Real) and not isinstance(eps, bool) and eps <= 0:
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
        and plain_momentum(momentum)
        and eps is not None
        and plain_eps(eps)
        and (not training or input.numel() > input.shape[1])
    ):
        check_input(fn, input)
        check_channels_input(fn, input)
        if not training and input.numel() > 0 and (running_mean is None or running_var is None):
            missing = "running_mean" if running_mean is None else "running_var"  # torch's order and class
            raise RuntimeError(
                f"{fn}: {missing} must be defined in evaluation mode (training=False); "
                f"pass both running statistics, or training=True to normalise with the batch's own statistics"
            )
        check_running_pair(fn, running_mean, running_var)
        check_per_channel(fn, input, running_mean=running_mean, running_var=running_var,
                           weight=weight, bias=bias)
        check_momentum(fn, momentum)
        check_eps(fn, eps, none_ok=False)
        if training and values_per_channel(input) == 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {input.size()}"
            )
    return _op.batch_norm(
        path, input, running_mean, running_var, weight, bias, bool(training), momentum_value(momentum), float(eps)
    )


def batch_renorm(
    input: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    r_max: float = 3.0,
    d_max: float = 5.0,
) -> torch.Tensor:
    """Batch Renormalization (Ioffe, 2017): BatchNorm whose training output is corrected towards
    the running statistics, ``y = ((x - mean_B) / sigma_B * r + d) * weight + bias`` with::

        r = clip(sigma_B / sigma, 1 / r_max, r_max),  d = clip((mean_B - mean) / sigma, -d_max, d_max)

    ``sigma = sqrt(running_var + eps)``, ``mean = running_mean`` as they were before this batch.

    No torch twin: ``r_max=1, d_max=0`` is ``torch.nn.functional.batch_norm`` exactly, and
    ``training=False`` is BatchNorm's eval. The running statistics are required.

    Shapes: input ``(N, C, *)``, output the same; ``running_mean``, ``running_var``,
    ``weight``, ``bias``: ``(C,)``.

    Numerics: as :func:`batch_norm` (statistics in float32 for float16/bfloat16/float32 input,
    float64 for float64; biased variance to normalise, unbiased into ``running_var`` with
    weight ``momentum``); ``r`` and ``d`` are constants for the backward.

    >>> import torch, normlab.functional as NF
    >>> x, rm, rv = torch.randn(8, 3), torch.zeros(3), torch.ones(3)
    >>> y = NF.batch_renorm(x, rm, rv, training=True, r_max=1.0, d_max=0.0)
    >>> torch.allclose(y, torch.nn.functional.batch_norm(x, None, None, training=True), atol=1e-6)
    True
    """
    fn = "batch_renorm"
    check_input(fn, input)
    check_channels_input(fn, input)
    if running_mean is None or running_var is None:
        raise ValueError(
            f"{fn}: expected running_mean and running_var (r and d compare the batch with them), got "
            f"{'None' if running_mean is None else 'a tensor'} and {'None' if running_var is None else 'a tensor'}; "
            f"without running statistics, use batch_norm"
        )
    check_per_channel(fn, input, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
    check_limit(fn, "r_max", r_max, 1.0, "r is clipped to [1 / r_max, r_max] (r_max=1: no correction of the scale)")
    check_limit(fn, "d_max", d_max, 0.0, "d is clipped to [-d_max, d_max] (d_max=0: no correction of the shift)")
    if not training:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    check_momentum(fn, momentum)
    check_eps(fn, eps, none_ok=False)
    if input.numel() == input.shape[1]:  # one value per channel: BatchNorm's own error, before any work
        return batch_norm(input, running_mean, running_var, weight, bias, True, momentum, eps)
    r, d = _renorm.renorm_factors(input, running_mean, running_var, float(eps), r_max, d_max)
    w_r, b_r = _renorm.renormed_affine(weight, bias, r, d)
    return batch_norm(input, running_mean, running_var, w_r, b_r, True, momentum, eps)


def ghost_batch_norm(
    input: torch.Tensor,
    virtual_batch_size: int,
    running_mean: torch.Tensor | None = None,
    running_var: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = True,
    momentum: float | None = 0.1,
    eps: float = 1e-5,
    num_batches_tracked: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Ghost BatchNorm: in training, ``y = (x - mean_v) / sqrt(var_v + eps) * weight + bias`` with
    the statistics of each virtual batch of ``virtual_batch_size`` consecutive samples (the
    last one holds what is left, if fewer).

    No torch twin: exactly ``torch.nn.functional.batch_norm`` applied to
    ``x.split(virtual_batch_size)`` one chunk after the other, in one kernel call;
    ``training=False`` is BatchNorm's eval.

    Shapes: input ``(N, C, *)``, output the same; per-channel tensors ``(C,)`` or None.

    Numerics: as :func:`batch_norm`, per virtual batch. Running statistics (when given) take
    one update per virtual batch, in order, with weight ``momentum`` (unbiased variance);
    ``momentum=None`` is the cumulative average, which needs ``num_batches_tracked`` (the
    batches counted before this call; the caller adds ``ceil(N / virtual_batch_size)``).

    >>> import torch, normlab.functional as NF
    >>> x = torch.randn(6, 3)
    >>> chunks = [torch.nn.functional.batch_norm(c, None, None, training=True) for c in x.split(4)]
    >>> torch.allclose(NF.ghost_batch_norm(x, 4), torch.cat(chunks), atol=1e-6)
    True
    """
    fn = "ghost_batch_norm"
    check_input(fn, input)
    check_channels_input(fn, input)
    check_virtual_batch_size(fn, virtual_batch_size)
    check_running_pair(fn, running_mean, running_var)
    check_per_channel(fn, input, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
    check_eps(fn, eps, none_ok=False)
    if not training:
        return batch_norm(input, running_mean, running_var, weight, bias, False, 0.0, eps)
    tracking = running_mean is not None
    if momentum is None and tracking and num_batches_tracked is None:
        raise ValueError(f"{fn}: momentum=None (the cumulative average) needs num_batches_tracked, the number "
                         f"of batches the running statistics already average; pass it, or a float momentum")
    if momentum is not None:
        check_momentum(fn, momentum)
    n, c, v = input.shape[0], input.shape[1], int(virtual_batch_size)
    k, rest = _ghost.split(n, v)
    for size in ([v] if k else []) + ([rest] if rest else []):
        if _ghost.values_per_channel(size, input) == 1:
            raise ValueError(
                f"{fn}: expected more than 1 value per channel in every virtual batch, got a virtual batch of "
                f"{size} sample(s) of shape {list(input.shape[1:])} (input {list(input.shape)}, "
                f"virtual_batch_size={v}); use a larger virtual_batch_size or a batch size that leaves no "
                f"single sample over"
            )
    ys, means, variances = [], [], []
    for count, size, part in ((k, v, input[: k * v]), (1, rest, input[k * v:])):
        if count == 0 or size == 0:
            continue
        stats = _ghost.stat_buffers(input, count * c) if tracking else (None, None)
        w = None if weight is None else weight.repeat(count)
        b = None if bias is None else bias.repeat(count)
        y = batch_norm(_ghost.to_channels(part, count), *stats, w, b, True, 1.0, eps)
        ys.append(_ghost.from_channels(y, count, c))
        if tracking:  # momentum 1: the buffers now hold this call's batch mean and unbiased variance
            means.append(stats[0].view(count, c))
            variances.append(stats[1].view(count, c))
    if tracking:
        _ghost.update_running(running_mean, running_var, torch.cat(means), torch.cat(variances), momentum,
                              num_batches_tracked)
    y = ys[0] if len(ys) == 1 else torch.cat(ys)
    fmt = output_memory_format(input)
    return y if fmt == torch.contiguous_format or y.is_contiguous(memory_format=fmt) else y.contiguous(
        memory_format=fmt)
