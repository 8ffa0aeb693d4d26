"""Differential test of the "cpu" kernels against float64, on shapes chosen to reach every path.

Each case runs one op of ``normlab.functional`` on the ``"cpu"`` backend (forward, then backward
with a random ``dy``) and the same op of ``torch.nn.functional`` in float64 on the same rounded
inputs. The output and the gradients of the input, weight and bias (and BatchNorm's running
statistics) must be within the 2x-rounding oracle of ``tests/oracle.py``: the relative error
(Frobenius norm, float64) of each result at most twice the error of rounding the float64 result
to the result's dtype. Half-precision results are held to exactly that (the kernels accumulate
in float32, whose errors are far below a bfloat16 or float16 rounding). Float32 and float64
results accumulate in their own dtype, so a floor is added (``_bound``):
``FLOOR_U * u * sqrt(n) * kappa``, with u the unit roundoff, n the number of values summed into
the result (a row's values for y and dx, the rows for dw and db) -- the relative error of a sum
of n terms of mixed signs against its own size grows like sqrt(n) u -- and, for the gradients,
kappa = 1 + |mean| / std of the input: the saved mean is rounded to the accumulation dtype
(u |mean| absolute), and x_hat magnifies that by 1 / std. The output itself keeps kappa = 1: the
shifted two passes centre a row exactly, whatever its mean (a kernel computing E[x^2] - E[x]^2
fails the ``offset`` cases by a factor of hundreds). Measured on x86-64-v4: at most 4.5 (float64
dx) and 2.7 (float32 dx) of ``FLOOR_U = 8``; 62 x kappa = 501 for float32 dw at mean 1000.

The thresholds below decide which path a shape takes; each is written where the kernels define
it, with the value this build uses, and the shapes of ``CASES`` sit on both sides of each one.
Vector lanes depend on the x86-64 level whose kernels run (``extension.cpu_level()``: the best the
CPU runs, or ``NORMLAB_CPU_LEVEL``'s); the shapes are derived from them.

- **Vector lanes** ``L`` (``csrc/numerics/vec.h``): ``NORMLAB_VEC_BYTES`` 64 (x86-64-v4), 32 (v3),
  16 (v1) over the accumulation type: float32 (and the half types) 16 / 8 / 4 lanes, float64
  8 / 4 / 2. Row sums (``numerics/moments.h``: ``shifted_sum``, ``shifted_sqdev``) run two chains of
  ``L``, then one vector, then a scalar tail: rows of ``3``, ``L - 1``, ``L``, ``L + 1``,
  ``2L - 1``, ``2L``, ``2L + 1``, ``3L + 1`` values (rows and groups of one value:
  ``test_a_group_of_one_value_gives_the_bias``).
- **Serial / parallel** (``numerics/chunks.h``): ``kGrainValues = 32768``; ``for_rows`` runs one
  call when ``items <= 32768 / values_per_item``, else ``at::parallel_for``. Cases above it run at
  two threads.
- **LayerNorm / RMSNorm** (``cpu/layer_norm_kernels.cpp``): ``kWidenCols = 512`` (half-precision rows
  longer than this are widened once into a float32 scratch row); ``kWidenRows = 8`` (a
  half-precision weight is widened from 8 rows); ``bwd_rows_per_chunk``: ``max(16, min(ceil(65536 /
  n_cols), ceil(n_rows / 8)))`` rows per dw/db chunk, at most ``n_rows``, enlarged to ``min(256, n_rows / 32)``; one
  chunk writes the sums, more write partials merged in blocks of ``B = 256`` columns.
  ``over_n``: float32 means of rows over ``2**24`` values divide in float64 (not reached: a
  row of 16M values).
- **BatchNorm** (``cpu/batch_norm_kernels.h``, ``Constants``; ``geometry`` in
  ``cpu/batch_norm_kernels.cpp``): planes of ``S >= plane_min = 256`` values (or of
  ``S >= short_plane_min = 32`` when ``S >= 8 N``; half precision with sums: ``S >= mid_plane_min = 128``
  when ``S >= 4 N``) are cut per channel
  into ``P = ceil(N * S / part_values)`` parts (``part_values = 65536``, at most 64), read in
  pieces of ``plane_piece = 4096``; ``P == 1`` finishes a channel in cache. Rows narrower than
  ``fold_below = 64`` values are folded to at most ``fold_width = 256``; ``column_block = 2048``
  columns per task; ``chunk_elems = 65536`` values and at most ``max_chunk_rows = 256`` rows per
  chunk; ``task_elems = 2**19``, at most 64 row groups and ``max_partials = 2**19`` partials;
  a block of whole channels is "local" when ``n_rows * S <= local_elems = 2**18`` (forward;
  ``2**17`` backward) and it reads runs of at least ``min_local_run = 1024`` values; the
  elementwise passes take ``phase1_values = 65536`` values per task.
- **GroupNorm / InstanceNorm** (``cpu/group_norm_kernels.cpp``, ``group_norm_s1_kernels.cpp``,
  ``group_norm_nhwc_kernels.cpp``): ``S == 1`` with ``2 <= Cg <= L`` takes the S1 kernels (``Cg`` a power
  of two: packed; else blocks of transposed groups); the row kernel takes rows of ``Cg * S <= 256``
  values ``kBlock = 8`` at a time, longer rows one at a time; channels-last inputs (and every
  ``S == 1`` backward) take the NHWC kernels, ``nhwc_samples_per_chunk = min(N, ceil(max(16,
  ceil(65536 / C)) / S))`` samples per chunk, dw/db runs of ``kRun = 16`` samples.
- **LayerNorm2d** (``cpu/layer_norm2d_kernels.cpp``, ``block_size``): NCHW pixels in blocks of about
  ``kBlockBytes = 256 KiB`` (runs of at least ``kRunBytes = 1 KiB``, at most ``kMaxBytes = 1 MiB``), at
  least ``kMinBlock = 64`` pixels, a multiple of ``kVecPixels = 16``, halved while there are fewer
  than ``kMinTasks = 16`` tasks; a block's last vector may be partial. Channels-last inputs run on
  LayerNorm's row kernels.

Each case's shape is small enough that the file runs in well under a minute on one core.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import normlab
import normlab.functional as NF
from normlab.ops import extension
from tests.oracle import rel_err, rounding_err

pytestmark = pytest.mark.skipif("cpu" not in normlab.available_backends(), reason="no cpu backend")

HALF = (torch.bfloat16, torch.float16)
ALL = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
WIDE = (torch.float32, torch.bfloat16)  # the large shapes: one full and one half dtype
FLOOR_U = 8
VEC_BYTES = (extension.cpu_level() or {}).get("vec_bytes", 16)
L32, L64 = VEC_BYTES // 4, VEC_BYTES // 8  # lanes of float (and the half types), of double


def _row_lengths(lanes):
    # from 3 values: a row of 1 or 2 has x_hat = 0 or +-1 whatever x, and dx = 0 exactly, which a
    # relative error cannot measure (test_rows_of_one_and_two_values checks them)
    return sorted(n for n in {3, lanes - 1, lanes, lanes + 1, 2 * lanes - 1, 2 * lanes, 2 * lanes + 1, 3 * lanes + 1}
                  if n >= 3)


# --- the references: torch.nn.functional in float64 -----------------------------------------------

def _ln(x, w, b, eps):
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


def _rms(x, w, b, eps):
    return F.rms_norm(x, x.shape[-1:], w, eps)


def _ln2d(x, w, b, eps):
    return F.layer_norm(x.movedim(1, -1), x.shape[1:2], w, b, eps).movedim(-1, 1)


def _in(x, w, b, eps):
    return F.instance_norm(x, weight=w, bias=b, eps=eps)


FAMILIES = {  # name: (normlab's call, the float64 reference, has bias)
    "layer_norm": (lambda x, w, b, eps: NF.layer_norm(x, x.shape[-1:], w, b, eps), _ln, True),
    "rms_norm": (lambda x, w, b, eps: NF.rms_norm(x, x.shape[-1:], w, eps), _rms, False),
    "layer_norm2d": (lambda x, w, b, eps: NF.layer_norm2d(x, w, b, eps), _ln2d, True),
    "instance_norm": (lambda x, w, b, eps: NF.instance_norm(x, weight=w, bias=b, eps=eps), _in, True),
}


def _case(family, shape, dtypes=ALL, layout="contiguous", threads=1, **kw):
    return pytest.param(family, tuple(shape), layout, threads, kw, dtypes,
                        id=f"{family}-{'x'.join(map(str, shape))}-{layout}-t{threads}"
                           + "".join(f"-{k}{v}" for k, v in kw.items()))


def _cases():
    out = []
    # LayerNorm / RMSNorm rows: every lane split of the row sums, float and double lanes
    for n in sorted(set(_row_lengths(L32)) | set(_row_lengths(L64))):
        out += [_case("layer_norm", (5, n)), _case("rms_norm", (5, n))]
    out += [
        _case("layer_norm", (7, 40), HALF), _case("layer_norm", (8, 40), HALF),      # kWidenRows: 7 | 8 rows
        _case("layer_norm", (3, 512), HALF), _case("layer_norm", (3, 513), HALF),    # kWidenCols: 512 | 513
        _case("rms_norm", (3, 513), HALF),
        _case("layer_norm", (16, 4096), WIDE), _case("layer_norm", (17, 4096), WIDE),  # 1 | 2 dw/db chunks (16 rows)
        _case("layer_norm", (257, 257), WIDE),   # an eighth of the rows: 8 chunks of 33; 2 merge blocks of 256 columns
        _case("rms_norm", (300, 257), WIDE),
        _case("layer_norm", (100, 512), WIDE),   # an eighth is 13 rows, raised to 16: 7 chunks
        _case("layer_norm", (128, 512), WIDE), _case("layer_norm", (129, 512), WIDE, threads=2),  # 8 x 16 | 8 x 17
        _case("layer_norm", (544, 1024), WIDE, threads=2),  # 64 rows a chunk (65536 values < an eighth, 68)
        _case("layer_norm", (2112, 1024), (torch.float32,), threads=2),  # enlarged to 2112 / 32 = 66 rows
        _case("layer_norm", (512, 64), WIDE), _case("layer_norm", (513, 64), WIDE, threads=2),  # grain: 512 rows
        _case("layer_norm", (4, 6, 33), ALL, layout="transposed"),                    # a copy first
        # rows shorter than two vectors in blocks of 16 rows (one row a lane: n < L; one vector and a
        # tail worked 16 rows together: L <= n < 2L), with rows left over for the row path
        *[_case(f, (37, n), WIDE) for f in ("layer_norm", "rms_norm") for n in (3, L32 - 1, L32, L32 + 1, 2 * L32 - 1)],
        _case("layer_norm", (6, 100), (torch.float32,), offset=1000.0),               # the shifted two passes
        _case("add_layer_norm", (5, 2 * L32 + 1)), _case("add_rms_norm", (5, 3 * L32 + 1)),
        _case("add_layer_norm", (300, 257), WIDE, threads=2),
    ]
    # BatchNorm: (N, C, S) views
    out += [
        _case("batch_norm", (5, 3)),                                  # folded 2-D (rows of 3 < fold_below)
        _case("batch_norm", (600, 300), WIDE),                        # rows of 300: not folded
        _case("batch_norm", (600, 63), WIDE), _case("batch_norm", (600, 64), WIDE),  # fold_below: 63 | 64
        _case("batch_norm", (300, 2500), WIDE),                       # 2 column blocks, chunks of 52 rows
        _case("batch_norm", (6, 5, 7)), _case("batch_norm", (6, 5, 2 * L32 + 1)),  # lane tails within a plane
        _case("batch_norm", (40, 64, 150), WIDE),                     # local, row sums (S < plane_min, S < 4 N)
        _case("batch_norm", (32, 8, 127), WIDE), _case("batch_norm", (32, 8, 128), WIDE),  # mid_plane_min, S >= 4 N: rows | planes
        _case("batch_norm", (33, 8, 128), WIDE),                      # S < 4 N: rows
        _case("batch_norm", (4, 8, 32), WIDE), _case("batch_norm", (5, 8, 32), WIDE),  # S >= 8 N: planes | rows
        _case("batch_norm", (2, 8, 31), WIDE),                        # S < short_plane_min 32: rows
        _case("batch_norm", (4, 8, 255), WIDE), _case("batch_norm", (4, 8, 256), WIDE),  # plane_min: 255 | 256
        _case("batch_norm", (2, 4, 4096), WIDE), _case("batch_norm", (2, 4, 4097), WIDE),  # plane_piece 4096
        _case("batch_norm", (16, 2, 4096), WIDE), _case("batch_norm", (16, 2, 4097), WIDE),  # P: 1 | 2 parts
        _case("batch_norm", (3, 2, 300000), WIDE, threads=2),        # P = 14 parts cutting planes
        _case("batch_norm", (128, 3, 1024), WIDE),                    # local forward and backward
        _case("batch_norm", (129, 3, 1024), WIDE),                    # local forward, not backward (2**17)
        _case("batch_norm", (257, 3, 1024), WIDE, threads=2),         # local in neither (2**18)
        _case("batch_norm", (4, 16, 8, 8), ALL, layout="channels_last"),
        _case("batch_norm", (2, 2500, 3, 3), WIDE, layout="channels_last", threads=2),
        _case("batch_norm", (6, 5, 7), (torch.float32,), train=False),  # evaluation: the running statistics
        _case("batch_norm", (4, 16, 8, 8), (torch.float32,), layout="channels_last", train=False),
        _case("batch_norm", (8, 5, 100), (torch.float32,), offset=1000.0),
    ]
    # GroupNorm and InstanceNorm
    out += [
        # (Cg = 2, float64's lanes at v1: the next case, without dx)
        *[_case("group_norm", (9, 6 * cg), groups=6) for cg in sorted({3, 4, 5, 8, L64, L32, L32 + 1} - {2})],
        _case("group_norm", (9, 12), groups=6, skip="dx"),           # Cg = 2: x_hat = +-1, dx = 0 exactly
        _case("group_norm", (4, 8, 32), groups=2),                    # Cg * S = 128: rows 8 at a time
        _case("group_norm", (4, 8, 64), groups=2),                    # 256
        _case("group_norm", (4, 8, 65), groups=2),                    # 260: one row at a time
        _case("group_norm", (3, 4, 2 * L32 + 1), groups=4),           # Cg = 1: rows of S values
        _case("group_norm", (16, 64, 4, 4), WIDE, layout="channels_last", groups=8),  # one chunk, one run
        _case("group_norm", (17, 64, 4, 4), WIDE, layout="channels_last", groups=8),  # two dw/db runs
        _case("group_norm", (65, 64, 4, 4), WIDE, layout="channels_last", groups=8, threads=2),  # 64 | 65 samples
        _case("group_norm", (1024, 64), WIDE, groups=16), _case("group_norm", (1025, 64), WIDE, groups=16),  # S == 1
        _case("group_norm", (40, 32, 30, 30), WIDE, groups=4, threads=2),
        _case("group_norm", (4, 6, 100), (torch.float32,), groups=3, offset=1000.0),
        _case("instance_norm", (3, 4, 2 * L32 + 1)), _case("instance_norm", (2, 3, 6, 6), ALL, layout="channels_last"),
    ]
    # LayerNorm2d
    out += [
        _case("layer_norm2d", (2, 3, 5, 5)),                          # one block, partial vectors
        _case("layer_norm2d", (1, 4, 32, 32), WIDE),                  # 16 blocks of 64 pixels
        _case("layer_norm2d", (1, 4, 33, 31), WIDE),                  # the last block's last vector partial
        _case("layer_norm2d", (8, 96, 28, 28), WIDE, threads=2),      # blocks of 672 pixels, parallel
        _case("layer_norm2d", (2, 3, 5, 5), ALL, layout="channels_last"),
        _case("layer_norm2d", (4, 2 * L32 + 1, 6, 6), WIDE, layout="channels_last"),
    ]
    return out


def _data(shape, dtype, layout, offset, seed):
    g = torch.Generator().manual_seed(seed)
    if layout == "transposed":
        x = torch.randn(shape[:-2] + (shape[-1], shape[-2]), generator=g, dtype=torch.float64).transpose(-1, -2)
    else:
        x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = (x * 2 + 0.5 + offset).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if layout == "channels_last":
        x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
    return x, dy, g


def _param_shape(family, shape):
    return shape[-1:] if family in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm") else shape[1:2]


def _terms(family, shape, kw, name):
    """How many values are summed into each entry of result ``name``."""
    n, s = shape[0], math.prod(shape[2:]) if len(shape) > 2 else 1
    per_row = name in ("y", "dx")
    if family in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"):
        return shape[-1] if per_row else math.prod(shape[:-1])
    if family == "layer_norm2d":
        return shape[1] if per_row else n * s
    if family == "group_norm":
        return shape[1] // kw["groups"] * s if per_row else n * s
    if family == "instance_norm":
        return s if per_row else n * s
    return n * s  # batch_norm


def _bound(ref, dtype, terms, kappa):
    """The oracle's 2x rounding error of ``ref`` in ``dtype``, plus the float32 / float64 floor."""
    bound = 2.0 * rounding_err(ref, dtype)
    if dtype not in HALF:
        bound += FLOOR_U * torch.finfo(dtype).eps / 2 * math.sqrt(terms) * kappa
    return bound


