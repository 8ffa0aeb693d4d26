"""The ``"cpu"`` backend (the C++ kernels) of GroupNorm and InstanceNorm.

Oracles: the reference path (backend ``"ref"``), torch.nn.functional, and a
float64 computation from the same (rounded) inputs. Low-precision results must
be within 2x the error of rounding the float64 result to their dtype.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF

import normlab
import normlab.functional as NF
from tests.oracle import (
    needs_cxx,
    HALF,
    saved_bytes_beyond_inputs,
    Step,
    assert_matches_reference,
    assert_within_rounding,
    check_compiled_against_eager,
    leaf,
    rel_err,
)

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
TIGHT = {torch.float32: 1e-5, torch.float64: 1e-12}
CL = {4: torch.channels_last, 5: torch.channels_last_3d}

# (input shape, num_groups, layout)
GN_CASES = [
    ((6, 12), 3, "contiguous"),  # (N, C): S = 1
    ((3, 8, 10), 4, "contiguous"),  # (N, C, L)
    ((2, 8, 5, 6), 2, "contiguous"),  # NCHW
    ((2, 8, 5, 6), 4, "channels_last"),  # NHWC kernel
    ((2, 4, 3, 4, 5), 2, "contiguous"),  # 3-D spatial
    ((2, 6, 3, 4, 5), 3, "channels_last"),  # channels_last_3d
]


def _layout(t, layout):
    if layout == "channels_last":
        return t.contiguous(memory_format=CL[t.dim()])
    if layout == "sliced":  # every other element of the last dim
        return torch.cat([t, t], dim=-1)[..., ::2]
    if layout == "batch_transposed":
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    return t


def _inputs(shape, dtype, affine="both", layout="contiguous", seed=0, param_dtype=None):
    g = torch.Generator().manual_seed(seed)
    pd = param_dtype or dtype
    c = shape[1]
    x = _layout((torch.randn(shape, generator=g) * 2 + 1).to(dtype), layout)
    w = (1 + 0.5 * torch.randn(c, generator=g)).to(pd) if affine in ("both", "weight") else None
    b = (0.5 * torch.randn(c, generator=g)).to(pd) if affine == "both" else None
    dy = _layout(torch.randn(shape, generator=g).to(dtype), layout)
    return x, w, b, dy


def _run(backend, fn, tensors, dy):
    """``fn(*tensors)`` under ``backend``, backward with ``dy``; returns [y, *grads] (None for absent inputs)."""
    leaves = [leaf(t) for t in tensors]
    with normlab.use_backend(backend):
        y = fn(*leaves)
    y.backward(dy)
    return [y.detach()] + [l.grad if l is not None else None for l in leaves]


def _assert_nonfinite_like(pairs):
    """Each ``(got, torch's)`` pair: NaN and Inf in the same places, finite values close."""
    for a, t in pairs:
        assert torch.equal(a.isnan(), t.isnan())
        assert torch.equal(a.isinf(), t.isinf())
        fin = t.isfinite()
        torch.testing.assert_close(a[fin], t[fin], atol=1e-5, rtol=1e-5)


def _f64(t):
    return None if t is None else t.detach().double()


def _samples_per_chunk(n, s, c):
    """Samples per chunk of the NHWC backward's dw/db partials (``csrc/cpu/group_norm_kernels.h``:
    about 64K values, at least 16 rows of C channels, whole samples; from the shape only)."""
    rows = max(1, min(max(16, -(-65536 // max(c, 1))), n * s))
    return max(1, min(n, -(-rows // max(s, 1))))


def _strides(t):
    return [t.stride(i) for i in range(t.dim()) if t.shape[i] > 1]


# ----------------------------------------------------------------------------
# GroupNorm against the reference path, float64 and torch
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", GN_CASES, ids=str)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_group_norm_matches_reference(dtype, case, affine):
    shape, groups, layout = case
    x, w, b, dy = _inputs(shape, dtype, affine, layout)

    def fn(x, w, b):
        return NF.group_norm(x, groups, w, b)

    got = _run("cpu", fn, (x, w, b), dy)
    ref = _run("ref", fn, (x, w, b), dy)
    ref64 = _run("ref", fn, (_f64(x), _f64(w), _f64(b)), dy.double())
    assert_matches_reference(got, ref, ref64, dtype, TIGHT, f"group_norm {shape} G={groups} {layout}")
    y_torch = TF.group_norm(x, groups, w, b)
    assert _strides(got[0]) == _strides(y_torch)  # torch's output layout
    if dtype in (torch.float32, torch.float64):
        tor = _run("ref", lambda x, w, b: TF.group_norm(x, groups, w, b), (x, w, b), dy)
        for a, t in zip(got, tor):
            assert (a is None) == (t is None)
            if a is not None:
                assert rel_err(a, t) < 1e-5


@pytest.mark.parametrize("layout", ["sliced", "batch_transposed"])
def test_non_contiguous_input(layout):
    x, w, b, dy = _inputs((3, 6, 4, 5), torch.float32, layout=layout)
    assert not x.is_contiguous()
    fn = lambda x, w, b: NF.group_norm(x, 3, w, b)  # noqa: E731
    for a, r in zip(_run("cpu", fn, (x, w, b), dy), _run("ref", fn, (x, w, b), dy)):
        assert rel_err(a, r) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_large_groups_stream_through_tiles(dtype, layout):
    """Groups of 2 x 9216 values: larger than the kernel's cached group (16384), so x is re-read in tiles."""
    x, w, b, dy = _inputs((2, 4, 96, 96), dtype, layout=layout, seed=3)
    fn = lambda x, w, b: NF.group_norm(x, 2, w, b)  # noqa: E731
    got = _run("cpu", fn, (x, w, b), dy)
    ref = _run("ref", fn, (x, w, b), dy)
    ref64 = _run("ref", fn, (_f64(x), _f64(w), _f64(b)), dy.double())
    assert_matches_reference(got, ref, ref64, dtype, TIGHT, f"large groups {layout}")


def test_mixed_precision_float32_params():
    """bfloat16/float16 input with float32 weight/bias: y and dx in the input's dtype, dw/db in float32."""
    for dtype in HALF:
        x, w, b, dy = _inputs((4, 16, 3, 5), dtype, param_dtype=torch.float32)
        fn = lambda x, w, b: NF.group_norm(x, 4, w, b)  # noqa: E731
        got = _run("cpu", fn, (x, w, b), dy)
        ref64 = _run("ref", fn, (_f64(x), _f64(w), _f64(b)), dy.double())
        assert [t.dtype for t in got] == [dtype, dtype, torch.float32, torch.float32]
        for i, (a, r64) in enumerate(zip(got, ref64)):
            # dw/db are float32 here: hold them to the input dtype's rounding rule
            assert rel_err(a, r64) <= 2 * rel_err(r64.to(dtype), r64), i


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_half_within_2x_rounding_error_at_16x64x16x16(dtype, layout):
    """Output and every gradient within 2x the error of rounding the float64 result
    (float64 computed from the same rounded inputs); dw/db sum over 16 samples."""
    x, w, b, dy = _inputs((16, 64, 16, 16), dtype, layout=layout, seed=7)
    got = _run("cpu", lambda x, w, b: NF.group_norm(x, 32, w, b), (x, w, b), dy)
    from normlab.ops.group_norm import group_norm_backward_ref, group_norm_ref

    x4 = x.double().reshape(16, 32, 2, 256)
    w3, b3 = w.double().reshape(32, 2, 1), b.double().reshape(32, 2, 1)
    y64, mean, rstd = group_norm_ref(x4, w3, b3, 1e-5)
    dx64, dw64, db64 = group_norm_backward_ref(dy.double().reshape(x4.shape), x4, w3, mean, rstd)
    refs = [y64.reshape(x.shape), dx64.reshape(x.shape), dw64.reshape(-1), db64.reshape(-1)]
    for name, a, r64 in zip(["y", "dx", "dw", "db"], got, refs):
        assert_within_rounding(a, r64, 2.0, name)


def samples_same_bits_as_alone(fn, x, fmt):
    """fn(x) on the cpu backend, on 1 thread and on 2, each sample's output the same bits as fn of
    that sample alone (x[i:i + 1] in memory format fmt); returns the last fn(x)."""
    before = torch.get_num_threads()
    try:
        with normlab.use_backend("cpu"), torch.no_grad():
            alone = [fn(x[i:i + 1].contiguous(memory_format=fmt)) for i in range(x.shape[0])]
            for n_threads in (1, 2):
                torch.set_num_threads(n_threads)
                y = fn(x)
                for i in range(x.shape[0]):
                    assert torch.equal(y[i:i + 1], alone[i]), (n_threads, i)
    finally:
        torch.set_num_threads(before)
    return y


@needs_cxx
@pytest.mark.parametrize("act", [None, "relu", "silu"], ids=str)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_rows_streamed_as_one_run_same_bits_as_a_sample_alone(dtype, act):
    """Half-precision NCHW rows of 3 x 4489 values (GroupNorm(32, 96), 67x67 planes: a channel's
    run is not whole cache lines, nor is a row, and vectors cross the channels' ends). x and y of
    20 samples (34 MB) pass the forward's share of a last-level cache of up to 45 MB (three
    quarters of it on two threads, half on one: stream.h streams_forward), so each row's y is written
    around the caches as one run of whole lines, a vector across a channel's end taking each lane's
    constants by a select -- on 1 thread and on 2; one sample alone (1.7 MB) is written plainly,
    channel run by channel run. Each sample's statistics are its own, so its y is the same bits
    either way -- with GroupNormAct's relu inside the streamed pass too (silu, which half
    precision applies over the row after its output pass, stores plainly); and within 2x the
    rounding of float64. (An off-by-one in the select, built and run, fails 4 of the 6.)"""
    _rows_streamed_check((20, 96, 67, 67), 32, dtype, act, 11, 2.0)


def _rows_streamed_check(shape, groups, dtype, act, seed, factor):
    """Each sample's y (GroupNorm, or GroupNormAct with `act`) the same bits as the sample alone
    (samples_same_bits_as_alone) and, without an activation, within `factor` x the rounding of
    float64."""
    x, w, b, _ = _inputs(shape, dtype, seed=seed)
    if act is None:
        fn = lambda t: NF.group_norm(t, groups, w, b)  # noqa: E731
    else:
        fn = lambda t: NF.group_norm_act(t, groups, w, b, act=act)  # noqa: E731
    y = samples_same_bits_as_alone(fn, x, torch.contiguous_format)
    if act is None:
        from normlab.ops.group_norm import group_norm_ref

        cg, s = shape[1] // groups, shape[2] * shape[3]
        x4 = x.double().reshape(shape[0], groups, cg, s)
        y64 = group_norm_ref(x4, w.double().reshape(groups, cg, 1), b.double().reshape(groups, cg, 1), 1e-5)[0]
        assert_within_rounding(y, y64.reshape(shape), factor, f"y {dtype}")


@needs_cxx
@pytest.mark.parametrize("act", [None, "relu"], ids=str)
def test_float32_rows_streamed_as_one_run_same_bits_as_a_sample_alone(act):
    """float32 NCHW rows of 8 x 196 values (GroupNorm(32, 256), 14x14 planes: a channel's run of
    784 bytes is off whole cache lines, the row of 6272 bytes is whole lines, and vectors cross
    the channels' ends). x and y of 168 samples (67 MB) pass the forward's share of a last-level
    cache of up to 89 MB (three quarters on two threads), so each row's y is written around the caches as one run (group_norm_sums.h,
    affine_row_streamed), on 1 thread and on 2; one sample alone (0.4 MB) is written plainly,
    channel run by channel run. Each sample's y the same bits either way (GroupNormAct's relu
    inside the run too), and within 6x the rounding of float64 (float32's y bound of
    test_group_norm_large_mean.py; an off-by-one in stream.h's streamed_runs select, built and
    run, fails both)."""
    _rows_streamed_check((168, 256, 14, 14), 32, torch.float32, act, 12, 6.0)


@needs_cxx
@pytest.mark.parametrize(
    "shape, groups, fixed",
    [
        ((96, 512, 8, 8), 8, False),  # channel runs of 64 float32 values: whole cache lines
        ((128, 512, 8, 8), 512, True),  # InstanceNorm2d from running statistics: dx = dy * a
        ((4, 16, 256, 256), 4, False),  # long group rows (a task a channel of 65536 values)
    ],
    ids=["runs", "fixed", "long-rows"],
)
def test_backward_dx_streamed_same_bits_as_a_sample_alone(shape, groups, fixed):
    """NCHW GroupNorm's backward streams dx past the caches where what its dx pass reads and
    writes (dy, x and dx, or dy and dx from fixed statistics) passes half a last-level cache of
    up to 64 MB and the channels' runs are whole cache lines (group_norm_kernels.cpp, streams_dx):
    here 37-50 MB. A sample's dx depends on that sample alone, so each sample's dx is the same bits
    as the sample's own backward (17-25 KB: stored plainly) -- on 1 thread and on 2 -- and within
    float32's tolerance of torch.nn's backward in float64. (A streamed store of a wrong value,
    built and run, fails all three.)"""
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(shape, generator=gen) * 2 + 1
    dy = torch.randn(shape, generator=gen)
    c = shape[1]
    w = 1 + 0.5 * torch.randn(c, generator=gen)
    b = torch.randn(c, generator=gen)
    rm, rv = torch.randn(c, generator=gen) * 0.1, torch.rand(c, generator=gen) + 0.5
    if fixed:
        fn = lambda t: NF.instance_norm(t, rm, rv, w, b, use_input_stats=False)  # noqa: E731
        ref = lambda t: TF.instance_norm(t, rm.double(), rv.double(), w.double(), b.double(), use_input_stats=False)  # noqa: E731
    else:
        fn = lambda t: NF.group_norm(t, groups, w, b)  # noqa: E731
        ref = lambda t: TF.group_norm(t, groups, w.double(), b.double())  # noqa: E731

    def dx_of(xs, dys):
        t = xs.clone().requires_grad_()
        fn(t).backward(dys)
        return t.grad

    picks = [0, shape[0] // 2 + 1, shape[0] - 1]
    before = torch.get_num_threads()
    try:
        with normlab.use_backend("cpu"):
            alone = {i: dx_of(x[i:i + 1], dy[i:i + 1]) for i in picks}
            for n_threads in (1, 2):
                torch.set_num_threads(n_threads)
                dx = dx_of(x, dy)
                for i in picks:
                    assert torch.equal(dx[i:i + 1], alone[i]), (n_threads, i)
    finally:
        torch.set_num_threads(before)
    x64 = x.double().requires_grad_()
    ref(x64).backward(dy.double())
    assert rel_err(dx, x64.grad) < 1e-5


# ----------------------------------------------------------------------------
# S == 1: (N, C) and (N, C, 1) inputs, which take the NHWC kernels
# ----------------------------------------------------------------------------

# (input shape, num_groups, NHWC kernel tasks)
S1_CASES = [
    ((1000, 256), 32, 4),  # (N, C), 8 channels a group; 4 tasks of 256 samples
    ((300, 1024, 1), 16, 5),  # (N, C, 1), 64 channels a group; 5 tasks of 64 samples
    ((3000, 40), 10, 2),  # C not a multiple of the SIMD width, 4 channels a group
    ((7, 12), 3, 1),  # tiny: one task, run on one thread
]


def _torch64(x, w, b, dy, groups):
    """The float64 oracle: torch's own GroupNorm and autograd, from the same (rounded) inputs."""
    return _run("ref", lambda x, w, b: TF.group_norm(x, groups, w, b), (_f64(x), _f64(w), _f64(b)), dy.double())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", S1_CASES, ids=str)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_s1_matches_float64(dtype, case, affine):
    """y, dx, dw, db of S == 1 inputs against float64: float32/float64 to 1e-5/1e-12
    relative, half precision within 2x the error of rounding the float64 result."""
    shape, groups, tasks = case
    n, c = shape[0], shape[1]
    assert -(-n // _samples_per_chunk(n, 1, c)) == tasks
    x, w, b, dy = _inputs(shape, dtype, affine, seed=21)
    got = _run("cpu", lambda x, w, b: NF.group_norm(x, groups, w, b), (x, w, b), dy)
    ref64 = _torch64(x, w, b, dy, groups)
    for name, a, r64 in zip(["y", "dx", "dw", "db"], got, ref64):
        assert (a is None) == (r64 is None), name
        if a is None:
            continue
        assert a.dtype == (x.dtype if name in ("y", "dx") else w.dtype), name
        if dtype in HALF:
            assert_within_rounding(a, r64, 2.0, f"{name} {shape} G={groups}")
        else:
            assert rel_err(a, r64) < TIGHT[dtype], (name, rel_err(a, r64))
    assert got[0].is_contiguous() and got[1].is_contiguous()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1000, 256, 1), (30, 12, 1)], ids=str)
def test_s1_instance_norm_eval_matches_float64(dtype, shape):
    """InstanceNorm with running statistics on (N, C, 1): the NHWC kernels' fixed mode, against float64 torch."""
    c = shape[1]
    x, w, b, dy = _inputs(shape, dtype, seed=24)
    g = torch.Generator().manual_seed(25)
    stat_dtype = torch.float32 if dtype in HALF else dtype
    rm = torch.randn(c, generator=g).to(stat_dtype)
    rv = (torch.rand(c, generator=g) + 0.5).to(stat_dtype)

    def fn(x, w, b):
        return NF.instance_norm(x, rm, rv, w, b, use_input_stats=False, eps=1e-4)

    def fn64(x, w, b):
        return TF.instance_norm(x, rm.double(), rv.double(), w, b, use_input_stats=False, eps=1e-4)

    got = _run("cpu", fn, (x, w, b), dy)
    ref64 = _run("ref", fn64, (_f64(x), _f64(w), _f64(b)), dy.double())
    for name, a, r64 in zip(["y", "dx", "dw", "db"], got, ref64):
        if dtype in HALF:
            assert_within_rounding(a, r64, 2.0, f"{name} {shape}")
        else:
            assert rel_err(a, r64) < TIGHT[dtype], (name, rel_err(a, r64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_s1_constant_group_gives_exactly_beta(dtype):
    big = 1e3 if dtype == torch.float16 else 1e4
    x = torch.empty(3, 48, dtype=dtype)
    for n, value in enumerate((0.1, big, -3.3)):
        x[n, :24] = value
        x[n, 24:] = value / 7 - 1
    w = torch.randn(48).to(dtype)
    b = torch.randn(48).to(dtype)
    with normlab.use_backend("cpu"):
        assert torch.equal(NF.group_norm(x, 2, w, b), b.expand(3, 48))
        assert torch.equal(NF.group_norm(x[:, :, None], 2, w, b), b.expand(3, 48)[:, :, None])


def test_s1_large_mean_groups_float32():
    """Groups with mean 1e4 and std 1: float32 output within 1e-5 of float64 from the same input."""
    x = 1e4 + torch.randn(512, 256, generator=torch.Generator().manual_seed(22))
    with normlab.use_backend("cpu"):
        y = NF.group_norm(x, 2)
    assert (y.double() - TF.group_norm(x.double(), 2)).abs().max() < 1e-5


def test_s1_nan_and_inf_propagate_like_torch():
    nan, inf = float("nan"), float("inf")
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(23))
    x[0, 2] = nan  # poisons group 0 of sample 0
    x[1, 13] = inf  # group 3 of sample 1
    x[2, 5] = -inf
    dy = torch.randn(6, 16)
    fn = lambda x: NF.group_norm(x, 4)  # noqa: E731
    tfn = lambda x: TF.group_norm(x, 4)  # noqa: E731
    (y, dx), (y_t, dx_t) = _run("cpu", fn, (x,), dy), _run("ref", tfn, (x,), dy)
    assert y.isnan().any()
    _assert_nonfinite_like(((y, y_t), (dx, dx_t)))


# ----------------------------------------------------------------------------
# InstanceNorm: training with running statistics, eval with them
# ----------------------------------------------------------------------------

IN_CASES = [((3, 4, 7), "contiguous"), ((2, 5, 4, 6), "contiguous"), ((2, 5, 4, 6), "channels_last"),
            ((2, 3, 3, 4, 2), "channels_last")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", IN_CASES, ids=str)
@pytest.mark.parametrize("use_input_stats", [True, False])
def test_instance_norm_matches_reference(dtype, case, use_input_stats):
    shape, layout = case
    c = shape[1]
    x, w, b, dy = _inputs(shape, dtype, "both", layout, seed=4)
    stat_dtype = torch.float32 if dtype in HALF else dtype
    g = torch.Generator().manual_seed(5)
    rm0 = torch.randn(c, generator=g).to(stat_dtype)
    rv0 = (torch.rand(c, generator=g) + 0.5).to(stat_dtype)
    stats = {}

    def make(key, sdt=None):
        def fn(x, w, b):
            rm, rv = rm0.to(sdt or stat_dtype, copy=True), rv0.to(sdt or stat_dtype, copy=True)
            stats[key] = (rm, rv)
            return NF.instance_norm(x, rm, rv, w, b, use_input_stats, momentum=0.3, eps=1e-4)
        return fn

    got = _run("cpu", make("cpu"), (x, w, b), dy)
    ref = _run("ref", make("ref"), (x, w, b), dy)
    ref64 = _run("ref", make("ref64", torch.float64), (_f64(x), _f64(w), _f64(b)), dy.double())
    assert_matches_reference(got, ref, ref64, dtype, TIGHT, f"instance_norm {shape} {layout}")
    assert got[0].is_contiguous()  # torch's instance_norm output is contiguous
    for s, s_ref, s64 in zip(stats["cpu"], stats["ref"], stats["ref64"]):
        assert s.dtype == stat_dtype
        tol = 1e-12 if dtype == torch.float64 else 1e-6
        assert rel_err(s, s_ref) < tol and rel_err(s, s64) < tol
    if not use_input_stats:
        assert torch.equal(stats["cpu"][0], rm0) and torch.equal(stats["cpu"][1], rv0)


@pytest.mark.parametrize("stat_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_instance_norm_running_stats_in_their_own_dtype(stat_dtype):
    """bfloat16 input with bfloat16 or float32 running statistics: each step's update is
    computed from the stored values and rounded once to their dtype (float64 oracle per step)."""
    g = torch.Generator().manual_seed(8)
    rm, rv = torch.zeros(6, dtype=stat_dtype), torch.ones(6, dtype=stat_dtype)
    for _ in range(3):
        x = (torch.randn(4, 6, 5, 5, generator=g) * 3 + 1).to(torch.bfloat16)
        rm64, rv64 = rm.double(), rv.double()
        TF.instance_norm(x.double(), rm64, rv64, momentum=0.2)
        with normlab.use_backend("cpu"):
            NF.instance_norm(x, rm, rv, momentum=0.2)
        for s, s64 in ((rm, rm64), (rv, rv64)):
            assert s.dtype == stat_dtype
            assert rel_err(s, s64) <= max(2 * rel_err(s64.to(stat_dtype), s64), 1e-6)


def test_instance_norm_running_stats_of_a_non_contiguous_buffer():
    base_m, base_v = torch.zeros(8), torch.ones(8)
    rm, rv = base_m[::2], base_v[::2]  # (4,) views with stride 2
    rm_t, rv_t = rm.clone(), rv.clone()
    x = torch.randn(3, 4, 10)
    with normlab.use_backend("cpu"):
        NF.instance_norm(x, rm, rv, momentum=0.5)
    TF.instance_norm(x, rm_t, rv_t, momentum=0.5)
    torch.testing.assert_close(rm, rm_t)
    torch.testing.assert_close(rv, rv_t)
    assert torch.equal(base_m[1::2], torch.zeros(4)) and torch.equal(base_v[1::2], torch.ones(4))


# ----------------------------------------------------------------------------
# Gradients: gradcheck, double backward
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gn", "gn_channels_last", "in_train", "in_eval"])
def test_gradcheck_and_gradgradcheck(name):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 3, 2, generator=g, dtype=torch.float64)
    if name == "gn_channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    w = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.randn(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64) + 0.5
    fn = {
        "gn": lambda x, w, b: NF.group_norm(x, 2, w, b),
        "gn_channels_last": lambda x, w, b: NF.group_norm(x, 2, w, b),
        "in_train": lambda x, w, b: NF.instance_norm(x, None, None, w, b),
        "in_eval": lambda x, w, b: NF.instance_norm(x, rm, rv, w, b, use_input_stats=False),
    }[name]
    with normlab.use_backend("cpu"):
        assert torch.autograd.gradcheck(fn, (x, w, b))
        assert torch.autograd.gradgradcheck(fn, (x, w, b))


# ----------------------------------------------------------------------------
# Determinism, NaN/Inf, large means, constant groups
# ----------------------------------------------------------------------------


# (shape, layout, NHWC kernel tasks): every case is above the serial threshold (32K values)
DETERMINISM_CASES = [
    ((8, 32, 16, 16), "contiguous", None),  # NCHW kernels: several tasks per thread
    ((8, 32, 16, 16), "channels_last", 1),  # NHWC, one task of 8 samples
    ((96, 32, 8, 8), "channels_last", 3),  # NHWC, per-task dw/db partials merged over 3 tasks
    ((2048, 128), "contiguous", 4),  # S == 1, (N, C): the NHWC kernels, 4 tasks
    ((4096, 64, 1), "contiguous", 4),  # S == 1, (N, C, 1)
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", DETERMINISM_CASES, ids=str)
def test_bitwise_identical_for_1_and_2_threads(dtype, case):
    shape, layout, tasks = case
    n, c, s = shape[0], shape[1], math.prod(shape[2:])
    if tasks is not None:  # the case covers what it claims: the NHWC kernels' chunks of samples
        assert -(-n // _samples_per_chunk(n, s, c)) == tasks
    x, w, b, dy = _inputs(shape, dtype, layout=layout, seed=5)
    fns = [
        lambda x, w, b: NF.group_norm(x, 8, w, b),
        lambda x, w, b: NF.instance_norm(x, torch.zeros(c), torch.ones(c), w, b, use_input_stats=False),
    ]
    if s > 1:  # InstanceNorm in training needs more than one value per channel
        fns.append(lambda x, w, b: NF.instance_norm(x, torch.zeros(c), torch.ones(c), w, b))
    before = torch.get_num_threads()
    try:
        for fn in fns:
            results = []
            for n_threads in (1, 2, 2):
                torch.set_num_threads(n_threads)
                results.append(_run("cpu", fn, (x, w, b), dy))
            for other in results[1:]:
                for a, o in zip(results[0], other):
                    assert torch.equal(a, o)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_nan_and_inf_propagate_like_torch(layout):
    nan, inf = float("nan"), float("inf")
    x = torch.randn(3, 4, 5, 2, generator=torch.Generator().manual_seed(18))
    x[0, 0, 2, 1] = nan  # poisons group 0 of sample 0 (and instance (0, 0))
    x[1, 3, 0, 0] = inf  # poisons group 1 of sample 1
    x[2, 1, 4, 1] = -inf
    x = _layout(x, layout)
    dy = _layout(torch.randn(3, 4, 5, 2), layout)
    for fn, tfn in [
        (lambda x: NF.group_norm(x, 2), lambda x: TF.group_norm(x, 2)),
        (lambda x: NF.group_norm(x, 4), lambda x: TF.group_norm(x, 4)),
        (lambda x: NF.instance_norm(x), lambda x: TF.instance_norm(x)),
        (lambda x: NF.instance_norm(x, torch.zeros(4), torch.ones(4), use_input_stats=False),
         lambda x: TF.instance_norm(x, torch.zeros(4), torch.ones(4), use_input_stats=False)),
    ]:
        (y, dx), (y_t, dx_t) = _run("cpu", fn, (x,), dy), _run("ref", tfn, (x,), dy)
        assert y.isnan().any()
        _assert_nonfinite_like(((y, y_t), (dx, dx_t)))


_NAN_PAYLOADS = pytest.mark.parametrize("payload", [0x7FFF, -1, 0x7FC0], ids=["0x7FFF", "0xFFFF", "0x7FC0"])


def _bf16_with_nan(shape, payload, seed=5):
    """bfloat16 x of mean 0.5 with a NaN of bits ``payload`` in channel 3 and an infinity in channel 20."""
    x = (0.5 + torch.randn(shape, generator=torch.Generator().manual_seed(seed))).to(torch.bfloat16)
    x.view(torch.int16)[0, 3, 1, 1] = payload
    x[-1, 20, 0, 0] = float("inf")
    return x


@_NAN_PAYLOADS
@pytest.mark.parametrize("zero_weight", [False, True], ids=["w", "zero_w"])
@pytest.mark.parametrize("layout,shape,groups", [
    ("channels_last", (2, 32, 6, 7), 4),  # the NHWC kernels: pairs over the channels of a position
    ("contiguous", (2, 32, 48, 48), 4),  # rows of 18432 values: the long-rows output pass
    ("contiguous", (2, 32, 4, 8), 16),  # rows of 64 values: the short rows' block
], ids=str)
def test_bfloat16_nan_of_any_payload_stays_nan(payload, zero_weight, layout, shape, groups):
    """bfloat16 y is rounded two vectors at a time, with the NaN test left out where no output can be
    NaN (the group's mean finite, no zero weight). A NaN of any payload poisons its group, as in
    torch, and is stored as 0x7FC0, as torch rounds every NaN (rounded without the test, a NaN of x
    keeps its own bits and the arithmetic's NaN 0xFFC00000 stores 0xFFC0); an infinity poisons its
    own group; a zero weight gives b on its channel; everything else within 2x rounding."""
    g = torch.Generator().manual_seed(6)
    x = _layout(_bf16_with_nan(shape, payload), layout)
    w = (1 + 0.5 * torch.randn(32, generator=g)).to(torch.bfloat16)
    b = (0.5 * torch.randn(32, generator=g)).to(torch.bfloat16)
    if zero_weight:
        w[9] = 0.0
    with normlab.use_backend("cpu"):
        y = NF.group_norm(x, groups, w, b)
    ref = TF.group_norm(x.double(), groups, w.double(), b.double())
    assert ref[0, 3].isnan().all() and ref[-1, 20].isnan().all()
    assert torch.equal(y.isnan(), ref.isnan())
    assert (y.view(torch.int16)[y.isnan()] == 0x7FC0).all()  # torch's (and the store's) one NaN
    if zero_weight:
        assert torch.equal(y[-1, 9], b[9].expand_as(y[-1, 9]))
    ok = ~ref.isnan()
    assert_within_rounding(y[ok], ref[ok], 2.0, "y")


@_NAN_PAYLOADS
def test_bfloat16_nan_with_running_statistics_is_stored_as_torch_does(payload):
    """InstanceNorm with running statistics: the statistics say nothing of x, so the NaN test stays
    on however finite they are -- a NaN of x is stored as 0x7FC0 (as torch), not with its own bits."""
    x = _bf16_with_nan((2, 32, 4, 8), payload)
    rm, rv = torch.randn(32) * 0.1, torch.rand(32) + 0.5
    with normlab.use_backend("cpu"):
        y = NF.instance_norm(x, rm, rv, use_input_stats=False)
    ref = TF.instance_norm(x.double(), rm.double(), rv.double(), use_input_stats=False)
    assert torch.equal(y.isnan(), ref.isnan()) and y.isnan().sum() == 1
    assert (y.view(torch.int16)[y.isnan()] == 0x7FC0).all()
    assert torch.equal(y.isinf(), ref.isinf()) and y[-1, 20, 0, 0] == float("inf")
    assert_within_rounding(y[ref.isfinite()], ref[ref.isfinite()], 2.0, "y")


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "large"])
def test_large_mean_groups_float32(layout):
    """Groups with mean 1e4 and std 1: float32 output within 1e-5 of float64 from the same input."""
    shape = (2, 4, 96, 96) if layout == "large" else (4, 8, 16, 16)
    g = torch.Generator().manual_seed(13)
    x = _layout(1e4 + torch.randn(shape, generator=g), "contiguous" if layout == "large" else layout)
    with normlab.use_backend("cpu"):
        y, y_in = NF.group_norm(x, 2), NF.instance_norm(x)
    assert (y.double() - TF.group_norm(x.double(), 2)).abs().max() < 1e-5
    assert (y_in.double() - TF.instance_norm(x.double())).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_constant_group_gives_exactly_beta(dtype, layout):
    big = 1e3 if dtype == torch.float16 else 1e4
    x = torch.empty(3, 6, 2, 2, dtype=dtype)
    for n, value in enumerate((0.1, big, -3.3)):
        x[n, :3] = value
        x[n, 3:] = value / 7 - 1
    x = _layout(x, layout)
    w = torch.randn(6).to(dtype)
    b = torch.randn(6).to(dtype)
    expected = b[None, :, None, None].expand(3, 6, 2, 2)
    with normlab.use_backend("cpu"):
        assert torch.equal(NF.group_norm(x, 2, w, b), expected)
        assert torch.equal(NF.instance_norm(x, weight=w, bias=b), expected)


# ----------------------------------------------------------------------------
# Integration: torch.compile, saved tensors, backend registry
# ----------------------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.gn = normlab.nn.GroupNorm(4, 8)
        self.inorm = normlab.nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.inorm_eval = normlab.nn.InstanceNorm2d(8, affine=True, track_running_stats=True).eval()

    def forward(self, x):
        h = self.gn(self.conv(x))
        return self.inorm_eval(self.inorm(h).relu()) * 2


def _net_and_input(layout=torch.contiguous_format):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 5).contiguous(memory_format=layout)
    torch.manual_seed(0)
    m = _Net()
    m.inorm_eval.running_mean.uniform_(-1, 1)
    m.inorm_eval.running_var.uniform_(0.5, 2)
    return m, x


def _eager_and_compiled(backend, layout=torch.contiguous_format):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 5).contiguous(memory_format=layout)
    results = []
    with normlab.use_backend("cpu"):
        for compiled in (False, True):
            torch.manual_seed(0)
            m = _Net()
            m.inorm_eval.running_mean.uniform_(-1, 1)
            m.inorm_eval.running_var.uniform_(0.5, 2)
            model = torch.compile(m, fullgraph=True, backend=backend) if compiled else m
            for _ in range(2):  # two steps: the running statistics move twice
                xx = x.clone().requires_grad_()
                out = model(xx)
                out.backward(torch.ones_like(out))
            results.append([out.detach(), xx.grad, *(p.grad.clone() for p in m.parameters()),
                            *(t.clone() for t in m.buffers())])
    return results


def test_torch_compile_fullgraph_uses_the_custom_ops():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen = {}

    def record(name):
        def compiler(gm, example_inputs):
            seen.setdefault(name, set()).update(
                str(n.target) if "normlab" in str(n.target) else str(n.args[0])
                for n in gm.graph.nodes
                if "normlab" in str(n.target) or "auto_functionalized" in str(n.target)
            )
            return make_boxed_func(gm)

        return compiler

    eager, compiled = _eager_and_compiled(aot_autograd(fw_compiler=record("fw"), bw_compiler=record("bw")))
    for a, c in zip(eager, compiled):
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-6)
    assert seen["fw"] == {"normlab.group_norm_fwd.default", "normlab.instance_norm_eval_fwd.default",
                          "normlab.instance_norm_update_stats.default"}
    assert seen["bw"] == {"normlab.group_norm_bwd.default", "normlab.instance_norm_eval_bwd.default"}


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=str)
def test_torch_compile_aot_eager_channels_last(layout):
    eager, compiled = _eager_and_compiled("aot_eager", layout)
    for a, c in zip(eager, compiled):
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-6)


@needs_cxx
def test_torch_compile_inductor_matches_eager():
    """Compiling changes nothing normlab computes; inductor's own code (the conv, the relu and
    scaling, their fusions) is held to its rounding: each normlab op the compiled graph calls
    gives the bits an eager call gives on the same inputs, and every result, eager and compiled,
    is within K u M of a float64 run (tests/oracle.py). Not a fixed tolerance: conv.bias.grad
    and gn.weight.grad are differences of much larger terms (a bias before a GroupNorm has a
    gradient that is zero up to rounding), and inductor's code differs from CPU to CPU."""
    m, x = _net_and_input()
    check_compiled_against_eager(m, x, [Step(), Step()], "inductor", {
        "normlab.group_norm_fwd.default", "normlab.group_norm_bwd.default",
        "normlab.instance_norm_update_stats.default",
        "normlab.instance_norm_eval_fwd.default", "normlab.instance_norm_eval_bwd.default"})


def test_forward_keeps_nothing_activation_sized_beyond_x():
    """What the forward keeps for the backward, beyond the inputs themselves: at most three float64
    values per group of a sample (no activation-sized tensor: not y, not x_hat). Measured with torch's
    saved-tensor hooks, whatever the tensors are."""
    x = torch.randn(4, 8, 3, 3, requires_grad=True)
    w, b = torch.ones(8, requires_grad=True), torch.zeros(8, requires_grad=True)
    kept = saved_bytes_beyond_inputs(lambda: NF.group_norm(x, 2, w, b), x, w, b)
    assert kept <= 3 * 8 * 4 * 2, kept  # 4 samples x 2 groups


def test_backend_registry():
    x = torch.randn(2, 3, 4)
    with normlab.use_backend("auto"):
        for op in ("group_norm", "instance_norm"):
            assert normlab.backend_for(x, op) == "cpu"
            assert normlab.backend_for(x.to("meta"), op) == "ref"
    with normlab.use_backend("cpu"):
        with pytest.raises(RuntimeError, match="cannot serve a torch.float32 tensor on meta"):
            normlab.backend_for(x.to("meta"), "group_norm")


# Channels-last tensors of 16 channels or more are made contiguous by a blocked transpose (the
# output of InstanceNorm of a channels_last x; its x with running statistics; GroupNorm's dy when
# x is contiguous): whole blocks of 64 positions x 16 channels by register tiles (8x8 of 16-bit
# values, 4x4 of 32-bit ones), the edges element by element, 64-bit values element by element.
# Oracle: the same values made contiguous by torch's own copy -- the transpose moves values, so
# the bits must be equal.
TRANSPOSE_SHAPES = [
    (1, 16, 8, 8),      # one whole block
    (2, 40, 9, 13),     # 117 positions: a whole block and an edge; channels 16 + 16 + 8
    (3, 17, 4, 33),     # one channel past a block
    (2, 32, 3, 5, 7),   # channels_last_3d
]


def _instance_inputs(shape, dtype, g):
    """x (mean 0.5, std 2), dy, weight (0.5 to 1.5), bias: drawn in float64 from g, rounded to dtype."""
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    w = torch.rand(shape[1], generator=g, dtype=torch.float64).add(0.5).to(dtype)
    b = torch.randn(shape[1], generator=g, dtype=torch.float64).to(dtype)
    return x, dy, w, b


@pytest.mark.parametrize("shape", TRANSPOSE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_channels_last_instance_norm_through_the_transpose_is_bit_exact(shape, dtype):
    """With its input's statistics, InstanceNorm of a channels_last x is GroupNorm(C, C) of x as it
    is, made contiguous: the same bits as ``group_norm(x, C).contiguous()`` (torch's copy), forward
    and backward. With running statistics, x is made contiguous first: the same bits as from
    ``x.contiguous()``."""
    g = torch.Generator().manual_seed(7)
    x, dy, w, b = _instance_inputs(shape, dtype, g)
    c = shape[1]
    xc = x.contiguous(memory_format=CL[len(shape)])
    outs = []
    with normlab.use_backend("cpu"):
        for fn in (lambda t, w, b: NF.instance_norm(t, weight=w, bias=b, eps=1e-5),
                   lambda t, w, b: NF.group_norm(t, c, w, b, eps=1e-5).contiguous()):
            xl, wl, bl = leaf(xc), leaf(w), leaf(b)
            y = fn(xl, wl, bl)
            y.backward(dy)
            outs.append((y, xl.grad, wl.grad, bl.grad))
    assert outs[0][0].is_contiguous()  # torch's instance_norm output is contiguous, whatever x's layout
    for got, want, name in zip(outs[0], outs[1], ("y", "dx", "dweight", "dbias")):
        assert torch.equal(got, want), f"{name} {shape} {dtype}"
    rm, rv = torch.randn(c, generator=g).to(dtype), torch.rand(c, generator=g).add(0.5).to(dtype)
    with normlab.use_backend("cpu"), torch.no_grad():
        ys = [NF.instance_norm(t, rm, rv, w, b, use_input_stats=False) for t in (xc, x.contiguous())]
    assert torch.equal(ys[0], ys[1]), f"y with running statistics {shape} {dtype}"


@pytest.mark.parametrize("shape", TRANSPOSE_SHAPES + [(1, 4, 5, 21, 21), (3, 3, 17, 19)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_channels_last_instance_norm_in_the_input_layout(shape, dtype):
    """InstanceNorm of a channels_last x (with its statistics) runs on x and a channels_last dy as
    they are (the channels-last kernels; y then made contiguous) and gives dx in x's layout, as
    torch.nn does; y, dx, dweight, dbias against torch's float64 InstanceNorm on the same rounded
    inputs: within 2x the rounding error (half precision), 8x / 16x (float32: y, dx / the sums
    dweight, dbias), 1e-12 (float64)."""
    from tests.oracle import rounding_err
    from tests.ops.group_norm.test_group_norm_nhwc import _expected_rounding

    g = torch.Generator().manual_seed(7)
    x, dy, w, b = _instance_inputs(shape, dtype, g)
    c = shape[1]
    fmt = CL[len(shape)]
    xl, wl, bl = leaf(x.contiguous(memory_format=fmt)), leaf(w), leaf(b)
    with normlab.use_backend("cpu"):
        y = NF.instance_norm(xl, weight=wl, bias=bl, eps=1e-5)
        y.backward(dy.contiguous(memory_format=fmt))
    assert xl.grad.is_contiguous(memory_format=fmt)
    x64, w64, b64 = leaf(x.double()), leaf(w.double()), leaf(b.double())
    y64 = TF.instance_norm(x64, weight=w64, bias=b64, eps=1e-5)
    y64.backward(dy.double())
    assert y.is_contiguous()
    for name, got, ref in (("y", y, y64), ("dx", xl.grad, x64.grad), ("dweight", wl.grad, w64.grad),
                           ("dbias", bl.grad, b64.grad)):
        what = f"{name} {shape} {dtype}"
        if dtype == torch.float64:
            assert rel_err(got, ref) < 1e-12, what
        elif dtype in HALF:
            assert_within_rounding(got, ref, 2.0, what, dtype)
        else:
            bound = (8.0 if name in ("y", "dx") else 16.0) * max(rounding_err(ref, dtype), _expected_rounding(ref, dtype))
            assert rel_err(got, ref) <= bound, (what, rel_err(got, ref), bound)


@pytest.mark.parametrize("shape", TRANSPOSE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_group_norm_backward_of_a_channels_last_dy_through_the_transpose_is_bit_exact(shape, dtype):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)  # contiguous: a contiguous output
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    grads = []
    with normlab.use_backend("cpu"):
        for d in (dy.contiguous(memory_format=CL[len(shape)]), dy.contiguous()):
            xl = leaf(x)
            NF.group_norm(xl, 1, eps=1e-5).backward(d)
            grads.append(xl.grad.contiguous())
    assert torch.equal(grads[0], grads[1])
