"""BatchNorm on the ``"cpu"`` kernels: what is this family's own, handed to ``ops/_register``.

Layering (kernel -> launcher -> the op's forms -> entry point), as in ``ops/layer_norm``:

- ``kernels.py``: the Numba kernels, on a 2-D view of the tensor: rows
  ``(M, C)`` or planes ``(N, C * S)`` (see its docstring).
- ``launch.py``: the chunk geometry and the launchers ``_forward`` /
  ``_backward``: pick the view, allocate outputs in torch's memory format, pass
  bfloat16/float16 as their bits, run the kernel with torch's thread count;
  ``_update_running``.
- declared to ``ops/_register``: the custom ops ``normlab::batch_norm_train_fwd``
  and ``normlab::batch_norm_eval_fwd`` (differentiable), ``normlab::batch_norm_bwd``
  (not differentiable itself) and ``normlab::batch_norm_update_stats`` (mutates
  the running statistics in place; ``torch.library`` allows no autograd formula
  on a mutating op, so the update is its own op, fed the forward's
  non-differentiable statistics), each with its fake, so
  ``torch.compile(fullgraph=True)`` traces them as single nodes and
  functionalises the update; the eager twin ``BatchNormEager`` and the
  transform Function ``BatchNormTransform`` (vmap: the batch members' channels
  are more channels).
- entry point :func:`batch_norm`: the backend table's ``"cpu"`` function (the
  ``"ref"`` one is ``reference.ref_batch_norm``); ``_register.route`` picks the
  form that runs.

Saved for the backward: the input (in its canonical layout), ``w``, and
``stats``, the forward's ``(3, C)`` float64 statistics (rows mean, biased var,
rstd; the float64 mean is what lets the kernels split it into ``hi + lo``).
Under ``create_graph=True`` the backward runs the reference's differentiable
backward instead (training: statistics recomputed from ``x``), so double
backward works for ``"cpu"`` too.

Running statistics are written through their addresses; an eager update then
moves their version counters once (``_register.written``), as an in-place
torch op (and the reference path's ``copy_``) does.

(No ``from __future__ import annotations`` here: ``torch.library`` reads the
type hints of the custom ops to build their schemas.)
"""

from typing import Optional

import torch
from torch import Tensor

from .. import _register, _transforms
from .._common import acc_dtype
from .launch import _backward, _backward_arrays, _canonical, _forward, _to, _update_running
from .reference import (
    _stat_shape,
    batch_norm_eval_backward_ref,
    batch_norm_stats,
    check_batched_buffers,
    ref_batch_norm,
    batch_norm_jvp,
    batch_norm_train_backward_ref,
)

# --------------------------------------------------------------------------
# Custom ops
# --------------------------------------------------------------------------


def _batch_norm_train_fwd(
    x: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor]:
    """Training-mode BatchNorm of a canonical ``x``: ``(y, stats)``, stats (3, C) float64 mean, biased var, rstd."""
    y, sn = _forward(x, w, b, None, None, True, eps)
    return y, torch.from_numpy(sn)


def _batch_norm_train_fwd_fake(x, w, b, eps):
    return torch.empty_like(x), x.new_empty((3, x.shape[1]), dtype=torch.float64)


def _batch_norm_eval_fwd(
    x: Tensor, running_mean: Tensor, running_var: Tensor, w: Optional[Tensor], b: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor]:
    """Evaluation-mode BatchNorm of a canonical ``x``: ``(y, stats)``, stats (3, C) float64 (the running ones, rstd)."""
    y, sn = _forward(x, w, b, running_mean, running_var, False, eps)
    return y, torch.from_numpy(sn)


def _batch_norm_eval_fwd_fake(x, running_mean, running_var, w, b, eps):
    return torch.empty_like(x), x.new_empty((3, x.shape[1]), dtype=torch.float64)


def _batch_norm_update_stats(
    running_mean: Tensor, running_var: Tensor, stats: Tensor, n: int, momentum: Tensor
) -> None:
    """Blend the batch statistics (``stats`` rows 0, 1: mean, biased var) into the running ones, in place.

    ``momentum`` is a 0-dim float64 tensor, read when the op runs: ``momentum=None``'s
    cumulative factor ``1 / (num_batches_tracked + 1)`` depends on a buffer's value, which a
    traced graph must not bake in.
    """
    _update_running(running_mean, running_var, stats.numpy(), n, float(momentum))


def _batch_norm_update_stats_fake(running_mean, running_var, stats, n, momentum):
    return None


