"""BatchNorm launchers: the chunk geometry, and handing tensors to the kernels (``kernels.py``).

:func:`geometry` splits the work by the shape only (the same bits for any
number of threads); :func:`_forward` / :func:`_backward` pick the 2-D view,
allocate outputs in torch's memory format, pass bfloat16/float16 as their
bits, and run the kernel in the version that fits the size
(``ops/_launch.use_parallel``); :func:`_update_running` blends the batch
statistics into the running ones through their addresses. ``op.py`` builds the
op's forms on these.
"""

import functools
import threading

import numpy as np
import torch
from torch import Tensor

from .._launch import PROTO as _PROTO
from .._launch import call as _call
from .._launch import empty_like as _empty_like
from .._launch import kernels_loader
from .._launch import param_ptr as _param_ptr
from .._common import acc_dtype
from .reference import _memory_format

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
    y = _empty_like(x)
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
            dy = _empty_like(x).copy_(dy)
    dx = _empty_like(x) if need_dx else x.new_empty((0,))
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
