"""Numba kernels of the ``"cpu"`` backend for GroupNorm/InstanceNorm on NHWC inputs.

channels_last inputs, and every input with ``S == 1`` (where the NCHW and NHWC
layouts are the same memory), are read as ``(N, S, C)``: channels fastest, a
fixed chunk of samples per task; the task keeps per-channel vectors (sums,
shifts, scales) of length ``C``, so every inner loop runs over contiguous
channels. The statistics, their order of summation and the backward's terms are
those of the NCHW kernels (``kernels.py``, whose docstring has the algorithm);
``kernels.py`` re-exports the entry functions for the loader.

This module imports numba: ``launch.py`` loads it (through ``kernels.py``) on first use.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._bf16 import acc_cast, acc_zero, load, store
from .._jit import helper, kernel
from .._ptr import at, params_at
from .._simd import wide as _wide
from .kernels import MERGE_COLS, _merge_rows


# --------------------------------------------------------------------------
# NHWC (channels_last, and every S == 1 input): x as (N, S, C), a chunk of samples per task
# --------------------------------------------------------------------------


@helper(sums=True)
def _group_sums(a, cg, out):
    """``out[g] = sum_{k < cg} a[g*cg + k]``: per-group sums of a per-channel scratch vector."""
    _wide()
    for g in range(out.shape[0]):
        s = acc_zero(a)
        for k in range(cg):
            s += a[g * cg + k]
        out[g] = s


@helper(sums=True)
def _group_dots(w, p, q, cg, op, oq):
    """``op[g] = sum_k w[c] * p[c]``, ``oq[g] = sum_k w[c] * q[c]`` over the channels ``c = g*cg + k`` of each group."""
    _wide()
    for g in range(op.shape[0]):
        sp = acc_zero(w)
        sq = acc_zero(w)
        for k in range(cg):
            c = g * cg + k
            sp += w[c] * p[c]
            sq += w[c] * q[c]
        op[g] = sp
        oq[g] = sq


@helper
def _spread(v, cg, out):
    """``out[g*cg + k] = v[g]``: a per-group value copied to each of the group's channels."""
    _wide()
    for g in range(v.shape[0]):
        vg = v[g]
        for k in range(cg):
            out[g * cg + k] = vg


