"""GroupNorm / InstanceNorm launchers: hand tensors to the kernels (``kernels.py``, ``kernels_nhwc.py``).

:func:`_forward`, :func:`_backward`, :func:`_update_running` allocate outputs,
pass bfloat16/float16 tensors as their bits (``ops/_bf16.py``), pick the NCHW
or the NHWC kernel from ``x``'s layout (NHWC also for every ``S == 1`` input:
:func:`_use_nhwc`) and run it in the version that fits the size
(``ops/_launch.use_parallel``). :func:`_kernel_input` settles an input's
layout first. ``op.py`` builds the op's forms on these.

The kernels take ``x`` as ``(N, C, S)``, either contiguous (NCHW) or with
channels_last strides ``(S*C, 1, C)`` (NHWC).
"""

import math

import torch
from torch import Tensor

from .. import _launch
from .._launch import bits as _bits
from .._launch import PROTO as _PROTO
from .._launch import call as _call
from .._launch import kernels_loader
from .._launch import param_ptr as _param_ptr

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


def _s1_blocks(k, shape, num_groups: int, fixed: bool, backward: bool, acc: torch.dtype) -> bool:
    """Whether the S == 1 small-group block kernels take an NHWC input of ``shape`` (N, S, C)
    (``kernels_nhwc.takes_s1_blocks``, from the shape only). Chosen here rather than inside the
    per-channel kernels, so that each kind compiles only when an input takes it."""
    _, s, c = shape
    return k.takes_s1_blocks(s, c, c // num_groups, fixed, backward, acc.itemsize)


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
    y = _launch.empty_like(x)  # x's (kernel) layout
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
        shape, rows = (n, s, c), _samples_per_task(n, s, c)
        entry = k.gn_fwd_s1_at if _s1_blocks(k, shape, num_groups, fixed, False, acc) else k.gn_fwd_nhwc_at
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
    dx = _launch.empty_like(x) if need_dx else None
    if x.numel() == 0:
        return dx, torch.zeros((c,), dtype=acc), torch.zeros((c,), dtype=acc)
    pw, keep_w = _param_ptr(w, acc)
    mean, rstd = _stats_tensor(mean, acc), _stats_tensor(rstd, acc)
    k = _k(x.numel())
    proto, acc_proto = _PROTO[x.dtype]
    if nhwc:
        shape, rows = (n, s, c), _samples_per_task(n, s, c)
        entry = k.gn_bwd_s1_at if _s1_blocks(k, shape, num_groups, fixed, True, acc) else k.gn_bwd_nhwc_at
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