def _batch_norm_bwd(
    dy: Tensor, x: Tensor, w: Optional[Tensor], stats: Tensor, training: bool, need_dx: bool, need_wb: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """BatchNorm gradients ``(dx, dw, db)``; dx empty unless ``need_dx``; dw/db float64, empty unless computed."""
    return _backward(dy, x, w, stats, training, need_dx, need_wb)


def _batch_norm_bwd_fake(dy, x, w, stats, training, need_dx, need_wb):
    c = x.shape[1] if (training or need_wb) else 0
    dx = torch.empty_like(x) if need_dx else x.new_empty((0,))
    return dx, x.new_empty((c,), dtype=torch.float64), x.new_empty((c,), dtype=torch.float64)


# --------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------


def _grads(ctx, dy, x, w, stats, need_dx, need_dw, need_db, eager=False):
    """``(dx, dw, db)`` of BatchNorm (``ctx.training``: through the batch statistics too).

    ``eager``: call the launcher directly instead of the backward custom op.
    """
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
            if not isinstance(stats, torch.Tensor):  # the eager node's array
                stats = torch.from_numpy(stats)
            mean, rstd = stats[0].to(acc).reshape(shape), stats[2].to(acc).reshape(shape)
            dx, dw, db = batch_norm_eval_backward_ref(dy, x, w, mean, rstd, need_dx, need_dw, need_db)
        return dx, dw, (db.to(ctx.b_dtype) if db is not None else None)
    if eager:
        dx, dw, db = _backward_arrays(dy, x, w, stats, ctx.training, need_dx, need_dw or need_db)
        return (
            dx if need_dx else None,
            _to(dw, w.dtype) if need_dw else None,
            _to(db, ctx.b_dtype) if need_db else None,
        )
    else:
        dx, dw, db = batch_norm_bwd(dy, x, w, stats, ctx.training, need_dx, need_dw or need_db)
    return (
        dx if need_dx else None,
        dw.to(w.dtype) if need_dw else None,
        db.to(ctx.b_dtype) if need_db else None,
    )


def _setup(ctx, x, w, b, eps, stats, training):
    ctx.save_for_backward(x, w, stats)
    ctx.eps = eps
    ctx.training = training
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(stats)


def _train_setup(ctx, inputs, output):
    x, w, b, eps = inputs
    _setup(ctx, x, w, b, eps, output[1], True)


def _train_backward(ctx, dy, _dstats):
    x, w, stats = ctx.saved_tensors
    dx, dw, db = _grads(ctx, dy, x, w, stats, *ctx.needs_input_grad[:3])
    return dx, dw, db, None


def _eval_setup(ctx, inputs, output):
    x, _, _, w, b, eps = inputs
    _setup(ctx, x, w, b, eps, output[1], False)


def _eval_backward(ctx, dy, _dstats):
    x, w, stats = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = _grads(ctx, dy, x, w, stats, need[0], need[3], need[4])
    return dx, None, None, dw, db, None




batch_norm_train_fwd = _register.custom_op(
    "batch_norm_train_fwd", _batch_norm_train_fwd, fake=_batch_norm_train_fwd_fake,
    backward=_train_backward, setup_context=_train_setup,
)
batch_norm_eval_fwd = _register.custom_op(
    "batch_norm_eval_fwd", _batch_norm_eval_fwd, fake=_batch_norm_eval_fwd_fake,
    backward=_eval_backward, setup_context=_eval_setup,
)
batch_norm_update_stats = _register.custom_op(
    "batch_norm_update_stats", _batch_norm_update_stats, fake=_batch_norm_update_stats_fake,
    mutates_args=("running_mean", "running_var"),
)
batch_norm_bwd = _register.custom_op("batch_norm_bwd", _batch_norm_bwd, fake=_batch_norm_bwd_fake)


# --------------------------------------------------------------------------
# The eager twin: the launchers and the backward as one Function. Returns y;
# the (3, C) float64 statistics stay a numpy array on the node (wrapping them
# as a tensor costs more than a small kernel) and are handed to the caller in
# ``out`` (a one-element list): in training they feed the running-statistic update.
# --------------------------------------------------------------------------


def _eager_forward(ctx, x, w, b, running_mean, running_var, training, eps, out):
    y, sn = _forward(x, w, b, running_mean, running_var, training, eps)
    ctx.save_for_backward(x, w)
    ctx.stats = out[0] = sn
    ctx.eps = eps
    ctx.training = training
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.set_materialize_grads(False)
    return y


def _eager_backward(ctx, dy):
    x, w = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = _grads(ctx, dy, x, w, ctx.stats, need[0], need[1], need[2], eager=True)
    return dx, dw, db, None, None, None, None, None


_eager_apply = _register.eager(
    "BatchNorm", _eager_forward, _eager_backward,
    "BatchNorm on the kernels: ``apply(x, w, b, running_mean, running_var, training, eps, out)`` -> ``y``.",
)


# --------------------------------------------------------------------------
# Under torch.func transforms and forward-mode AD (ops/_transforms.py)
# --------------------------------------------------------------------------


def _transform_forward(x, w, b, running_mean, running_var, training, eps):
    y, sn = _forward(_canonical(x), w, b, running_mean, running_var, training, eps)
    return y, torch.from_numpy(sn)


def _transform_setup_context(ctx, inputs, output):
    x, w, b, _, _, training, eps = inputs
    stats = output[1]
    _setup(ctx, x, w, b, eps, stats, training)
    ctx.save_for_forward(x, w, stats)


def _transform_backward(ctx, dy, _dstats):
    x, w, stats = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = _grads(ctx, dy, x, w, stats, need[0], need[1], need[2], eager=True)
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
    doc="BatchNorm on the kernels: ``apply(x, w, b, running_mean, running_var, training, eps)`` -> "
        "``(y, stats)``, ``stats`` the (3, C) float64 rows mean, biased var, rstd (not differentiable). "
        "The running-statistic update is the caller's.",
)