def _assert_within(got, ref, bound, what):
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert torch.isfinite(got).all(), what
    err = rel_err(got, ref)
    assert err <= bound, f"{what}: relative error {err:.3e} > bound {bound:.3e} ({got.dtype})"


def _run(family, shape, layout, kw, dtype, seed=0):
    offset, train, groups = kw.get("offset", 0.0), kw.get("train", True), kw.get("groups")
    eps = 1e-5
    x, dy, g = _data(shape, dtype, layout, offset, seed)
    pshape = _param_shape(family, shape)
    w = (1 + 0.5 * torch.randn(pshape, generator=g, dtype=torch.float64)).to(dtype)
    b = (0.5 * torch.randn(pshape, generator=g, dtype=torch.float64)).to(dtype)
    res = (torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype) if family.startswith("add_") else None
    has_b = family not in ("rms_norm", "add_rms_norm")
    buffers = None
    if family == "batch_norm":
        bdt = torch.float32 if dtype in HALF else dtype
        buffers = (torch.randn(shape[1], generator=g, dtype=torch.float64).to(bdt),
                   (torch.rand(shape[1], generator=g, dtype=torch.float64) + 0.5).to(bdt))

    def ours(xl, wl, bl):
        if family == "batch_norm":
            return NF.batch_norm(xl, buffers[0], buffers[1], wl, bl, training=train, momentum=0.1, eps=eps)
        if family == "group_norm":
            return NF.group_norm(xl, groups, wl, bl, eps)
        if family == "add_layer_norm":
            return NF.add_layer_norm(xl, res, xl.shape[-1:], wl, bl, eps)[0]
        if family == "add_rms_norm":
            return NF.add_rms_norm(xl, res, xl.shape[-1:], wl, eps)[0]
        return FAMILIES[family][0](xl, wl, bl, eps)

    def reference(xl, wl, bl):
        if family == "batch_norm":
            rm, rv = (t.double() for t in buffers_before)
            y = F.batch_norm(xl, rm, rv, wl, bl, training=train, momentum=0.1, eps=eps)
            return y, (rm, rv)
        if family == "group_norm":
            return F.group_norm(xl, groups, wl, bl, eps), None
        if family in ("add_layer_norm", "add_rms_norm"):  # h = x + residual, rounded as torch.add rounds it
            h = xl + (torch.add(x, res).double() - x.double())
            fn = _ln if family == "add_layer_norm" else _rms
            return fn(h, wl, bl, eps), None
        return FAMILIES[family][1](xl, wl, bl, eps), None

    buffers_before = tuple(t.clone() for t in buffers) if buffers else None
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    with normlab.use_backend("cpu"):
        y = ours(leaves[0], leaves[1], leaves[2] if has_b else None)
        y.backward(dy)
    got = {"y": y.detach(), "dx": leaves[0].grad, "dw": leaves[1].grad}
    if has_b:
        got["db"] = leaves[2].grad

    refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y64, buf64 = reference(refs[0], refs[1], refs[2] if has_b else None)
    y64.backward(dy.double())
    want = {"y": y64.detach(), "dx": refs[0].grad, "dw": refs[1].grad}
    if has_b:
        want["db"] = refs[2].grad
    if buffers is not None and train:
        got["running_mean"], got["running_var"] = buffers
        want["running_mean"], want["running_var"] = buf64
    return got, want


