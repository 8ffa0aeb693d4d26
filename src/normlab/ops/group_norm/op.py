"""GroupNorm / InstanceNorm: the family's entries, each running the path ``normlab._backend.route``
decided (``REF``: the reference math; the others: the C++ ops ``torch.ops.normlab.*``).

The ops they call (registered in ``csrc/group_norm.cpp``):

- ``group_norm(x, weight, bias, num_groups, eps) -> y``: the output alone when autograd does not record
  the call (no statistics allocated), else through ``group_norm_fwd``;
- ``group_norm_fwd(x, weight, bias, num_groups, eps) -> (y, mean, var, rstd)``, statistics (N, G) in the
  accumulation dtype, differentiable in ``y``; InstanceNorm in training uses it with ``G = C``;
- ``group_norm_bwd(dy, x, weight, mean, rstd, num_groups, need_dx) -> (dx, dw, db)``;
- ``instance_norm_eval_fwd(x, weight, bias, mean, rstd) -> y`` / ``instance_norm_eval_bwd``: InstanceNorm
  with the running statistics (a per-channel linear map, ``mean``/``rstd`` (C,));
- ``instance_norm_update_stats(running_mean!, running_var!, mean, var, momentum, n_spatial)``: the
  in-place running-statistics update (a mutating op of its own: torch.compile functionalises it).

The paths: ``EAGER`` goes straight to ``normlab._C`` (a C++ entry point that calls the
registered op through a cached dispatcher handle, no Python dispatch); ``COMPILE`` traces
``torch.ops.normlab.*``; ``TRANSFORM`` (torch.func transforms and forward-mode AD) takes the
Python Function ``GroupNormTransform`` (vmap and jvp rules) calls the same forward and
backward ops (a C++ autograd Function refuses functorch transforms). Empty inputs take the
reference path.

Layouts: GroupNorm's output has torch's memory format (``x.suggest_memory_format()``: a
channels_last input is read and written in its own layout); InstanceNorm's output is contiguous.
Under ``create_graph=True`` the backward runs the reference analytic backward in differentiable
torch ops, so double backward works.
"""

import math

import torch

from ..._backend import COMPILE, EAGER, REF
from .. import _register, _transforms, extension
from ..layouts import group_params, grouped, in_memory_format, output_memory_format
from ..numerics import acc_dtype, to_acc
from .reference import (
    group_norm_backward_ref,
    group_norm_jvp,
    group_norm_stats,
    instance_norm_eval_backward_ref,
    ref_group_norm,
    ref_instance_norm,
    update_running_ops,
)

_C = extension.load()
_ops = torch.ops.normlab


def _kernel_input(x, fmt):
    """``x`` as (N, C, S): channels_last strides kept for a channels_last ``fmt`` (no copy when ``x``
    already is), contiguous otherwise (copies only if it must)."""
    n, c = x.shape[0], x.shape[1]
    s = math.prod(x.shape[2:])
    if fmt != torch.contiguous_format:
        return x.contiguous(memory_format=fmt).reshape(n, c, s)
    return x.reshape(n, c, s).contiguous()


def _forward(x, w, b, num_groups, eps, fixed_mean=None, fixed_rstd=None):
    """One forward op call: ``(y, mean, var)``, statistics (N, G); with ``fixed_mean``/``fixed_rstd``
    (C,) InstanceNorm with those statistics, and empty (N, 0) ``mean``/``var``."""
    if fixed_mean is None:
        y, mean, var, _ = _ops.group_norm_fwd(x, w, b, num_groups, eps)
        return y, mean, var
    y = _ops.instance_norm_eval_fwd(x, w, b, fixed_mean, fixed_rstd)
    empty = fixed_mean.new_empty((x.shape[0], 0))
    return y, empty, empty.clone()


def _grads(ctx, dy, x, w, mean, rstd, needs):
    """``(dx, dw, db)`` of GroupNorm (``ctx.fixed``: InstanceNorm with running statistics): the
    backward ops, or under ``create_graph=True`` the differentiable reference backward on the
    grouped view, with the statistics recomputed from ``x``."""
    if dy is None:
        return None, None, None
    need_dx, need_dw, need_db = needs
    need_dw = need_dw and w is not None
    need_db = need_db and ctx.b_dtype is not None
    g = ctx.num_groups
    if _transforms.differentiable_backward():  # double backward
        x4, dy4, w3 = grouped(x, g), grouped(dy, g), group_params(w, g)  # (N, G, Cg, S), (G, Cg, 1)
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
        if ctx.fixed:
            dx, dw, db = _ops.instance_norm_eval_bwd(dy, x, w, mean, rstd, need_dx)
        else:
            dx, dw, db = _ops.group_norm_bwd(dy, x, w, mean, rstd, g, need_dx)
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


