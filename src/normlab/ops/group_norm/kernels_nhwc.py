"""Numba kernels of the ``"cpu"`` backend for GroupNorm/InstanceNorm on NHWC inputs.

channels_last inputs, and every input with ``S == 1`` (where the NCHW and NHWC
layouts are the same memory), are read as ``(N, S, C)``: channels fastest, a
fixed chunk of samples per task. The statistics, their two passes and the
backward's terms are those of the NCHW kernels (``kernels.py``, whose docstring
has the algorithm); ``kernels.py`` re-exports the entry functions for the loader.
Two kinds of kernels:

- per channel, :func:`gn_fwd_nhwc` / :func:`gn_bwd_nhwc`: a sample at a time, the
  task keeps per-channel vectors (sums, shifts, scales) of length ``C``, so every
  inner loop runs over contiguous channels; per-group values are spread to their
  channels, per-channel sums added per group. Fast when ``S`` is large or groups
  have many channels; with ``S == 1`` and small groups a sample's ~10 loops of
  length ``C`` and its per-group loops of length ``Cg`` (and scalar divisions and
  square roots per group) cost ~170 ns per 64-value sample.
- blocks, :func:`gn_fwd_s1` / :func:`gn_bwd_s1`, for ``S == 1`` and small groups
  (:func:`takes_s1_blocks`, which the launcher asks; each kind is compiled only
  when an input takes it; their helpers are ``generic``, compiled once each): each group's
  ``Cg`` values are contiguous, so a task takes a block of whole samples (~1K
  values) and runs every step as one loop over all the block's values, or all its
  groups (the divisions and square roots vectorize too): per-group sums by
  pairwise halvings over the block (:func:`_block_sums`), per-group values spread
  to their channels by vector stores (:func:`_block_spread`). At (15000, 64),
  G = 8, float32, one thread (measured): forward ~2.5x, backward ~1.5x the
  per-channel kernels' speed.

Summation orders, fixed by the source and the shape, never by the threads: the
per-channel kernels add a group's per-channel sums in ``_group_sums`` /
``_group_dots`` (their only reassociated sums, split into SIMD lanes by LLVM),
the per-channel sums over ``s`` in order; the block kernels add a group pairwise
while its count is even, then in order (no reassociation anywhere). dw/db: each
task adds its samples' terms into its own partials (one row per task; the block
backward first into one slot per sample of a block, the slots then added in
order), and the rows are merged over tasks in task order (``kernels._merge_rows``).

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
    group's channels. With S == 1 a sample is one row of ``C`` values; with
    S == 1 and small groups the launcher runs :func:`gn_fwd_s1` instead (:func:`takes_s1_blocks`).
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
    With S == 1 and small groups the launcher runs :func:`gn_bwd_s1` instead (:func:`takes_s1_blocks`).
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


# --------------------------------------------------------------------------
# S == 1 and small groups: x as (N, 1, C), each group's Cg values contiguous, a block at a time
# --------------------------------------------------------------------------

# Values per block (of float32; half as many of float64): a task takes its samples a block
# at a time (at least one sample), so that the block's scratch rows and its slices of
# the inputs and outputs stay in L1 (the sizes measured fastest at (15000, 64), G = 8).
FWD_BLOCK = 1024
BWD_BLOCK = 512
# Scratch rows are SKEW values longer than a block: rows a multiple of 4 KiB apart make
# loads wait on earlier stores to another row at the same offset (4K aliasing).
SKEW = 80


@helper
def _odd_part(cg):
    """``(m, p)`` with ``cg = m * 2**p``, ``m`` odd."""
    m = cg
    p = 0
    while m % 2 == 0:
        m //= 2
        p += 1
    return m, p


@helper
def _s1_geometry(nc, n_groups, block, itemsize, rows):
    """The block kernels' sizes: ``(cg, m, p, bs, nv, nb)``.

    cg       channels per group; ``cg = m * 2**p`` with ``m`` odd (:func:`_odd_part`)
    bs       samples per block: about ``block`` float32-sized values, at least 1, at most ``rows``
    nv, nb   values and groups per block (``bs * nc``, ``bs * n_groups``)
    """
    cg = nc // n_groups
    m, p = _odd_part(cg)
    bs = max(1, min(block * 4 // itemsize // nc, rows))
    return cg, m, p, bs, bs * nc, bs * n_groups


def takes_s1_blocks(ns, nc, cg, fixed, backward, acc_size):
    """Whether the block kernel (:func:`gn_fwd_s1`, or :func:`gn_bwd_s1` when ``backward``)
    takes the input, rather than :func:`gn_fwd_nhwc` / :func:`gn_bwd_nhwc`: from the shape
    and the accumulation dtype's size (``acc_size``) only.

    Only S == 1 without fixed statistics. The per-channel kernels spend their time
    in short per-sample and per-group loops when groups are small; the block
    kernels' cost grows with the halvings and the odd factor of ``Cg``
    (:func:`_block_sums`), the per-channel kernels' falls as their loops over the
    channels get longer. Where the block kernels were not faster (one thread,
    measured), the per-channel kernels keep the input:

    - float32 accumulation (float32, bfloat16, float16): the forward for ``Cg <=
      8``, and ``Cg <= 32`` with an odd factor of at most 5 on samples of at most
      128 channels; the backward for ``Cg <= 8`` a power of two, and other
      ``Cg <= 8`` on samples of at most 64 channels;
    - float64 (half the values per vector): the forward for ``Cg <= 4``, the
      backward for ``Cg <= 2``.
    """
    if ns != 1 or fixed:
        return False
    m, p = _odd_part.py_func(cg)
    if acc_size == 8:
        return cg <= (2 if backward else 4)
    if backward:
        return cg <= 8 and (m == 1 or nc <= 64)
    return cg <= 8 or (cg <= 32 and nc <= 128 and m <= 5)


@helper
def _view(own, w):
    """The 2-D scratch ``own`` as an array that owns nothing: a view from its address
    (``ops/_ptr.at``; ``w`` gives the dtype). The owner, passed to a helper that is not
    inlined, costs two atomic reference-count operations per call, in every block (a
    fifth of the backward at (15000, 64), G = 8, measured); the view none. The kernel's
    own loops use the owner, which must outlive the view (:func:`_alive`)."""
    return at(own.ctypes.data, w, own.shape)


@helper
def _alive(own):
    """Nothing: a last use of ``own``, so that it is freed only after its :func:`_view`'s last use."""
    return own.shape[0]


