"""GroupNorm / InstanceNorm on the ``"cpu"`` kernels: what is this family's own, handed to ``ops/_register``.

Layering (kernel -> launcher -> the op's forms -> entry point), as in ``ops/layer_norm``:

- ``kernels.py``: the Numba kernels, on numpy views of the tensors.
- launchers :func:`_forward`, :func:`_backward`, :func:`_update_running`:
  allocate outputs, pass bfloat16/float16 tensors as their bits
  (``ops/_bf16.py``), pick the NCHW or the NHWC kernel from ``x``'s layout
  (NHWC also for every ``S == 1`` input: :func:`_use_nhwc`), run with torch's
  thread count.
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

from .. import _launch, _register, _transforms
from .._launch import bits as _bits
from .._launch import PROTO as _PROTO
from .._launch import call as _call
from .._launch import kernels_loader
from .._launch import param_ptr as _param_ptr
from .._common import acc_dtype, to_acc
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
# Launchers
# --------------------------------------------------------------------------

_k = kernels_loader(__package__)  # kernels.py, imported (numba and all) on first use


_ACC = {torch.float64: torch.float64}  # accumulation dtype; float32 for the rest


# Values per task of the NCHW kernels (whole groups, at least one): enough work to
# amortise a task, enough tasks to balance threads. No effect on results (the
# reductions over groups are per (n, c), merged in fixed order).
_TASK_VALUES = 32768


def _rows_per_task(n_rows: int, n_cols: int) -> int:
    return max(1, min(n_rows, -(-_TASK_VALUES // max(n_cols, 1))))


def _samples_per_task(n: int, s: int, c: int) -> int:
    """Samples per task of the NHWC kernels: the chunk of ``_launch.rows_per_chunk`` over the
    ``N*S`` rows of ``C`` channels (~64K values, at least 16 rows), in whole samples.

    From the shape only, never the thread count: the backward's dw/db are
    per-task partials merged in task order, so the chunks fix the bits.
    """
    return max(1, min(n, -(-_launch.rows_per_chunk(n * s, c) // max(s, 1))))


def _is_nhwc(x: Tensor) -> bool:
    """``x`` (N, C, S) has channels_last strides (and is not also plain contiguous)."""
    return not x.is_contiguous() and x.permute(0, 2, 1).is_contiguous()


def _use_nhwc(x: Tensor, fixed: bool) -> bool:
    """Whether the NHWC kernels take ``x`` (N, C, S): S == 1, or channels_last strides.

    With S == 1 the two layouts are the same memory, and the NCHW kernels'
    loops over a channel's S values would have length 1; the NHWC kernels run
    over the C contiguous channels instead (~4-10x faster, measured). With
    fixed statistics (InstanceNorm in eval) only an S == 1 input does: the
    instance_norm entry point makes every other input contiguous.
    """
    return x.shape[2] == 1 or (not fixed and _is_nhwc(x))


def _kernel_layout(t: Tensor, nhwc: bool) -> Tensor:
    """``t`` (N, C, S) in the layout the kernel reads: NHWC (``nhwc``) or contiguous."""
    if nhwc:
        return t if t.permute(0, 2, 1).is_contiguous() else t.permute(0, 2, 1).contiguous().permute(0, 2, 1)
    return t.contiguous()


def _array(t: Tensor, shape, nhwc: bool = False, out: bool = False):
    """A numpy view of ``t`` (N, C, S) in the kernel's ``shape``: NCHW ``(N*G, Cg, S)`` or NHWC ``(N, S, C)``.

    bfloat16 as int16 bits, float16 as uint16 bits (``ops/_bf16.py``).
    ``out``: reshaped by torch's ``view``, which never copies (a copy would
    lose what the kernel writes); inputs take numpy's cheaper ``reshape``.
    """
    t = t.detach()
    if nhwc:
        t = t.permute(0, 2, 1)
    if out:
        return _bits(t.view(shape))
    return _bits(t).reshape(shape)


def _stats_tensor(t: Tensor, acc: torch.dtype) -> Tensor:
    """Statistics (any shape) as a contiguous tensor in the accumulation dtype (no copy if they are)."""
    if t.dtype != acc or not t.is_contiguous():
        t = t.detach().to(acc).contiguous()
    return t


def _forward(x, w, b, num_groups, eps, fixed_mean=None, fixed_rstd=None, one_buffer=True):
    """GroupNorm of ``x`` (N, C, S); returns ``(y, mean, var, rstd)``, stats (N, G) in the accumulation dtype.

    With ``fixed_mean``/``fixed_rstd`` (C,) (InstanceNorm with running
    statistics, ``num_groups == C``): ``y`` only; ``mean, var, rstd`` are None.
    ``y`` has ``x``'s layout when that is NHWC, contiguous otherwise.
    ``one_buffer``: the statistics are views of one (3, N, G) buffer (one
    allocation; a custom op may not return aliases, so it passes False).
    """
    n, c, s = x.shape
    acc = _ACC.get(x.dtype, torch.float32)
    fixed = fixed_mean is not None
    nhwc = _use_nhwc(x, fixed)
    x = _kernel_layout(x, nhwc)
    y = torch.empty_like(x)  # x's (kernel) layout
    if fixed:
        mean = var = rstd = None
    elif one_buffer:
        stats = torch.empty((3, n, num_groups), dtype=acc)
        mean, var, rstd = stats.unbind(0)  # (N, G) each
    else:
        mean, var, rstd = (torch.empty((n, num_groups), dtype=acc) for _ in range(3))
    if y.numel() == 0:
        if not fixed:
            for t in (mean, var, rstd):
                t.fill_(math.nan)
        return y, mean, var, rstd
    pw, keep_w = _param_ptr(w, acc)
    pb, keep_b = _param_ptr(b, acc)
    if fixed:
        fixed_mean, fixed_rstd = _stats_tensor(fixed_mean, acc), _stats_tensor(fixed_rstd, acc)
        pmean, pvar, prstd, n_stats = fixed_mean.data_ptr(), fixed_rstd.data_ptr(), fixed_rstd.data_ptr(), c
    else:  # var: not written when fixed
        pmean, pvar, prstd, n_stats = mean.data_ptr(), var.data_ptr(), rstd.data_ptr(), n * num_groups
    k = _k(y.numel())
    proto, acc_proto = _PROTO[x.dtype]
    if nhwc:
        shape, entry, rows = (n, s, c), k.gn_fwd_nhwc_at, _samples_per_task(n, s, c)
    else:
        shape = (n * num_groups, c // num_groups, s)
        entry, rows = k.gn_fwd_at, _rows_per_task(shape[0], shape[1] * s)
    _call(entry, x.dtype, proto, acc_proto, x.data_ptr(), pw, pb, y.data_ptr(), pmean, pvar, prstd, n_stats,
          shape, c, float(eps), num_groups, fixed, rows)
    return y, mean, var, rstd


def _backward(dy, x, w, mean, rstd, num_groups, fixed, need_dx):
    """Gradients of GroupNorm (``fixed``: of InstanceNorm with running statistics).

    ``x`` (N, C, S); ``mean``/``rstd`` (N, G), or (C,) when ``fixed``. Returns
    ``(dx, dw, db)``: ``dx`` in ``x``'s kernel layout (None unless
    ``need_dx``), ``dw``/``db`` (C,) in the accumulation dtype.
    """
    n, c, s = x.shape
    acc = _ACC.get(x.dtype, torch.float32)
    nhwc = _use_nhwc(x, fixed)
    x = _kernel_layout(x, nhwc)
    if dy.dtype != x.dtype:
        dy = dy.to(x.dtype)
    dy = _kernel_layout(dy, nhwc)
    dx = torch.empty_like(x) if need_dx else None
    if x.numel() == 0:
        return dx, torch.zeros((c,), dtype=acc), torch.zeros((c,), dtype=acc)
    pw, keep_w = _param_ptr(w, acc)
    mean, rstd = _stats_tensor(mean, acc), _stats_tensor(rstd, acc)
    k = _k(x.numel())
    proto, acc_proto = _PROTO[x.dtype]
    if nhwc:
        shape, entry, rows = (n, s, c), k.gn_bwd_nhwc_at, _samples_per_task(n, s, c)
    else:
        shape = (n * num_groups, c // num_groups, s)
        entry, rows = k.gn_bwd_at, _rows_per_task(shape[0], shape[1] * s)
    px = x.data_ptr()
    dw, db = _call(entry, x.dtype, proto, acc_proto, dy.data_ptr(), px, pw, mean.data_ptr(), rstd.data_ptr(),
                   mean.numel(), dx.data_ptr() if need_dx else px,  # x: a placeholder never written
                   shape, c, num_groups, fixed, bool(need_dx), rows)
    return dx, torch.from_numpy(dw), torch.from_numpy(db)


def _update_running(running_mean, running_var, mean, var, momentum, n_spatial):
    """InstanceNorm's running statistics (C,), in place, from ``mean``/``var`` (N, C) (``kernels.update_running``)."""
    bufs = [t.detach() for t in (running_mean, running_var)]
    work = [t if t.is_contiguous() else t.contiguous() for t in bufs]  # the kernel writes these
    acc = mean.dtype
    _k().update_running(_array(work[0], -1, out=True), _array(work[1], -1, out=True),
                        mean.detach().contiguous().numpy(), var.detach().to(acc).contiguous().numpy(),
                        float(momentum), int(n_spatial))
    for t, w in zip(bufs, work):
        if w is not t:  # a non-contiguous buffer: updated through a copy
            t.copy_(w)


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
# Entry points (called by normlab.functional after its argument checks)
# --------------------------------------------------------------------------


def _kernel_input(x: Tensor, fmt: torch.memory_format) -> Tensor:
    """``x`` as (N, C, S) in a layout the kernels read: NHWC for a channels_last ``fmt``
    (no copy when ``x`` already is), contiguous otherwise (copies only if it must)."""
    n, c = x.shape[0], x.shape[1]
    s = math.prod(x.shape[2:])
    if fmt != torch.contiguous_format:
        x3 = x.contiguous(memory_format=fmt).reshape(n, c, s)
        if x3.is_contiguous() or _is_nhwc(x3):
            return x3
    return x.reshape(n, c, s).contiguous()


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
    return y.reshape(x.shape).contiguous(memory_format=fmt)  # a view (NHWC stays channels_last)


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
