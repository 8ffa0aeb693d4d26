"""Row reductions that more than one family's kernels use (imported by ``kernels.py`` files only).

Both are the first and second pass of the shifted two-pass statistics
(``ops/_common.shifted_mean_var``) over one row held in a 2-D array:
LayerNorm/RMSNorm rows and GroupNorm's NCHW group rows.
"""

from __future__ import annotations

from numba import njit

from ._bf16 import acc_zero, load
from ._numba import SUM_OPTIONS
from ._simd import wide


@njit(**SUM_OPTIONS)
def shift_row(x, r, d, shift):
    """``d[j] = x[r, j] - shift`` over the row (``d``'s length); returns the sum of ``d``.

    One loop: the row is read from memory once, converted to the accumulation
    dtype (``d``'s), stored in scratch and summed. Each difference is stored,
    and so used twice: it is a value of its own, which reassociation keeps
    whole (the sum is split into lanes, the difference is never rewritten).
    """
    wide()
    s = acc_zero(d)
    for j in range(d.shape[0]):
        e = load(x, (r, j)) - shift
        d[j] = e
        s += e
    return s


@njit(**dict(SUM_OPTIONS, fastmath={"reassoc", "contract"}))
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
