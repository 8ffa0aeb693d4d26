"""The kernels' sums must not depend on where their scratch lies in memory.

A loop that both stores to scratch and sums (with the reassociation the row sums
are compiled with) gets a vector version guarded by a run-time overlap check on
the two addresses; scratch just after the input fails the check and the scalar
fallback adds in another order. These tests put the scratch right after the
input row (0 to 64 values apart) and far away, and ask for the same bits.
"""

from __future__ import annotations

import numpy as np
import pytest

from normlab.ops import _launch

pytestmark = pytest.mark.skipif(not _launch.available(), reason="numba not installed")

GAPS = (0, 1, 3, 8, 16, 64)
LENGTHS = (9, 17, 40, 100, 257)


@pytest.fixture(scope="module")
def runners():
    import numba

    from normlab.ops._rows import shift_row
    from normlab.ops.group_norm.kernels import _grad_row as gn_grad_row

    @numba.njit
    def shift(buf, n, gap):
        x = buf[:n].reshape(1, n)
        near = shift_row(x, 0, buf[n + gap : 2 * n + gap], np.float32(0.3))
        far = shift_row(x, 0, np.empty(n, np.float32), np.float32(0.3))
        return near, far

    @numba.njit
    def gn(buf, n, gap):
        dy, x = buf[:n].reshape(1, 1, n), buf[n : 2 * n].reshape(1, 1, n)
        o = 2 * n + gap
        near = gn_grad_row(dy, x, 0, 0, np.float32(0.1), buf[o : o + n].reshape(1, n),
                           buf[o + n : o + 2 * n].reshape(1, n))
        far = gn_grad_row(dy, x, 0, 0, np.float32(0.1), np.empty((1, n), np.float32), np.empty((1, n), np.float32))
        return near, far

    return {"shift_row": (shift, 1), "group_norm _grad_row": (gn, 2)}


@pytest.mark.parametrize("name", ["shift_row", "group_norm _grad_row"])
def test_sums_do_not_depend_on_the_scratch_address(runners, name):
    run, n_inputs = runners[name]
    rng = np.random.default_rng(0)
    for n in LENGTHS:
        for gap in GAPS:
            buf = np.zeros((n_inputs + 2) * n + gap + 8, np.float32)
            buf[: n_inputs * n] = (rng.standard_normal(n_inputs * n) * 100).astype(np.float32)
            near, far = run(buf, n, gap)
            assert near == far, (name, n, gap, near, far)
