"""Numba kernels of the ``"cpu"`` backend for LayerNorm and RMSNorm.

Two kernels serve four ops. RMSNorm is LayerNorm without centring
(``center=False``: the shift and the mean are 0, there is no bias, and the
backward loses the ``mean(g)`` term); the fused residual add is the same
kernel reading ``x + residual`` (``has_res=True``); the Llama-style RMSNorm
rounds ``x_hat`` to the storage dtype before the weight multiplies it
(``cast_x_hat=True``: a loop of its own, so the default loops are unchanged).
One source is compiled for
each storage type of ``x`` (float32, float64, int16 = bfloat16 bits, uint16 =
float16 bits: see ``ops/_bf16.py``), with the accumulation dtype following it
(float64 for float64, float32 otherwise).

Memory traffic per element:

- forward:  read x (and residual), write y (and h = x + residual)
- backward: read x and dy (and dh), write dx; dw/db through per-chunk partials

Rows of up to ``SHORT_COLS`` values (512 in half precision) are normalised
without scratch: each pass of the forward reads the row again, from L1
(:func:`_fwd_short`). Longer rows are read from memory once into a scratch
row in the accumulation dtype, and the further passes run over the scratch
(:func:`_fwd_long`). The backward keeps no scratch either (:func:`_bwd_direct`:
its sums read ``x`` and ``dy``, and the ``dx`` loop reads them again, from L1
or L2), except for the fused add's and the rounded ``x_hat``'s, which store
``g`` and ``x_hat`` rows. All loops are plain elementwise loops that LLVM
vectorizes (with 512-bit registers where the CPU has them: ``ops/_simd.wide``).
The fused row loops that sum (:func:`_shift_row` and :func:`_sqdev`, shared with
GroupNorm from ``ops/_rows.py``, :func:`_grad_row` and :func:`_grad_sums`)
are the only code compiled with
``fastmath={"reassoc"}`` (and ``_sqdev`` with ``"contract"``: fused
multiply-adds): it lets LLVM split a sum into SIMD lanes, which only reorders
the additions of numbers already computed (no NaN/Inf assumptions, no
rewriting of the differences that the shifted statistics rely on: each is a
stored value or a two-operand difference). The order is fixed by the compiled
code, so results do not depend on threads.

This module imports numba: ``launch.py`` loads it on first use.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._bf16 import acc_cast, acc_zero, load, round_as, store
from .._jit import helper, kernel
from .._ptr import at
from .._rows import shift_row as _shift_row
from .._rows import sqdev as _sqdev
from .._simd import inline, wide



@helper(sums=True)
def _grad_row(dyr, xr, w, m, rs, x_hat, g):
    """``x_hat[j] = (x[j] - m) * rs``, ``g[j] = dy[j] * w[j]``; returns ``(sum(g), sum(g * x_hat))``.

    One loop over the two input rows (each read from memory once) stores both
    products; a second loop sums them from scratch (L1). A loop that stored and
    summed at once would add in an order that depends on the scratch's address
    (``ops/_rows.shift_row`` says why).
    """
    wide()
    inline()
    for j in range(g.shape[0]):
        x_hat[j] = (load(xr, j) - m) * rs
        g[j] = load(dyr, j) * w[j]
    s1 = acc_zero(g)
    s2 = acc_zero(g)
    for j in range(g.shape[0]):
        gv = g[j]
        s1 += gv
        s2 += gv * x_hat[j]
    return s1, s2


@helper(sums=True)
def _grad_sums(dyr, xr, w, m, rs):
    """``(sum(g), sum(g * x_hat))`` of :func:`_grad_row` without storing ``g`` and ``x_hat``
    (:func:`_bwd_direct`, whose ``dx`` loop computes them again from ``x`` and ``dy``)."""
    wide()
    inline()
    s1 = acc_zero(w)
    s2 = acc_zero(w)
    for j in range(w.shape[0]):
        xh = (load(xr, j) - m) * rs
        gv = load(dyr, j) * w[j]
        s1 += gv
        s2 += gv * xh
    return s1, s2


@helper(sums=True)
def _shift_sum(x, r, shift):
    """``sum_j (x[r, j] - shift)``: :func:`ops._rows.shift_row`'s sum, read from the row
    itself instead of stored to scratch (the loop only reads: one order, any addresses).
    The same differences, summed by the same loop: the same value."""
    wide()
    inline()
    s = shift - shift
    for j in range(x.shape[1]):
        s += load(x, (r, j)) - shift
    return s


@helper(sums=True, fma=True)
def _sqdev_row(x, r, shift, m):
    """``sum_j ((x[r, j] - shift) - m)^2``: :func:`ops._rows.sqdev` over the row's
    differences computed again from the row (same two halves, same fused multiply-adds)."""
    wide()
    inline()
    s0 = m - m
    s1 = m - m
    n = x.shape[1]
    h = n // 2
    for j in range(h):
        e = (load(x, (r, j)) - shift) - m
        s0 += e * e
        f = (load(x, (r, h + j)) - shift) - m
        s1 += f * f
    for j in range(2 * h, n):
        e = (load(x, (r, j)) - shift) - m
        s0 += e * e
    return s0 + s1


# Rows of at most this many values are normalised without scratch: each of the three
# passes (sum, squared deviations, output) reads the row again (from L1), which costs
# less than storing it to scratch and reading that back. Side by side, one thread, the
# forward with the old limit (256) and this one, same bits: float32 in cache (2 MB)
# 384 columns 198 -> 181 us, 512 201 -> 176, 1024 216 -> 163, 2048 185 -> 175; from
# memory (64 MB) 15.1 -> 12.9 ms, 16.0 -> 12.7, 14.7 -> 12.2, 14.4 -> 12.6.
SHORT_COLS = 2048
# The same for half-precision storage, whose every re-read converts the row again:
# bfloat16 384 columns 218 -> 200 us (9.5 -> 8.2 ms from memory), 512 187 -> 188 us
# (9.7 -> 8.5 ms); at 1024 slower in cache (165 -> 176 us), so not beyond 512.
SHORT_COLS_HALF = 512


# --------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------


@kernel
def norm_fwd(x, res, h, w, b, y, mean, rstd, eps, has_res, center, cast_x_hat, rows, rpw):
    """LayerNorm (``center``) or RMSNorm of every row, optionally of ``x + res``.

    x     (n_rows, n_cols)  input, storage dtype
    res   (n_rows, n_cols)  residual, same dtype (read if ``has_res``)
    h     (n_rows, n_cols)  out: x + res rounded to the storage dtype (written if ``has_res``)
    w, b  (G, n_cols)       weight, bias in the accumulation dtype (ones / zeros if absent);
                            row i uses row ``i // rpw`` of each (G = 1: one weight for all rows;
                            G > 1: torch.func.vmap over stacked weights, a weight per group of
                            ``rpw`` rows)
    y     (n_rows, n_cols)  out: the normalised rows, storage dtype
    mean  (n_rows,)         out: row means, accumulation dtype (written if ``center``)
    rstd  (n_rows,)         out: 1 / sqrt(var + eps), accumulation dtype
    cast_x_hat  bool        y = round(x_hat) * w + b: x_hat rounded to the storage dtype first
    rows  int               rows per task
    rpw   int               rows per weight row (n_rows when G = 1)

    The statistics are those of ``ops/_common.shifted_mean_var``::

        d     = x - x[0]            shift by the row's own first value
        mean  = x[0] + mean(d)
        xc    = d - mean(d)
        var   = mean(xc * xc)       biased
        y     = xc * rstd * w + b

    so a row with a large mean against its spread keeps its digits and a
    constant row gives exactly ``b``. RMSNorm: shift and mean are 0, ``xc = x``.
    """
    n_rows, n_cols = x.shape
    n_tasks = (n_rows + rows - 1) // rows
    for t in prange(n_tasks):
        wide()
        lo = t * rows
        hi = min(lo + rows, n_rows)
        if n_cols > (SHORT_COLS if x.itemsize >= 4 else SHORT_COLS_HALF):
            _fwd_long(x, res, h, w, b, y, mean, rstd, eps, has_res, center, cast_x_hat, lo, hi, rpw)
        else:
            src = x  # the rows normalised: x, or h for the fused add
            if has_res:  # h = x + res for the task's rows (in L2), then normalise h
                for i in range(lo, hi):
                    _add_row(x, res, h, i)
                src = h
            _fwd_short(src, w, b, y, mean, rstd, eps, center, cast_x_hat, lo, hi, rpw)


@helper(spliced=True)
def _add_row(x, res, h, i):
    """``h[i] = x[i] + res[i]``, rounded to the storage dtype as ``torch.add`` rounds it."""
    hr = h[i]
    xr = x[i]
    rr = res[i]
    for j in range(hr.shape[0]):
        store(hr, j, load(xr, j) + load(rr, j))


@helper(spliced=True)
def _over_n(a, s, n):
    """``s / n`` rounded to the accumulation dtype (``a``'s, ``s``'s), as ``acc_cast(a, s / n)`` (a
    float64 quotient) gives it, but divided in that dtype: for ``n <= 2**24`` (exact in float32)
    the float64 quotient of two float32 values rounds to the float32 quotient (float64 carries
    more than twice float32's digits, so the double rounding is exact), and one ``divss`` is ~10
    cycles shorter on a row's critical path than ``cvtss2sd, divsd, cvtsd2ss``."""
    if n <= 16777216:
        return s / acc_cast(a, n)
    return acc_cast(a, s / n)


@helper
def _fwd_short(x, w, b, y, mean, rstd, eps, center, cast_x_hat, lo, hi, rpw):
    """:func:`norm_fwd` of rows ``lo:hi`` of ``x`` (``h`` for the fused add), rows of at most
    ``SHORT_COLS`` values (``SHORT_COLS_HALF`` in half precision): no scratch, each pass reads
    the row again (from L1), which costs less than storing it to scratch and reading that back.
    The weight row is picked once unless there are several (vmap)."""
    wide()
    n_cols = x.shape[1]
    wr = w[0]
    br = b[0]
    for i in range(np.uint64(lo), np.uint64(hi)):  # unsigned: see _bwd_direct
        if w.shape[0] > 1:  # vmap's stacked weights (an absent weight or bias stays one row)
            wr = w[np.int64(i) // rpw]
        if b.shape[0] > 1:
            br = b[np.int64(i) // rpw]
        shift = acc_zero(wr)
        if center:
            shift = load(x, (i, 0))
        sum_d = _shift_sum(x, i, shift)
        mean_d = acc_zero(wr)
        if center:
            mean_d = _over_n(wr, sum_d, n_cols)
            mean[i] = shift + mean_d
        var = _over_n(wr, _sqdev_row(x, i, shift, mean_d), n_cols)  # RMSNorm: the mean square
        rs = acc_cast(wr, 1.0) / np.sqrt(var + acc_cast(wr, eps))
        rstd[i] = rs
        yr = y[i]
        if cast_x_hat:  # y = round(x_hat) * w + b: the product of two storage values
            for j in range(n_cols):
                store(yr, j, round_as(yr, ((load(x, (i, j)) - shift) - mean_d) * rs) * wr[j] + br[j])
        else:
            for j in range(n_cols):  # y = x_hat * w + b, x_hat = (d - mean(d)) * rstd, d recomputed
                store(yr, j, (((load(x, (i, j)) - shift) - mean_d) * rs) * wr[j] + br[j])


@helper
def _fwd_long(x, res, h, w, b, y, mean, rstd, eps, has_res, center, cast_x_hat, lo, hi, rpw):
    """:func:`norm_fwd` of rows ``lo:hi``, rows longer than :func:`_fwd_short` takes: each row is read
    from memory once into scratch ``d`` (the row minus its shift); the other passes read ``d``
    (L1). The fused add writes ``h`` a row at a time, just before normalising it."""
    wide()
    n_cols = x.shape[1]
    d = np.empty(n_cols, w.dtype)  # (n_cols,) scratch: the row minus its shift
    for i in range(lo, hi):
        wr = w[i // rpw if w.shape[0] > 1 else 0]  # (n_cols,) this row's weight and bias (an
        br = b[i // rpw if b.shape[0] > 1 else 0]  # absent one is a single row of ones / zeros)
        src = x  # the rows normalised: x, or h for the fused add
        if has_res:  # h = x + res, rounded as torch.add would; normalise h
            _add_row(x, res, h, i)
            src = h
        shift = acc_zero(d)
        if center:
            shift = load(src, (i, 0))
        sum_d = _shift_row(src, i, d, shift)  # d = x - shift, read from memory once
        mean_d = acc_zero(d)
        if center:
            mean_d = _over_n(d, sum_d, n_cols)
            mean[i] = shift + mean_d
        var = _over_n(d, _sqdev(d, n_cols, mean_d), n_cols)  # RMSNorm: the mean square
        rs = acc_cast(d, 1.0) / np.sqrt(var + acc_cast(d, eps))
        rstd[i] = rs
        yr = y[i]
        if cast_x_hat:
            for j in range(n_cols):
                store(yr, j, round_as(yr, (d[j] - mean_d) * rs) * wr[j] + br[j])
        else:
            for j in range(n_cols):
                store(yr, j, ((d[j] - mean_d) * rs) * wr[j] + br[j])


# --------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------


@helper
def _bwd_direct(dy, x, wr, mean, rstd, dx, pw, pb, center, need_wb, lo, hi):
    """:func:`norm_bwd` of rows ``lo:hi`` (without the fused add and the rounded ``x_hat``), all
    of one weight row ``wr``: no scratch, the sums read ``x`` and ``dy`` and the ``dx`` loop
    reads them again (from L1, or L2 for the widest rows); this chunk's ``dw``/``db`` added to
    ``pw``/``pb``. ``x_hat`` and ``g`` are the same two-operand products the scratch path stores,
    so the results are the same bits. Side by side against scratch rows (one thread, float32):
    384 columns 340 -> 273 us in cache, 22.6 -> 19.7 ms from memory; 1024 361 -> 304 us,
    25.2 -> 23.2 ms; bfloat16 384 279 -> 244 us.

    The row index is unsigned: numba indexes with a signed integer through a check for a
    negative index (Python's ``a[-1]``), which LLVM could not remove here (it cannot tell that
    ``lo`` is not negative), and it cost ~7 ns a row -- rows of 16 float32 values took 1.8x as
    long as with the index unsigned (measured)."""
    wide()
    n_cols = x.shape[1]
    for i in range(np.uint64(lo), np.uint64(hi)):
        # (these lines repeat norm_bwd's row loop on purpose: spliced from one helper
        # (``helper(spliced=True)``) they made this loop 2-3x slower on rows of 16-256
        # values, measured)
        xr = x[i]
        dyr = dy[i]
        dxr = dx[i]
        m = acc_zero(wr)
        if center:
            m = mean[i]
        rs = rstd[i]
        sum_g, sum_gx = _grad_sums(dyr, xr, wr, m, rs)
        mean_g = acc_zero(wr)
        if center:
            mean_g = _over_n(wr, sum_g, n_cols)  # term 2
        mean_gx = _over_n(wr, sum_gx, n_cols)  # term 3's factor
        if need_wb:  # dx and this row's share of dw/db in one loop
            for j in range(n_cols):
                xh = (load(xr, j) - m) * rs
                dyv = load(dyr, j)
                store(dxr, j, rs * ((dyv * wr[j] - mean_g) - xh * mean_gx))
                pw[j] += dyv * xh
                pb[j] += dyv
        else:
            for j in range(n_cols):
                xh = (load(xr, j) - m) * rs
                store(dxr, j, rs * ((load(dyr, j) * wr[j] - mean_g) - xh * mean_gx))


@kernel
def norm_bwd(dy, x, w, mean, rstd, dh, dx, rows, has_dh, center, cast_x_hat, need_wb, rpw):
    """Gradients of LayerNorm (``center``) or RMSNorm for every row; returns ``(dw, db)``.

    dy       (n_rows, n_cols)    gradient of y, storage dtype
    x        (n_rows, n_cols)    the forward's input (its h for the fused add)
    w        (G, n_cols)         weight, accumulation dtype (ones if absent); row i uses
                                 row ``i // rpw`` (see :func:`norm_fwd`)
    mean     (n_rows,)           saved means (read if ``center``)
    rstd     (n_rows,)           saved 1 / sqrt(var + eps)
    dh       (n_rows, n_cols)    gradient arriving at h = x + res (read if ``has_dh``)
    dx       (n_rows, n_cols)    out: gradient of x (plus dh), storage dtype
    rows     int                 rows per chunk (``_launch.rows_per_chunk``)
    cast_x_hat bool              the forward rounded x_hat first: dw sums dy * round(x_hat)
    rpw      int                 rows per weight row (n_rows when G = 1)
    returns  dw, db (G, n_cols)  sums over each weight row's rows, accumulation dtype
                                 (size 0 unless ``need_wb``)

    With ``g = dy * w`` and ``x_hat = (x - mean) * rstd``::

        dx = rstd * ( g                            # term 1: through x directly
                      - mean(g)                    # term 2: through the mean (LayerNorm only)
                      - x_hat * mean(g * x_hat) )  # term 3: through the variance
        dw = sum over rows of dy * x_hat,   db = sum over rows of dy

    (``cast_x_hat``: the rounding counts as the identity for dx, as autograd's cast does;
    dw sums ``dy * round(x_hat)``, the value the weight multiplied.)

    dw and db are summed over fixed chunks of ``rows`` rows (each weight row's
    ``rpw`` rows split into chunks of their own), then the chunk partials are
    merged in chunk order, in float64: the same bits for any number of threads.
    """
    n_rows, n_cols = x.shape
    n_w = w.shape[0]
    per_w = (rpw + rows - 1) // rows  # chunks per weight row
    n_chunks = n_w * per_w
    n_part = n_chunks if need_wb else 0
    dw_part = np.empty((n_part, n_cols), w.dtype)  # per-chunk partial sums of dy * x_hat
    db_part = np.empty((n_part, n_cols), w.dtype)  # per-chunk partial sums of dy
    n_out = n_w if need_wb else 0
    dw = np.empty((n_out, n_cols), w.dtype)
    db = np.empty((n_out, n_cols), w.dtype)
    # scratch rows only for the fused add (dx adds dh) and the rounded x_hat (dw reads it
    # rounded); otherwise _bwd_direct reads x and dy again
    direct = not has_dh and not cast_x_hat
    for c in prange(n_chunks):
        wide()
        x_hat = np.empty(0 if direct else n_cols, w.dtype)  # (n_cols,) scratch
        g = np.empty(0 if direct else n_cols, w.dtype)  # (n_cols,) scratch
        pw = np.zeros(n_cols, w.dtype)  # (n_cols,) this chunk's sum of dy * x_hat
        pb = np.zeros(n_cols, w.dtype)  # (n_cols,) this chunk's sum of dy
        gw = c // per_w  # the chunk's weight row
        wr = w[gw if w.shape[0] > 1 else 0]  # (n_cols,) (an absent weight: one row of ones)
        lo_row = gw * rpw + (c - gw * per_w) * rows
        hi_row = min(lo_row + rows, (gw + 1) * rpw, n_rows)
        if direct:
            _bwd_direct(dy, x, wr, mean, rstd, dx, pw, pb, center, need_wb, lo_row, hi_row)
            lo_row = hi_row  # done: the loop below runs no row
        for i in range(lo_row, hi_row):
            xr = x[i]
            dyr = dy[i]
            dxr = dx[i]
            m = acc_zero(wr)
            if center:
                m = mean[i]
            rs = rstd[i]
            sum_g, sum_gx = _grad_row(dyr, xr, wr, m, rs, x_hat, g)
            mean_g = acc_zero(wr)
            if center:
                mean_g = _over_n(wr, sum_g, n_cols)  # term 2
            mean_gx = _over_n(wr, sum_gx, n_cols)  # term 3's factor
            if has_dh:  # fused add: h's own gradient joins dx
                dhr = dh[i]
                for j in range(n_cols):
                    store(dxr, j, rs * ((g[j] - mean_g) - x_hat[j] * mean_gx) + load(dhr, j))
            else:  # (here cast_x_hat: the rows without either took _bwd_direct)
                for j in range(n_cols):
                    store(dxr, j, rs * ((g[j] - mean_g) - x_hat[j] * mean_gx))
            if need_wb and cast_x_hat:  # dw: dy times the rounded x_hat the weight saw
                for j in range(n_cols):
                    dyv = load(dyr, j)
                    pw[j] += dyv * round_as(dyr, x_hat[j])
                    pb[j] += dyv
            elif need_wb and has_dh:
                for j in range(n_cols):
                    dyv = load(dyr, j)
                    pw[j] += dyv * x_hat[j]
                    pb[j] += dyv
        if need_wb:
            for j in range(n_cols):
                dw_part[c, j] = pw[j]
                db_part[c, j] = pb[j]
    if need_wb:  # merge each weight row's partials in chunk order, 256 columns per task
        n_blk = (n_cols + 255) // 256
        for task in prange(n_w * n_blk):
            gw = task // n_blk
            lo = (task - gw * n_blk) * 256
            hi = min(lo + 256, n_cols)
            sw = np.zeros(hi - lo, np.float64)
            sb = np.zeros(hi - lo, np.float64)
            for c in range(gw * per_w, (gw + 1) * per_w):
                for j in range(lo, hi):
                    sw[j - lo] += dw_part[c, j]
                    sb[j - lo] += db_part[c, j]
            for j in range(lo, hi):
                dw[gw, j] = sw[j - lo]
                db[gw, j] = sb[j - lo]
    return dw, db


# --------------------------------------------------------------------------
# Entry functions: the kernels on raw pointers (``ops/_ptr.py``)
# --------------------------------------------------------------------------


@helper
def _weights_at(acc, pw, pb, n_w, n_cols):
    """Weight and bias (n_w, n_cols) in the accumulation dtype at ``pw``/``pb``; a (1, n_cols)
    row of ones / zeros for address 0 (an absent weight or bias)."""
    w = at(pw, acc, (n_w, n_cols)) if pw != 0 else np.ones((1, n_cols), acc.dtype)
    b = at(pb, acc, (n_w, n_cols)) if pb != 0 else np.zeros((1, n_cols), acc.dtype)
    return w, b


@helper
def norm_fwd_at(proto, acc, px, pres, ph, pw, pb, py, n_rows, n_cols, eps, has_res, center, cast_x_hat, rows,
                n_w):
    """:func:`norm_fwd` on the buffers at the given addresses; returns ``(mean, rstd)``.

    proto, acc   (1,)  prototypes of the storage and the accumulation dtype
    px, py             x, y: (n_rows, n_cols), storage dtype
    pres, ph           residual, h (read / written if ``has_res``)
    pw, pb             weight, bias: (n_w, n_cols), accumulation dtype; 0 for ones / zeros;
                       ``n_w`` rows, each for ``n_rows / n_w`` consecutive rows of x
    returns            mean (n_rows,) (size 0 unless ``center``), rstd (n_rows,)
    """
    shape = (n_rows, n_cols)
    x = at(px, proto, shape)
    res = at(pres if has_res else px, proto, shape)
    h = at(ph if has_res else px, proto, shape)
    w, b = _weights_at(acc, pw, pb, n_w, n_cols)
    mean = np.empty(n_rows if center else 0, acc.dtype)
    rstd = np.empty(n_rows, acc.dtype)
    norm_fwd(x, res, h, w, b, at(py, proto, shape), mean, rstd, eps, has_res, center, cast_x_hat, rows,
             n_rows // n_w)
    return mean, rstd


@helper
def norm_bwd_at(proto, acc, pdy, px, pw, mean, rstd, pdh, pdx, n_rows, n_cols, rows, has_dh, center, cast_x_hat,
                need_wb, n_w):
    """:func:`norm_bwd` on the buffers at the given addresses; returns ``(dw, db)``, (n_w, n_cols) each.

    pdy, px, pdx       dy, x, dx: (n_rows, n_cols), storage dtype
    pdh                dh (read if ``has_dh``)
    pw                 weight (n_w, n_cols), accumulation dtype; 0 for ones (see :func:`norm_fwd_at`)
    mean, rstd         the forward's statistics (arrays)
    """
    shape = (n_rows, n_cols)
    dy = at(pdy, proto, shape)
    w, _ = _weights_at(acc, pw, 0, n_w, n_cols)
    dh = at(pdh if has_dh else pdy, proto, shape)
    return norm_bwd(dy, at(px, proto, shape), w, mean, rstd, dh, at(pdx, proto, shape), rows, has_dh, center,
                    cast_x_hat, need_wb, n_rows // n_w)
