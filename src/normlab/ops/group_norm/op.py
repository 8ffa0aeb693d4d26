"""GroupNorm / InstanceNorm on the ``"cpu"`` kernels: what is this family's own, handed to ``ops/_register``.

Layering (kernel -> launcher -> the op's forms -> entry point), as in ``ops/layer_norm``:

- ``kernels.py``, ``kernels_nhwc.py``: the Numba kernels, on numpy views of the tensors.
- ``launch.py``: the launchers ``_forward``, ``_backward``, ``_update_running``:
  allocate outputs, pass bfloat16/float16 tensors as their bits, pick the NCHW
  or the NHWC kernel from ``x``'s layout, run with torch's thread count.
- declared to ``ops/_register`` (custom ops each with a fake, so
  ``torch.compile(fullgraph=True)`` traces them as single nodes):

  - ``normlab::group_norm_fwd`` -> ``(y, mean, var, rstd)``, differentiable;
    InstanceNorm in training uses it with ``G = C``;
  - ``normlab::group_norm_bwd`` (not differentiable itself);
  - ``normlab::instance_norm_eval_fwd`` / ``normlab::instance_norm_eval_bwd``:
    InstanceNorm with the running statistics (a per-channel linear map);
  - ``normlab::instance_norm_update_stats``: the in-place running-statistics
    update, declared with ``mutates_args`` (torch.compile functionalises it; a
    mutating op cannot carry an autograd formula, hence its own op);
  - the eager twins ``GroupNormEager`` and ``InstanceNormEvalEager``, and the
    transform Function ``GroupNormTransform`` (vmap: the batch members' samples
    are more samples; with fixed statistics, their channels more channels).

- entry points :func:`group_norm`, :func:`instance_norm`: the backend table's
  ``"cpu"`` functions (the ``"ref"`` ones are ``reference.ref_group_norm`` and
  ``ref_instance_norm``; empty inputs take them too); ``_register.route`` picks
  the form that runs.

The kernels take ``x`` as ``(N, C, S)``, either contiguous (NCHW) or with
channels_last strides ``(S*C, 1, C)`` (NHWC); the entry points make any other
layout contiguous with one copy. GroupNorm's output has torch's layout
(``output_memory_format``): a channels_last input is read and written in its
own layout, without a copy. InstanceNorm's output is contiguous, as torch's (a
channels_last input is copied once).

The forward saves ``x``, ``w``, ``mean``, ``rstd``; the backward recomputes
``x_hat``. Under ``create_graph=True`` the backward runs the reference analytic
backward in differentiable torch ops instead, so double backward works for
``"cpu"`` too.

(No ``from __future__ import annotations`` here: ``torch.library`` reads the
type hints of the custom ops to build their schemas.)
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .. import _register, _transforms
from .._common import acc_dtype, in_memory_format, to_acc
from .launch import _backward, _forward, _is_nhwc, _kernel_input, _update_running
from .reference import (
    _grouped,
    _per_channel,
    group_norm_backward_ref,
    group_norm_jvp,
    group_norm_stats,
    instance_norm_eval_backward_ref,
    output_memory_format,
    ref_group_norm,
    ref_instance_norm,
    update_running_ops,
)

# --------------------------------------------------------------------------
# Custom ops
# --------------------------------------------------------------------------


def _stats_like(x: Tensor, *shape) -> Tensor:
    return x.new_empty(shape, dtype=acc_dtype(x.dtype))


def _group_norm_fwd(
    x: Tensor, w: Optional[Tensor], b: Optional[Tensor], num_groups: int, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """GroupNorm of ``x`` (N, C, S), contiguous or NHWC: ``(y, mean, var, rstd)``, stats (N, G)."""
    return _forward(x, w, b, num_groups, eps, one_buffer=False)


def _group_norm_fwd_fake(x, w, b, num_groups, eps):
    n = x.shape[0]
    y = torch.empty_like(x) if _is_nhwc(x) else torch.empty_like(x, memory_format=torch.contiguous_format)
    return y, _stats_like(x, n, num_groups), _stats_like(x, n, num_groups), _stats_like(x, n, num_groups)


def _group_norm_bwd(
    dy: Tensor,
    x: Tensor,
    w: Optional[Tensor],
    mean: Tensor,
    rstd: Tensor,
    num_groups: int,
    need_dx: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """GroupNorm gradients ``(dx, dw, db)``; ``dx`` empty unless ``need_dx``, dw/db (C,) in the accumulation dtype."""
    dx, dw, db = _backward(dy, x, w, mean, rstd, num_groups, False, need_dx)
    return (dx if dx is not None else x.new_empty((0,))), dw, db


def _group_norm_bwd_fake(dy, x, w, mean, rstd, num_groups, need_dx):
    if not need_dx:
        return x.new_empty((0,)), _stats_like(x, x.shape[1]), _stats_like(x, x.shape[1])
    dx = torch.empty_like(x) if _is_nhwc(x) else torch.empty_like(x, memory_format=torch.contiguous_format)
    return dx, _stats_like(x, x.shape[1]), _stats_like(x, x.shape[1])


def _instance_norm_eval_fwd(
    x: Tensor, w: Optional[Tensor], b: Optional[Tensor], mean: Tensor, rstd: Tensor
) -> Tensor:
    """InstanceNorm of contiguous ``x`` (N, C, S) with fixed per-channel ``mean``/``rstd`` (C,)."""
    y, _, _, _ = _forward(x, w, b, x.shape[1], 0.0, mean, rstd)
    return y


def _instance_norm_eval_fwd_fake(x, w, b, mean, rstd):
    return x.new_empty(x.shape)


def _instance_norm_eval_bwd(
    dy: Tensor, x: Tensor, w: Optional[Tensor], mean: Tensor, rstd: Tensor, need_dx: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dx, dw, db)`` of InstanceNorm with fixed statistics (``dx`` empty unless ``need_dx``)."""
    dx, dw, db = _backward(dy, x, w, mean, rstd, x.shape[1], True, need_dx)
    return (dx if dx is not None else x.new_empty((0,))), dw, db