@helper
def _u(i):
    """``i`` as an unsigned index: numba then leaves out its negative-index wraparound, so a
    loop over ``a[_u(base + j)]`` vectorizes like one over ``a[j]``."""
    return np.uint64(i)


# The helpers below read and write rows of 2-D scratch arrays, ``a[ra, j]``: taking a
# row as a view (``a[ra]``) would cost reference counting in every block.


@helper(generic=True)
def _pairs(a, ra, n, sq, o, ro):
    """``o[ro, j] = a[ra, 2j] + a[ra, 2j+1]`` for ``j < n`` (of their squares when ``sq``)."""
    _wide()
    if sq:
        for j in range(n):
            e = a[ra, 2 * j]
            f = a[ra, 2 * j + 1]
            o[ro, j] = e * e + f * f
    else:
        for j in range(n):
            o[ro, j] = a[ra, 2 * j] + a[ra, 2 * j + 1]


@helper(generic=True)
def _runs(a, ra, nr, m, sq, o, ro):
    """``o[ro, r] = a[ra, r*m] + a[ra, r*m+1] + ... + a[ra, r*m+m-1]``, added in that order, for
    ``r < nr`` (of their squares when ``sq``)."""
    _wide()
    for r in range(nr):
        e = a[ra, _u(r * m)]
        o[ro, r] = e * e if sq else e
    for k in range(1, m):
        for r in range(nr):
            e = a[ra, _u(r * m + k)]
            o[ro, r] += e * e if sq else e