@kernel
def gn_fwd_nhwc(x, w, b, y, mean, var, rstd, eps, n_groups, fixed, rows):
    """GroupNorm (or InstanceNorm with fixed statistics) of channels_last samples,
    and of any input with S == 1 (there NCHW is NHWC).

    x        (N, S, C)  input, storage dtype (channels fastest)
    w, b     (C,)       weight, bias in the accumulation dtype
    y        (N, S, C)  out, the same layout
    mean     (N*G,)     out: group means (``fixed``: in, (C,) per-channel means)
    var      (N*G,)     out: biased group variances (``fixed``: unused)
    rstd     (N*G,)     out: 1 / sqrt(var + eps) (``fixed``: in, (C,))
    n_groups int        G (``fixed``: C)
    rows     int        samples per task (no effect on results)

    Per sample, three passes over its ``S`` rows of ``C`` channels (the
    second and third from cache, unless the sample is larger than L2), each
    a loop over the contiguous channels with per-channel vectors spread from
    per-group values (:func:`_spread`)::

        pass 1   acc[c] = sum_s (x - shift)                      -> mean(d) per group
        pass 2   acc[c] = sum_s ((x - shift) - mean(d))^2        -> var, rstd per group
        output   y = ((x - shift) - mean(d)) * (rstd * w[c]) + b[c]

    The per-channel sums run over ``s`` in order; :func:`_group_sums` adds a
    group's channels. With S == 1 a sample is one row of ``C`` values.
    ``fixed``: only the output pass, with ``shift = mean[c]``, ``mean(d) = 0``.
    """
    n, ns, nc = x.shape
    cg = nc // n_groups
    m_grp = cg * ns  # values per group
    n_tasks = (n + rows - 1) // rows
    for t in prange(n_tasks):
        _wide()
        sh = np.empty(nc, w.dtype)  # per channel: its group's shift
        mdc = np.empty(nc, w.dtype)  # per channel: its group's mean(x - shift)
        ac = np.empty(nc, w.dtype)  # per channel: its group's rstd, then rstd * w[c]
        acc = np.empty(nc, w.dtype)  # per channel: sums over s
        gsh = np.empty(n_groups, w.dtype)  # per group: shift
        gmd = np.empty(n_groups, w.dtype)  # per group: mean(x - shift)
        gv = np.empty(n_groups, w.dtype)  # per group: sums, then rstd
        if fixed:  # the running statistics: the same per-channel map for every sample
            for c in range(nc):
                sh[c] = mean[c]
                mdc[c] = acc_zero(w)
                ac[c] = rstd[c] * w[c]
        for i in range(t * rows, min((t + 1) * rows, n)):
            if not fixed:
                for g in range(n_groups):
                    gsh[g] = load(x, (i, 0, g * cg))  # the group's first value
                _spread(gsh, cg, sh)
                for c in range(nc):  # pass 1
                    acc[c] = load(x, (i, 0, c)) - sh[c]
                for s in range(1, ns):
                    for c in range(nc):
                        acc[c] += load(x, (i, s, c)) - sh[c]
                _group_sums(acc, cg, gv)
                for g in range(n_groups):
                    gmd[g] = acc_cast(w, gv[g] / m_grp)
                _spread(gmd, cg, mdc)
                for c in range(nc):  # pass 2
                    e = (load(x, (i, 0, c)) - sh[c]) - mdc[c]
                    acc[c] = e * e
                for s in range(1, ns):
                    for c in range(nc):
                        e = (load(x, (i, s, c)) - sh[c]) - mdc[c]
                        acc[c] += e * e
                _group_sums(acc, cg, gv)
                for g in range(n_groups):
                    v = acc_cast(w, gv[g] / m_grp)
                    rs = acc_cast(w, 1.0) / np.sqrt(v + acc_cast(w, eps))
                    mean[i * n_groups + g] = gsh[g] + gmd[g]
                    var[i * n_groups + g] = v
                    rstd[i * n_groups + g] = rs
                    gv[g] = rs
                _spread(gv, cg, ac)
                for c in range(nc):
                    ac[c] = ac[c] * w[c]
            for s in range(ns):  # output
                for c in range(nc):
                    store(y, (i, s, c), ((load(x, (i, s, c)) - sh[c]) - mdc[c]) * ac[c] + b[c])


