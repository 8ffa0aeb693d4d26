"""The channels_last (NHWC) GroupNorm kernels at the shapes their blocking rule tells apart.

``csrc/cpu/group_norm_nhwc_kernels.cpp`` cuts a sample into tiles and chunks of rows and runs whole
samples (or whole runs of 16 samples, backward) a task, or, when those are too few for the threads,
chunks a task with the partials merged after. Every output (y, dx, dw, db) is close to the float64
result computed from the same rounded inputs (the reference formula, two passes): half precision
within 2x the error of rounding it, float32 within 8x (y, dx: a handful of roundings) or 16x (dw,
db: sums of thousands of terms of both signs); torch's own float32 GroupNorm is 3-40x at mean 0.5
and ~1e9x at mean 1e4; float64 within 1e-12 (1e-10 at mean 1e4, the oracle's own) -- also on
groups with mean 1e4 and std 1, where a kernel that drops the shift or the corrections for the
rounded mean (output, backward) loses digits -- and the bits are the same for 1 and 2 threads (the
two schedules).
"""

from __future__ import annotations

import pytest
import torch

import normlab.functional as NF
from normlab.ops.group_norm import group_norm_backward_ref, group_norm_ref
from tests.oracle import HALF, assert_within_rounding, rel_err, rounding_err
from tests.ops.group_norm.test_group_norm_cpu import _run, samples_same_bits_as_alone

# (shape, groups): what each case covers in the kernels' rule
CASES = [
    ((1, 64, 64, 64), 32),  # one sample of 4 chunks: chunks on threads (2 threads), 2 channels a group
    ((3, 32, 40, 40), 32),  # 3 samples on 2 threads: chunks a task; G = C (one channel a group)
    ((4, 40, 12, 12), 8),  # C = 40, not a multiple of 16: runs of 2 rows read as 80 values (5 vectors)
    ((2, 24, 33, 33), 3),  # C = 24: runs of 2 rows as 3 vectors, a row past the last run
    ((1, 520, 24, 24), 4),  # C > 512: channel blocks of 4 vectors; runs of 2 rows as 1040 values
    ((2, 3, 17, 19), 3),  # C = 3: runs of 16 rows (8: float64) as 3 vectors, the last 3 rows one by one
    ((3, 8, 20, 21), 2),  # C = 8: runs of 2 rows a vector
    ((1, 12, 96, 96), 4),  # C = 12: runs of 4 rows; one sample of 3 chunks on 2 threads
    ((2, 330, 5, 7), 10),  # C = 330, lcm with the lanes too large for a view: a partial vector a row
    ((1, 330, 16, 16), 1),  # the same, one sample of 3 chunks on 2 threads; a group of 330 channels
    ((2, 258, 3, 5), 2),  # C = 258: partial vectors of 2 lanes; groups of 129 channels (vector sums)
    ((2, 384, 6, 7), 1),  # one group of 24 whole vectors of channels (the tile's group sums as vectors)
    ((17, 32, 24, 48), 4),  # 17 samples of 2 chunks: backward runs of 16 and 1 -- whole runs on 1 thread, by chunks on 2
]


def _inputs(shape, dtype, mean, seed, step=None):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    cl = torch.channels_last
    x = mean + torch.randn(shape, generator=g, dtype=torch.float64)
    if step is not None:  # (value, mask over the rows h): the mean jumps by value on those rows
        x[:, :, step[1]] += step[0]
    x = x.to(dtype).contiguous(memory_format=cl)
    w = (1 + 0.5 * torch.randn(c, generator=g)).to(dtype)
    b = (0.5 * torch.randn(c, generator=g)).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype).contiguous(memory_format=cl)
    return x, w, b, dy


