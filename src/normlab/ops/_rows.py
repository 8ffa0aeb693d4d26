"""Row reductions that more than one family's kernels use (imported by ``kernels.py`` files only).

:func:`shift_row` and :func:`sqdev` are the first and second pass of the
shifted two-pass statistics (``ops/_common.shifted_mean_var``) over one row:
LayerNorm/RMSNorm rows, GroupNorm's NCHW group rows, BatchNorm's planes.
:func:`grad_sums` is the backward's pair of sums over a slice of ``dy`` and
``x``: GroupNorm's short channels, BatchNorm's planes.
"""

from __future__ import annotations


from ._bf16 import acc_zero, load
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
def grad_sums(g, x, m):
    """``(sum dy, sum dy * (x - m))`` over 1-D slices ``g`` of ``dy`` and ``x`` of ``x``, in the
    accumulation dtype (``m``'s), straight from the tensors, split into SIMD lanes
    (reassociation of the two sums only: ``x - m`` is a two-operand difference inside a
    product)."""
    wide()
    s1 = m - m
    s2 = m - m
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
