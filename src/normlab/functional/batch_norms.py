"""BatchNorm and its variants as functions: BatchNorm, BatchRenorm, GhostBatchNorm, and the
entry of SyncBatchNorm's synchronised step (``normlab.functional``; the math:
``normlab.ops.batch_norm``).

``batch_norm`` judges the arguments and runs the path ``normlab._backend.route`` decided
(``REF``: the reference math; the others: the C++ ops ``torch.ops.normlab.batch_norm_*``).

The ops it calls (registered in ``csrc/batch_norm.h``):

- ``batch_norm_fwd(x, weight, bias, eps) -> (y, stats)``: training; stats (3, C) float64 rows
  batch mean, biased var, rstd (not differentiable);
- ``batch_norm_eval_fwd(x, weight, bias, running_mean, running_var, eps) -> y``;
- ``batch_norm_bwd(dy, x, weight, stats, training, need_dx, need_wb) -> (dx, dw, db)``;
- ``batch_norm_stats(x) -> (2, C)`` (SyncBatchNorm's per-rank statistics);
- ``batch_norm_update_stats(running_mean!, running_var!, stats, n, momentum)``: the running
  statistics blended in place in float64 with the unbiased variance ``var * n / (n - 1)``,
  rounded once to each buffer (``momentum`` a 0-dim tensor, read when the op runs:
  ``momentum=None``'s cumulative factor depends on a buffer a traced graph must not bake in).

The paths: ``EAGER`` -> ``normlab._C.batch_norm``, one C++ call through the ops' cached
dispatcher handles (autograd included, running statistics updated and their version counters
moved); ``COMPILE`` -> the ops through ``torch.ops``; ``TRANSFORM`` (torch.func transforms and
forward-mode AD) -> the ``BatchNorm`` transform Function (a Python Function:
a C++ autograd Function refuses functorch transforms), whose forward and backward call the ops.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from .._backend import COMPILE, EAGER, REF, TRANSFORM, route
from .._checks import check_eps, check_input, cpu_params_fit, plain_eps
from ..ops import _register, _transforms
from ..ops import extension as _extension
from ..ops.batch_norm import ghost as _ghost
from ..ops.batch_norm import renorm as _renorm
from ..ops.batch_norm.reference import (_stat_shape, batch_norm_eval_backward_ref, batch_norm_jvp, batch_norm_stats,
                                        batch_norm_train_backward_ref, check_batched_buffers, ref_batch_norm)
from ..ops.layouts import canonical, output_memory_format
from ..ops.numerics import acc_dtype
from .checks import (check_channels_input, check_limit, check_momentum, check_per_channel, check_running_not_recorded,
                     check_running_pair, check_virtual_batch_size, momentum_value, plain_momentum, values_per_channel)

_C = _extension.load()
# BatchNorm's C++ entry (a module global: one lookup a call)
_batch_norm_fast = _C.batch_norm_fast if _C is not None else None


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
    return _batch_norm_path(
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


# --------------------------------------------------------------------------
# The C++ ops (csrc/batch_norm.h) and their Function under transforms
# --------------------------------------------------------------------------

_ops = torch.ops.normlab


# the eager entry, normlab._C.batch_norm (this module's "cpu" function is registered only with it)
_eager = _C.batch_norm if _C is not None else None


def _running_stats(running_mean, running_var, eps):
    """(3, C) float64: the running statistics as the evaluation kernel reads them, and rstd."""
    m, v = running_mean.detach().double(), running_var.detach().double()
    return torch.stack([m, v, torch.reciprocal(torch.sqrt(v + eps))])


def _forward(x, w, b, running_mean, running_var, training, eps):
    """``(y, stats)`` from the forward op: stats (3, C) float64 rows mean, var, rstd (the batch's
    in training, the running ones in evaluation)."""
    if training:
        return _ops.batch_norm_fwd(x, w, b, eps)
    return _ops.batch_norm_eval_fwd(x, w, b, running_mean, running_var, eps), _running_stats(
        running_mean, running_var, eps)


# --------------------------------------------------------------------------
# Under torch.func transforms and forward-mode AD (ops/_transforms.py)
# --------------------------------------------------------------------------


def _grads(ctx, dy, x, w, stats, need_dx, need_dw, need_db):
    """``(dx, dw, db)`` of BatchNorm (``ctx.training``: through the batch statistics too)."""
    need_dw = need_dw and w is not None
    need_db = need_db and ctx.b_dtype is not None
    if dy is None or not (need_dx or need_dw or need_db):
        return None, None, None
    if _transforms.differentiable_backward():  # create_graph=True: the differentiable reference backward
        acc = acc_dtype(x.dtype)
        if ctx.training:  # the statistics as functions of x
            mean, _, rstd = batch_norm_stats(x.to(acc), ctx.eps)
            dx, dw, db = batch_norm_train_backward_ref(dy, x, w, mean, rstd, need_dx, need_dw, need_db)
        else:
            shape = _stat_shape(x)
            mean, rstd = stats[0].to(acc).reshape(shape), stats[2].to(acc).reshape(shape)
            dx, dw, db = batch_norm_eval_backward_ref(dy, x, w, mean, rstd, need_dx, need_dw, need_db)
        return dx, dw, (db.to(ctx.b_dtype) if db is not None else None)
    dx, dw, db = _ops.batch_norm_bwd(dy, x, w, stats, ctx.training, need_dx, need_dw or need_db)
    return (
        dx if need_dx else None,
        dw.to(w.dtype) if need_dw else None,
        db.to(ctx.b_dtype) if need_db else None,
    )


def _transform_forward(x, w, b, running_mean, running_var, training, eps):
    return _forward(canonical(x), w, b, running_mean, running_var, training, eps)


def _transform_setup_context(ctx, inputs, output):
    x, w, b, _, _, training, eps = inputs
    stats = output[1]
    ctx.save_for_backward(x, w, stats)
    ctx.save_for_forward(x, w, stats)
    ctx.eps = eps
    ctx.training = training
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(stats)


def _transform_backward(ctx, dy, _dstats):
    x, w, stats = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = _grads(ctx, dy, canonical(x), w, stats, need[0], need[1], need[2])
    return dx, dw, db, None, None, None, None


def _transform_jvp(ctx, xt, wt, bt, _rmt, _rvt, _training_t, _eps_t):
    x, w, stats = ctx.saved_tensors
    shape = _stat_shape(x)
    acc = acc_dtype(x.dtype)
    mean, rstd = stats[0].to(acc).reshape(shape), stats[2].to(acc).reshape(shape)
    return batch_norm_jvp(x, w, mean, rstd, xt, wt, bt, ctx.training), None


def _transform_vmap(info, in_dims, x, w, b, running_mean, running_var, training, eps):
    """Each batch member's channels become channels of their own: (B, N, C, *) is normalised
    as (N, B * C, *), so every member gets its own statistics from one kernel call."""
    n = info.batch_size
    xb = _transforms.front(x, in_dims[0], n)  # (B, N, C, *spatial)
    c = xb.shape[2]
    x2 = xb.movedim(0, 1).reshape(xb.shape[1], n * c, *xb.shape[3:])  # (N, B*C, *spatial)

    def channels(t, d):  # (C,) or batched (B, C) -> (B*C,)
        if t is None:
            return None
        return t.repeat(n) if d is None else _transforms.front(t, d, n).reshape(n * c)

    y, stats = _Transform.apply(
        x2, channels(w, in_dims[1]), channels(b, in_dims[2]),
        channels(running_mean, in_dims[3]), channels(running_var, in_dims[4]), training, eps,
    )
    return (y.reshape(xb.shape[1], n, c, *xb.shape[3:]), stats.view(3, n, c)), (1, 1)


_Transform = _register.transform(
    "BatchNorm", forward=_transform_forward, setup_context=_transform_setup_context,
    backward=_transform_backward, jvp=_transform_jvp, vmap=_transform_vmap,
    doc="BatchNorm on the C++ ops: ``apply(x, w, b, running_mean, running_var, training, eps)`` -> "
        "``(y, stats)``, ``stats`` the (3, C) float64 rows mean, biased var, rstd (not differentiable). "
        "The running-statistic update is the caller's.",
)


def _update_running_ops(running_mean, running_var, x, stats, n, momentum):
    """The running-statistics update in torch ops (under transforms: the buffers may be batched),
    the same float64 blend, rounded once to each buffer. A batched input with unbatched buffers
    raises torch's error."""
    check_batched_buffers(x, running_mean, running_var)
    keep = 1.0 - momentum
    with torch.no_grad():
        running_mean.copy_(keep * running_mean.to(torch.float64) + momentum * stats[0])
        running_var.copy_(keep * running_var.to(torch.float64) + momentum * (stats[1] * (n / (n - 1.0))))


