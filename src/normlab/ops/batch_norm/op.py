"""BatchNorm on the ``"cpu"`` kernels: what is this family's own, handed to ``ops/_register``.

Layering (kernel -> launcher -> the op's forms -> entry point), as in ``ops/layer_norm``:

- ``kernels.py``: the Numba kernels, on a 2-D view of the tensor: rows
  ``(M, C)`` or planes ``(N, C * S)`` (see its docstring).
- launchers :func:`_forward` / :func:`_backward`: pick the view, allocate
  outputs in torch's memory format, pass bfloat16/float16 as their bits,
  run the kernel with torch's thread count; :func:`_update_running`.
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

import functools
import threading
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from .. import _register, _transforms
from .._launch import PROTO as _PROTO
from .._launch import call as _call
from .._launch import kernels_loader
from .._launch import param_ptr as _param_ptr
from .._common import acc_dtype
from .reference import (
    _memory_format,
    _stat_shape,
    batch_norm_eval_backward_ref,
    batch_norm_stats,
    check_batched_buffers,
    ref_batch_norm,
    batch_norm_jvp,
    batch_norm_train_backward_ref,
)

# --------------------------------------------------------------------------
# Chunk geometry (depends on the shape only: results are the same bits for
# any number of threads)
# --------------------------------------------------------------------------

FOLD_WIDTH = 2048  # narrow rows are folded: F consecutive rows read as one of <= 2048 values
# ... of <= 256 values in tensors below FOLD_SMALL_ELEMS: each folded column has float64
# partials merged per channel after its sums, a fixed cost per column that a small tensor
# does not amortise (BatchNorm1d(64) on (300, 64), one thread: forward 44 -> 17 us,
# backward 68 -> 26 us; (32768, 32) and larger keep 2048)
FOLD_WIDTH_SMALL = 256
FOLD_SMALL_ELEMS = 1 << 17
COLUMN_BLOCK = 2048  # columns per task: scratch sums stay in L1, rows are read in runs of 8 KB or more
CHUNK_ELEMS = 65536  # values per chunk: two passes over it stay in cache (256 KB of float32)
MAX_CHUNK_ROWS = 256  # rows a per-column float sum adds one by one
TASK_ELEMS = 1 << 19  # values per task (a group of chunks merged by one task)
LOCAL_ELEMS = 1 << 18  # a column block of every row up to this size is one task, in cache (1 MB of float32)
MIN_LOCAL_RUN = 1024  # ... if it reads runs of at least this many values per row


@functools.lru_cache(maxsize=256)
def geometry(n_rows: int, width: int, s_len: int, local_elems: int) -> tuple[int, int, int, int, bool]:
    """``(fold, cw, sub, group, local)`` for the ``(R, C * S)`` view. Depends on the shape only
    (the forward and the backward may differ: they share no partial sums).

    - ``fold``: the largest divisor ``F`` of ``R`` with ``F * width <=``
      :data:`FOLD_WIDTH` (:data:`FOLD_WIDTH_SMALL` below :data:`FOLD_SMALL_ELEMS`) -- narrow rows (``(N, C)`` or channels-last with few
      channels) are read ``F`` at a time as one row of the ``(R / F, F * width)``
      view, so that loops run over thousands of values instead of a few dozen.
    - ``local``: a block of whole channels, every row of them at most
      ``local_elems`` values (:data:`LOCAL_ELEMS` for the forward, half that for
      the backward, which reads ``x`` and ``dy``) in runs of at least
      :data:`MIN_LOCAL_RUN` (contiguous NCHW with a batch of modest size), is one
      task: the statistics (the sums), then the normalisation (``dx``) while
      the block is in cache -- one read of the input from memory instead of
      two. ``cw`` is then the block's columns. (Training forward and backward
      only: evaluation's forward is a single pass in memory order.)
    - otherwise tasks of about :data:`TASK_ELEMS` values: ``group`` chunks of
      ``sub`` rows by ``cw`` (at most :data:`COLUMN_BLOCK`) columns, each task
      writing one float64 partial per column, merged after.

    Chunks hold about :data:`CHUNK_ELEMS` values and at most :data:`MAX_CHUNK_ROWS` rows.
    """
    fold = 1
    fold_width = FOLD_WIDTH if n_rows * width >= FOLD_SMALL_ELEMS else FOLD_WIDTH_SMALL
    for f in range(min(n_rows, max(1, fold_width // width)), 1, -1):
        if n_rows % f == 0:
            fold = f
            break
    n_rows, width = n_rows // fold, width * fold
    n_ch = width // s_len
    per_block = max(1, min(n_ch, local_elems // max(1, n_rows * s_len), -(-COLUMN_BLOCK // s_len)))
    if fold == 1 and n_rows * s_len <= local_elems and per_block * s_len >= MIN_LOCAL_RUN:
        n_blocks = -(-n_ch // per_block)
        cw = -(-n_ch // n_blocks) * s_len  # whole channels, split evenly
        sub = max(1, min(MAX_CHUNK_ROWS, n_rows, CHUNK_ELEMS // cw))
        return fold, cw, sub, -(-n_rows // sub), True
    n_cb = max(1, -(-width // COLUMN_BLOCK))
    cw = max(1, -(-width // n_cb))
    sub = max(1, min(MAX_CHUNK_ROWS, n_rows, CHUNK_ELEMS // cw))
    group = max(1, TASK_ELEMS // (sub * cw))
    return fold, cw, sub, group, False


# --------------------------------------------------------------------------
# Views and launchers
# --------------------------------------------------------------------------

_k = kernels_loader(__package__)  # kernels.py, imported (numba and all) on first use

_scratch = threading.local()  # .work: this thread's float64 scratch for the kernels' partials


def _work(n_rows: int, width: int, sub: int, group: int, needed: bool):
    """``(2, G, W)`` float64 scratch for a kernel's per-task partials (G row groups).

    Kept between calls (per thread; it only grows): freeing and reallocating a
    megabyte each call hands the kernel fresh pages, whose page faults cost
    more than the reads they hold.
    """
    if not needed:
        return np.empty((2, 0, 0))
    n_rg = -(-n_rows // (sub * group))
    size = 2 * n_rg * width
    buf = getattr(_scratch, "work", None)
    if buf is None or buf.size < size:
        buf = _scratch.work = np.empty(size)
    return buf[:size].reshape(2, n_rg, width)


def _canonical(x: Tensor) -> Tensor:
    """``x`` in the memory format of torch's output for it (a copy only if it is not already)."""
    if x.is_contiguous():  # the common cases first: no Python walk over the strides
        return x
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return x
    return x.contiguous(memory_format=_memory_format(x))