@helper(generic=True)
def _block_sums(a, ra, nr, m, p, sq, u, o, ro):
    """``o[ro, r]`` = the sum of the ``Cg = m * 2**p`` values ``a[ra, r*Cg : (r+1)*Cg]`` (of
    their squares when ``sq``) for ``r < nr``, ``m`` odd: pairwise while the count is
    even, then the ``m`` partial sums of the group in order.

    ``p`` halvings (:func:`_pairs`), each one vectorized loop over the whole block,
    between the two rows of the scratch ``u`` (each of at least ``nr*Cg/2``), then
    ``m - 1`` additions per group (:func:`_runs`). A group of 8: ``((a0 + a1) + (a2 +
    a3)) + ((a4 + a5) + (a6 + a7))``; of 6: ``((a0 + a1) + (a2 + a3)) + (a4 + a5)``.
    The order is the source's (no reassociation): the same for every input with this
    ``Cg``.
    """
    if p == 0:
        _runs(a, ra, nr, m, sq, o, ro)
        return
    n = (nr * m) << (p - 1)
    if p == 1 and m == 1:
        _pairs(a, ra, n, sq, o, ro)
        return
    _pairs(a, ra, n, sq, u, 0)
    for lev in range(1, p):  # level lev reads row (lev - 1) % 2 and writes row lev % 2 (or o)
        n //= 2
        if lev == p - 1 and m == 1:
            _pairs(u, (lev - 1) % 2, n, False, o, ro)
        else:
            _pairs(u, (lev - 1) % 2, n, False, u, lev % 2)
    if m > 1:
        _runs(u, (p - 1) % 2, nr, m, False, o, ro)


@helper(generic=True)
def _dup(a, ra, n, f, o, ro):
    """``o[ro, f*j + k] = a[ra, j]`` for ``k < f``, ``j < n``; ``f`` is 2, 4 or 8 (inner loops of
    constant length: a run of ``f`` copies is one vector store)."""
    _wide()
    if f == 8:
        for j in range(n):
            e = a[ra, j]
            for k in range(8):
                o[ro, 8 * j + k] = e
    elif f == 4:
        for j in range(n):
            e = a[ra, j]
            for k in range(4):
                o[ro, 4 * j + k] = e
    else:
        for j in range(n):
            e = a[ra, j]
            o[ro, 2 * j] = e
            o[ro, 2 * j + 1] = e


@helper(generic=True)
def _fill_runs(a, ra, nr, m, o, ro):
    """``o[ro, r*m + k] = a[ra, r]`` for ``k < m``, ``r < nr``."""
    _wide()
    for k in range(m):
        for r in range(nr):
            o[ro, _u(r * m + k)] = a[ra, r]


@helper(generic=True)
def _block_spread(a, ra, nr, m, p, o, ro, u):
    """``o[ro, r*Cg + k] = a[ra, r]`` for ``k < Cg = m * 2**p``, ``r < nr``, ``m`` odd: a
    per-group value on each of the group's channels (copies: exact).

    The odd factor first (:func:`_fill_runs`), then the power of two in steps of 8
    (:func:`_dup`; a remainder of 2 or 4 first), between the two rows of the scratch
    ``u`` (each of at least ``nr*Cg/2``), the last step into ``o``. Steps of 8 write
    fewer values, in fewer loops, than doublings (measured).
    """
    if p == 0:
        _fill_runs(a, ra, nr, m, o, ro)
        return
    n_steps = (p + 2) // 3
    f = 1 << (p - 3 * (n_steps - 1))  # the first step: 2, 4 or 8; then 8s
    n = nr * m
    if m > 1:
        _fill_runs(a, ra, nr, m, u, 0)
        if n_steps == 1:
            _dup(u, 0, n, f, o, ro)
            return
        _dup(u, 0, n, f, u, 1)
    elif n_steps == 1:
        _dup(a, ra, n, f, o, ro)
        return
    else:
        _dup(a, ra, n, f, u, 1)
    n *= f
    for st in range(1, n_steps):  # step st reads row st % 2 and writes row (st + 1) % 2 (or o)
        if st == n_steps - 1:
            _dup(u, st % 2, n, 8, o, ro)
        else:
            _dup(u, st % 2, n, 8, u, (st + 1) % 2)
        n *= 8


