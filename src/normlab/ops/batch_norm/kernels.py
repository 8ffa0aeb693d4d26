"""Numba kernels of the ``"cpu"`` backend for BatchNorm.

(Longer than the project's ~500 lines on purpose: numba caches compiled code
per source file, and the two kernels share most helpers, so they stay together.)

Every input reaches the kernels as one 2-D view, ``(R, C * S)``: rows ``(M, C)``
(``(N, C)`` and channels-last tensors) or planes ``(N, C * S)`` (contiguous
NCHW/NCDHW), narrow rows folded. Two kernels, :func:`bn_fwd` (training:
statistics then normalise; evaluation: normalise with the running statistics)
and :func:`bn_bwd` (gradients of either), each a serial driver around one
parallel pass function; :func:`update_running` blends the running statistics.
Statistics per column per chunk by the corrected two-pass algorithm, merged
with Chan's formula in float64 in a fixed order (the same bits for any number
of threads); the mean split into ``hi + lo`` for the normalisation.

The algorithm -- views and folding, tasks and chunks, the statistics, the
normalisation, the backward's sums -- is written out in
``docs/derivations/batch_norm.md`` ("The cpu kernels").

This module imports numba: ``launch.py`` loads it on first use.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._bf16 import acc_cast, load, store
from .._jit import helper, kernel
from .._ptr import at, params_at
from .._rows import grad_sums, inf_signs, shift_row64, sqdev, torch_mean
from .._simd import wide

# Sums of finished float64 partials (and, below, of plane values) are split into
# SIMD lanes: @helper(sums=True), reassociation of those additions only; the order is
# fixed by the compiled code, so still the same bits for any number of threads.


@helper(sums=True)
def _sum64(a):
    """sum_j a_j of float64 partials."""
    s = 0.0
    for j in range(a.shape[0]):
        s += a[j]
    return s


@helper
def _sum_dev(a, ref):
    """sum_j (a_j - ref) of float64 partials, in order (no reassociation: it could
    regroup the differences, and a constant channel must give exactly 0)."""
    s = 0.0
    for j in range(a.shape[0]):
        s += a[j] - ref
    return s


@helper(sums=True)
def _sumsq_dev(a, mu):
    """sum_j (a_j - mu)^2 of float64 partials."""
    s = 0.0
    for j in range(a.shape[0]):
        d = a[j] - mu
        s += d * d
    return s


# --------------------------------------------------------------------------
# Loops over a block of rows r0..r1 and columns c0..c0+n, accumulating per
# column into scratch arrays indexed 0..n-1. The statistics take four rows at
# a time: one load and store of each accumulator per four values, the four
# summed in pairs first (~10% faster training forward).
# Rows are sliced before indexing (``x[i][c0:c0 + n]``, indices from 0): an
# index with a runtime offset makes LLVM emit gathers.
# --------------------------------------------------------------------------


@helper
def _acc_shifted(x, r0, r1, c0, n, sh, s1):
    """s1[u] += sum_i (x[i, c0 + u] - sh[u])."""
    wide()
    c1 = c0 + n
    i = r0
    while i + 4 <= r1:
        xa = x[i][c0:c1]
        xb = x[i + 1][c0:c1]
        xc = x[i + 2][c0:c1]
        xd = x[i + 3][c0:c1]
        for u in range(n):
            m = sh[u]
            s1[u] += ((load(xa, u) - m) + (load(xb, u) - m)) + ((load(xc, u) - m) + (load(xd, u) - m))
        i += 4
    while i < r1:
        xa = x[i][c0:c1]
        for u in range(n):
            s1[u] += load(xa, u) - sh[u]
        i += 1


@helper
def _acc_centred(x, r0, r1, c0, n, m, s1, s2):
    """With d = x[i, c0 + u] - m[u]: s1[u] += sum_i d, s2[u] += sum_i d * d."""
    wide()
    c1 = c0 + n
    i = r0
    while i + 4 <= r1:
        xa = x[i][c0:c1]
        xb = x[i + 1][c0:c1]
        xc = x[i + 2][c0:c1]
        xd = x[i + 3][c0:c1]
        for u in range(n):
            mu = m[u]
            da = load(xa, u) - mu
            db = load(xb, u) - mu
            dc = load(xc, u) - mu
            dd = load(xd, u) - mu
            s1[u] += (da + db) + (dc + dd)
            s2[u] += (da * da + db * db) + (dc * dc + dd * dd)
        i += 4
    while i < r1:
        xa = x[i][c0:c1]
        for u in range(n):
            d = load(xa, u) - m[u]
            s1[u] += d
            s2[u] += d * d
        i += 1


@helper
def _acc_grad(dy, x, dx, r0, r1, c0, n, hi, a, s1, s2, write_dx):
    """s1[u] += sum_i dy, s2[u] += sum_i dy * (x - hi[u]).

    ``write_dx`` (evaluation mode): also ``dx = dy * a[u]``, in a loop of its
    own over the same row (in L1 by then; one loop storing to three arrays has
    too many possible overlaps for LLVM to check, and would not vectorise).
    One row at a time: two inputs per accumulator already (unrolling measured
    no faster, and costs compile time).
    """
    wide()
    c1 = c0 + n
    for i in range(r0, r1):
        xa = x[i][c0:c1]
        ga = dy[i][c0:c1]
        for u in range(n):
            v = load(ga, u)
            s1[u] += v
            s2[u] += v * (load(xa, u) - hi[u])
        if write_dx:
            outr = dx[i][c0:c1]
            for u in range(n):
                store(outr, u, load(ga, u) * a[u])


# --------------------------------------------------------------------------
# Elementwise passes over rows r0..r1 and columns c0..c0+n. S == 1: per-column
# constants (arrays of n, the caller's slice); S > 1: whole planes, a loop over
# them with per-channel scalars, channel ch0 first (channels cycle: a folded
# row holds several rows' channels).
# --------------------------------------------------------------------------


@helper
def _normalise(x, y, r0, r1, c0, n, s_len, ch0, hi, a, b2):
    """y = (x - hi) * a + b2."""
    wide()
    n_ch = hi.shape[0]
    c1 = c0 + n
    for i in range(r0, r1):
        xr = x[i][c0:c1]
        yr = y[i][c0:c1]
        if s_len == 1:
            for u in range(n):
                store(yr, u, (load(xr, u) - hi[u]) * a[u] + b2[u])
        else:
            c = ch0
            for p0 in range(0, n, s_len):
                xp = xr[p0 : p0 + s_len]
                yp = yr[p0 : p0 + s_len]
                h = hi[c]
                f = a[c]
                bc = b2[c]
                for t in range(s_len):
                    store(yp, t, (load(xp, t) - h) * f + bc)
                c = c + 1 if c + 1 < n_ch else 0


@helper
def _grad_x(dy, x, dx, r0, r1, c0, n, s_len, ch0, a, hi, k2, k0, train):
    """dx = (a * dy - k2 * (x - hi)) - k0 (train) or dy * a (eval)."""
    wide()
    n_ch = a.shape[0]
    c1 = c0 + n
    for i in range(r0, r1):
        xr = x[i][c0:c1]
        gr = dy[i][c0:c1]
        outr = dx[i][c0:c1]
        if s_len == 1:
            if train:
                for u in range(n):
                    store(outr, u, (a[u] * load(gr, u) - k2[u] * (load(xr, u) - hi[u])) - k0[u])
            else:
                for u in range(n):
                    store(outr, u, load(gr, u) * a[u])
        else:
            c = ch0
            for p0 in range(0, n, s_len):
                xp = xr[p0 : p0 + s_len]
                gp = gr[p0 : p0 + s_len]
                op = outr[p0 : p0 + s_len]
                f = a[c]
                if train:
                    h = hi[c]
                    q2 = k2[c]
                    q0 = k0[c]
                    for t in range(s_len):
                        store(op, t, (f * load(gp, t) - q2 * (load(xp, t) - h)) - q0)
                else:
                    for t in range(s_len):
                        store(op, t, load(gp, t) * f)
                c = c + 1 if c + 1 < n_ch else 0


@helper
def _tile(e, vals, c0, s_len):
    """e[u] = vals[((c0 + u) % (C * S)) // S]: per-channel values laid out per column of a row."""
    n_ch = vals.shape[0]
    c = (c0 // s_len) % n_ch  # the only divisions
    t = c0 % s_len  # offset into channel c's columns
    n = e.shape[0]
    u = 0
    while u < n:
        run = min(s_len - t, n - u)
        seg = e[u : u + run]
        v = vals[c]
        for q in range(run):
            seg[q] = v
        u += run
        c = c + 1 if c + 1 < n_ch else 0
        t = 0


@helper
def _tiled(vals, width, s_len):
    """``vals`` per column of a row of ``width`` columns when S == 1 (else ``vals`` itself)."""
    if s_len != 1 or width == vals.shape[0]:
        return vals
    e = np.empty(width, vals.dtype)
    _tile(e, vals, 0, s_len)
    return e


# --------------------------------------------------------------------------
# A task's reductions: rows t0..t1, columns c0..c0+n, chunk by chunk
# --------------------------------------------------------------------------


@helper
def _task_stats(x, t0, t1, c0, n, sub, w, tm, tq):
    """Per-column mean (``tm``) and M2 (``tq``), float64, of rows t0..t1: the two-pass
    statistics of each chunk of ``sub`` rows, merged in chunk order (Chan)."""
    sh = np.empty(n, w.dtype)  # chunk's first row, then its pass-1 mean
    s1 = np.empty(n, w.dtype)  # sums of x - sh, then of d
    s2 = np.empty(n, w.dtype)  # sums of d * d
    n_a = 0
    for r0 in range(t0, t1, sub):
        r1 = min(r0 + sub, t1)
        k = r1 - r0
        x0 = x[r0][c0 : c0 + n]
        for u in range(n):
            sh[u] = load(x0, u)
            s1[u] = 0
        _acc_shifted(x, r0, r1, c0, n, sh, s1)  # pass 1
        inv_k = acc_cast(w, 1.0 / k)
        for u in range(n):
            sh[u] = sh[u] + s1[u] * inv_k  # m: the pass-1 mean
            s1[u] = 0
            s2[u] = 0
        _acc_centred(x, r0, r1, c0, n, sh, s1, s2)  # pass 2
        # chunk: mean = m + s1 / k, M2 = s2 - s1^2 / k (float64); Chan into the task's
        inv = 1.0 / k
        f_b = k / (n_a + k)  # 1 for the first chunk: the merge is a copy
        f_ab = n_a * f_b
        for u in range(n):
            d1 = np.float64(s1[u])
            q = np.float64(s2[u]) - d1 * d1 * inv
            q = q if not q < 0.0 else 0.0  # rounding; NaN stays NaN
            cm = np.float64(sh[u]) + d1 * inv
            if n_a == 0:
                tm[u] = cm
                tq[u] = q
            else:
                delta = cm - tm[u]
                tm[u] += delta * f_b
                tq[u] += q + delta * delta * f_ab
        n_a += k


@helper
def _task_grad_sums(dy, x, dx, t0, t1, c0, n, sub, eh, ea, ty, tx, fused):
    """Per-column sums of dy (``ty``) and dy * (x - eh) (``tx``), float64, of rows t0..t1:
    chunk sums in the accumulation dtype added in chunk order. ``fused``: also dx = dy * ea."""
    s1 = np.empty(n, eh.dtype)  # chunk sums of dy
    s2 = np.empty(n, eh.dtype)  # chunk sums of dy * (x - hi)
    for u in range(n):
        ty[u] = 0.0
        tx[u] = 0.0
    for r0 in range(t0, t1, sub):
        r1 = min(r0 + sub, t1)
        for u in range(n):
            s1[u] = 0
            s2[u] = 0
        _acc_grad(dy, x, dx, r0, r1, c0, n, eh, ea, s1, s2, fused)
        for u in range(n):
            ty[u] += s1[u]
            tx[u] += s2[u]


# Planes of at least this many values (contiguous NCHW with large H*W) take their
# gradient sums plane by plane (:func:`_task_grad_sums_planes`) in pieces of at
# most PLANE_PIECE values, each a float sum split into SIMD lanes.
PLANE_MIN = 256
PLANE_PIECE = 4096


@helper
def _task_grad_sums_planes(dy, x, dx, t0, t1, c0, n, s_len, hi, a, ty, tx, fused, local):
    """:func:`_task_grad_sums` for a task of whole planes (``c0`` and ``n`` multiples of
    ``S >= PLANE_MIN``): per row and plane, the sums over the plane's ``S`` values in
    pieces of at most PLANE_PIECE (float, SIMD lanes), added in float64 into the
    plane's first column of ``ty``/``tx`` (its other columns stay 0, so the per-channel
    sums over columns are unchanged). Far fewer loads and stores than per-column
    accumulators. ``fused``: also dx = dy * a[c]. ``local`` (the task finishes its
    channels itself, reading the first columns only): only the first columns are
    zeroed -- zeroing and summing the other columns cost two float64 stores and
    loads per value, more than the sums themselves (N = 1 with 300-value planes:
    backward ~4.5 -> ~2 ms for 960K values)."""
    wide()
    step = s_len if local else 1
    for u in range(0, n, step):
        ty[u] = 0.0
        tx[u] = 0.0
    n_ch = hi.shape[0]
    ch0 = (c0 // s_len) % n_ch
    for i in range(t0, t1):
        xr = x[i][c0 : c0 + n]
        gr = dy[i][c0 : c0 + n]
        c = ch0
        for p0 in range(0, n, s_len):
            xp = xr[p0 : p0 + s_len]
            gp = gr[p0 : p0 + s_len]
            h = hi[c]
            sy = 0.0
            sx = 0.0
            for lo in range(0, s_len, PLANE_PIECE):
                hi_ = min(lo + PLANE_PIECE, s_len)
                s1, s2 = grad_sums(gp[lo:hi_], xp[lo:hi_], h)
                sy += s1
                sx += s2
            ty[p0] += sy
            tx[p0] += sx
            if fused:
                op = dx[i][c0 + p0 : c0 + p0 + s_len]
                f = a[c]
                for t in range(s_len):
                    store(op, t, load(gp, t) * f)
            c = c + 1 if c + 1 < n_ch else 0


@helper
def _task_stats_planes(x, r0, r1, c0, n, s_len, w, mean, var, ch0, d):
    """Mean and biased variance (float64) of each channel of a task that holds every row
    (r0..r1) of whole planes (``c0`` and ``n`` multiples of ``S >= PLANE_MIN``), into
    ``mean``/``var`` from channel ``ch0`` on.

    Each plane in pieces of at most PLANE_PIECE values, with the shifted two-pass
    statistics of a piece as in LayerNorm's rows (``ops/_rows.py``): pass 1 reads the
    piece from memory into the scratch ``d = x - x[first]`` and sums it (SIMD lanes),
    pass 2 sums ``(d - mean(d))^2`` over ``d`` in L1. Register sums over a contiguous
    plane instead of per-column accumulators loaded and stored for every row
    (bfloat16 training forward of (32, 64, 32, 32): ~440 -> ~300 us).

    Pieces are merged in row and piece order in float64, shifted by the channel's
    first value ``ref``: with a piece's mean ``ref + dev`` (``dev`` small: its
    shift's offset from ``ref``, exact, plus its mean of ``d``), the channel's mean
    is ``ref + sum(k * dev) / N`` and its M2 the pieces' M2 plus
    ``sum(k * dev^2) - N * mean(dev)^2``, sums of values at the scale of the spread,
    so a mean of 1e4 keeps its digits and a constant channel gives its value and 0.

    A piece's sum of ``d`` is exact, in float64 (``_rows.shift_row64``): in float32, the
    rounding of each ``x - sh`` and of the lanes' sums left the running mean of a channel
    of 32768 values with mean near 0 at 30-200x its float32 rounding error (torch's double
    sums: 1.4-6x; now 1.0x, measured against float64). Kernel time in cache 0-18 % more.
    """
    n_pl = n // s_len
    acc = np.zeros((4, n_pl))  # per channel: ref, sum k * dev, sum k * dev^2, sum of the pieces' M2
    for i in range(r0, r1):
        xr = x[i][c0 : c0 + n]
        for p in range(n_pl):
            xp = xr[p * s_len : (p + 1) * s_len]
            if i == r0:
                acc[0, p] = load(xp, 0)
            ref = acc[0, p]
            for lo in range(0, s_len, PLANE_PIECE):
                k = min(PLANE_PIECE, s_len - lo)
                dk = d[:k]
                sh = load(xp, lo)
                s = shift_row64(xp[lo : lo + k].reshape(1, k), 0, dk, sh)  # pass 1: d = x - sh; sum d
                md = acc_cast(w, s / k)
                sk = np.float64(s) / k
                corr = sk - np.float64(md)  # mean(d) - md: md's rounding
                q = np.float64(sqdev(dk, k, md)) - k * corr * corr  # pass 2: the piece's M2
                dev = (np.float64(sh) - ref) + sk
                acc[1, p] += k * dev
                acc[2, p] += k * dev * dev
                acc[3, p] += q if not q < 0.0 else 0.0  # rounding; NaN stays NaN
    cnt = (r1 - r0) * s_len
    for p in range(n_pl):
        dm = acc[1, p] / cnt
        mean[ch0 + p] = acc[0, p] + dm
        m2 = acc[3, p] + (acc[2, p] - acc[1, p] * dm)
        var[ch0 + p] = (m2 if not m2 < 0.0 else 0.0) / cnt


@helper
def _channel_stats(tm, tq, start, s_len, fold, period, n_rows):
    """(mean, biased var) of a channel from its columns' (mean, M2), each of ``n_rows`` values:
    columns start + r*period .. + S for r < fold (equal counts: the mean of the means,
    and M2 plus the spread of the means)."""
    n_col = fold * s_len
    ref = tm[start]  # shifted by one of the means: a constant channel gives exactly its value
    tot = 0.0
    for r in range(fold):
        lo = start + r * period
        tot += _sum_dev(tm[lo : lo + s_len], ref)
    mu = ref + tot / n_col
    m2 = 0.0
    spread = 0.0
    for r in range(fold):
        lo = start + r * period
        m2 += _sum64(tq[lo : lo + s_len])
        spread += _sumsq_dev(tm[lo : lo + s_len], mu)
    return mu, (m2 + n_rows * spread) / (n_rows * n_col)


@helper
def _channel_sums(ty, tx, start, s_len, fold, period):
    """A channel's sums over its columns (as in :func:`_channel_stats`), in order."""
    sy = 0.0
    sx = 0.0
    for r in range(fold):
        lo = start + r * period
        sy += _sum64(ty[lo : lo + s_len])
        sx += _sum64(tx[lo : lo + s_len])
    return sy, sx


@helper
def _inf_mean(x, m, c, s_len, period):
    """Channel ``c``'s mean ``m``, or torch's where the shift made it NaN (``_rows.torch_mean``):
    ``+-inf`` for a channel holding infinities of one sign and no NaN. Channel ``c`` is
    columns ``f * period + c * s_len .. + s_len`` of every row of the 2-D view, for each
    fold ``f``; they are read only when ``m`` is NaN."""
    if not np.isnan(m):
        return m
    mask = 0
    for i in range(x.shape[0]):
        for lo in range(c * s_len, x.shape[1], period):
            mask |= inf_signs(x[i][lo : lo + s_len])
    return torch_mean(m, mask)


@helper
def _constants(w, b, mean, var, eps, rstd, hi, a, b2, c):
    """Channel c: rstd = 1 / sqrt(var + eps); y = ((x - hi) - lo) * a + b = (x - hi) * a + b2
    with hi = the mean rounded, lo = the rest, a = rstd * w, b2 = b - lo * a (float64, rounded once)."""
    rs = 1.0 / np.sqrt(var[c] + eps)
    rstd[c] = rs
    h = acc_cast(w, mean[c])
    f = rs * w[c]
    hi[c] = h
    a[c] = acc_cast(w, f)
    b2[c] = acc_cast(w, b[c] - (mean[c] - h) * f)


@helper
def _grad_constants(w, mean, rstd, db, sum_dyxc, cnt, train, hi, a, k2, k0, c):
    """Channel c: dx = a * ((dy - m1) - xc * m2) = (a * dy - k2 * (x - hi)) - k0 with
    m1 = mean(dy), m2 = rstd^2 * mean(dy * xc), k2 = a * m2, k0 = a * m1 - k2 * lo."""
    rs = rstd[c]
    h = acc_cast(w, mean[c])
    f = rs * w[c]
    hi[c] = h
    a[c] = acc_cast(w, f)
    if train:
        q2 = f * (rs * rs * sum_dyxc / cnt)
        k2[c] = acc_cast(w, q2)
        k0[c] = acc_cast(w, f * (db / cnt) - q2 * (mean[c] - h))
    else:
        k2[c] = 0
        k0[c] = 0


# --------------------------------------------------------------------------
# Tasks of the two passes
# --------------------------------------------------------------------------

# Phase 1 (elementwise, no reduction: any split gives the same bits) runs
# tasks of whole rows, about this many values each.
PHASE1_VALUES = 65536


@helper
def _n_tasks(n_rows, width, rows, cw, phase):
    """Tasks of a pass: phase 0, one per (row group of ``rows`` rows, column block of
    ``cw`` columns); phase 1, one per run of whole rows of about PHASE1_VALUES values."""
    if phase == 0:
        return ((n_rows + rows - 1) // rows) * ((width + cw - 1) // cw)
    per = max(1, PHASE1_VALUES // width)
    return (n_rows + per - 1) // per


@helper
def _task_span(task, phase, n_rows, width, rows, cw):
    """``(g, r0, r1, c0, n)`` of a task: its row group ``g`` (phase 0), rows ``r0..r1``
    and columns ``c0..c0+n``."""
    if phase == 0:
        n_cb = (width + cw - 1) // cw
        g = task // n_cb
        c0 = (task - g * n_cb) * cw
        r0 = g * rows
        return g, r0, min(r0 + rows, n_rows), c0, min(cw, width - c0)
    per = max(1, PHASE1_VALUES // width)
    r0 = task * per
    return 0, r0, min(r0 + per, n_rows), 0, width


# --------------------------------------------------------------------------
# Kernels. Each kernel is a serial driver around one parallel pass function,
# called once or twice: one ``prange`` loop per pass function, each helper
# called from one place, so that numba and LLVM compile every loop once (the
# cold compile of the four dtypes is most of the test suite's time).
# --------------------------------------------------------------------------


@kernel
def _fwd_pass(x, y, w, b, stats, eps, s_len, cw, sub, rows, local, phase, pmean, pm2, hi, a, b2):
    """Phase 0: the statistics tasks (row group x column block) into ``pmean``/``pm2``;
    ``local``: each task then finishes its channels' statistics and constants and
    normalises them. Phase 1: normalise every row with ``hi``, ``a``, ``b2`` (tiled per
    column when S == 1)."""
    n_rows, width = x.shape
    n_ch = w.shape[0]
    mean = stats[0]
    var = stats[1]
    rstd = stats[2]
    for task in prange(_n_tasks(n_rows, width, rows, cw, phase)):
        wide()
        g, r0, r1, c0, n = _task_span(task, phase, n_rows, width, rows, cw)
        ch0 = 0
        if phase == 0:
            tm = pmean[g][c0 : c0 + n]
            tq = pm2[g][c0 : c0 + n]
            if local and s_len >= PLANE_MIN:  # whole channels, every row, large planes: plane by plane
                ch0 = c0 // s_len
                _task_stats_planes(x, r0, r1, c0, n, s_len, w, mean, var, ch0,
                                   np.empty(min(s_len, PLANE_PIECE), w.dtype))
                for c in range(ch0, ch0 + n // s_len):
                    mean[c] = _inf_mean(x, mean[c], c, s_len, n_ch * s_len)
                    _constants(w, b, mean, var, eps, rstd, hi, a, b2, c)
            else:
                _task_stats(x, r0, r1, c0, n, sub, w, tm, tq)
            if local and s_len < PLANE_MIN:  # whole channels, every row (r0 == 0, r1 == n_rows): finish them here
                ch0 = c0 // s_len
                for c in range(ch0, ch0 + n // s_len):
                    mean[c], var[c] = _channel_stats(tm, tq, (c - ch0) * s_len, s_len, 1, n_ch * s_len, n_rows)
                    mean[c] = _inf_mean(x, mean[c], c, s_len, n_ch * s_len)
                    _constants(w, b, mean, var, eps, rstd, hi, a, b2, c)
        if phase == 1 or local:
            eh = hi
            ea = a
            eb = b2
            if s_len == 1:  # per column
                eh = hi[c0 : c0 + n]
                ea = a[c0 : c0 + n]
                eb = b2[c0 : c0 + n]
            _normalise(x, y, r0, r1, c0, n, s_len, ch0, eh, ea, eb)


@helper
def bn_fwd(x, y, w, b, stats, work, eps, s_len, cw, sub, group, local, train):
    """BatchNorm forward on the 2-D view ``x``; a row holds ``F = width / (C * S)``
    consecutive rows of ``(R, C * S)`` (``launch.py`` folds narrow rows), channel
    ``c`` at columns ``r*C*S + c*S .. r*C*S + c*S + S``.

    x       (R/F, F*C*S)  input, storage dtype
    y       (R/F, F*C*S)  out: output, storage dtype
    w, b    (C,)          weight, bias in the accumulation dtype (ones / zeros if absent)
    stats   (3, C)        float64 rows mean, var, rstd. train: out, the batch mean and
                          biased variance; eval: in, the running ones. rstd: out
    work    (2, G, W)     float64 scratch (train): per-task, per-column partial means and
                          M2, G = the row groups (``launch.py`` keeps it between calls: large
                          allocations here would be fresh pages, faulted in on every call)
    eps     float
    s_len   int           S, values per channel per row of the unfolded view
    cw      int           columns per task
    sub     int           rows per chunk (two passes over a chunk in cache)
    group   int           chunks per task, merged by that task in order
    local   bool          (train) one task per column block holds every row and whole
                          channels (F == 1, cw a multiple of S): it computes its
                          channels' statistics and normalises them while they are in cache
    train   bool          compute the statistics (else use rows 0, 1 of ``stats``)
    """
    n_rows, width = x.shape
    mean = stats[0]
    var = stats[1]
    rstd = stats[2]
    n_ch = w.shape[0]
    period = n_ch * s_len
    fold = width // period
    rows = sub * group  # rows per task
    n_rg = (n_rows + rows - 1) // rows  # row groups
    hi = np.empty_like(w)  # (C,) the mean rounded to the accumulation dtype
    a = np.empty_like(w)  # (C,) rstd * w
    b2 = np.empty_like(w)  # (C,) b - lo * a
    pmean = work[0]  # (G, W) per-task, per-column partial means
    pm2 = work[1]  # (G, W) per-task, per-column partial M2
    local = local and train
    # phase numbers and flags as runtime values: a literal argument would make numba
    # compile the pass function once more for that constant
    phase0 = n_rows - n_rows
    if train:
        _fwd_pass(x, y, w, b, stats, eps, s_len, cw, sub, rows, local, phase0, pmean, pm2, hi, a, b2)
        if local:
            return
        # per column: the row groups' partials in order (into row 0)
        tm = pmean[0]
        tq = pm2[0]
        n_a = min(rows, n_rows)
        for g in range(1, n_rg):
            k = min(rows, n_rows - g * rows)
            f_b = k / (n_a + k)
            f_ab = n_a * f_b
            pg = pmean[g]
            qg = pm2[g]
            for u in range(width):
                delta = pg[u] - tm[u]
                tm[u] += delta * f_b
                tq[u] += qg[u] + delta * delta * f_ab
            n_a += k
        for c in range(n_ch):  # per channel: its F * S columns
            mean[c], var[c] = _channel_stats(tm, tq, c * s_len, s_len, fold, period, n_rows)
            mean[c] = _inf_mean(x, mean[c], c, s_len, period)
    for c in range(n_ch):
        _constants(w, b, mean, var, eps, rstd, hi, a, b2, c)
    _fwd_pass(x, y, w, b, stats, eps, s_len, cw, sub, rows, local and not train, phase0 + 1, pmean, pm2,
              _tiled(hi, width, s_len), _tiled(a, width, s_len), _tiled(b2, width, s_len))


@kernel
def _bwd_pass(dy, x, dx, w, stats, s_len, cw, sub, rows, local, train, need_dx, fused, phase,
              pdy, pdx, hi, a, k2, k0, db, dw):
    """Phase 0: the sums tasks (row group x column block) into ``pdy``/``pdx`` (``fused``:
    and evaluation's dx); ``local``: each task then finishes its channels' sums and
    constants and writes their dx. Phase 1: dx of every row."""
    n_rows, width = x.shape
    n_ch = w.shape[0]
    mean = stats[0]
    rstd = stats[2]
    cnt = n_rows * width // n_ch  # values per channel
    for task in prange(_n_tasks(n_rows, width, rows, cw, phase)):
        wide()
        g, r0, r1, c0, n = _task_span(task, phase, n_rows, width, rows, cw)
        ch0 = 0
        if phase == 0:
            ty = pdy[g][c0 : c0 + n]
            tx = pdx[g][c0 : c0 + n]
            planes = s_len >= PLANE_MIN and c0 % s_len == 0 and n % s_len == 0
            if planes:  # whole planes
                _task_grad_sums_planes(dy, x, dx, r0, r1, c0, n, s_len, hi, a, ty, tx, fused, local)
            else:
                eh = np.empty(n, w.dtype)  # per column: hi, a of its channel
                ea = np.empty(n, w.dtype)
                _tile(eh, hi, c0, s_len)
                _tile(ea, a, c0, s_len)
                _task_grad_sums(dy, x, dx, r0, r1, c0, n, sub, eh, ea, ty, tx, fused)
            if local:  # whole channels, every row (r0 == 0, r1 == n_rows): finish them here
                ch0 = c0 // s_len
                for c in range(ch0, ch0 + n // s_len):
                    u = (c - ch0) * s_len
                    if planes:  # the plane's sums sit in its first column (the rest unused)
                        sy = ty[u]
                        sx = tx[u]
                    else:
                        sy, sx = _channel_sums(ty, tx, u, s_len, 1, n_ch * s_len)
                    sum_dyxc = sx - (mean[c] - hi[c]) * sy  # minus lo * sum(dy)
                    db[c] = sy
                    dw[c] = sum_dyxc * rstd[c]  # sum(dy * x_hat)
                    _grad_constants(w, mean, rstd, sy, sum_dyxc, cnt, train, hi, a, k2, k0, c)
        if phase == 1 or (local and need_dx and not fused):
            ea = a
            eh = hi
            e2 = k2
            e0 = k0
            if s_len == 1:  # per column
                ea = a[c0 : c0 + n]
                eh = hi[c0 : c0 + n]
                e2 = k2[c0 : c0 + n]
                e0 = k0[c0 : c0 + n]
            _grad_x(dy, x, dx, r0, r1, c0, n, s_len, ch0, ea, eh, e2, e0, train)


@helper
def bn_bwd(dy, x, dx, w, stats, work, s_len, cw, sub, group, local, train, need_dx, need_wb):
    """BatchNorm backward on the forward's view; returns ``(db, dw)`` in float64.

    dy       (R/F, F*C*S)  gradient of y, storage dtype
    x        (R/F, F*C*S)  the forward's input
    dx       (R/F, F*C*S)  out: gradient of x (written if ``need_dx``)
    w        (C,)          weight in the accumulation dtype (ones if absent)
    stats    (3, C)        the forward's float64 statistics: rows mean, var, rstd
    work     (2, G, W)     float64 scratch (train or need_wb): per-task, per-column sums
    s_len, cw, sub, group, local   geometry, as for :func:`bn_fwd`
    train    bool          gradient through the batch statistics too
    returns  db = sum(dy), dw = sum(dy * x_hat)  (C,) float64; (0,) unless
             ``train`` or ``need_wb``

    Sums per column per chunk in the accumulation dtype, added in float64 per
    task in chunk order, then over tasks in order, then over a channel's
    columns in order. ``sum(dy * xc) = sum(dy * (x - hi)) - lo * sum(dy)``.
    """
    n_rows, width = x.shape
    mean = stats[0]
    rstd = stats[2]
    n_ch = w.shape[0]
    period = n_ch * s_len
    fold = width // period
    rows = sub * group
    n_rg = (n_rows + rows - 1) // rows
    need_sums = train or need_wb
    fused = need_dx and need_wb and not train  # eval: dx in the same pass as the sums
    cnt = n_rows * fold * s_len  # values per channel
    hi = np.empty_like(w)  # (C,) the mean rounded to the accumulation dtype
    a = np.empty_like(w)  # (C,) rstd * w
    k2 = np.empty_like(w)  # (C,) see _grad_constants
    k0 = np.empty_like(w)
    for c in range(n_ch):
        _grad_constants(w, mean, rstd, 0.0, 0.0, cnt, False, hi, a, k2, k0, c)
    n_out = n_ch if need_sums else 0
    db = np.zeros(n_out, np.float64)
    dw = np.zeros(n_out, np.float64)
    pdy = work[0]  # (G, W) per-task, per-column sums of dy
    pdx = work[1]  # (G, W) ... of dy * (x - hi)
    local = local and need_sums
    phase0 = n_rows - n_rows  # runtime values, not literals (see bn_fwd)
    if need_sums:
        _bwd_pass(dy, x, dx, w, stats, s_len, cw, sub, rows, local, train, need_dx, fused, phase0,
                  pdy, pdx, hi, a, k2, k0, db, dw)
        if local:
            return db, dw
        ty = pdy[0]  # per column, over tasks in order
        tx = pdx[0]
        for g in range(1, n_rg):
            yg = pdy[g]
            xg = pdx[g]
            for u in range(width):
                ty[u] += yg[u]
                tx[u] += xg[u]
        for c in range(n_ch):  # per channel, over its columns in order
            sy, sx = _channel_sums(ty, tx, c * s_len, s_len, fold, period)
            sum_dyxc = sx - (mean[c] - hi[c]) * sy  # minus lo * sum(dy)
            db[c] = sy
            dw[c] = sum_dyxc * rstd[c]  # sum(dy * x_hat)
            _grad_constants(w, mean, rstd, sy, sum_dyxc, cnt, train, hi, a, k2, k0, c)
    if need_dx and not fused:
        _bwd_pass(dy, x, dx, w, stats, s_len, cw, sub, rows, local and not need_sums, train, need_dx,
                  fused, phase0 + 1, pdy, pdx, _tiled(hi, width, s_len), _tiled(a, width, s_len),
                  _tiled(k2, width, s_len), _tiled(k0, width, s_len), db, dw)
    return db, dw


# --------------------------------------------------------------------------
# Running statistics
# --------------------------------------------------------------------------


@helper
def update_running(running_mean, running_var, stats, n, momentum):
    """Blend the batch statistics into the running ones, in place, in the buffers' dtype.

    running_mean, running_var  (C,)    buffers, storage dtype (bits for half)
    stats                      (3, C)  float64: rows batch mean, *biased* variance (, rstd)
    n                          int     values per channel

    ``running = (1 - momentum) * running + momentum * stat`` formed in float64
    with the unbiased variance ``var * n / (n - 1)``, rounded once to the buffer.
    """
    keep = 1.0 - momentum
    bessel = n / (n - 1.0)
    mean = stats[0]
    var = stats[1]
    for j in range(mean.shape[0]):
        store(running_mean, j, keep * np.float64(load(running_mean, j)) + momentum * mean[j])
        store(running_var, j, keep * np.float64(load(running_var, j)) + momentum * (var[j] * bessel))


# --------------------------------------------------------------------------
# Entry functions: the kernels on raw pointers (``ops/_ptr.py``)
# --------------------------------------------------------------------------


@helper
def bn_fwd_at(proto, acc, px, py, pw, pb, n_ch, stats, work, eps, n_rows, width, s_len, cw, sub, group,
              local, train):
    """:func:`bn_fwd` on x, y (the ``(n_rows, width)`` view, storage dtype) and weight, bias
    (accumulation dtype; address 0 for ones / zeros) at the given addresses."""
    w, b = params_at(acc, pw, pb, n_ch)
    shape = (n_rows, width)
    bn_fwd(at(px, proto, shape), at(py, proto, shape), w, b, stats, work, eps, s_len, cw, sub, group, local,
           train)


@helper
def bn_bwd_at(proto, acc, pdy, px, pdx, pw, n_ch, stats, work, n_rows, width, s_len, cw, sub, group, local,
              train, need_dx, need_wb):
    """:func:`bn_bwd` on dy, x, dx (the ``(n_rows, width)`` view) and the weight at the given
    addresses (0: ones); returns ``(db, dw)``."""
    w, _ = params_at(acc, pw, 0, n_ch)
    shape = (n_rows, width)
    return bn_bwd(at(pdy, proto, shape), at(px, proto, shape), at(pdx, proto, shape), w, stats, work, s_len,
                  cw, sub, group, local, train, need_dx, need_wb)


@helper
def update_running_at(proto, prm, prv, n_ch, stats, n, momentum):
    """:func:`update_running` on the (C,) buffers at ``prm``/``prv`` (``proto``: their storage dtype)."""
    update_running(at(prm, proto, (n_ch,)), at(prv, proto, (n_ch,)), stats, n, momentum)