def _dims(t: Tensor, n_ch: int) -> tuple:
    """``(R, W, S)``: the kernels' 2-D view ``(R, W = C * S)`` of a canonical ``t``.

    Rows view ``(M, C)``, ``S = 1``, for ``(N, C)`` and channels-last tensors
    (``(N, *spatial, C)`` in memory); planes view ``(N, C * S)`` for contiguous
    ``(N, C, *spatial)``, channel ``c`` at columns ``c*S .. c*S+S``. Either is
    ``t``'s storage read in memory order; the kernels get its address.
    """
    numel = t.numel()
    if t.dim() > 2 and t.stride(1) == 1:  # channels-last: channels innermost
        return numel // n_ch, n_ch, 1
    n = t.shape[0]
    return n, numel // n, numel // (n * n_ch)


def _forward(x, w, b, running_mean, running_var, training, eps):
    """Run the forward kernel on ``x`` (canonical, non-empty); returns ``(y, stats)``.

    ``y`` has ``x``'s strides. ``stats`` (3, C) float64 numpy array: rows mean,
    biased var, rstd -- the batch's in training, the running ones in evaluation.
    """
    n_ch = x.shape[1]
    acc = acc_dtype(x.dtype)
    y = torch.empty_like(x)
    n_rows, width, s = _dims(x, n_ch)
    sn = np.empty((3, n_ch))
    if not training:
        for row, r in ((0, running_mean), (1, running_var)):
            r = r.detach()
            sn[row] = (r if r.dtype in (torch.float32, torch.float64) else r.float()).numpy()
    fold, cw, sub, group, local = geometry(n_rows, width, s, LOCAL_ELEMS)
    n_rows, width = n_rows // fold, width * fold  # fold consecutive rows into one
    work = _work(n_rows, width, sub, group, training)
    pw, keep_w = _param_ptr(w, acc)
    pb, keep_b = _param_ptr(b, acc)
    proto, acc_proto = _PROTO[x.dtype]
    _call(
        _k(x.numel()).bn_fwd_at, x.dtype, proto, acc_proto, x.data_ptr(), y.data_ptr(), pw, pb, n_ch, sn,
        work, float(eps), n_rows, width, s, cw, sub, group, bool(local), bool(training),
    )
    return y, sn


