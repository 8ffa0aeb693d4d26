"""GroupNorm and InstanceNorm as functions (``normlab.functional``; the math:
``normlab.ops.group_norm``).

GroupNorm / InstanceNorm: the family's entries, each running the path ``normlab._backend.route``
decided (``REF``: the reference math; the others: the C++ ops ``torch.ops.normlab.*``).

The ops they call (registered in ``csrc/group_norm.h``):

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

from __future__ import annotations

import math

import torch

from .._backend import COMPILE, EAGER, REF, route
from .._checks import check_eps, check_input, check_num_groups, cpu_params_fit, plain_eps
from ..ops import _register, _transforms
from ..ops import extension as _extension
from ..ops.group_norm.reference import (group_norm_backward_ref, group_norm_jvp, group_norm_stats,
                                        instance_norm_eval_backward_ref, ref_group_norm, ref_instance_norm,
                                        update_running_ops)
from ..ops.layouts import group_params, grouped, in_memory_format, output_memory_format
from ..ops.numerics import acc_dtype, to_acc
from .checks import (check_channels_input, check_momentum, check_per_channel, check_running_not_recorded,
                     check_running_pair, plain_momentum)

_C = _extension.load()


def group_norm(
    input: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """GroupNorm: the ``C`` channels of an ``(N, C, *)`` input split into ``num_groups`` groups,
    ``y = (x - mean_g) / sqrt(var_g + eps) * weight + bias`` with each group of each sample's
    own statistics, then a per-channel affine.

    Twin: ``torch.nn.functional.group_norm`` -- same signature and results; ``num_groups`` must
    be a positive int dividing ``C`` (``ValueError``/``RuntimeError`` with what was given).

    Shapes: input ``(N, C, *)``, output the same (in the input's memory format);
    ``weight``, ``bias``: ``(C,)`` or None.

    Numerics: mean and biased variance per (sample, group), accumulated in float32 for
    float16/bfloat16/float32 input and float64 for float64; output cast once.

    >>> import torch, normlab.functional as NF
    >>> NF.group_norm(torch.tensor([[1.0, 3.0, 10.0, 30.0]]), 2)
    tensor([[-1.0000,  1.0000, -1.0000,  1.0000]])
    """
    path = route(input, "group_norm")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        y = _C.group_norm_fast(input, num_groups, weight, bias, eps)
        if y is not None:
            return y
    fn = "group_norm"
    if not (
        isinstance(input, torch.Tensor)
        and input.dim() >= 2
        and type(num_groups) is int
        and num_groups > 0
        and input.shape[1] % num_groups == 0
        and cpu_params_fit(input, input.shape[1:2], weight, bias)
        and eps is not None
        and plain_eps(eps)
        and input.numel() != num_groups  # N * (C / G) * S == 1: one value per group
    ):
        check_input(fn, input)
        check_channels_input(fn, input)
        num_groups = check_num_groups(fn, num_groups)
        c = input.shape[1]
        if c % num_groups != 0:
            raise RuntimeError(
                f"{fn}: expected the number of channels ({c}, input.shape[1] of input shape "
                f"{list(input.shape)}) to be divisible by num_groups ({num_groups})"
            )
        check_per_channel(fn, input, weight=weight, bias=bias)
        check_eps(fn, eps, none_ok=False)
        if input.shape[0] * (c // num_groups) * math.prod(input.shape[2:]) == 1:
            raise ValueError(  # each group would hold a single value: its variance is 0
                f"Expected more than 1 value per channel when training, got input size "
                f"{[input.shape[0] * c // num_groups, num_groups, *input.shape[2:]]}"
            )
    return _group_norm_path(path, input, int(num_groups), weight, bias, float(eps))


def instance_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None = None,
    running_var: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    """InstanceNorm: ``y = (x - mean) / sqrt(var + eps) * weight + bias``, each channel of each
    sample of an ``(N, C, *spatial)`` input over its spatial dims.

    Twin: ``torch.nn.functional.instance_norm`` -- same signature and results.

    Shapes: input ``(N, C, *spatial)`` (at least 3 dims with ``use_input_stats``), output the
    same; ``running_mean``, ``running_var``, ``weight``, ``bias``: ``(C,)`` or None.

    Numerics: mean and biased variance per (sample, channel), accumulated in float32 for
    float16/bfloat16/float32 input and float64 for float64; output cast once. With
    ``use_input_stats`` and running statistics given, these are updated in place with weight
    ``momentum`` (in ``[0, 1]``) towards the batch average of the per-instance means and
    *unbiased* variances; ``use_input_stats=False`` normalises with the running statistics.

    >>> import torch, normlab.functional as NF
    >>> NF.instance_norm(torch.tensor([[[1.0, 2.0, 3.0]]]))
    tensor([[[-1.2247,  0.0000,  1.2247]]])
    """
    path = route(input, "instance_norm")
    if path == EAGER:  # the C++ entry judges the arguments as the checks below; None: not its case
        y = _C.instance_norm_fast(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
        if y is not None:
            return y
    fn = "instance_norm"
    check_running_not_recorded(fn, running_mean, running_var)
    if not (
        isinstance(input, torch.Tensor)
        and input.dim() >= (3 if use_input_stats else 2)
        and cpu_params_fit(input, input.shape[1:2], running_mean, running_var, weight, bias)
        and (running_mean is None) == (running_var is None)
        and (running_mean is not None or use_input_stats)
        and plain_momentum(momentum)
        and eps is not None
        and plain_eps(eps)
        and (not use_input_stats or input.numel() != input.shape[0] * input.shape[1])  # S == 1
    ):
        check_input(fn, input)
        if input.dim() < 2 or (use_input_stats and input.dim() < 3):
            raise ValueError(
                f"{fn}: expected an input of shape (N, C, *spatial) with at least 3 dims, "
                f"got input of shape {list(input.shape)}; add a batch dim with x.unsqueeze(0)"
            )
        check_running_pair(fn, running_mean, running_var)
        if not use_input_stats and running_mean is None:
            raise RuntimeError(
                f"{fn}: expected running_mean and running_var when use_input_stats=False, got None"
            )
        check_per_channel(fn, input, running_mean=running_mean, running_var=running_var,
                           weight=weight, bias=bias)
        check_momentum(fn, momentum)
        check_eps(fn, eps, none_ok=False)
        if use_input_stats and math.prod(input.shape[2:]) == 1:
            raise ValueError(
                f"Expected more than 1 spatial element when training, got input size {input.size()}"
            )
    return _instance_norm_path(
        path, input, running_mean, running_var, weight, bias, bool(use_input_stats), float(momentum), float(eps)
    )


# --------------------------------------------------------------------------
# The C++ ops (csrc/group_norm.h) and their Function under transforms
# --------------------------------------------------------------------------

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
# The entries of each path (the arguments judged by the public functions above)
# --------------------------------------------------------------------------


def _group_norm_path(path, x, num_groups, w, b, eps):
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


def _instance_norm_path(path, x, running_mean, running_var, w, b, use_input_stats, momentum, eps):
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