def _instance_norm_eval_bwd_fake(dy, x, w, mean, rstd, need_dx):
    dx = x.new_empty(x.shape) if need_dx else x.new_empty((0,))
    return dx, _stats_like(x, x.shape[1]), _stats_like(x, x.shape[1])


def _instance_norm_update_stats(
    running_mean: Tensor, running_var: Tensor, mean: Tensor, var: Tensor, momentum: float, n_spatial: int
) -> None:
    """``running = (1 - momentum) * running + momentum * batch average`` of ``mean`` / unbiased ``var`` (N, C)."""
    _update_running(running_mean, running_var, mean, var, momentum, n_spatial)


instance_norm_update_stats = _register.custom_op(
    "instance_norm_update_stats", _instance_norm_update_stats,
    fake=lambda running_mean, running_var, mean, var, momentum, n_spatial: None,
    mutates_args=("running_mean", "running_var"),
)


# --------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------


def _grads(ctx, dy, x, w, mean, rstd, needs, eager):
    """``(dx, dw, db)`` of GroupNorm (``ctx.fixed``: InstanceNorm with running statistics).

    ``eager``: call the launcher directly instead of the backward custom op.
    Under ``create_graph=True``: the differentiable reference backward on the
    grouped view, with the statistics recomputed from ``x``.
    """
    if dy is None:
        return None, None, None
    need_dx, need_dw, need_db = needs
    need_dw = need_dw and w is not None
    need_db = need_db and ctx.b_dtype is not None
    g = ctx.num_groups
    if _transforms.differentiable_backward():  # double backward
        x4, dy4, w3 = _grouped(x, g), _grouped(dy, g), _per_channel(w, g)  # (N, G, Cg, S), (G, Cg, 1)
        if ctx.fixed:
            m4, r4 = mean.reshape(1, g, 1, 1), rstd.reshape(1, g, 1, 1)
            dx, dw, db = instance_norm_eval_backward_ref(dy4, x4, w3, m4, r4, need_dx, need_dw, need_db)
        else:
            m4, _, r4, _ = group_norm_stats(to_acc(x4), ctx.eps)
            dx, dw, db = group_norm_backward_ref(dy4, x4, w3, m4, r4, need_dx, need_dw, need_db)
        dx = dx.reshape(x.shape) if dx is not None else None
        dw = dw.reshape(-1) if dw is not None else None
        db = db.reshape(-1) if db is not None else None
    else:
        if eager:
            dx, dw, db = _backward(dy, x, w, mean, rstd, g, ctx.fixed, need_dx)
        elif ctx.fixed:
            dx, dw, db = instance_norm_eval_bwd(dy, x, w, mean, rstd, need_dx)
        else:
            dx, dw, db = group_norm_bwd(dy, x, w, mean, rstd, g, need_dx)
        dx = dx if need_dx else None
    dw = (dw if dw.dtype == w.dtype else dw.to(w.dtype)) if need_dw else None
    db = (db if db.dtype == ctx.b_dtype else db.to(ctx.b_dtype)) if need_db else None
    return dx, dw, db