def _update_running_ops(running_mean, running_var, x, stats, n, momentum):
    """:func:`_update_running` in torch ops (under transforms: the buffers may be batched), the
    same float64 blend, rounded once to each buffer. A batched input with unbatched buffers
    raises torch's error."""
    check_batched_buffers(x, running_mean, running_var)
    keep = 1.0 - momentum
    with torch.no_grad():
        running_mean.copy_(keep * running_mean.to(torch.float64) + momentum * stats[0])
        running_var.copy_(keep * running_var.to(torch.float64) + momentum * (stats[1] * (n / (n - 1.0))))


# --------------------------------------------------------------------------
# Entry point (called by normlab.functional after its argument checks)
# --------------------------------------------------------------------------


def batch_norm(x, running_mean, running_var, w, b, training, momentum, eps):
    """BatchNorm of an ``(N, C, *spatial)`` ``x`` on the kernels (the backend table's ``"cpu"``
    function; the ``"ref"`` one is ``reference.ref_batch_norm``).

    ``training=True``: normalise with the batch's statistics and, when
    ``running_mean``/``running_var`` are given, update them in place with
    weight ``momentum`` (``running = (1 - momentum) * running + momentum *
    stat``, the *unbiased* variance ``var * n / (n - 1)`` for ``running_var``,
    blended in float64 and rounded once to each buffer's dtype).
    ``training=False``: normalise with the running statistics, left untouched.
    An empty batch takes the reference path.
    """
    if x.numel() == 0:
        return ref_batch_norm(x, running_mean, running_var, w, b, training, momentum, eps)
    update = training and running_mean is not None
    n = x.numel() // x.shape[1]  # values per channel
    rm, rv = (None, None) if training else (running_mean, running_var)
    path = _register.route(x, w, b)
    if path == _register.TRANSFORM:  # the layout is settled on the plain tensors, in the Function's forward
        y, stats = _Transform.apply(x, w, b, rm, rv, training, eps)
        if update:
            _update_running_ops(running_mean, running_var, x, stats, n, momentum)
        return y
    xc = _canonical(x)  # the one copy of an input that is neither contiguous nor channels-last
    if path == _register.EAGER:
        out = [None]
        y = _eager_apply(xc, w, b, rm, rv, training, eps, out)
        sn = out[0]
    elif path == _register.PLAIN:
        y, sn = _forward(xc, w, b, rm, rv, training, eps)
    elif training:
        y, stats = batch_norm_train_fwd(xc, w, b, eps)
        if update:
            if not isinstance(momentum, Tensor):
                momentum = torch.tensor(momentum, dtype=torch.float64)
            batch_norm_update_stats(running_mean, running_var, stats, n, momentum)
        return y
    else:
        return batch_norm_eval_fwd(xc, running_mean, running_var, w, b, eps)[0]
    if update:
        _update_running(running_mean, running_var, sn, n, momentum)
        _register.written(running_mean, running_var)
    return y
