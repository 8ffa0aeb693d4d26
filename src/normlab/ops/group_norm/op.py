"""GroupNorm / InstanceNorm ops: the ``"cpu"`` kernels as torch.library custom ops, and the entry points.

Layering (kernel -> launcher -> custom op -> entry point), as in ``ops/layer_norm``:

- ``kernels.py``: the Numba kernels, on numpy views of the tensors.
- launchers :func:`_forward`, :func:`_backward`, :func:`_update_running`:
  allocate outputs, pass bfloat16/float16 tensors as their bits
  (``ops/_bf16.py``), pick the NCHW or the NHWC kernel from ``x``'s layout
  (NHWC also for every ``S == 1`` input: :func:`_use_nhwc`), run with torch's
  thread count.
- custom ops (each with a fake implementation, so ``torch.compile(fullgraph=True)``
  traces them as single nodes):

  - ``normlab::group_norm_fwd`` -> ``(y, mean, var, rstd)``, with
    ``register_autograd``; InstanceNorm in training uses it with ``G = C``;
  - ``normlab::group_norm_bwd`` (not differentiable itself);
  - ``normlab::instance_norm_eval_fwd`` / ``normlab::instance_norm_eval_bwd``:
    InstanceNorm with the running statistics (a per-channel linear map);
  - ``normlab::instance_norm_update_stats``: the in-place running-statistics
    update, declared with ``mutates_args`` (torch.compile functionalises it; a
    mutating op cannot carry ``register_autograd``, hence its own op).

- :class:`CpuGroupNormFunction`, :class:`CpuInstanceNormEvalFunction`: the same
  launchers and backward as ``autograd.Function`` s for eager calls (the
  ``torch.library`` dispatch costs tens of microseconds a call).
- entry points :func:`group_norm`, :func:`instance_norm` (called by
  ``normlab.functional``): the reference path (``reference.py``) for
  ``backend="ref"`` and for empty inputs; for ``"cpu"``, the custom ops while
  ``torch.compile`` traces, the Functions when autograd records, the
  launchers alone otherwise (inference: no Function at all).

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

from .. import _numba, _transforms
from .._launch import bits as _bits
from .._launch import PROTO as _PROTO
from .._launch import call as _call
from .._launch import fast_apply, kernels_loader
from .._launch import records as _records
from .._launch import param_ptr as _param_ptr
from .._common import acc_dtype, empty_output, to_acc
from .reference import (
    GroupNormFunction,
    InstanceNormEvalFunction,
    _grouped,
    _per_channel,
    group_norm_backward_ref,
    group_norm_jvp,
    group_norm_stats,
    instance_norm_eval_backward_ref,
    output_memory_format,
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
    """Samples per task of the NHWC kernels: the chunk of ``_numba.rows_per_chunk`` over the
    ``N*S`` rows of ``C`` channels (~64K values, at least 16 rows), in whole samples.

    From the shape only, never the thread count: the backward's dw/db are
    per-task partials merged in task order, so the chunks fix the bits.
    """
    return max(1, min(n, -(-_numba.rows_per_chunk(n * s, c) // max(s, 1))))


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
        elif not t.is_inference():
            torch.autograd.graph.increment_version(t)  # written through numpy: tell autograd


# --------------------------------------------------------------------------
# Custom ops
# --------------------------------------------------------------------------


def _stats_like(x: Tensor, *shape) -> Tensor:
    return x.new_empty(shape, dtype=acc_dtype(x.dtype))


@torch.library.custom_op("normlab::group_norm_fwd", mutates_args=(), device_types="cpu")
def group_norm_fwd(
    x: Tensor, w: Optional[Tensor], b: Optional[Tensor], num_groups: int, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """GroupNorm of ``x`` (N, C, S), contiguous or NHWC: ``(y, mean, var, rstd)``, stats (N, G)."""
    return _forward(x, w, b, num_groups, eps, one_buffer=False)


@group_norm_fwd.register_fake
def _(x, w, b, num_groups, eps):
    n = x.shape[0]
    y = torch.empty_like(x) if _is_nhwc(x) else torch.empty_like(x, memory_format=torch.contiguous_format)
    return y, _stats_like(x, n, num_groups), _stats_like(x, n, num_groups), _stats_like(x, n, num_groups)


@torch.library.custom_op("normlab::group_norm_bwd", mutates_args=(), device_types="cpu")
def group_norm_bwd(
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


@group_norm_bwd.register_fake
def _(dy, x, w, mean, rstd, num_groups, need_dx):
    if not need_dx:
        return x.new_empty((0,)), _stats_like(x, x.shape[1]), _stats_like(x, x.shape[1])
    dx = torch.empty_like(x) if _is_nhwc(x) else torch.empty_like(x, memory_format=torch.contiguous_format)
    return dx, _stats_like(x, x.shape[1]), _stats_like(x, x.shape[1])


@torch.library.custom_op("normlab::instance_norm_eval_fwd", mutates_args=(), device_types="cpu")
def instance_norm_eval_fwd(
    x: Tensor, w: Optional[Tensor], b: Optional[Tensor], mean: Tensor, rstd: Tensor
) -> Tensor:
    """InstanceNorm of contiguous ``x`` (N, C, S) with fixed per-channel ``mean``/``rstd`` (C,)."""
    y, _, _, _ = _forward(x, w, b, x.shape[1], 0.0, mean, rstd)
    return y


@instance_norm_eval_fwd.register_fake
def _(x, w, b, mean, rstd):
    return x.new_empty(x.shape)


@torch.library.custom_op("normlab::instance_norm_eval_bwd", mutates_args=(), device_types="cpu")
def instance_norm_eval_bwd(
    dy: Tensor, x: Tensor, w: Optional[Tensor], mean: Tensor, rstd: Tensor, need_dx: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dx, dw, db)`` of InstanceNorm with fixed statistics (``dx`` empty unless ``need_dx``)."""
    dx, dw, db = _backward(dy, x, w, mean, rstd, x.shape[1], True, need_dx)
    return (dx if dx is not None else x.new_empty((0,))), dw, db