def _setup(ctx, x, w, b, mean, rstd, num_groups, eps, fixed):
    ctx.save_for_backward(x, w, mean, rstd)
    ctx.num_groups = num_groups
    ctx.eps = eps
    ctx.fixed = fixed
    ctx.b_dtype = b.dtype if b is not None else None
    ctx.set_materialize_grads(False)


def _group_norm_setup(ctx, inputs, output):
    x, w, b, num_groups, eps = inputs
    _, mean, var, rstd = output
    _setup(ctx, x, w, b, mean, rstd, num_groups, eps, False)
    ctx.mark_non_differentiable(mean, var, rstd)


def _group_norm_backward(ctx, dy, _dmean, _dvar, _drstd):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3], eager=False)
    return dx, dw, db, None, None


def _instance_norm_eval_setup(ctx, inputs, output):
    x, w, b, mean, rstd = inputs
    _setup(ctx, x, w, b, mean, rstd, x.shape[1], 0.0, True)


def _instance_norm_eval_backward(ctx, dy):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3], eager=False)
    return dx, dw, db, None, None




group_norm_fwd = _register.custom_op(
    "group_norm_fwd", _group_norm_fwd, fake=_group_norm_fwd_fake,
    backward=_group_norm_backward, setup_context=_group_norm_setup,
)
group_norm_bwd = _register.custom_op("group_norm_bwd", _group_norm_bwd, fake=_group_norm_bwd_fake)
instance_norm_eval_fwd = _register.custom_op(
    "instance_norm_eval_fwd", _instance_norm_eval_fwd, fake=_instance_norm_eval_fwd_fake,
    backward=_instance_norm_eval_backward, setup_context=_instance_norm_eval_setup,
)
instance_norm_eval_bwd = _register.custom_op(
    "instance_norm_eval_bwd", _instance_norm_eval_bwd, fake=_instance_norm_eval_bwd_fake,
)


# --------------------------------------------------------------------------
# The eager twins: the launchers and the backward as Functions
# --------------------------------------------------------------------------


def _gn_eager_forward(ctx, x, w, b, num_groups, eps):
    y, mean, var, rstd = _forward(x, w, b, num_groups, eps)
    _setup(ctx, x, w, b, mean, rstd, num_groups, eps, False)
    ctx.mark_non_differentiable(mean, var)
    return y, mean, var


def _gn_eager_backward(ctx, dy, _dmean, _dvar):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3], eager=True)
    return dx, dw, db, None, None


_gn_apply = _register.eager(
    "GroupNorm", _gn_eager_forward, _gn_eager_backward,
    "GroupNorm of ``x`` (N, C, S), contiguous or NHWC: ``apply(x, w, b, num_groups, eps)`` -> "
    "``(y, mean, var)``; ``mean`` and ``var`` (N, G) are non-differentiable (InstanceNorm's running "
    "statistics read them).",
)


def _in_eval_eager_forward(ctx, x, w, b, mean, rstd):
    y, _, _, _ = _forward(x, w, b, x.shape[1], 0.0, mean, rstd)
    _setup(ctx, x, w, b, mean, rstd, x.shape[1], 0.0, True)
    return y


def _in_eval_eager_backward(ctx, dy):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3], eager=True)
    return dx, dw, db, None, None