@kernel
def gn_fwd_s1(x, w, b, y, mean, var, rstd, eps, n_groups, rows):
    """:func:`gn_fwd_nhwc` for S == 1 and small groups (:func:`takes_s1_blocks`), statistics
    not fixed.

    x, y     (N, 1, C)  C-contiguous
    mean, var, rstd (N*G,) out; rows: samples per task (no effect on results)

    A task takes its samples a block of :data:`FWD_BLOCK` values at a time: ``ni``
    samples, ``nr = ni*G`` groups of ``Cg`` contiguous values. Every step is one
    loop over the block's values (vectorized, whatever ``Cg``) or over its groups::

        sh[r] = the group's first value           spread to sp[j] (:func:`_block_spread`)
        d[j]  = x[j] - sp[j]                      summed per group (:func:`_block_sums`)
        md[r] = sum / Cg                          spread; d[j] = d[j] - sp[j]
        q[r]  = sum of d^2 / Cg = var             rstd = 1 / sqrt(var + eps); spread
        y[j]  = d[j] * (sp[j] * w[c]) + b[c]      (w, b tiled over a block's samples)

    The operations of :func:`gn_fwd_nhwc` (``(x - shift) - mean(d)``, then ``*
    (rstd * w) + b``) but for the order of the per-group sums (pairwise). The
    divisions by ``Cg`` are in the accumulation dtype: the same bits as
    :func:`gn_fwd_nhwc`'s division in float64 rounded to float32 (double rounding
    is innocuous for a quotient of two floats).
    """
    n, ns, nc = x.shape
    cg, m, p, bs, nv, nb = _s1_geometry(nc, n_groups, FWD_BLOCK, w.itemsize, rows)
    xf = x.reshape(n * nc)
    yf = y.reshape(n * nc)
    n_tasks = (n + rows - 1) // rows
    for t in prange(n_tasks):
        _wide()
        # per value: 0 x - shift, then x - shift - mean(d); 1 a per-group value spread; 2, 3 w, b tiled
        sv = np.empty((4, nv + SKEW), w.dtype)
        sg = np.empty((3, nb + SKEW), w.dtype)  # per group: 0 shift, 1 mean(x - shift), 2 var, then rstd
        u_own = np.empty((2, nv // 2 + SKEW), w.dtype)  # scratch of _block_sums, _block_spread
        svv = _view(sv, w)  # for the helpers (_view); the loops here use the owners
        sgv = _view(sg, w)
        u = _view(u_own, w)
        for i in range(bs):
            for c in range(nc):
                sv[2, i * nc + c] = w[c]
                sv[3, i * nc + c] = b[c]
        cgf = acc_cast(w, cg)
        t_end = min((t + 1) * rows, n)
        for i0 in range(t * rows, t_end, bs):
            nr = min(bs, t_end - i0) * n_groups
            nj = nr * cg
            j0 = i0 * nc  # the block's first value, and group
            r0 = i0 * n_groups
            for r in range(nr):
                sg[0, r] = load(xf, _u(j0 + r * cg))  # the group's first value
            _block_spread(sgv, 0, nr, m, p, svv, 1, u)
            for j in range(nj):  # pass 1
                sv[0, j] = load(xf, _u(j0 + j)) - sv[1, j]
            _block_sums(svv, 0, nr, m, p, False, u, sgv, 1)
            for r in range(nr):
                sg[1, r] = sg[1, r] / cgf
            _block_spread(sgv, 1, nr, m, p, svv, 1, u)
            for j in range(nj):  # pass 2, in scratch
                sv[0, j] = sv[0, j] - sv[1, j]
            _block_sums(svv, 0, nr, m, p, True, u, sgv, 2)
            for r in range(nr):
                sg[2, r] = sg[2, r] / cgf
            for r in range(nr):
                var[_u(r0 + r)] = sg[2, r]
            for r in range(nr):
                mean[_u(r0 + r)] = sg[0, r] + sg[1, r]
            for r in range(nr):
                sg[2, r] = acc_cast(w, 1.0) / np.sqrt(sg[2, r] + acc_cast(w, eps))
            for r in range(nr):
                rstd[_u(r0 + r)] = sg[2, r]
            _block_spread(sgv, 2, nr, m, p, svv, 1, u)
            for j in range(nj):  # output
                store(yf, _u(j0 + j), sv[0, j] * (sv[1, j] * sv[2, j]) + sv[3, j])
        _alive(sv)
        _alive(sg)
        _alive(u_own)


@kernel
def gn_bwd_s1(dy, x, w, mean, rstd, dx, n_groups, need_dx, rows):
    """:func:`gn_bwd_nhwc` for S == 1 and small groups (:func:`takes_s1_blocks`), statistics
    not fixed; returns ``(dw, db)``.

    Blocks of :data:`BWD_BLOCK` values, as in :func:`gn_fwd_s1`. With S == 1 the
    per-channel sums over ``s`` of :func:`gn_bwd_nhwc` are single values, ``sdy =
    dy`` and ``sdx = dy * (x - mean)``; per block::

        xm[j] = x[j] - mean (spread)              rs[j] = rstd (spread)
        dw/db: aw[j] += (dy * xm[j]) * rs[j],  ab[j] += dy
        gw[j] = w[c] * dy,  gx[j] = w[c] * (dy * xm[j])    summed per group (:func:`_block_sums`)
        t2 = (sum gw / Cg) * rstd,  t3 = ((sum gx * rstd) / Cg) * rstd^2      spread
        dx[j] = (dy * (rs[j] * w[c]) - xm[j] * t3) - t2

    the operations of :func:`gn_bwd_nhwc` but for the order of the sums (per group
    pairwise; dw/db below). Division by a power-of-two ``Cg`` is a product with
    ``1 / Cg``: the same bits.

    dw/db: ``aw``, ``ab`` have a slot per sample of a block and channel; each slot
    adds up its samples of the task's blocks in order, and at the end of the task
    each channel's slots are added in slot order into the task's row of partials,
    merged over tasks as in :func:`gn_bwd_nhwc`. The order depends on the shape
    only, never the number of threads.
    """
    n, ns, nc = x.shape
    cg, m, p, bs, nv, nb = _s1_geometry(nc, n_groups, BWD_BLOCK, w.itemsize, rows)
    xf = x.reshape(n * nc)
    dyf = dy.reshape(n * nc)
    dxf = dx.reshape(n * nc)
    inv = 1.0 / cg  # exact for a power of two (m == 1)
    n_tasks = (n + rows - 1) // rows
    pw = np.empty((n_tasks, nc), w.dtype)  # per task: sums of dy * x_hat
    pb = np.empty((n_tasks, nc), w.dtype)  # per task: sums of dy
    for t in prange(n_tasks):
        _wide()
        # per value: 0 the group's mean spread, then x - mean; 1 the group's rstd spread;
        # 2 gw = w * dy, then t2 spread; 3 gx = w * dy * (x - mean), then t3 spread;
        # 4 w tiled; 5, 6 aw, ab: per slot, sums of dy * x_hat and of dy
        sv = np.zeros((7, nv + SKEW), w.dtype)
        sg = np.empty((4, nb + SKEW), w.dtype)  # per group: 0 mean, 1 rstd, 2 sum gw, then t2, 3 sum gx, then t3
        u_own = np.empty((2, nv // 2 + SKEW), w.dtype)  # scratch of _block_sums, _block_spread
        svv = _view(sv, w)  # for the helpers (_view); the loops here use the owners
        sgv = _view(sg, w)
        u = _view(u_own, w)
        for i in range(bs):
            for c in range(nc):
                sv[4, i * nc + c] = w[c]
        t_end = min((t + 1) * rows, n)
        for i0 in range(t * rows, t_end, bs):
            nr = min(bs, t_end - i0) * n_groups
            nj = nr * cg
            j0 = i0 * nc  # the block's first value, and group
            r0 = i0 * n_groups
            for r in range(nr):
                sg[0, r] = mean[_u(r0 + r)]
            for r in range(nr):
                sg[1, r] = rstd[_u(r0 + r)]
            _block_spread(sgv, 0, nr, m, p, svv, 0, u)
            _block_spread(sgv, 1, nr, m, p, svv, 1, u)
            for j in range(nj):
                sv[0, j] = load(xf, _u(j0 + j)) - sv[0, j]
            for j in range(nj):  # dw, db
                dyv = load(dyf, _u(j0 + j))
                sv[5, j] += (dyv * sv[0, j]) * sv[1, j]
                sv[6, j] += dyv
            if not need_dx:
                continue
            for j in range(nj):
                dyv = load(dyf, _u(j0 + j))
                sv[2, j] = sv[4, j] * dyv
                sv[3, j] = sv[4, j] * (dyv * sv[0, j])
            _block_sums(svv, 2, nr, m, p, False, u, sgv, 2)  # per group: sum of dy * w
            _block_sums(svv, 3, nr, m, p, False, u, sgv, 3)  # per group: sum of dy * w * (x - mean)
            if m == 1:
                for r in range(nr):
                    rs = sg[1, r]
                    sg[2, r] = acc_cast(w, (sg[2, r] * inv) * rs)  # t2 = rstd * mean_grp(g)
                    sg[3, r] = acc_cast(w, ((sg[3, r] * rs) * inv) * (rs * rs))  # t3
            else:
                for r in range(nr):
                    rs = sg[1, r]
                    sg[2, r] = acc_cast(w, (sg[2, r] / cg) * rs)
                    sg[3, r] = acc_cast(w, ((sg[3, r] * rs) / cg) * (rs * rs))
            _block_spread(sgv, 2, nr, m, p, svv, 2, u)
            _block_spread(sgv, 3, nr, m, p, svv, 3, u)
            for j in range(nj):  # dx = dy * (rstd * w[c]) - (x - mean) * t3 - t2
                store(dxf, _u(j0 + j), (load(dyf, _u(j0 + j)) * (sv[1, j] * sv[4, j]) - sv[0, j] * sv[3, j])
                      - sv[2, j])
        n_slots = min(bs, t_end - t * rows)
        for c in range(nc):
            pw[t, c] = sv[5, c]
            pb[t, c] = sv[6, c]
        for i in range(1, n_slots):  # the slots in order
            for c in range(nc):
                pw[t, c] += sv[5, i * nc + c]
                pb[t, c] += sv[6, i * nc + c]
        _alive(sv)
        _alive(sg)
        _alive(u_own)
    dw = np.empty(nc, w.dtype)
    db = np.empty(nc, w.dtype)
    for blk in prange((nc + MERGE_COLS - 1) // MERGE_COLS):  # merge the partials over tasks, in order
        _merge_rows(pw, pb, dw, db, blk * MERGE_COLS, min((blk + 1) * MERGE_COLS, nc))
    return dw, db


# --------------------------------------------------------------------------
# Entry functions (see kernels.py)
# --------------------------------------------------------------------------


@helper
def gn_fwd_nhwc_at(proto, acc, px, pw, pb, py, pmean, pvar, prstd, n_stats, shape, n_ch, eps, n_groups, fixed,
                   rows):
    """:func:`gn_fwd_nhwc` on the buffers at the given addresses."""
    w, b = params_at(acc, pw, pb, n_ch)
    gn_fwd_nhwc(at(px, proto, shape), w, b, at(py, proto, shape), at(pmean, acc, (n_stats,)),
                at(pvar, acc, (n_stats,)), at(prstd, acc, (n_stats,)), eps, n_groups, fixed, rows)


@helper
def gn_fwd_s1_at(proto, acc, px, pw, pb, py, pmean, pvar, prstd, n_stats, shape, n_ch, eps, n_groups, fixed,
                 rows):
    """:func:`gn_fwd_s1` on the buffers at the given addresses; the arguments of
    :func:`gn_fwd_nhwc_at` (``fixed`` is False wherever :func:`takes_s1_blocks` holds)."""
    w, b = params_at(acc, pw, pb, n_ch)
    gn_fwd_s1(at(px, proto, shape), w, b, at(py, proto, shape), at(pmean, acc, (n_stats,)),
              at(pvar, acc, (n_stats,)), at(prstd, acc, (n_stats,)), eps, n_groups, rows)


@helper
def gn_bwd_nhwc_at(proto, acc, pdy, px, pw, pmean, prstd, n_stats, pdx, shape, n_ch, n_groups, fixed, need_dx,
                   rows):
    """:func:`gn_bwd_nhwc` on the buffers at the given addresses; returns ``(dw, db)``."""
    w, _ = params_at(acc, pw, 0, n_ch)
    return gn_bwd_nhwc(at(pdy, proto, shape), at(px, proto, shape), w, at(pmean, acc, (n_stats,)),
                       at(prstd, acc, (n_stats,)), at(pdx, proto, shape), n_groups, fixed, need_dx, rows)


@helper
def gn_bwd_s1_at(proto, acc, pdy, px, pw, pmean, prstd, n_stats, pdx, shape, n_ch, n_groups, fixed, need_dx,
                 rows):
    """:func:`gn_bwd_s1` on the buffers at the given addresses; returns ``(dw, db)``; the arguments
    of :func:`gn_bwd_nhwc_at` (``fixed`` is False wherever :func:`takes_s1_blocks` holds)."""
    w, _ = params_at(acc, pw, 0, n_ch)
    return gn_bwd_s1(at(pdy, proto, shape), at(px, proto, shape), w, at(pmean, acc, (n_stats,)),
                     at(prstd, acc, (n_stats,)), at(pdx, proto, shape), n_groups, need_dx, rows)