# --------------------------------------------------------------------------
# The entries of each path (the arguments judged by the public functions above)
# --------------------------------------------------------------------------


def _batch_norm_path(path, x, running_mean, running_var, w, b, training, momentum, eps):
    """BatchNorm of an ``(N, C, *spatial)`` ``x`` on ``path`` (``REF``: ``reference.ref_batch_norm``;
    the others: the C++ ops).

    ``training=True``: normalise with the batch's statistics and, when
    ``running_mean``/``running_var`` are given, update them in place with
    weight ``momentum`` (``running = (1 - momentum) * running + momentum *
    stat``, the *unbiased* variance ``var * n / (n - 1)`` for ``running_var``,
    blended in float64 and rounded once to each buffer's dtype).
    ``training=False``: normalise with the running statistics, left untouched.
    An empty batch takes the reference math.
    """
    if path == REF or x.numel() == 0:
        return ref_batch_norm(x, running_mean, running_var, w, b, training, momentum, eps)
    if path == TRANSFORM:
        update = training and running_mean is not None
        rm, rv = (None, None) if training else (running_mean, running_var)
        y, stats = _Transform.apply(x, w, b, rm, rv, training, eps)
        if update:
            _update_running_ops(running_mean, running_var, x, stats, x.numel() // x.shape[1], float(momentum))
        return y
    if path == COMPILE:
        if not training:
            return _ops.batch_norm_eval_fwd(x, w, b, running_mean, running_var, eps)
        y, stats = _ops.batch_norm_fwd(x, w, b, eps)
        if running_mean is not None:
            if not isinstance(momentum, Tensor):
                momentum = torch.tensor(momentum, dtype=torch.float64)
            _ops.batch_norm_update_stats(running_mean, running_var, stats, x.numel() // x.shape[1], momentum)
        return y
    if type(momentum) is not float:
        momentum = float(momentum)
    return _eager(x, w, b, running_mean, running_var, training, momentum, eps)
