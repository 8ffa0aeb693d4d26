"""Row reductions that more than one family's kernels use (imported by ``kernels.py`` files only).

:func:`shift_row` and :func:`sqdev` are the first and second pass of the
shifted two-pass statistics (``ops/_common.shifted_mean_var``) over one row:
LayerNorm/RMSNorm rows, GroupNorm's NCHW group rows, BatchNorm's planes.
:func:`grad_sums` is the backward's pair of sums over a slice of ``dy`` and
``x``: GroupNorm's short channels, BatchNorm's planes. :func:`inf_signs` and
:func:`torch_mean` give a statistic torch's value where the shift made it NaN.
"""

from __future__ import annotations


import numpy as np

from ._bf16 import acc_zero, load, zero_of
from ._jit import helper
from ._simd import wide


@helper(sums=True)
def shift_row(x, r, d, shift):
    """``d[j] = x[r, j] - shift`` over the row (``d``'s length); returns the sum of ``d``.

    Two loops: the row is read from memory once, converted to the accumulation
    dtype (``d``'s) and stored in scratch; then the scratch (in L1) is summed.
    Each difference is a stored value of its own, which reassociation keeps
    whole (the sum is split into lanes, the difference is never rewritten).

    Why not one loop that stores and sums: LLVM then guards its vector loop with
    a run-time check that ``d`` does not overlap the row -- a check on how far
    apart the two addresses are, which fails for scratch that merely lies just
    after the row in memory -- and falls back to a scalar loop that adds in
    another order. The bits then depended on where malloc put the scratch
    (seen: a GroupNorm result 1 ulp off in about one run in twenty). A loop that
    only reads has no such check: one order, whatever the addresses.
    """
    wide()
    for j in range(d.shape[0]):
        d[j] = load(x, (r, j)) - shift
    s = acc_zero(d)
    for j in range(d.shape[0]):
        s += d[j]
    return s


@helper(sums=True)
def shift_row64(x, r, d, shift):
    """:func:`shift_row` with the sum taken exactly, in float64: ``d[j] = x[r, j] - shift``
    stored as before, and ``sum_j (x[r, j] - shift)`` without the rounding of the float32
    differences and of a float32 sum of thousands of them (BatchNorm's plane statistics).

    Half-precision values minus a shift are exact in float32, so ``d`` is summed in float64;
    a float32 difference rounds, so float32 rows are summed from ``x`` (``sum x - n * shift``,
    each float32 value exact in float64). float64 rows as :func:`shift_row`."""
    wide()
    for j in range(d.shape[0]):
        d[j] = load(x, (r, j)) - shift
    s = 0.0
    if x.itemsize == 4:
        for j in range(d.shape[0]):
            s += np.float64(load(x, (r, j)))
        return s - d.shape[0] * np.float64(shift)
    for j in range(d.shape[0]):
        s += np.float64(d[j])
    return s


@helper(sums=True)
def grad_sums(g, x, m):
    """``(sum dy, sum dy * (x - m))`` over 1-D slices ``g`` of ``dy`` and ``x`` of ``x``, in the
    accumulation dtype (``m``'s), straight from the tensors, split into SIMD lanes
    (reassociation of the two sums only: ``x - m`` is a two-operand difference inside a
    product)."""
    wide()
    s1 = zero_of(m)  # not m - m: the sum of dy must not turn NaN with an infinite mean
    s2 = zero_of(m)
    for t in range(g.shape[0]):
        v = load(g, t)
        s1 += v
        s2 += v * (load(x, t) - m)
    return s1, s2


@helper(sums=True, fma=True)
def sqdev(a, n, m):
    """sum_{j < n} (a_j - m)^2 of a 1-D scratch array, without storing the differences.

    Two halves with their own sums (twice the independent SIMD chains), each
    ``e * e + s`` one fused multiply-add: the second pass costs ~15 % of the
    GroupNorm forward, this is its fastest form (measured).
    """
    wide()
    s0 = acc_zero(a)
    s1 = acc_zero(a)
    h = n // 2
    for j in range(h):
        e = a[j] - m
        s0 += e * e
        f = a[h + j] - m
        s1 += f * f
    for j in range(2 * h, n):
        e = a[j] - m
        s0 += e * e
    return s0 + s1


# An infinity among a slice's values gives the shifted statistics a NaN mean (inf - inf),
# where torch's mean, sum / count, is +-inf. Where it is visible (BatchNorm's and
# InstanceNorm's running means), the kernels look at such a mean again: the values'
# infinities and NaNs as a bit mask (:func:`inf_signs`, over the slices that make up the
# statistic), then torch's mean from it (:func:`torch_mean`).
HAS_NAN = 1
HAS_POS_INF = 2
HAS_NEG_INF = 4


@helper
def inf_signs(a):
    """The NaNs and infinities among the values of the 1-D slice ``a``, as a mask of
    ``HAS_NAN | HAS_POS_INF | HAS_NEG_INF``."""
    mask = 0
    for j in range(a.shape[0]):
        v = load(a, j)
        if np.isnan(v):
            mask |= HAS_NAN
        elif v == np.inf:
            mask |= HAS_POS_INF
        elif v == -np.inf:
            mask |= HAS_NEG_INF
    return mask


@helper
def torch_mean(m, mask):
    """The mean ``m`` (NaN) as torch's ``sum / count`` gives it for values with ``mask``:
    ``+-inf`` for infinities of one sign and no NaN, else ``m``."""
    if mask == HAS_POS_INF:
        return np.inf
    if mask == HAS_NEG_INF:
        return -np.inf
    return m