@instance_norm_eval_bwd.register_fake
def _(dy, x, w, mean, rstd, need_dx):
    dx = x.new_empty(x.shape) if need_dx else x.new_empty((0,))
    return dx, _stats_like(x, x.shape[1]), _stats_like(x, x.shape[1])


@torch.library.custom_op(
    "normlab::instance_norm_update_stats",
    mutates_args=("running_mean", "running_var"),
    device_types="cpu",
)
def instance_norm_update_stats(
    running_mean: Tensor, running_var: Tensor, mean: Tensor, var: Tensor, momentum: float, n_spatial: int
) -> None:
    """``running = (1 - momentum) * running + momentum * batch average`` of ``mean`` / unbiased ``var`` (N, C)."""
    _update_running(running_mean, running_var, mean, var, momentum, n_spatial)


@instance_norm_update_stats.register_fake
def _(running_mean, running_var, mean, var, momentum, n_spatial):
    return None


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


group_norm_fwd.register_autograd(_group_norm_backward, setup_context=_group_norm_setup)
instance_norm_eval_fwd.register_autograd(_instance_norm_eval_backward, setup_context=_instance_norm_eval_setup)


class CpuGroupNormFunction(torch.autograd.Function):
    """``normlab::group_norm_fwd``'s eager twin: same launchers and backward, no dispatcher.

    ``x`` (N, C, S), contiguous or NHWC. Returns ``(y, mean, var)``; ``mean``
    and ``var`` (N, G) are non-differentiable (InstanceNorm's running
    statistics read them).
    """

    @staticmethod
    def forward(ctx, x, w, b, num_groups, eps):
        y, mean, var, rstd = _forward(x, w, b, num_groups, eps)
        _setup(ctx, x, w, b, mean, rstd, num_groups, eps, False)
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3], eager=True)
        return dx, dw, db, None, None


class CpuInstanceNormEvalFunction(torch.autograd.Function):
    """``normlab::instance_norm_eval_fwd``'s eager twin: fixed per-channel ``mean``/``rstd`` (C,)."""

    @staticmethod
    def forward(ctx, x, w, b, mean, rstd):
        y, _, _, _ = _forward(x, w, b, x.shape[1], 0.0, mean, rstd)
        _setup(ctx, x, w, b, mean, rstd, x.shape[1], 0.0, True)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3], eager=True)
        return dx, dw, db, None, None


