"""BatchNorm: the family's entry, running the path ``normlab._backend.route`` decided (``REF``: the
reference math; the others: the C++ ops ``torch.ops.normlab.batch_norm_*``).

The ops it calls (registered in ``csrc/batch_norm.cpp``):

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
forward-mode AD) -> :class:`BatchNormTransform` (a Python Function:
a C++ autograd Function refuses functorch transforms), whose forward and backward call the ops.
"""

import torch
from torch import Tensor

from ..._backend import COMPILE, REF, TRANSFORM
from .. import _register, _transforms, extension
from ..layouts import output_memory_format
from ..numerics import acc_dtype
from .reference import (
    _stat_shape,
    batch_norm_eval_backward_ref,
    batch_norm_jvp,
    batch_norm_stats,
    batch_norm_train_backward_ref,
    check_batched_buffers,
    ref_batch_norm,
)

_ops = torch.ops.normlab


def _canonical(x: Tensor) -> Tensor:
    """``x`` in the memory format of torch's output for it (a copy only if it is not already)."""
    if x.is_contiguous():
        return x
    return x.contiguous(memory_format=output_memory_format(x))


_C = extension.load()
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
    return _forward(_canonical(x), w, b, running_mean, running_var, training, eps)


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
    dx, dw, db = _grads(ctx, dy, _canonical(x), w, stats, need[0], need[1], need[2])
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
# Entry (called by normlab.functional after its argument judgement)
# --------------------------------------------------------------------------


def batch_norm(path, x, running_mean, running_var, w, b, training, momentum, eps):
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


def update_running(running_mean, running_var, stats, n, momentum):
    """Blend ``stats`` ((2 or 3, C) float64 contiguous: mean, biased var) into the running
    statistics in place, as the training forward does (eager; version counters moved)."""
    extension.load().batch_norm_update(running_mean, running_var, stats, int(n), float(momentum))