# --------------------------------------------------------------------------
# Under torch.func transforms and forward-mode AD (ops/_transforms.py)
# --------------------------------------------------------------------------


def _transform_forward(x, w, b, num_groups, eps, fixed_mean, fixed_rstd):
    return _forward(x, w, b, num_groups, eps, fixed_mean, fixed_rstd)


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
    dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3])
    return dx, dw, db, None, None, None, None


def _transform_jvp(ctx, xt, wt, bt, _g_t, _eps_t, _mean_t, _rstd_t):
    x, w, mean, rstd = ctx.saved_tensors
    g = ctx.num_groups
    stat = (1, g, 1, 1) if ctx.fixed else (x.shape[0], g, 1, 1)
    yt = group_norm_jvp(grouped(x, g), group_params(w, g), mean.reshape(stat), rstd.reshape(stat),
                        grouped(xt, g) if xt is not None else None, group_params(wt, g),
                        group_params(bt, g), fixed=ctx.fixed)
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
# Entries: one function per op, taking the path normlab._backend.route
# decided (normlab.functional has judged the arguments)
# --------------------------------------------------------------------------


def group_norm(path, x, num_groups, w, b, eps):
    """GroupNorm of an ``(N, C, *)`` ``x`` with ``num_groups`` groups on ``path`` (``REF``:
    ``reference.ref_group_norm``; the others: the C++ ops). An empty input takes the reference
    math."""
    if path == REF or x.numel() == 0:
        return ref_group_norm(x, num_groups, w, b, eps)
    if path == EAGER:
        return _C.group_norm(x, num_groups, w, b, eps)
    if path == COMPILE:
        return _ops.group_norm(x, w, b, num_groups, eps)
    fmt = output_memory_format(x)
    y = _Transform.apply(_kernel_input(x, fmt), w, b, num_groups, eps, None, None)[0]
    return in_memory_format(y.reshape(x.shape), fmt)  # a view (NHWC stays channels_last)


def _channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` is a channels_last (4-D) or channels_last_3d (5-D) tensor that is not also
    contiguous."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return fmt is not None and not x.is_contiguous() and x.is_contiguous(memory_format=fmt)


def instance_norm(path, x, running_mean, running_var, w, b, use_input_stats, momentum, eps):
    """InstanceNorm of an ``(N, C, *spatial)`` ``x`` on ``path`` (``REF``, and what every path
    computes: ``reference.ref_instance_norm``; the others: the C++ ops). An empty input takes the
    reference math. The output is contiguous."""
    if path == REF or x.numel() == 0:
        return ref_instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, eps)
    if path == EAGER:
        return _C.instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, eps)
    n, c, s = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    if path == COMPILE:
        # torch's instance_norm output is contiguous; as the eager entry (autograd/group_norm.cpp),
        # a channels_last x with its own statistics is normalised as it is (the channels-last
        # kernels) and the output made contiguous after, any other x made contiguous first
        if not (use_input_stats and _channels_last(x)):
            x = x.contiguous()
        if use_input_stats:
            if running_mean is None:
                return _ops.group_norm(x, w, b, c, eps).contiguous()
            y, mean, var, _ = _ops.group_norm_fwd(x, w, b, c, eps)
            _ops.instance_norm_update_stats(running_mean, running_var, mean, var, momentum, s)
            return y.contiguous()
        with torch.no_grad():  # constants of the map; a copy, safe from later buffer updates
            acc = acc_dtype(x.dtype)
            mean = running_mean.to(acc, copy=True)  # (C,)
            rstd = torch.rsqrt(running_var.to(acc) + eps)  # (C,)
        return _ops.instance_norm_eval_fwd(x, w, b, mean, rstd)
    x3 = x.reshape(n, c, s).contiguous()  # (N, C, S)
    if use_input_stats:
        y, mean, var = _Transform.apply(x3, w, b, c, eps, None, None)
        if running_mean is not None:
            update_running_ops(running_mean, running_var, mean, var, momentum, s)
        return y.reshape(x.shape)
    with torch.no_grad():
        acc = acc_dtype(x.dtype)
        mean = running_mean.to(acc, copy=True)  # (C,)
        rstd = torch.rsqrt(running_var.to(acc) + eps)  # (C,)
    return _Transform.apply(x3, w, b, c, 0.0, mean, rstd)[0].reshape(x.shape)