_in_eval_apply = _register.eager(
    "InstanceNormEval", _in_eval_eager_forward, _in_eval_eager_backward,
    "InstanceNorm with fixed per-channel ``mean``/``rstd`` (C,): ``apply(x, w, b, mean, rstd)`` -> ``y``.",
)


# --------------------------------------------------------------------------
# Under torch.func transforms and forward-mode AD (ops/_transforms.py)
# --------------------------------------------------------------------------


def _transform_forward(x, w, b, num_groups, eps, fixed_mean, fixed_rstd):
    if fixed_mean is None:
        y, mean, var, _ = _forward(x, w, b, num_groups, eps, one_buffer=False)
        return y, mean, var
    y = _forward(x, w, b, num_groups, 0.0, fixed_mean, fixed_rstd)[0]
    empty = fixed_mean.new_empty((x.shape[0], 0))
    return y, empty, empty.clone()


def _transform_setup_context(ctx, inputs, output):
    x, w, b, num_groups, eps, fixed_mean, fixed_rstd = inputs
    _, mean, var = output
    fixed = fixed_mean is not None
    rstd = fixed_rstd if fixed else torch.rsqrt(var + eps)  # as the kernel's
    _setup(ctx, x, w, b, fixed_mean if fixed else mean, rstd, num_groups, eps, fixed)
    ctx.save_for_forward(x, w, fixed_mean if fixed else mean, rstd)
    ctx.mark_non_differentiable(mean, var)


def _transform_backward(ctx, dy, _dmean, _dvar):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3], eager=True)
    return dx, dw, db, None, None, None, None


def _transform_jvp(ctx, xt, wt, bt, _g_t, _eps_t, _mean_t, _rstd_t):
    x, w, mean, rstd = ctx.saved_tensors
    g = ctx.num_groups
    stat = (1, g, 1, 1) if ctx.fixed else (x.shape[0], g, 1, 1)
    yt = group_norm_jvp(_grouped(x, g), _per_channel(w, g), mean.reshape(stat), rstd.reshape(stat),
                        _grouped(xt, g) if xt is not None else None, _per_channel(wt, g),
                        _per_channel(bt, g), fixed=ctx.fixed)
    return (None if yt is None else yt.reshape(x.shape)), None, None


def _transform_vmap(info, in_dims, x, w, b, num_groups, eps, fixed_mean, fixed_rstd):
    """GroupNorm: the batch members' samples are more samples (a batched weight or bias is
    applied after the kernel, in torch ops). Fixed statistics: the members' channels are
    more channels, each with its own statistics, weight and bias."""
    n = info.batch_size
    xb = _transforms.front(x, in_dims[0], n)  # (B, N, C, S)
    bn, c, s = xb.shape[1:]
    if fixed_mean is not None:
        def channels(t, d):  # (C,) or batched (B, C) -> (B*C,)
            if t is None:
                return None
            return t.repeat(n) if d is None else _transforms.front(t, d, n).reshape(n * c)

        x2 = xb.movedim(0, 1).reshape(bn, n * c, s).contiguous()  # (N, B*C, S)
        y, mean, var = _Transform.apply(
            x2, channels(w, in_dims[1]), channels(b, in_dims[2]), n * c, eps,
            channels(fixed_mean, in_dims[5]), channels(fixed_rstd, in_dims[6]))
        return (y.view(bn, n, c, s), mean.new_empty((n, bn, 0)), var.new_empty((n, bn, 0))), (1, 0, 0)
    x2 = xb.reshape(n * bn, c, s).contiguous()  # (B*N, C, S)
    if in_dims[1] is None and in_dims[2] is None:
        y, mean, var = _Transform.apply(x2, w, b, num_groups, eps, None, None)
        y = y.reshape(n, bn, c, s)
    else:
        y, mean, var = _Transform.apply(x2, None, None, num_groups, eps, None, None)
        y = to_acc(y.reshape(n, bn, c, s))
        if w is not None:
            y = y * to_acc(_transforms.front(w, in_dims[1], n)).reshape(n, 1, c, 1)
        if b is not None:
            y = y + to_acc(_transforms.front(b, in_dims[2], n)).reshape(n, 1, c, 1)
        y = y.to(x.dtype)
    return (y, mean.view(n, bn, -1), var.view(n, bn, -1)), (0, 0, 0)


