"""Numba kernels of the ``"cpu"`` backend for GroupNorm and InstanceNorm.

Every kernel sees the input as ``(N, C, S)`` (``S`` = product of the spatial
dims) in one of two memory layouts:

- NCHW (contiguous): :func:`gn_fwd` / :func:`gn_bwd` take ``x`` as
  ``(N*G, Cg, S)`` -- one *group* per row: ``Cg = C / G`` channels of ``S``
  values, contiguous. A task owns a fixed chunk of rows.
- NHWC (channels_last, and every input with ``S == 1``, where the two layouts
  are the same memory): :func:`gn_fwd_nhwc` / :func:`gn_bwd_nhwc` take ``x``
  as ``(N, S, C)`` -- channels fastest, a fixed chunk of samples per task;
  the task keeps per-channel vectors (sums, shifts, scales) of length ``C``,
  so every inner loop runs over contiguous channels. (The NCHW kernels would
  loop over a channel's ``S`` values: loops of length 1 when ``S == 1``.)

InstanceNorm is GroupNorm with ``G = C``; with fixed (running) statistics
(``fixed=True``) the kernels read ``mean``/``rstd`` per channel instead of
computing them, and the backward keeps only the first term.

One source is compiled for each storage type of ``x`` (float32, float64,
int16 = bfloat16 bits, uint16 = float16 bits: see ``ops/_bf16.py``); the
accumulation dtype is that of ``w`` (float64 for float64, float32 otherwise).

Statistics: the shifted two-pass method of ``ops/_common.shifted_mean_var``::

    shift = x[n, g*Cg, 0]              the group's first value
    d     = x - shift                  exact when x and shift are close
    mean  = shift + mean(d)
    var   = mean((d - mean(d))^2)      biased; second pass over d in cache
    y     = (d - mean(d)) * (rstd * w[c]) + b[c]

so a constant group gives exactly ``b`` and a group with a large mean keeps
its digits. NCHW: a group of up to :data:`CACHED` values is read from ``x``
once, into a scratch copy of ``d`` in the accumulation dtype (L1/L2); the
second pass and the output run over that copy. A larger group streams
through :data:`TILE`-value tiles, re-reading ``x`` for each pass.

Memory traffic per element: forward reads x, writes y; backward reads x and
dy, writes dx; dw/db through partials: (N, C) in NCHW, (tasks, C) in NHWC.

Vectorisation: the sums (:func:`_sum`, :func:`_sqdev`, :func:`_dot`, the
fused first passes :func:`_shift_row`, :func:`_grad_row`, and the NHWC
kernels' per-group sums of per-channel vectors :func:`_group_sums`,
:func:`_group_dots`) are the only code compiled with
``fastmath={"reassoc"}``, which lets LLVM split a sum into SIMD lanes
(:func:`_sqdev` also with ``"contract"``: fused multiply-adds). Every
difference they sum is a stored value of its own (``d``, ``x - mean``) or a
two-operand difference, so reassociation cannot rewrite ``(x - shift) -
mean(d)`` into ``x - (shift + mean(d))``; the large-mean tests guard this.
The order is fixed by the compiled code, not by threads. Everything else has
fastmath off: NaN and Inf propagate as in torch. (The NHWC kernels' sums
over ``s`` run per channel, in order, across SIMD lanes of channels: they
need no reassociation.)

Backward, with ``g = dy * w[c]`` and ``x_hat = (x - mean) * rstd``::

    dx = rstd * ( g                              # term 1: through x directly
                  - mean_grp(g)                  # term 2: through the mean
                  - x_hat * mean_grp(g * x_hat)) # term 3: through the variance
    dw[c] = sum over n, s of dy * x_hat,   db[c] = sum over n, s of dy

computed as ``dy * (rstd * w[c]) - (x - mean) * t3 - t2`` with the group's
``t2 = rstd * mean_grp(g)`` and ``t3 = rstd^2 * mean_grp(g * x_hat)``.
Both group means come from the per-(n, c) sums ``sum_s dy`` and
``sum_s dy * (x - mean)``, which also make dw/db:

- NCHW: each is written by the one task that owns ``(n, c)`` into an
  ``(N, C)`` array of partials (a sample's group rows may span two tasks);
- NHWC: a task adds those of its own samples, in order, into its own ``(C,)``
  partials (accumulation dtype), written to an ``(n_tasks, C)`` array: with
  ``S == 1`` a task's ~64K values are >= 16 samples, so the partials are at
  least 16 times smaller than ``x`` (per-(n, c) partials would be as large).
  The ``S == 1`` small-group block kernels (``kernels_nhwc.gn_bwd_s1``) first add
  into one slot per sample position of a block, then the slots in slot order,
  into the same ``(n_tasks, C)`` array.

Either way the rows of partials are then summed in row order, in float64,
in parallel over blocks of channels (:func:`_merge_rows`). The chunks of
rows and samples depend on the shape only (``launch.py``), so results are
bitwise the same for any number of threads.

Float16/bfloat16/float32 accumulate in float32, float64 in float64; outputs
are rounded once.

This module imports numba: ``launch.py`` loads it on first use.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._bf16 import acc_cast, acc_zero, load, store
from .._jit import helper, kernel
from .._ptr import at, params_at
from .._rows import grad_sums as _grad_sums
from .._rows import inf_signs, torch_mean
from .._rows import shift_row as _shift_row
from .._rows import sqdev as _sqdev
from .._simd import prefetch as _prefetch
from .._simd import wide as _wide


@helper
def _prefetch_row(a, r, n):
    """Prefetch the first ``n`` values of row ``r`` of the 2-D ``a``, at most 4 KiB (64 lines).

    Called once a group is in scratch: the next group's lines arrive while
    this one's second pass and output run (the hardware prefetcher alone
    waits for the next misses). Measured: ~10 % off the (256, 256, 8, 8) forward.
    """
    step = 64 // a.itemsize  # values per cache line
    for j in range(0, min(n, 64 * step), step):
        _prefetch(a, r, j)


# A group of up to CACHED values is kept in scratch (16K float32 = 64 KiB, in L2)
# and read from x once; a larger group streams through TILE-value tiles (8 KiB,
# in L1), re-reading x.
CACHED = 16384
TILE = 2048
# The backward's first pass fuses copy and sums for channels of at least this
# many values (faster there). Shorter channels take no scratch: the sums read x
# and dy, and dx reads them again from L1 (bfloat16 (256, 256, 8, 8) backward,
# 2 threads: ~1.20 -> ~1.12 ms; float32 ~1.23 -> ~1.20 ms).
FUSE_MIN = 256

# Sums below are compiled with @helper(sums=True) (SUM_OPTIONS): LLVM may split them into SIMD lanes
# (reassociation only; see the module docstring).


@helper(sums=True)
def _sum(a, n):
    """sum_{j < n} a_j of a 1-D scratch array."""
    _wide()
    s = acc_zero(a)
    for j in range(n):
        s += a[j]
    return s


@helper(sums=True)
def _dot(a, b, n):
    """sum_{j < n} a_j * b_j of two 1-D scratch arrays."""
    _wide()
    s = acc_zero(a)
    for j in range(n):
        s += a[j] * b[j]
    return s


@helper(sums=True)
def _grad_row(dy, x, r, k, m, u, v):
    """``u[k, j] = dy[r, k, j]``, ``v[k, j] = x[r, k, j] - m``; returns ``(sum(u[k]), sum(u[k] * v[k]))``.

    Stores first, then sums the scratch in a loop that only reads: a loop that
    stored and summed at once would add in an order that depends on the
    scratch's address (``ops/_rows.shift_row`` says why).
    """
    _wide()
    for j in range(u.shape[1]):
        u[k, j] = load(dy, (r, k, j))
        v[k, j] = load(x, (r, k, j)) - m
    s1 = acc_zero(u)
    s2 = acc_zero(u)
    for j in range(u.shape[1]):
        a = u[k, j]
        s1 += a
        s2 += a * v[k, j]
    return s1, s2


# Columns per task when merging dw/db partials (float64 sums of 256 columns: 2 KiB each, in L1).
MERGE_COLS = 256


@helper
def _merge_rows(pw, pb, dw, db, lo, hi):
    """``dw[j]``, ``db[j]`` for ``lo <= j < hi``: columns of the partials ``pw``, ``pb``
    (rows, C) summed over the rows in order, in float64, rounded once to ``dw``'s dtype.

    Each column's order is fixed (row 0, 1, ...), whatever task merges it: the
    kernels call this in parallel over blocks of :data:`MERGE_COLS` columns.
    """
    sw = np.zeros(hi - lo, np.float64)
    sb = np.zeros(hi - lo, np.float64)
    for i in range(pw.shape[0]):
        for j in range(hi - lo):
            sw[j] += pw[i, lo + j]
            sb[j] += pb[i, lo + j]
    for j in range(hi - lo):
        dw[lo + j] = sw[j]
        db[lo + j] = sb[j]


# Indexing note: every array is indexed with loop counters that start at 0
# (x[r, k, j], never x[r][lo + j] or a slice): numba's negative-index
# wraparound then folds away and the inner loops vectorize; slices would also
# touch the shared array's reference count from every thread.

# --------------------------------------------------------------------------
# NCHW: x as (N*G, Cg, S), one group per row
# --------------------------------------------------------------------------


@kernel
def gn_fwd(x, w, b, y, mean, var, rstd, eps, n_groups, fixed, rows):
    """GroupNorm (or InstanceNorm with fixed statistics) of every group.

    x        (N*G, Cg, S)  input, storage dtype; row r is group r % G of sample r // G
    w, b     (C,)          weight, bias in the accumulation dtype (ones / zeros if absent)
    y        (N*G, Cg, S)  out: the output, storage dtype
    mean     (N*G,)        out: group means (``fixed``: in, (C,) per-channel means)
    var      (N*G,)        out: biased group variances (``fixed``: unused)
    rstd     (N*G,)        out: 1 / sqrt(var + eps) (``fixed``: in, (C,))
    n_groups int           G (``fixed``: C)
    rows     int           rows per task (no effect on results)
    """
    n_rows, cg, ns = x.shape
    n_cols = cg * ns
    x_rows = x.reshape(n_rows, n_cols)  # the same memory, one group per row
    cached = n_cols <= CACHED  # the whole group stays in scratch
    n_tasks = (n_rows + rows - 1) // rows
    for t in prange(n_tasks):
        _wide()
        d = np.empty((cg if cached else 0, ns), w.dtype)  # scratch: the group's x - shift
        dflat = d.reshape(d.size)
        tile = np.empty(0 if cached else TILE, w.dtype)  # scratch: a tile of x - shift
        for r in range(t * rows, min((t + 1) * rows, n_rows)):
            g = r % n_groups
            if fixed:  # running statistics: y = (x - mean) * rstd * w + b
                shift = mean[g]
                md = acc_zero(w)
                rs = rstd[g]
            else:
                shift = load(x, (r, 0, 0))
                if cached:  # pass 1 from memory, pass 2 in cache
                    md = acc_cast(w, _shift_row(x_rows, r, dflat, shift) / n_cols)  # mean(x - shift)
                    if r + 1 < n_rows:
                        _prefetch_row(x_rows, r + 1, n_cols)
                    q = _sqdev(dflat, n_cols, md)
                else:
                    s = acc_zero(w)
                    for k in range(cg):
                        for lo in range(0, ns, TILE):
                            n = min(TILE, ns - lo)
                            for j in range(n):
                                tile[j] = load(x, (r, k, lo + j)) - shift
                            s += _sum(tile, n)
                    md = acc_cast(w, s / n_cols)
                    q = acc_zero(w)
                    for k in range(cg):
                        for lo in range(0, ns, TILE):
                            n = min(TILE, ns - lo)
                            for j in range(n):
                                tile[j] = load(x, (r, k, lo + j)) - shift
                            q += _sqdev(tile, n, md)
                v = acc_cast(w, q / n_cols)
                rs = acc_cast(w, 1.0) / np.sqrt(v + acc_cast(w, eps))
                mean[r] = shift + md
                if np.isnan(mean[r]):  # InstanceNorm's running mean takes torch's: ``_rows.torch_mean``
                    mean[r] = torch_mean(mean[r], inf_signs(x_rows[r]))
                var[r] = v
                rstd[r] = rs
            for k in range(cg):  # y = (x - mean) * (rstd * w[c]) + b[c], channel by channel
                a = rs * w[g * cg + k]
                bc = b[g * cg + k]
                if cached and not fixed:
                    for j in range(ns):
                        store(y, (r, k, j), (d[k, j] - md) * a + bc)
                else:
                    for j in range(ns):
                        store(y, (r, k, j), ((load(x, (r, k, j)) - shift) - md) * a + bc)


@kernel
def gn_bwd(dy, x, w, mean, rstd, dx, n_groups, fixed, need_dx, rows):
    """Gradients of GroupNorm (or of InstanceNorm with fixed statistics); returns ``(dw, db)``.

    dy, x      (N*G, Cg, S)  gradient of y and the forward's input, storage dtype
    w          (C,)          weight, accumulation dtype (ones if absent)
    mean, rstd (N*G,)        saved group statistics (``fixed``: (C,) per channel)
    dx         (N*G, Cg, S)  out: gradient of x (written if ``need_dx``)
    returns    dw, db (C,)   accumulation dtype

    ``fixed``: the statistics are constants, ``dx = rstd * dy * w[c]`` (term 1).
    """
    n_rows, cg, ns = x.shape
    n_cols = cg * ns
    x_rows = x.reshape(n_rows, n_cols)  # the same memory, one group per row
    dy_rows = dy.reshape(n_rows, n_cols)
    dx_rows = dx.reshape(n_rows, n_cols)
    n = n_rows // n_groups
    pw = np.empty((n, n_groups * cg), w.dtype)  # (N, C) per-(n, c) sums of dy * x_hat
    pb = np.empty((n, n_groups * cg), w.dtype)  # (N, C) per-(n, c) sums of dy
    cached = n_cols <= CACHED and ns >= FUSE_MIN  # short channels: no scratch (read twice, from L1)
    short = n_cols <= CACHED and ns < FUSE_MIN
    n_tasks = (n_rows + rows - 1) // rows
    for t in prange(n_tasks):
        _wide()
        u = np.empty((cg if cached else 0, ns), w.dtype)  # scratch: the group's dy
        v = np.empty((cg if cached else 0, ns), w.dtype)  # scratch: the group's x - mean
        tu = np.empty(0 if cached else TILE, w.dtype)  # scratch tiles when not cached
        tv = np.empty(0 if cached else TILE, w.dtype)
        for r in range(t * rows, min((t + 1) * rows, n_rows)):
            i = r // n_groups
            g = r % n_groups
            if fixed:
                m = mean[g]
                rs = rstd[g]
            else:
                m = mean[r]
                rs = rstd[r]
            sg = acc_zero(w)  # sum over the group of dy * w
            sgx = acc_zero(w)  # sum over the group of dy * w * (x - mean)
            for k in range(cg):
                if cached:  # one loop: copy in, both sums
                    sdy, sdx = _grad_row(dy, x, r, k, m, u, v)
                elif short:  # the sums straight from x and dy (the output pass re-reads them from L1)
                    sdy, sdx = _grad_sums(dy_rows[r][k * ns : (k + 1) * ns], x_rows[r][k * ns : (k + 1) * ns], m)
                else:
                    sdy = acc_zero(w)
                    sdx = acc_zero(w)
                    for lo in range(0, ns, TILE):
                        nt = min(TILE, ns - lo)
                        for j in range(nt):
                            tu[j] = load(dy, (r, k, lo + j))
                            tv[j] = load(x, (r, k, lo + j)) - m
                        sdy += _sum(tu, nt)
                        sdx += _dot(tu, tv, nt)
                c = g * cg + k
                pb[i, c] = sdy
                pw[i, c] = sdx * rs
                sg += w[c] * sdy
                sgx += w[c] * sdx
            if not need_dx:
                continue
            if fixed:  # term 1 only
                for k in range(cg):
                    a = rs * w[g * cg + k]
                    for j in range(ns):
                        store(dx, (r, k, j), load(dy, (r, k, j)) * a)
                continue
            # dx = rstd * (g - mean_grp(g) - x_hat * mean_grp(g * x_hat)), each term
            # scaled by rstd first: dy * (rstd * w[c]) - (x - mean) * t3 - t2
            t2 = acc_cast(w, (sg / n_cols) * rs)  # term 2: rstd * mean_grp(g)
            t3 = acc_cast(w, ((sgx * rs) / n_cols) * (rs * rs))  # term 3's factor, times rstd^2
            for k in range(cg):
                a = rs * w[g * cg + k]
                if short:  # from x and dy again (in L1)
                    lo = k * ns
                    gk = dy_rows[r][lo : lo + ns]
                    xk = x_rows[r][lo : lo + ns]
                    dk = dx_rows[r][lo : lo + ns]
                    for j in range(ns):
                        store(dk, j, (load(gk, j) * a - (load(xk, j) - m) * t3) - t2)
                elif cached:
                    for j in range(ns):
                        store(dx, (r, k, j), (u[k, j] * a - v[k, j] * t3) - t2)
                else:
                    for j in range(ns):
                        store(dx, (r, k, j), (load(dy, (r, k, j)) * a - (load(x, (r, k, j)) - m) * t3) - t2)
    nc = n_groups * cg
    dw = np.empty(nc, w.dtype)
    db = np.empty(nc, w.dtype)
    for blk in prange((nc + MERGE_COLS - 1) // MERGE_COLS):  # merge the (N, C) partials over n, in order
        _merge_rows(pw, pb, dw, db, blk * MERGE_COLS, min((blk + 1) * MERGE_COLS, nc))
    return dw, db


# --------------------------------------------------------------------------
# InstanceNorm's running statistics
# --------------------------------------------------------------------------


@helper
def update_running(rm, rv, mean, var, momentum, n_spatial):
    """``running = (1 - momentum) * running + momentum * batch average``, in place.

    rm, rv     (C,)    running mean / variance, storage dtype
    mean, var  (N, C)  per-instance means and biased variances, accumulation dtype

    The variance joins unbiased (``var * S / (S - 1)``). Averages over n in
    order, in float64; the new value is rounded once to the storage dtype.
    """
    n, nc = mean.shape
    corr = n_spatial / (n_spatial - 1.0)
    for c in range(nc):
        sm = 0.0
        sv = 0.0
        for i in range(n):
            sm += mean[i, c]
            sv += var[i, c]
        new_m = (1.0 - momentum) * load(rm, c) + momentum * (sm / n)
        new_v = (1.0 - momentum) * load(rv, c) + momentum * ((sv / n) * corr)
        store(rm, c, new_m)
        store(rv, c, new_v)


# --------------------------------------------------------------------------
# Entry functions: the kernels on raw pointers (``ops/_ptr.py``)
#
# shape   the kernel's view of x, y, dy, dx: NCHW (N*G, Cg, S) or NHWC (N, S, C)
# n_ch    C; pw, pb: weight, bias (C,) in the accumulation dtype, address 0 for ones / zeros
# pmean, pvar, prstd, n_stats: the statistics, n_stats values each in the accumulation
#         dtype ((N*G,), or (C,) when ``fixed``); pvar is not written when ``fixed``
# --------------------------------------------------------------------------


@helper
def gn_fwd_at(proto, acc, px, pw, pb, py, pmean, pvar, prstd, n_stats, shape, n_ch, eps, n_groups, fixed, rows):
    """:func:`gn_fwd` on the buffers at the given addresses."""
    w, b = params_at(acc, pw, pb, n_ch)
    gn_fwd(at(px, proto, shape), w, b, at(py, proto, shape), at(pmean, acc, (n_stats,)),
           at(pvar, acc, (n_stats,)), at(prstd, acc, (n_stats,)), eps, n_groups, fixed, rows)


@helper
def gn_bwd_at(proto, acc, pdy, px, pw, pmean, prstd, n_stats, pdx, shape, n_ch, n_groups, fixed, need_dx, rows):
    """:func:`gn_bwd` on the buffers at the given addresses; returns ``(dw, db)``."""
    w, _ = params_at(acc, pw, 0, n_ch)
    return gn_bwd(at(pdy, proto, shape), at(px, proto, shape), w, at(pmean, acc, (n_stats,)),
                  at(prstd, acc, (n_stats,)), at(pdx, proto, shape), n_groups, fixed, need_dx, rows)


# The NHWC kernels (channels_last, and every S == 1 input) live in their own file; the
# loader (``launch.py``) reads every kernel from this module, so they are re-exported here.
# (Imported last: they use _merge_rows above.)
from .kernels_nhwc import gn_bwd_nhwc_at, gn_bwd_s1_at, gn_fwd_nhwc_at, gn_fwd_s1_at, takes_s1_blocks  # noqa: E402