def _backward_arrays(dy, x, w, stats, training, need_dx, need_wb):
    """Run the backward kernel; returns ``(dx, dw, db)``: dx in ``x``'s strides (empty (0,) unless
    ``need_dx``), dw/db (C,) float64 numpy arrays (empty (0,) unless ``training`` or ``need_wb``).

    ``x`` is the forward's canonical input, ``stats`` its (3, C) float64 statistics
    (a numpy array or a tensor).
    """
    n_ch = x.shape[1]
    acc = acc_dtype(x.dtype)
    if dy.dtype != x.dtype:
        dy = dy.to(x.dtype)
    if dy.stride() != x.stride():
        dy = dy.contiguous(memory_format=_memory_format(x))
        if dy.stride() != x.stride():  # size-1 dims: strides that differ only there
            dy = torch.empty_like(x).copy_(dy)
    dx = torch.empty_like(x) if need_dx else x.new_empty((0,))
    if isinstance(stats, torch.Tensor):
        stats = stats.numpy()
    n_rows, width, s = _dims(x, n_ch)
    fold, cw, sub, group, local = geometry(n_rows, width, s, LOCAL_ELEMS // 2)
    n_rows, width = n_rows // fold, width * fold
    work = _work(n_rows, width, sub, group, training or need_wb)
    pw, keep_w = _param_ptr(w, acc)
    proto, acc_proto = _PROTO[x.dtype]
    pdy = dy.data_ptr()
    db, dw = _call(
        _k(x.numel()).bn_bwd_at, x.dtype, proto, acc_proto, pdy, x.data_ptr(),
        dx.data_ptr() if need_dx else pdy,  # dy: a placeholder never written
        pw, n_ch, stats, work, n_rows, width, s, cw, sub, group, bool(local), bool(training),
        bool(need_dx), bool(need_wb),
    )
    return dx, dw, db


def _backward(dy, x, w, stats, training, need_dx, need_wb):
    """:func:`_backward_arrays` with dw/db as (C,) float64 tensors (the custom op's outputs)."""
    dx, dw, db = _backward_arrays(dy, x, w, stats, training, need_dx, need_wb)
    return dx, torch.from_numpy(dw), torch.from_numpy(db)


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def _to(a, dtype: torch.dtype) -> Tensor:
    """A float64 array as a tensor of ``dtype``: rounded by numpy for float32/float64 (the same
    round-to-nearest-even as ``Tensor.to``, at a fraction of its per-call cost), by torch otherwise."""
    np_dtype = _NUMPY.get(dtype)
    if np_dtype is not None:
        return torch.from_numpy(a.astype(np_dtype, copy=False))
    return torch.from_numpy(a).to(dtype)


def _update_running(running_mean, running_var, stats, n, momentum):
    """``running = (1 - momentum) * running + momentum * stat`` in place (unbiased var), float64 blend.

    ``stats``: the forward's (3, C) float64 statistics, a numpy array.
    """
    rm, rv = running_mean, running_var  # buffers: no autograd history to detach from
    dense = rm.is_contiguous() and rv.is_contiguous() and rm.dtype == rv.dtype
    if not dense:  # float64 copies: blended in float64 and rounded once, by copy_, as in place
        rm, rv = rm.detach().to(torch.float64, copy=True), rv.detach().to(torch.float64, copy=True)
    # written through their addresses: the version counters do not move (see the module docstring)
    proto = _PROTO[rm.dtype][0]
    _call(_k().update_running_at, rm.dtype, proto, rm.data_ptr(), rv.data_ptr(), rm.shape[0], stats, int(n),
          float(momentum))
    if not dense:
        with torch.no_grad():
            running_mean.copy_(rm)
            running_var.copy_(rv)


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