_Transform = _register.transform(
    "GroupNorm", forward=_transform_forward, setup_context=_transform_setup_context,
    backward=_transform_backward, jvp=_transform_jvp, vmap=_transform_vmap,
    doc="GroupNorm of ``x`` (N, C, S): ``apply(x, w, b, num_groups, eps, fixed_mean, fixed_rstd)`` -> "
        "``(y, mean, var)``, the group statistics (N, G), not differentiable; with ``fixed_mean``/"
        "``fixed_rstd`` (C,) given, InstanceNorm with those statistics (and empty ``mean``/``var``).",
)


# --------------------------------------------------------------------------
# Entry points: the backend table's "cpu" functions (normlab.functional has
# checked the arguments)
# --------------------------------------------------------------------------


def group_norm(x, num_groups, w, b, eps):
    """GroupNorm of an ``(N, C, *)`` ``x`` with ``num_groups`` groups on the kernels (the backend
    table's ``"cpu"`` function; the ``"ref"`` one is ``reference.ref_group_norm``). An empty
    input takes the reference path."""
    if x.numel() == 0:
        return ref_group_norm(x, num_groups, w, b, eps)
    fmt = output_memory_format(x)
    x3 = _kernel_input(x, fmt)  # (N, C, S)
    path = _register.route(x, w, b)
    if path == _register.EAGER:
        y, _, _ = _gn_apply(x3, w, b, num_groups, eps)
    elif path == _register.PLAIN:  # nothing to differentiate: the launcher alone
        y, _, _, _ = _forward(x3, w, b, num_groups, eps)
    elif path == _register.TRANSFORM:
        y = _Transform.apply(x3, w, b, num_groups, eps, None, None)[0]
    else:
        y, _, _, _ = group_norm_fwd(x3, w, b, num_groups, eps)
    return in_memory_format(y.reshape(x.shape), fmt)  # a view (NHWC stays channels_last)


def instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, eps):
    """InstanceNorm of an ``(N, C, *spatial)`` ``x`` on the kernels (the backend table's ``"cpu"``
    function; the ``"ref"`` one, and what both compute, is ``reference.ref_instance_norm``). An
    empty input takes the reference path. The output is contiguous."""
    c = x.shape[1]
    if x.numel() == 0:
        return ref_instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, eps)
    n, s = x.shape[0], math.prod(x.shape[2:])
    x3 = x.reshape(n, c, s).contiguous()  # (N, C, S); torch's output is contiguous
    path = _register.route(x, w, b)
    if use_input_stats:
        if path == _register.EAGER:
            y, mean, var = _gn_apply(x3, w, b, c, eps)
        elif path == _register.PLAIN:
            y, mean, var, _ = _forward(x3, w, b, c, eps)
        elif path == _register.TRANSFORM:
            y, mean, var = _Transform.apply(x3, w, b, c, eps, None, None)
            if running_mean is not None:
                update_running_ops(running_mean, running_var, mean, var, momentum, s)
            return y.reshape(x.shape)
        else:
            y, mean, var, _ = group_norm_fwd(x3, w, b, c, eps)
            if running_mean is not None:
                instance_norm_update_stats(running_mean, running_var, mean, var, momentum, s)
            return y.reshape(x.shape)
        if running_mean is not None:
            _update_running(running_mean, running_var, mean, var, momentum, s)
            _register.written(running_mean, running_var)
        return y.reshape(x.shape)
    with torch.no_grad():  # constants of the map; a copy, safe from later buffer updates
        acc = acc_dtype(x.dtype)
        mean = running_mean.to(acc, copy=True)  # (C,)
        rstd = torch.rsqrt(running_var.to(acc) + eps)  # (C,)
    if path == _register.EAGER:
        y = _in_eval_apply(x3, w, b, mean, rstd)
    elif path == _register.PLAIN:
        y, _, _, _ = _forward(x3, w, b, c, 0.0, mean, rstd)
    elif path == _register.TRANSFORM:
        y = _Transform.apply(x3, w, b, c, 0.0, mean, rstd)[0]
    else:
        y = instance_norm_eval_fwd(x3, w, b, mean, rstd)
    return y.reshape(x.shape)