@pytest.mark.parametrize("family, shape, layout, threads, kw, dtypes", _cases())
def test_outputs_and_gradients_within_twice_rounding_of_float64(family, shape, layout, threads, kw, dtypes):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype in dtypes:
            got, want = _run(family, shape, layout, kw, dtype)
            assert got.keys() == want.keys()
            kappa = 1 + abs(0.5 + kw.get("offset", 0.0)) / 2  # the inputs: 2 * randn + 0.5 + offset
            for name in got:
                if name == kw.get("skip"):
                    continue
                k = 1.0 if name in ("y", "running_mean", "running_var") else kappa
                bound = _bound(want[name], got[name].dtype, _terms(family, shape, kw, name), k)
                _assert_within(got[name], want[name], bound, f"{family} {shape} {layout} {dtype} {name}")
            if layout == "channels_last":  # the output's memory format is torch's
                cl = torch.channels_last
                assert got["y"].is_contiguous(memory_format=cl) == want["y"].is_contiguous(memory_format=cl)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("family", ["layer_norm", "group_norm"])
def test_a_group_of_one_value_gives_the_bias(family, dtype):
    """Rows (LayerNorm) or groups (GroupNorm, S == 1) of one value, which the relative oracle above
    cannot measure (x_hat = 0: dx and dw are zero in exact arithmetic). The exact answer is known
    by hand: x - shift = 0 exactly (the shift is the value itself), so y = b exactly and dw = 0;
    LayerNorm's dx = rstd * (g - mean(g)) = 0 exactly; GroupNorm's dx (three terms, each rounded)
    within FLOOR_U unit roundoffs of the size of its first term, rstd |dy w| (rstd = 1 / sqrt(eps));
    db = sum(dy) within the main test's bound. (y is checked against b itself, not against torch in
    float64: torch's float64 GroupNorm gives b + ~300 u here.)"""
    shape = (5, 1) if family == "layer_norm" else (9, 6)
    got, want = _run(family, shape, "contiguous", {"groups": 6}, dtype)
    _, _, g = _data(shape, dtype, "contiguous", 0.0, 0)  # _run's draws, in its order
    w = (1 + 0.5 * torch.randn(shape[1:2], generator=g, dtype=torch.float64)).to(dtype)
    b = (0.5 * torch.randn(shape[1:2], generator=g, dtype=torch.float64)).to(dtype)
    assert torch.equal(got["y"], b.expand(shape)), "y is the bias"
    assert torch.equal(got["dw"], torch.zeros_like(got["dw"]))
    if family == "layer_norm":
        assert torch.equal(got["dx"], torch.zeros_like(got["dx"]))
    else:
        dy = _data(shape, dtype, "contiguous", 0.0, 0)[1]
        term1 = dy.double().abs() * w.double().abs() / math.sqrt(1e-5)
        u = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps / 2
        assert (got["dx"].double().abs() <= FLOOR_U * u * term1 * (1 + torch.finfo(dtype).eps)).all()
    _assert_within(got["db"], want["db"], _bound(want["db"], dtype, shape[0], 1.0), f"{family} {dtype} db")
