"""Numba kernels of the ``"cpu"`` backend for LayerNorm2d on contiguous (NCHW) inputs.

LayerNorm2d normalises each pixel over its ``C`` channels. In NCHW memory a
pixel's channels lie ``S = H * W`` values apart, so instead of gathering them
into rows (a copy in, a copy out) the kernels read ``x`` as ``(N, C, S)`` and
stream over the ``C`` planes of a *block* of pixels, with the pixel index as
the inner, contiguous, vectorised loop and one accumulator per pixel in a
scratch row::

    for c in range(C):                 # the planes, in order
        for p in block:                # contiguous pixels: SIMD lanes
            acc[p] += x[n, c, p] - shift[p]

Each pixel's sum therefore runs over ``c`` in order whatever the vector width
or the block: the statistics need no reassociation, and ``y`` and ``dx`` do not
depend on the block size, the thread count or the serial/parallel version
(dw/db are summed per block, and the block size is fixed by the shape).

The loops index slices of the planes (``x[n, c, p0:p0 + m]``) from 0 rather than
``x[n, c, p0 + p]``: numba cannot prove ``p0 + p`` non-negative, adds a
negative-index fix-up to every access, and LLVM then loads and stores one
element at a time (measured: bfloat16 forward of (8, 64, 32, 32) 2.6 -> 0.29 ms).

A task is one block of ``block`` pixels of one sample (``launch_2d.block_size``:
about ``BLOCK_BYTES``, so the block's ``C`` planes stay in L2 across the passes). Memory traffic per element:

- forward:  read x, write y (the second and third pass read x from cache)
- backward: read x and dy, write dx; dw/db through per-task partials

The statistics are those of ``ops/_common.shifted_mean_var``, per pixel::

    d     = x - x[n, 0, p]          shift by the pixel's first channel
    mean  = x[n, 0, p] + mean_c(d)
    var   = mean_c((d - mean_c(d))^2)   biased, second pass
    y     = ((d - mean_c(d)) * rstd) * w[c] + b[c]

One source serves the four storage dtypes (float32, float64, int16 = bfloat16
bits, uint16 = float16 bits: ``ops/_bf16.py``), accumulating in float64 for
float64 and float32 otherwise. This module imports numba: ``launch_2d.py``
loads it on first use.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._bf16 import acc_cast, acc_zero, load, store
from .._jit import helper, kernel
from .._ptr import at, params_at
from .._simd import prefetch, prefetch_write, wide


# How many planes ahead the first pass asks for a block's next runs (``far``): measured 2, 4
# and 8 alike on large tensors (float32 3-9 %, bfloat16 5-27 % faster forward at C >= 96).
AHEAD = 4
LINE_BYTES = 64
# The output pass of a far float32/float64 forward asks for y's runs AHEAD planes on for writing
# (``prefetch_write``): y is the pass's only traffic to memory, and its C runs are too many
# streams for the hardware to fetch ahead; each store otherwise waits for its line to be read
# for ownership. Side by side (one thread, medians of 13, fresh outputs): (16, 64, 128, 128)
# 29.4 -> 27.4 ms, (15, 768, 37, 37) 33.0 -> 31.1, (32, 96, 64, 64) 24.8 -> 22.6. Not in half
# precision (bfloat16 forward 6-10 % slower: its output pass is bound by the conversions, not
# by memory) nor in the backward (dx: no change, within noise).


@helper
def _prefetch_run(a2, row, p0, m):
    """Ask for the cache lines of ``a2[row, p0:p0 + m]`` (a plane's run of a block, ``a2`` the
    tensor as (N * C, S) rows); no loads, so no result changes."""
    step = max(1, LINE_BYTES // a2.itemsize)
    for q in range(0, m, step):
        prefetch(a2, row, p0 + q)


@helper
def _prefetch_run_write(a2, row, p0, m):
    """:func:`_prefetch_run` for a run about to be stored to (the lines fetched for ownership)."""
    step = max(1, LINE_BYTES // a2.itemsize)
    for q in range(0, m, step):
        prefetch_write(a2, row, p0 + q)


@helper(sums=True)
def _plane_sums(dyr, xr, m, rs):
    """``(sum_p dy * x_hat, sum_p dy)`` over one plane's block of pixels: a channel's share of
    dw/db. Reads only (no store in the loop), so LLVM splits the sums into SIMD lanes in one
    fixed order (``ops/_rows.shift_row`` says why a storing loop would not be fixed)."""
    wide()
    sw = acc_zero(m)
    sb = acc_zero(m)
    for p in range(m.shape[0]):
        dyv = load(dyr, p)
        sw += dyv * ((load(xr, p) - m[p]) * rs[p])
        sb += dyv
    return sw, sb


# --------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------


@kernel
def ln2d_fwd(x, w, b, y, mean, rstd, eps, block, far):
    """LayerNorm over the channels of every pixel of NCHW ``x``.

    x      (N, C, S)  input, storage dtype, contiguous (S = H * W)
    w, b   (C,)       weight, bias in the accumulation dtype (ones / zeros if absent)
    y      (N, C, S)  out: the normalised input, storage dtype
    mean   (N * S,)   out: per-pixel means, accumulation dtype
    rstd   (N * S,)   out: 1 / sqrt(var + eps)
    block  int        pixels per task (no effect on results)
    far    bool       x is far larger than the caches: the first pass asks for the runs of the
                      plane ``AHEAD`` planes on while it sums this one (no effect on results)
    """
    n, nc, ns = x.shape
    n_blk = (ns + block - 1) // block
    x2 = x.reshape(n * nc, ns)  # the planes as rows, for the prefetches
    y2 = y.reshape(n * nc, ns)
    for t in prange(n * n_blk):
        wide()
        i = t // n_blk
        p0 = (t - i * n_blk) * block
        m = min(block, ns - p0)  # pixels in this block
        sh = np.empty(m, w.dtype)  # (m,) per pixel: the shift (its channel 0)
        md = np.empty(m, w.dtype)  # (m,) per pixel: mean(x - shift)
        rs = np.empty(m, w.dtype)  # (m,) per pixel: rstd
        acc = np.empty(m, w.dtype)  # (m,) per pixel: the running sum over channels
        x0 = x[i, 0, p0:p0 + m]
        for p in range(m):
            sh[p] = load(x0, p)
            acc[p] = acc_zero(w)
        for c in range(nc):  # pass 1: sum of d = x - shift
            if far and c + AHEAD < nc:
                _prefetch_run(x2, i * nc + c + AHEAD, p0, m)
            xr = x[i, c, p0:p0 + m]  # this block of the plane
            for p in range(m):
                acc[p] += load(xr, p) - sh[p]
        for p in range(m):
            md[p] = acc_cast(w, acc[p] / nc)
            acc[p] = acc_zero(w)
        for c in range(nc):  # pass 2: sum of (d - mean(d))^2, from cache
            xr = x[i, c, p0:p0 + m]  # this block of the plane
            for p in range(m):
                e = (load(xr, p) - sh[p]) - md[p]
                acc[p] += e * e
        mo = mean[i * ns + p0:i * ns + p0 + m]  # (m,) this block's outputs
        ro = rstd[i * ns + p0:i * ns + p0 + m]
        for p in range(m):
            var = acc_cast(w, acc[p] / nc)  # biased
            r = acc_cast(w, 1.0) / np.sqrt(var + acc_cast(w, eps))
            rs[p] = r
            mo[p] = sh[p] + md[p]
            ro[p] = r
        for c in range(nc):  # output: y = x_hat * w + b
            if far and y.itemsize >= 4 and c + AHEAD < nc:  # see AHEAD
                _prefetch_run_write(y2, i * nc + c + AHEAD, p0, m)
            xr = x[i, c, p0:p0 + m]  # this block of the plane
            yr = y[i, c, p0:p0 + m]
            wc = w[c]
            bc = b[c]
            for p in range(m):
                store(yr, p, (((load(xr, p) - sh[p]) - md[p]) * rs[p]) * wc + bc)


# --------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------


@kernel
def ln2d_bwd(dy, x, w, mean, rstd, dx, block, need_wb, far):
    """Gradients of LayerNorm2d for every pixel; returns ``(dw, db)``.

    dy       (N, C, S)   gradient of y, storage dtype
    x        (N, C, S)   the forward's input
    w        (C,)        weight, accumulation dtype (ones if absent)
    mean     (N * S,)    saved per-pixel means
    rstd     (N * S,)    saved 1 / sqrt(var + eps)
    dx       (N, C, S)   out: gradient of x, storage dtype
    block    int         pixels per task (``launch_2d.block_size``, from the shape and dtype only)
    returns  dw, db (C,) in the accumulation dtype (size 0 unless ``need_wb``)

    Per pixel, with ``g = dy * w`` and ``x_hat = (x - mean) * rstd`` (LayerNorm's rows)::

        dx = rstd * ( g                             # term 1: through x directly
                      - mean_c(g)                   # term 2: through the mean
                      - x_hat * mean_c(g * x_hat) ) # term 3: through the variance
        dw[c] = sum over n, p of dy * x_hat,   db[c] = sum over n, p of dy

    Each task writes its block's share of dw/db as one partial row; the rows are
    merged in task order, in float64. Tasks depend on the shape only, so the bits do
    not depend on the number of threads.
    """
    n, nc, ns = x.shape
    n_blk = (ns + block - 1) // block
    n_tasks = n * n_blk
    n_part = n_tasks if need_wb else 0
    dw_part = np.empty((n_part, nc), w.dtype)  # per-task partial sums of dy * x_hat
    db_part = np.empty((n_part, nc), w.dtype)  # per-task partial sums of dy
    n_out = nc if need_wb else 0
    dw = np.empty(n_out, w.dtype)
    db = np.empty(n_out, w.dtype)
    x2 = x.reshape(n * nc, ns)  # the planes as rows, for the prefetches
    dy2 = dy.reshape(n * nc, ns)
    for t in prange(n_tasks):
        wide()
        i = t // n_blk
        p0 = (t - i * n_blk) * block
        m = min(block, ns - p0)
        mu = np.empty(m, w.dtype)  # (m,) per pixel: mean
        rs = np.empty(m, w.dtype)  # (m,) per pixel: rstd
        s1 = np.empty(m, w.dtype)  # (m,) per pixel: sum of g, then mean(g)
        s2 = np.empty(m, w.dtype)  # (m,) per pixel: sum of g * x_hat, then its mean
        mi = mean[i * ns + p0:i * ns + p0 + m]  # (m,) this block's statistics
        ri = rstd[i * ns + p0:i * ns + p0 + m]
        for p in range(m):
            mu[p] = mi[p]
            rs[p] = ri[p]
            s1[p] = acc_zero(w)
            s2[p] = acc_zero(w)
        for c in range(nc):  # the per-pixel sums over channels
            if far and c + AHEAD < nc:
                _prefetch_run(x2, i * nc + c + AHEAD, p0, m)
                _prefetch_run(dy2, i * nc + c + AHEAD, p0, m)
            xr = x[i, c, p0:p0 + m]  # this block of the plane
            dyr = dy[i, c, p0:p0 + m]
            wc = w[c]
            for p in range(m):
                xh = (load(xr, p) - mu[p]) * rs[p]
                g = load(dyr, p) * wc
                s1[p] += g
                s2[p] += g * xh
        for p in range(m):
            s1[p] = acc_cast(w, s1[p] / nc)  # term 2
            s2[p] = acc_cast(w, s2[p] / nc)  # term 3's factor
        for c in range(nc):  # dx, from cache
            xr = x[i, c, p0:p0 + m]  # this block of the plane
            dyr = dy[i, c, p0:p0 + m]
            dxr = dx[i, c, p0:p0 + m]
            wc = w[c]
            for p in range(m):
                xh = (load(xr, p) - mu[p]) * rs[p]
                store(dxr, p, rs[p] * ((load(dyr, p) * wc - s1[p]) - xh * s2[p]))
            if need_wb:
                sw, sb = _plane_sums(dyr, xr, mu, rs)
                dw_part[t, c] = sw
                db_part[t, c] = sb
    if need_wb:  # merge the partials in task order, 256 channels per task
        for blk in prange((nc + 255) // 256):
            lo = blk * 256
            hi = min(lo + 256, nc)
            sw = np.zeros(hi - lo, np.float64)
            sb = np.zeros(hi - lo, np.float64)
            for t in range(n_tasks):
                for c in range(lo, hi):
                    sw[c - lo] += dw_part[t, c]
                    sb[c - lo] += db_part[t, c]
            for c in range(lo, hi):
                dw[c] = sw[c - lo]
                db[c] = sb[c - lo]
    return dw, db


# --------------------------------------------------------------------------
# Entry functions: the kernels on raw pointers (``ops/_ptr.py``)
# --------------------------------------------------------------------------


@helper
def ln2d_fwd_at(proto, acc, px, pw, pb, py, n, nc, ns, eps, block, far):
    """:func:`ln2d_fwd` on the buffers at the given addresses; returns ``(mean, rstd)``, (N * S,) each.

    proto, acc   (1,)  prototypes of the storage and the accumulation dtype
    px, py             x, y: (N, C, S), storage dtype
    pw, pb             weight, bias: (C,), accumulation dtype; 0 for ones / zeros
    """
    shape = (n, nc, ns)
    w, b = params_at(acc, pw, pb, nc)
    mean = np.empty(n * ns, acc.dtype)
    rstd = np.empty(n * ns, acc.dtype)
    ln2d_fwd(at(px, proto, shape), w, b, at(py, proto, shape), mean, rstd, eps, block, far)
    return mean, rstd


@helper
def ln2d_bwd_at(proto, acc, pdy, px, pw, mean, rstd, pdx, n, nc, ns, block, need_wb, far):
    """:func:`ln2d_bwd` on the buffers at the given addresses; returns ``(dw, db)``.

    pdy, px, pdx   dy, x, dx: (N, C, S), storage dtype
    pw             weight (C,), accumulation dtype; 0 for ones
    mean, rstd     the forward's statistics (arrays, (N * S,))
    """
    shape = (n, nc, ns)
    w, _ = params_at(acc, pw, 0, nc)
    return ln2d_bwd(at(pdy, proto, shape), at(px, proto, shape), w, mean, rstd, at(pdx, proto, shape), block,
                    need_wb, far)