def _float64(x, w, b, dy, groups):
    """y, dx, dw, db in float64 from the same (rounded) inputs: the reference formula (two passes)."""
    n, c = x.shape[:2]
    x4 = x.double().reshape(n, groups, c // groups, -1)
    w3, b3 = w.double().reshape(groups, c // groups, 1), b.double().reshape(groups, c // groups, 1)
    y, mean, rstd = group_norm_ref(x4, w3, b3, 1e-5)
    dx, dw, db = group_norm_backward_ref(dy.double().reshape(x4.shape), x4, w3, mean, rstd)
    return [y.reshape(x.shape), dx.reshape(x.shape), dw.reshape(-1), db.reshape(-1)]


def _expected_rounding(ref, dtype):
    """The expected relative error of rounding ``ref`` to ``dtype`` (Frobenius norm): a value's
    rounding error is uniform over its ulp, so its variance is ulp^2 / 12."""
    r = ref.to(dtype)
    ulp = (torch.nextafter(r, torch.full_like(r, float("inf"))) - r).double()
    return ((ulp.square() / 12).sum().sqrt() / ref.norm()).item()


def _check(shape, groups, dtype, mean, seed=3, step=None):
    x, w, b, dy = _inputs(shape, dtype, mean, seed, step)
    got = _run("cpu", lambda x, w, b: NF.group_norm(x, groups, w, b), (x, w, b), dy)
    ref = _float64(x, w, b, dy, groups)
    assert got[0].is_contiguous(memory_format=torch.channels_last)
    for name, a, r in zip(["y", "dx", "dw", "db"], got, ref):
        what = f"{name} {shape} {dtype} mean {mean}"
        if dtype == torch.float64:  # at mean 1e4 the oracle's own x - mean keeps 12 digits
            assert rel_err(a, r) < (1e-12 if abs(mean) < 10 else 1e-10), (what, rel_err(a, r))
        elif dtype in HALF:
            assert_within_rounding(a, r, 2.0, what)
        else:  # float32: dw, db sum thousands of terms of both signs (their error grows with that);
            # the rounding error of a few values (dw of 3 channels) is a noisy estimate: at least
            # its expectation (which the actual rounding of many values matches within ~20 %; for
            # dw of 3 channels at mean 1e4 it reads 0.36x)
            bound = (8.0 if name in ("y", "dx") else 16.0) * max(rounding_err(r, dtype), _expected_rounding(r, dtype))
            assert rel_err(a, r) <= bound, (what, rel_err(a, r), bound)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_within_2x_rounding_of_float64(case, dtype):
    _check(*case, dtype, mean=0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_large_mean_within_2x_rounding_of_float64(case, dtype):
    """Groups with mean 1e4 and std 1 (float32: four digits of every value are the mean's)."""
    _check(*case, dtype, mean=1e4)


@pytest.mark.parametrize("case", CASES[:2], ids=str)
def test_larger_mean_float32(case):
    """Mean 1e5, std 1: the rounding of a tile's mean (up to 4e-3) enters the second pass's sum of
    squares as count * offset^2, 1e-5 of the variance, unless taken out."""
    _check(*case, torch.float32, mean=1e5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_mean_jumping_between_tiles(dtype):
    """A tile after the chunk's first is summed about the chunk's running mean (one pass), or again
    about its own mean where that shift is far from it. Rows of 64 float32 channels: tiles of 256
    rows, chunks of two; the mean jumps by 1e4 (bfloat16: 50) on the second tile of every chunk
    (rows h % 8 >= 4), far from the shift: y, dx, dw, db within the same bounds as on stationary
    input. (Which pass such a tile takes does not show in the bounds: its error from cancelling
    goes with the jump squared, which the merged variance holds too; the first tile's shift, one
    value, is where the choice shows -- the mean-1e4 cases.)"""
    rows = torch.arange(64) % 8 >= 4
    _check((1, 64, 64, 64), 8, dtype, mean=0.5, step=(1e4 if dtype != torch.bfloat16 else 50.0, rows))


@pytest.mark.parametrize("shape,dtype,mean", [((1, 64, 256, 256), torch.float32, 1e4),
                                              ((1, 64, 256, 512), torch.bfloat16, 0.5)], ids=str)
def test_large_output_streamed_within_2x_rounding_of_float64(shape, dtype, mean):
    """x and y of 32 MiB: past half a last-level cache of up to 64 MiB, y is written around the
    caches (bfloat16: two vectors at a time, even and odd values apart)."""
    _check(shape, 32, dtype, mean=mean)


@pytest.mark.parametrize("act", [None, "silu"], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_streamed_rows_off_whole_lines_same_bits_as_a_sample_alone(dtype, act):
    """161 channels (7 groups): a position's values are not whole cache lines. x and y of 4 samples
    (42 MB in half precision, 47 in float32) pass half a last-level cache of up to 64 MB (one
    thread; two: a whole one of up to 32 MB, stream.h streams_forward), so y is written
    around the caches as one run of whole lines (affine_flat) -- on 1 thread and on 2 (chunks of
    the samples on each) -- where one sample alone (10.5 / 11.9 MB) is written row by row from the
    caches on a 32 MB one. Each sample's statistics depend on that sample alone, so its y is
    the same bits either way (bfloat16: pairs of vectors at every channel offset, even and odd); and
    within 2x the rounding of float64 (float32: 8x). With the activation of GroupNormAct too (silu
    inside the output pass)."""
    shape, groups = (4, 161, 128, 128) if dtype in HALF else (4, 161, 96, 96), 7
    x, w, b, _ = _inputs(shape, dtype, 0.5, seed=5)
    if act is None:
        fn = lambda t: NF.group_norm(t, groups, w, b)  # noqa: E731
    else:
        fn = lambda t: NF.group_norm_act(t, groups, w, b, act=act)  # noqa: E731
    y = samples_same_bits_as_alone(fn, x, torch.channels_last)
    assert y.is_contiguous(memory_format=torch.channels_last)
    if act is None:
        ref = _float64(x, w, b, torch.zeros_like(x), groups)[0]
        if dtype in HALF:
            assert_within_rounding(y, ref, 2.0, f"y {dtype}")
        else:
            assert rel_err(y, ref) <= 8.0 * max(rounding_err(ref, dtype), _expected_rounding(ref, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_bitwise_identical_for_1_and_2_threads(case, dtype):
    shape, groups = case
    x, w, b, dy = _inputs(shape, dtype, 3.0, seed=4)
    before = torch.get_num_threads()
    try:
        results = []
        for n_threads in (1, 2, 2):
            torch.set_num_threads(n_threads)
            results.append(_run("cpu", lambda x, w, b: NF.group_norm(x, groups, w, b), (x, w, b), dy))
        for other in results[1:]:
            for a, o in zip(results[0], other):
                assert torch.equal(a, o)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("shape,dtype", [((3, 70, 9, 11), torch.float32), ((2, 5, 3, 4, 6), torch.bfloat16),
                                         ((2, 130, 65, 3), torch.float64)], ids=str)
def test_instance_norm_channels_last_grad_out_same_bits(shape, dtype):
    """InstanceNorm's output is contiguous; a channels_last grad_out is made contiguous by the
    kernels' blocked transpose (blocks of 64 channels x 64 positions, partial ones here): the same
    gradients as from the contiguous grad_out."""
    import normlab

    g = torch.Generator().manual_seed(9)
    x = torch.randn(shape, generator=g).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    grads = []
    for d in (dy, dy.contiguous(memory_format=fmt)):
        xx = x.clone().requires_grad_(True)
        with normlab.use_backend("cpu"):
            y = NF.instance_norm(xx)
        y.backward(d)
        grads.append(xx.grad)
    assert torch.equal(grads[0], grads[1])


def test_instance_norm_channels_last_input_gradcheck_and_gradgradcheck():
    """A channels_last input of 16 channels or more is made contiguous by the blocked transpose, a
    differentiable step of its own: first and second derivatives through it."""
    import normlab

    g = torch.Generator().manual_seed(10)
    x = torch.randn(2, 16, 3, 4, generator=g, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    w = torch.randn(16, generator=g, dtype=torch.float64)
    b = torch.randn(16, generator=g, dtype=torch.float64)
    x.requires_grad_(True), w.requires_grad_(True), b.requires_grad_(True)

    def fn(x, w, b):
        with normlab.use_backend("cpu"):
            return NF.instance_norm(x, weight=w, bias=b)

    assert torch.autograd.gradcheck(fn, (x, w, b))
    assert torch.autograd.gradgradcheck(fn, (x, w, b))
