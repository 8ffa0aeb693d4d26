"""GroupNorm of S == 1 inputs with small groups.

(N, C) and (N, C, 1) inputs with few channels a group: the forward runs each group's Cg
contiguous channels as a row, the backward the NHWC kernel's S == 1 path (per-chunk dw/db
partials). Checked here: y and the gradients of x, weight and bias against torch in float64
(from the same rounded inputs), and the bits at 1 and 2 threads.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import normlab
import normlab.functional as NF
from normlab.ops import extension
from tests.oracle import assert_within_rounding, leaf, rel_err
from tests.ops.group_norm.test_group_norm_cpu import _inputs as _gn_inputs
from tests.ops.group_norm.test_group_norm_cpu import _run, _samples_per_chunk

pytestmark = pytest.mark.skipif(not extension.available(), reason="the C++ extension is not installed")

TIGHT = {torch.float32: 1e-5, torch.float64: 1e-12}
EPS = 1e-5

# (input shape, num_groups): S == 1, Cg = C / G small
CASES = [
    ((2, 8), 8),  # Cg = 1 (N = 1 would leave one value a group: an error, as in torch)
    ((1, 24), 8),  # N = 1, Cg = 3
    ((37, 16), 8),  # Cg = 2
    ((50, 24), 8),  # Cg = 3 (odd)
    ((45, 40), 10),  # Cg = 4
    ((70, 48, 1), 8),  # (N, C, 1), Cg = 6 = 3 * 2
    ((20, 56), 8),  # Cg = 7 (odd)
    ((3, 21), 7),  # Cg = 3; 21 groups, a count no vector width divides: the last groups take the scalar loop
    ((300, 64), 8),  # Cg = 8; N not a multiple of a block's samples
    ((1100, 64), 8),  # Cg = 8; two tasks of 1024 and 76 samples
    ((33, 60), 5),  # Cg = 12 = 3 * 4
    ((9, 96), 3),  # Cg = 32
]


def _ids(case):
    shape, groups = case
    return f"{shape}-G{groups}"


def _inputs(shape, dtype, affine, seed):
    """The GroupNorm tests' inputs (``test_group_norm_cpu._inputs``), with weight and bias or neither."""
    return _gn_inputs(shape, dtype, "both" if affine else None, seed=seed)


def _torch64(x, w, b, dy, groups):
    """torch's GroupNorm and its autograd in float64, from the same (rounded) inputs."""
    f64 = [None if t is None else t.double() for t in (x, w, b)]
    return _run("ref", lambda x, w, b: TF.group_norm(x, groups, w, b, EPS), f64, dy.double())


def _ours(x, w, b, dy, groups):
    return _run("cpu", lambda x, w, b: NF.group_norm(x, groups, w, b, EPS), (x, w, b), dy)


UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}  # unit roundoff


