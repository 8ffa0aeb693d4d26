"""``_jit.helper(generic=True)``: a helper typed without its constant arguments' literal values,
so that calls with different constants share one compiled version (and the same results)."""

from __future__ import annotations

import numpy as np
import pytest

from normlab.ops._jit import helper, serial


def _row_sum(a, r, sq):
    """Sum of row ``r`` of ``a`` (of its squares when ``sq``)."""
    s = 0.0
    for j in range(a.shape[1]):
        s += a[r, j] * a[r, j] if sq else a[r, j]
    return s


generic_sum = helper(generic=True)(_row_sum)
literal_sum = helper(_row_sum)


def _calls(f):
    """A jitted caller passing constants (0, 1, 2 and True/False) to ``f``."""

    def calls(a):
        return f(a, 0, False) + f(a, 1, False) + f(a, 2, True)

    return helper(calls)


def test_generic_helper_compiles_once_for_all_constants():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    expected = a[0].sum() + a[1].sum() + (a[2] ** 2).sum()
    assert _calls(generic_sum)(a) == expected
    assert len(generic_sum.signatures) == 1
    # a plain helper is compiled once per literal combination: what generic=True avoids
    assert _calls(literal_sum)(a) == expected
    assert len(literal_sum.signatures) == 3


def test_generic_helper_is_its_own_serial_twin():
    assert serial(generic_sum) is generic_sum


def test_spliced_helper_compiles_only_inside_its_callers():
    """``helper(spliced=True)``: numba splices the code into each caller; it is never compiled
    on its own, whatever argument types its callers give it."""
    spliced_sum = helper(spliced=True)(_row_sum)
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    expected = a[0].sum() + a[1].sum() + (a[2] ** 2).sum()
    assert _calls(spliced_sum)(a) == expected
    assert _calls(spliced_sum)(a.astype(np.float32)) == expected
    assert len(spliced_sum.signatures) == 0


def test_spliced_helper_cannot_take_sum_options():
    with pytest.raises(ValueError, match="caller's options"):
        helper(spliced=True, sums=True)(_row_sum)