class _TransformGroupNorm(torch.autograd.Function):
    """GroupNorm of ``x`` (N, C, S) on the kernels under torch.func transforms and forward-mode AD
    (``ops/_transforms.py``); with ``mean``/``rstd`` (C,) given, InstanceNorm with those fixed
    statistics. Returns ``(y, mean, var)``: the group statistics (N, G), not differentiable
    (empty with fixed statistics)."""

    @staticmethod
    def forward(x, w, b, num_groups, eps, fixed_mean, fixed_rstd):
        if fixed_mean is None:
            y, mean, var, _ = _forward(x, w, b, num_groups, eps, one_buffer=False)
            return y, mean, var
        y = _forward(x, w, b, num_groups, 0.0, fixed_mean, fixed_rstd)[0]
        empty = fixed_mean.new_empty((x.shape[0], 0))
        return y, empty, empty.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, num_groups, eps, fixed_mean, fixed_rstd = inputs
        _, mean, var = output
        fixed = fixed_mean is not None
        rstd = fixed_rstd if fixed else torch.rsqrt(var + eps)  # as the kernel's
        _setup(ctx, x, w, b, fixed_mean if fixed else mean, rstd, num_groups, eps, fixed)
        ctx.save_for_forward(x, w, fixed_mean if fixed else mean, rstd)
        ctx.mark_non_differentiable(mean, var)

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = _grads(ctx, dy, x, w, mean, rstd, ctx.needs_input_grad[:3], eager=True)
        return dx, dw, db, None, None, None, None

    @staticmethod
    def jvp(ctx, xt, wt, bt, _g_t, _eps_t, _mean_t, _rstd_t):
        x, w, mean, rstd = ctx.saved_tensors
        g = ctx.num_groups
        stat = (1, g, 1, 1) if ctx.fixed else (x.shape[0], g, 1, 1)
        yt = group_norm_jvp(_grouped(x, g), _per_channel(w, g), mean.reshape(stat), rstd.reshape(stat),
                            _grouped(xt, g) if xt is not None else None, _per_channel(wt, g),
                            _per_channel(bt, g), fixed=ctx.fixed)
        return (None if yt is None else yt.reshape(x.shape)), None, None

    @staticmethod
    def vmap(info, in_dims, x, w, b, num_groups, eps, fixed_mean, fixed_rstd):
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
            y, mean, var = _TransformGroupNorm.apply(
                x2, channels(w, in_dims[1]), channels(b, in_dims[2]), n * c, eps,
                channels(fixed_mean, in_dims[5]), channels(fixed_rstd, in_dims[6]))
            return (y.view(bn, n, c, s), mean.new_empty((n, bn, 0)), var.new_empty((n, bn, 0))), (1, 0, 0)
        x2 = xb.reshape(n * bn, c, s).contiguous()  # (B*N, C, S)
        if in_dims[1] is None and in_dims[2] is None:
            y, mean, var = _TransformGroupNorm.apply(x2, w, b, num_groups, eps, None, None)
            y = y.reshape(n, bn, c, s)
        else:
            y, mean, var = _TransformGroupNorm.apply(x2, None, None, num_groups, eps, None, None)
            y = to_acc(y.reshape(n, bn, c, s))
            if w is not None:
                y = y * to_acc(_transforms.front(w, in_dims[1], n)).reshape(n, 1, c, 1)
            if b is not None:
                y = y + to_acc(_transforms.front(b, in_dims[2], n)).reshape(n, 1, c, 1)
            y = y.to(x.dtype)
        return (y, mean.view(n, bn, -1), var.view(n, bn, -1)), (0, 0, 0)


def _update_running_ops(running_mean, running_var, mean, var, momentum, n_spatial):
    """InstanceNorm's running-statistic update in torch ops (under transforms: batched buffers
    update per member): the batch average of the per-instance mean and unbiased variance."""
    with torch.no_grad():
        acc = mean.dtype
        mean_stat = mean.mean(dim=0)  # (C,)
        var_stat = (var * (n_spatial / (n_spatial - 1))).mean(dim=0)  # (C,) unbiased
        running_mean.copy_((1 - momentum) * running_mean.to(acc) + momentum * mean_stat)
        running_var.copy_((1 - momentum) * running_var.to(acc) + momentum * var_stat)


_gn_apply = fast_apply(CpuGroupNormFunction)
_in_eval_apply = fast_apply(CpuInstanceNormEvalFunction)


# --------------------------------------------------------------------------
# Entry points (called by normlab.functional after its argument checks)
# --------------------------------------------------------------------------


def _eager() -> bool:
    """True outside ``torch.compile`` tracing: use the Functions, not the custom ops."""
    return not torch.compiler.is_compiling()


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