def _dx_scale(x, w, dy, groups):
    """||dy * w * rstd||: the size of dx's first term, the scale of its rounding errors. (With
    one or two channels a group dx is ~0: its terms cancel, so relative to itself it has
    no precision to check.)"""
    n, c = x.shape[0], x.shape[1]
    xg = x.double().reshape(n, groups, -1)
    rstd = (xg.var(-1, unbiased=False) + EPS).rsqrt()  # (N, G)
    rstd = rstd.repeat_interleave(c // groups, dim=1).reshape(dy.shape)
    wd = torch.ones(c, dtype=torch.float64) if w is None else w.double()
    return (dy.double() * wd.reshape(c, *([1] * (dy.dim() - 2))) * rstd).norm().item()


def _check(got, ref64, x, w, dy, groups, what):
    """y, dw, db: float32/float64 to 1e-5/1e-12 relative to float64 torch, half precision
    within 2x the error of rounding the float64 result (as the other GroupNorm tests).
    dx: the same, relative to the size of its first term (:func:`_dx_scale`); half: or
    within 2x that of rounding it."""
    dtype = x.dtype
    names = ["y", "dx", "dw", "db"]
    for name, a, r in zip(names, got, ref64):
        assert (a is None) == (r is None), (what, name)
        if a is None:
            continue
        assert a.dtype == (x.dtype if name in ("y", "dx") else w.dtype), (what, name)
        assert a.shape == r.shape and torch.isfinite(a).all(), (what, name)
        if name == "dx":
            err = (a.double() - r).norm().item()
            scale = _dx_scale(x, w, dy, groups)
            if dtype in UNIT:
                bound = max(2 * (r.to(dtype).double() - r).norm().item(), 2 * UNIT[dtype] * scale)
            else:
                bound = TIGHT[dtype] * scale
            assert err <= bound, (what, name, err, bound)
        elif r.norm() == 0:  # y without affine, dw: one channel a group
            assert (a == 0).all(), (what, name)
        elif dtype in UNIT:
            assert_within_rounding(a, r, 2.0, f"{what} {name}")
        else:
            err = rel_err(a, r)
            assert err < TIGHT[dtype], (what, name, err)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_matches_torch_float64(dtype, case, affine):
    shape, groups = case
    x, w, b, dy = _inputs(shape, dtype, affine, seed=31)
    got = _ours(x, w, b, dy, groups)
    ref64 = _torch64(x, w, b, dy, groups)
    _check(got, ref64, x, w, dy, groups, f"{shape} G={groups}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weight_only(dtype):
    """A weight without a bias: db is not returned, dw is."""
    x, w, _, dy = _inputs((300, 64), dtype, True, seed=32)
    got = _ours(x, w, None, dy, 8)
    ref64 = _torch64(x, w, None, dy, 8)
    _check(got, ref64, x, w, dy, 8, "weight only")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_weight_and_bias_grads_without_dx(dtype):
    """x not requiring grad: the backward makes dw and db only (no dx)."""
    x, w, b, dy = _inputs((700, 64), dtype, True, seed=38)
    wl, bl = leaf(w), leaf(b)
    with normlab.use_backend("cpu"):
        NF.group_norm(x, 8, wl, bl, EPS).backward(dy)
    w64, b64 = leaf(w.double()), leaf(b.double())
    TF.group_norm(x.double(), 8, w64, b64, EPS).backward(dy.double())
    assert rel_err(wl.grad, w64.grad) < TIGHT[dtype]
    assert rel_err(bl.grad, b64.grad) < TIGHT[dtype]


def test_one_channel_a_group_gives_beta():
    """Cg = 1 (G = C): every group is its own mean, y is exactly the bias."""
    x, w, b, dy = _inputs((500, 32), torch.float32, True, seed=33)
    with normlab.use_backend("cpu"):
        y = NF.group_norm(x, 32, w, b)
    assert torch.equal(y, b.expand(500, 32))


def test_constant_groups_give_exactly_beta():
    x = torch.empty(3, 48)
    for n, value in enumerate((0.1, 1e4, -3.3)):
        for g in range(8):
            x[n, 6 * g : 6 * g + 6] = value * (g + 1)
    w, b = torch.randn(48), torch.randn(48)
    with normlab.use_backend("cpu"):
        assert torch.equal(NF.group_norm(x, 8, w, b), b.expand(3, 48))


def test_large_mean_groups_float32():
    """Groups of 8 with mean 1e4 and std 1: float32 y within 1e-5 of float64 from the same input."""
    x = 1e4 + torch.randn(2000, 64, generator=torch.Generator().manual_seed(34))
    with normlab.use_backend("cpu"):
        y = NF.group_norm(x, 8)
    assert (y.double() - TF.group_norm(x.double(), 8)).abs().max() < 1e-5


def test_nan_stays_in_its_group():
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(35))
    x[3, 10] = float("nan")  # group 1 of sample 3
    dy = torch.randn(40, 64)
    y, dx = _ours(x, None, None, dy, 8)[:2]
    y_t, dx_t = _run("ref", lambda x: TF.group_norm(x, 8, eps=EPS), (x,), dy)
    for a, t in ((y, y_t), (dx, dx_t)):
        assert torch.equal(a.isnan(), t.isnan())
        assert a[3, 8:16].isnan().all()
        fin = t.isfinite()
        torch.testing.assert_close(a[fin], t[fin], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------
# The same bits at 1 and 2 threads
# ----------------------------------------------------------------------------

# (shape, groups, chunks of the backward): every case above the serial threshold (32K values)
DETERMINISM_CASES = [
    ((5000, 64), 8, 5),  # Cg = 8; the last task 904 samples, not whole blocks
    ((4100, 48), 8, 4),  # Cg = 6
    ((3000, 40), 10, 2),  # Cg = 4
    ((40000, 8), 8, 5),  # Cg = 1
    ((3000, 24, 1), 8, 2),  # (N, C, 1), Cg = 3
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", DETERMINISM_CASES, ids=lambda c: f"{c[0]}-G{c[1]}")
def test_bitwise_identical_for_1_and_2_threads(dtype, case):
    shape, groups, tasks = case
    n, c = shape[0], shape[1]
    assert n * c >= 32768  # above the size that runs on one thread
    assert -(-n // _samples_per_chunk(n, 1, c)) == tasks
    x, w, b, dy = _inputs(shape, dtype, True, seed=36)
    before = torch.get_num_threads()
    try:
        results = []
        for n_threads in (1, 2, 2):
            torch.set_num_threads(n_threads)
            results.append(_ours(x, w, b, dy, groups))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, o in zip(results[0], other):
            assert torch.equal(a, o)