@kernel
def gn_bwd_nhwc(dy, x, w, mean, rstd, dx, n_groups, fixed, need_dx, rows):
    """Gradients of GroupNorm (or of InstanceNorm with fixed statistics) for channels_last
    samples, and for any input with S == 1; returns ``(dw, db)`` (see :func:`gn_bwd`).

    dy, x, dx  (N, S, C)  storage dtype (channels fastest)
    w          (C,)       weight, accumulation dtype (ones if absent)
    mean, rstd (N*G,)     saved group statistics (``fixed``: (C,) per channel)
    rows       int        samples per task (``op._samples_per_task``: from the shape only)
    returns    dw, db (C,)  accumulation dtype

    dw/db: each task adds ``sum_s dy * x_hat`` and ``sum_s dy`` of its own
    samples, in order, into its own ``(C,)`` partials (accumulation dtype);
    the ``(n_tasks, C)`` partials are then merged over tasks in task order,
    in float64, in parallel over blocks of channels (:func:`_merge_rows`).
    The chunks depend on the shape only, so the bits do not depend on the
    number of threads. ``fixed``: ``dx = rstd * dy * w[c]`` (term 1 only).
    """
    n, ns, nc = x.shape
    cg = nc // n_groups
    m_grp = cg * ns
    n_tasks = (n + rows - 1) // rows
    pw = np.empty((n_tasks, nc), w.dtype)  # per task: sums of dy * x_hat
    pb = np.empty((n_tasks, nc), w.dtype)  # per task: sums of dy
    for t in prange(n_tasks):
        _wide()
        mc = np.empty(nc, w.dtype)  # per channel: its group's mean
        rsc = np.empty(nc, w.dtype)  # per channel: its group's rstd
        ac = np.empty(nc, w.dtype)  # per channel: rstd * w[c]
        sdy = np.empty(nc, w.dtype)  # per channel: sum over s of dy
        sdx = np.empty(nc, w.dtype)  # per channel: sum over s of dy * (x - mean)
        t2 = np.empty(nc, w.dtype)  # per channel: its group's t2, t3 (see gn_bwd)
        t3 = np.empty(nc, w.dtype)
        gp = np.empty(n_groups, w.dtype)  # per group: sums, then values to spread
        gq = np.empty(n_groups, w.dtype)
        tw = np.zeros(nc, w.dtype)  # this task's sum of dy * x_hat
        tb = np.zeros(nc, w.dtype)  # this task's sum of dy
        if fixed:  # the running statistics, per channel
            for c in range(nc):
                mc[c] = mean[c]
                rsc[c] = rstd[c]
                ac[c] = rstd[c] * w[c]
        for i in range(t * rows, min((t + 1) * rows, n)):
            if not fixed:
                for g in range(n_groups):
                    gp[g] = mean[i * n_groups + g]
                    gq[g] = rstd[i * n_groups + g]
                _spread(gp, cg, mc)
                _spread(gq, cg, rsc)
            for c in range(nc):
                dyv = load(dy, (i, 0, c))
                sdy[c] = dyv
                sdx[c] = dyv * (load(x, (i, 0, c)) - mc[c])
            for s in range(1, ns):
                for c in range(nc):
                    dyv = load(dy, (i, s, c))
                    sdy[c] += dyv
                    sdx[c] += dyv * (load(x, (i, s, c)) - mc[c])
            for c in range(nc):
                tw[c] += sdx[c] * rsc[c]
                tb[c] += sdy[c]
            if not need_dx:
                continue
            if fixed:  # term 1 only
                for s in range(ns):
                    for c in range(nc):
                        store(dx, (i, s, c), load(dy, (i, s, c)) * ac[c])
                continue
            _group_dots(w, sdy, sdx, cg, gp, gq)  # per group: sum of dy * w, of dy * w * (x - mean)
            for g in range(n_groups):
                rs = rstd[i * n_groups + g]
                gp[g] = acc_cast(w, (gp[g] / m_grp) * rs)  # t2 = rstd * mean_grp(g)
                gq[g] = acc_cast(w, ((gq[g] * rs) / m_grp) * (rs * rs))  # t3
            _spread(gp, cg, t2)
            _spread(gq, cg, t3)
            for c in range(nc):
                ac[c] = rsc[c] * w[c]
            for s in range(ns):  # dx = dy * (rstd * w[c]) - (x - mean) * t3 - t2
                for c in range(nc):
                    store(dx, (i, s, c), (load(dy, (i, s, c)) * ac[c] - (load(x, (i, s, c)) - mc[c]) * t3[c]) - t2[c])
        for c in range(nc):
            pw[t, c] = tw[c]
            pb[t, c] = tb[c]
    dw = np.empty(nc, w.dtype)
    db = np.empty(nc, w.dtype)
    for blk in prange((nc + MERGE_COLS - 1) // MERGE_COLS):  # merge the partials over tasks, in order
        _merge_rows(pw, pb, dw, db, blk * MERGE_COLS, min((blk + 1) * MERGE_COLS, nc))
    return dw, db


@helper
def gn_fwd_nhwc_at(proto, acc, px, pw, pb, py, pmean, pvar, prstd, n_stats, shape, n_ch, eps, n_groups, fixed,
                   rows):
    """:func:`gn_fwd_nhwc` on the buffers at the given addresses."""
    w, b = params_at(acc, pw, pb, n_ch)
    gn_fwd_nhwc(at(px, proto, shape), w, b, at(py, proto, shape), at(pmean, acc, (n_stats,)),
                at(pvar, acc, (n_stats,)), at(prstd, acc, (n_stats,)), eps, n_groups, fixed, rows)


@helper
def gn_bwd_nhwc_at(proto, acc, pdy, px, pw, pmean, prstd, n_stats, pdx, shape, n_ch, n_groups, fixed, need_dx,
                   rows):
    """:func:`gn_bwd_nhwc` on the buffers at the given addresses; returns ``(dw, db)``."""
    w, _ = params_at(acc, pw, 0, n_ch)
    return gn_bwd_nhwc(at(pdy, proto, shape), at(px, proto, shape), w, at(pmean, acc, (n_stats,)),
                       at(prstd, acc, (n_stats,)), at(pdx, proto, shape), n_groups, fixed, need_dx, rows)