def group_norm(x, num_groups, w, b, eps, backend="ref"):
    """GroupNorm of an ``(N, C, *)`` ``x`` with ``num_groups`` groups (arguments already checked)."""
    fmt = output_memory_format(x)
    if backend == "cpu" and x.numel() > 0:
        x3 = _kernel_input(x, fmt)  # (N, C, S)
        if _transforms.active():
            y = _TransformGroupNorm.apply(x3, w, b, num_groups, eps, None, None)[0]
        elif not _eager():
            y, _, _, _ = group_norm_fwd(x3, w, b, num_groups, eps)
        elif _records(x, w, b):
            y, _, _ = _gn_apply(x3, w, b, num_groups, eps)
        else:  # nothing to differentiate: the launcher alone
            y, _, _, _ = _forward(x3, w, b, num_groups, eps)
        return y.reshape(x.shape).contiguous(memory_format=fmt)  # a view (NHWC stays channels_last)
    y, _, _ = _transforms.pick(GroupNormFunction).apply(
        _grouped(x, num_groups), _per_channel(w, num_groups), _per_channel(b, num_groups), eps
    )
    # The grouped view may keep x's strides (a view, not a copy), and elementwise
    # ops keep them too: settle the layout torch gives, once, at the end.
    return y.reshape(x.shape).contiguous(memory_format=fmt)


def instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, eps, backend="ref"):
    """InstanceNorm of an ``(N, C, *spatial)`` ``x`` (arguments already checked).

    ``use_input_stats=True``: GroupNorm with one group per channel; when
    running statistics are given they are updated in place, under
    ``torch.no_grad()``, with the batch average of the per-instance mean and
    unbiased variance::

        running_mean = (1 - momentum) * running_mean + momentum * mean_n(mean)
        running_var  = (1 - momentum) * running_var  + momentum * mean_n(var * S / (S - 1))

    ``use_input_stats=False``: ``(x - running_mean) / sqrt(running_var + eps) * w + b``.
    The output is contiguous.
    """
    c = x.shape[1]
    if c == 0:  # no channels: an empty output, as torch gives (nothing to normalise or update)
        return empty_output(x, w, b)
    if backend == "cpu" and x.numel() > 0:
        n, s = x.shape[0], math.prod(x.shape[2:])
        x3 = x.reshape(n, c, s).contiguous()  # (N, C, S); torch's output is contiguous
        if use_input_stats and _transforms.active():
            y, mean, var = _TransformGroupNorm.apply(x3, w, b, c, eps, None, None)
            if running_mean is not None:
                _update_running_ops(running_mean, running_var, mean, var, momentum, s)
        elif use_input_stats:
            if _eager():
                if _records(x, w, b):
                    y, mean, var = _gn_apply(x3, w, b, c, eps)
                else:
                    y, mean, var, _ = _forward(x3, w, b, c, eps)
                if running_mean is not None:
                    _update_running(running_mean, running_var, mean, var, momentum, s)
            else:
                y, mean, var, _ = group_norm_fwd(x3, w, b, c, eps)
                if running_mean is not None:
                    instance_norm_update_stats(running_mean, running_var, mean, var, momentum, s)
        else:
            with torch.no_grad():  # constants of the map; a copy, safe from later buffer updates
                acc = acc_dtype(x.dtype)
                mean = running_mean.to(acc, copy=True)  # (C,)
                rstd = torch.rsqrt(running_var.to(acc) + eps)  # (C,)
            if _transforms.active():
                y = _TransformGroupNorm.apply(x3, w, b, c, 0.0, mean, rstd)[0]
            elif not _eager():
                y = instance_norm_eval_fwd(x3, w, b, mean, rstd)
            elif _records(x, w, b):
                y = _in_eval_apply(x3, w, b, mean, rstd)
            else:
                y, _, _, _ = _forward(x3, w, b, c, 0.0, mean, rstd)
        return y.reshape(x.shape)
    x4 = _grouped(x, c)  # (N, C, 1, S)
    w3, b3 = _per_channel(w, c), _per_channel(b, c)  # (C, 1, 1)
    if use_input_stats:
        y, mean, var = _transforms.pick(GroupNormFunction).apply(x4, w3, b3, eps)
        if running_mean is not None and x.numel() > 0:  # an empty batch leaves them as they are, as in torch
            n = x4.shape[0]
            _update_running_ops(running_mean, running_var, mean.reshape(n, c), var.reshape(n, c), momentum,
                                x4.shape[3])
    else:
        with torch.no_grad():  # the running statistics are constants of this map
            # (a copy: the backward must not see later in-place updates of the buffer)
            mean = to_acc(running_mean).reshape(1, c, 1, 1).clone()  # (1, C, 1, 1)
            rstd = torch.rsqrt(to_acc(running_var).reshape(1, c, 1, 1) + eps)  # (1, C, 1, 1)
        y = _transforms.pick(InstanceNormEvalFunction).apply(x4, w3, b3, mean, rstd)
    return y.reshape(x.shape).contiguous()  # torch's instance_norm output is contiguous
