"""The fused norm+act kernels along every path of the norm kernels they ride on (csrc/cpu/norm_act.cpp):
GroupNorm's row kernels (short, scratch and long group rows, S == 1 packed and not) and NHWC
kernels (whole samples and chunked) with the activation inside their output pass; BatchNorm's and
GroupNorm's backwards reading dz = dy * act'(z) from dx's own buffer and writing dx over it.

Oracles: normlab's unfused path (the norm's own op, then torch's activation) -- the same bits for
the piecewise-linear activations, whose result torch computes exactly from the norm's rounded
output; the float64 reference for the others (tests/oracle.assert_accurate_vs_unfused); and, for
the backward's in-place dz, the identity activation, where dz = dy * 1 = dy exactly, so the fused
gradients must be the norm's own gradients, bit for bit, on every kernel path."""

from __future__ import annotations

import math

import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.ops import activation as A
from tests.oracle import assert_accurate_vs_unfused, ops_dispatched

HAS_FUSED = "cpu" in normlab.available_backends()  # (the fused ops come with the C++ extension)

pytestmark = pytest.mark.skipif(not HAS_FUSED, reason="the fused C++ ops are not built")

EXACT = ("identity", "relu", "leaky_relu", "hardswish")
SMOOTH = ("silu", "gelu", "gelu_tanh", "tanh")
CL = torch.channels_last

# (shape, groups, memory format): the GroupNorm kernel path each reaches
GN_PATHS = {
    "rows short (Cg*S <= 256)": ((3, 16, 5, 7), 4, None),
    "rows in scratch (256 < Cg*S <= 16384)": ((2, 32, 24, 20), 8, None),
    "rows long (Cg*S > 16384)": ((2, 4, 96, 100), 2, None),
    "S == 1, groups packed in a vector": ((37, 16), 8, None),
    "S == 1, wide groups": ((9, 96), 2, None),
    "NHWC, whole samples a task": ((16, 24, 6, 5), 6, CL),
    "NHWC, chunks of a sample": ((1, 32, 70, 66), 4, CL),
    "NHWC, short rows of the view": ((2, 3, 9, 11), 3, CL),
}


def _x(shape, dtype, seed=0, fmt=None):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.3).to(dtype)
    return t.contiguous(memory_format=fmt) if fmt is not None else t


def _params(c, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    b = (torch.randn(c, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    return w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("path", list(GN_PATHS))
def test_group_norm_act_forward_on_every_kernel_path(path, dtype):
    shape, g, fmt = GN_PATHS[path]
    x = _x(shape, dtype, fmt=fmt)
    w, b = _params(shape[1], dtype)
    z = NF.group_norm(x, g, w, b, 1e-5)
    for act in EXACT:
        y = NF.group_norm_act(x, g, w, b, 1e-5, act, 0.2)
        assert y.is_contiguous(memory_format=fmt or torch.contiguous_format), (path, act)
        assert torch.equal(y, A.act_forward(z, A.ID[act], 0.2)), (path, act)
    with normlab.use_backend("ref"):
        z64 = NF.group_norm(x.double(), g, w.double(), b.double(), 1e-5)
    for act in SMOOTH:
        y = NF.group_norm_act(x, g, w, b, 1e-5, act)
        assert_accurate_vs_unfused(y, A.act_forward(z, A.ID[act]), A.act_forward(z64, A.ID[act]), f"{path} {act}")


def _grads(fn, x, w, b, dy):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = fn(x, w, b)
    return (y, *torch.autograd.grad(y, (x, w, b), dy))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", list(GN_PATHS))
def test_group_norm_act_backward_in_place_dz_is_group_norms_backward(path, dtype):
    """identity: dz = dy exactly, so the gradients are GroupNorm's own bits (dz read and dx written
    in one buffer on every path of GroupNorm's backward)."""
    shape, g, fmt = GN_PATHS[path]
    x, dy = _x(shape, dtype, fmt=fmt), _x(shape, dtype, seed=3, fmt=fmt)
    w, b = _params(shape[1], dtype)
    fused = _grads(lambda x, w, b: NF.group_norm_act(x, g, w, b, 1e-5, "identity"), x, w, b, dy)
    plain = _grads(lambda x, w, b: NF.group_norm(x, g, w, b, 1e-5), x, w, b, dy)
    for i, (u, v) in enumerate(zip(fused, plain)):
        assert torch.equal(u, v), (path, i)


# BatchNorm: (shape, memory format): planes in one part per channel (local), planes in several
# parts (a task a part; a task a channel, its parts in order: at least 4 channels a thread), short
# planes (the rows view), channels-last rows, (N, C)
BN_PATHS = {
    "planes, local": ((4, 8, 32, 32), None),
    "planes, parts": ((2, 3, 200, 200), None),
    "planes, a task a channel": ((2, 8, 200, 200), None),
    "short planes": ((6, 16, 5, 7), None),
    "channels_last rows": ((4, 24, 9, 10), CL),
    "(N, C)": ((300, 20), None),
}


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", list(BN_PATHS))
def test_batch_norm_act_backward_in_place_dz_is_batch_norms_backward(path, dtype, training):
    shape, fmt = BN_PATHS[path]
    x, dy = _x(shape, dtype, fmt=fmt), _x(shape, dtype, seed=3, fmt=fmt)
    c = shape[1]
    w, b = _params(c, torch.float32)
    rm, rv = torch.randn(c) * 0.1, torch.rand(c) + 0.5

    def fused(x, w, b):
        return NF.batch_norm_act(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5, "identity")

    def plain(x, w, b):
        return NF.batch_norm(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5)

    for i, (u, v) in enumerate(zip(_grads(fused, x, w, b, dy), _grads(plain, x, w, b, dy))):
        assert torch.equal(u, v), (path, i)


@pytest.mark.parametrize("mode", ["train", "eval", "eval, affine frozen"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", list(BN_PATHS))
def test_batch_norm_act_relu_backward_is_the_unfused_bits(path, dtype, mode):
    """relu's dz (dy where z > 0, +0 where not: exact) written inside BatchNorm's backward -- on the
    planes view a run at a time by the task that sums it, elsewhere in a pass first -- gives the bits
    of torch's relu backward followed by BatchNorm's: in training, in evaluation (dx in the sums
    pass), and in evaluation with the affine frozen (dx alone: no sums pass, dz in the dx pass)."""
    shape, fmt = BN_PATHS[path]
    x, dy = _x(shape, dtype, fmt=fmt), _x(shape, dtype, seed=3, fmt=fmt)
    c = shape[1]
    w, b = _params(c, torch.float32)
    g = torch.Generator().manual_seed(5)
    rm, rv = torch.randn(c, generator=g) * 0.1, torch.rand(c, generator=g) + 0.5
    training = mode == "train"

    def grads(norm):
        leaves = [x.detach().clone().requires_grad_()]
        leaves += [t.detach().clone().requires_grad_(mode != "eval, affine frozen") for t in (w, b)]
        y = norm(*leaves)
        return (y, *torch.autograd.grad(y, [t for t in leaves if t.requires_grad], dy))

    got = grads(lambda x, w, b: NF.batch_norm_act(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5, "relu"))
    want = grads(lambda x, w, b: torch.relu(NF.batch_norm(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5)))
    assert (got[0] == 0).any() and (got[0] > 0).any()
    assert len(got) == (2 if mode == "eval, affine frozen" else 4)
    for i, (u, v) in enumerate(zip(got, want)):
        assert torch.equal(u, v), (path, mode, i)


# (N, side, channels_last): planes of 576 values (the planes view), its channels_last rows, and
# planes of 16 values (the rows view of short planes), 1152 values a channel each; and 841
# channels_last rows of 4, which no fold near 64 divides (13 x 64 folded, the last 9 unfolded)
RELU_MASK_VIEWS = {"planes": (2, 24, False), "channels_last rows": (2, 24, True), "short planes": (72, 4, False),
                   "channels_last rows, fold tail": (1, 29, True)}


@pytest.mark.parametrize("zero_weight", [False, True])
@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("view", list(RELU_MASK_VIEWS))
def test_batch_norm_act_relu_mask_at_its_boundary(view, dtype, frozen, zero_weight):
    """BatchNorm's backward reads relu's mask as "x <= t" (or "x >= t" where the scale is negative)
    for one t a channel, found by a search over the dtype's values, in place of z = (x - h) * a + b
    <= 0 (rows: "x * sign <= t" a column). Every value of x from 300 steps below to 300 steps above
    where z crosses 0, channels of positive and negative weight and, zero_weight, one of zero weight
    (planes: z itself for that channel; rows: dz written first for the call), NaN and infinite x:
    the bits of torch's relu backward followed by BatchNorm's, in evaluation (dx in the sums pass;
    and, affine frozen, dx alone)."""
    n, side, cl = RELU_MASK_VIEWS[view]
    c, s = 4, side * side
    rm = torch.tensor([0.37, -1.3, 0.2, 5.1], dtype=torch.float64)
    rv = torch.tensor([0.8, 2.5, 1.0, 0.3], dtype=torch.float64)
    w = torch.tensor([1.3, -0.7, 0.0 if zero_weight else 0.9, 2.1], dtype=torch.float64)
    b = torch.tensor([0.41, -0.23, 0.5, -1.7], dtype=torch.float64)
    # where z = (x - rm) * w / sqrt(rv + eps) + b is 0, then the n * s representable values of the
    # dtype stepping up from 300 below it (the 1/2 * ... for the channel of zero weight: any x)
    x = torch.empty(n, c, s, dtype=torch.float64)
    for ch in range(c):
        root = rm[ch] - b[ch] * math.sqrt(rv[ch] + 1e-5) / w[ch] if w[ch] != 0 else 0.5  # (0.5: any x)
        v = torch.tensor([root], dtype=dtype)
        for _ in range(300):
            v = torch.nextafter(v, torch.tensor([-math.inf], dtype=dtype))
        vals = [v.clone()]
        for _ in range(n * s - 1):
            v = torch.nextafter(v, torch.tensor([math.inf], dtype=dtype))
            vals.append(v.clone())
        x[:, ch] = torch.cat(vals).double().reshape(n, s)
    x = x.to(dtype)
    x[0, 0, 5], x[n - 1, 1, 7], x[0, 3, 11], x[n - 1, 3, 13] = math.nan, math.nan, math.inf, -math.inf
    x = x.reshape(n, c, side, side)
    dy = _x(x.shape, dtype, seed=3)
    if cl:
        x, dy = x.contiguous(memory_format=CL), dy.contiguous(memory_format=CL)
    p = [t.to(dtype) for t in (rm, rv, w, b)]

    def grads(norm):
        leaves = [x.clone().requires_grad_()] + [t.clone().requires_grad_(not frozen) for t in p[2:]]
        y = norm(*leaves)
        return (y, *torch.autograd.grad(y, [t for t in leaves if t.requires_grad], dy))

    got = grads(lambda x, w, b: NF.batch_norm_act(x, p[0].clone(), p[1].clone(), w, b, False, 0.1, 1e-5, "relu"))
    want = grads(lambda x, w, b: torch.relu(NF.batch_norm(x, p[0].clone(), p[1].clone(), w, b, False, 0.1, 1e-5)))
    for ch in (0, 1, 3) if zero_weight else range(c):  # the crossing is inside each channel's values
        assert (got[0][:, ch] == 0).sum() > 100 and (got[0][:, ch] > 0).sum() > 100, ch
    for i, (u, v) in enumerate(zip(got, want)):  # (a NaN's payload is not a result: NaN where NaN)
        bits = torch.int64 if u.dtype == torch.float64 else torch.int32 if u.dtype == torch.float32 else torch.int16
        nan = u.isnan()
        assert torch.equal(nan, v.isnan()), (dtype, frozen, i)
        assert torch.equal(u.view(bits)[~nan], v.view(bits)[~nan]), (dtype, frozen, i)


@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_group_norm_act_relu_mask_at_its_boundary(dtype, nan, layout):
    """GroupNorm's backward (NCHW group rows of at least 512 values a channel; channels_last: the
    NHWC kernel, its columns of 4 channels tiled to whole vectors) reads relu's mask as
    "x * sign <= t" a sample and channel in place of z = (x - mean) * (rstd * w) + b <= 0. Oracle:
    that z computed here in the accumulation dtype, op by op, dz = dy where z > 0 (or NaN) and +0
    elsewhere, and GroupNorm's own backward over dz -- bit for bit. Channels 1 and 3 (groups of
    two) step through 576 consecutive values of the dtype across z's zero, one group of negative
    weight; nan: a NaN in the input, whose group's statistics are NaN (no bound: dz written first)."""
    ops = torch.ops.normlab
    n, c, g, side = 2, 4, 2, 24
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    w = torch.tensor([0.8, 1.3, -0.6, -1.1], dtype=dtype)
    b = torch.tensor([0.2, 0.41, -0.3, 0.25], dtype=dtype)
    x = _x((n, c, side, side), torch.float64).reshape(n, c, -1)

    def consts(mean, rstd):  # nact's z constants a (sample, channel), each rounded once to acc
        m = mean.reshape(n, g, 1).expand(n, g, c // g).reshape(n, c, 1).to(acc)
        r = rstd.reshape(n, g, 1).expand(n, g, c // g).reshape(n, c, 1).double()
        return m, (r * w.double().reshape(1, c, 1)).to(acc), b.double().reshape(1, c, 1).to(acc)

    bits_of = {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)
    top = torch.iinfo(bits_of).min  # the sign bit

    def around(root):  # 576 consecutive values of dtype from 300 below root, in order
        k = root.view(bits_of).long()
        k = torch.where(k >= 0, k, -(k - top) - 1) - 300 + torch.arange(side * side)  # ordered keys
        return torch.where(k >= 0, k, (-k - 1) + top).to(bits_of).view(dtype).double()

    for _ in range(100):  # the boundary channels' values around z's zero and the statistics they give
        _, mean, rstd = ops.group_norm_act_fwd(x.to(dtype).reshape(n, c, side, side), w, b, g, 1e-5, 1, 0.0)
        m, a, b2 = consts(mean, rstd)
        for i in range(n):
            for ch in (1, 3):
                x[i, ch] = around(torch.tensor([m[i, ch, 0].item() - b2[0, ch, 0].item() / a[i, ch, 0].item()],
                                               dtype=dtype))
    x = x.to(dtype)
    if nan:
        x[1, 0, 3] = math.nan
    x = x.reshape(n, c, side, side)
    dy = _x(x.shape, dtype, seed=3)
    fmt = CL if layout == "channels_last" else torch.contiguous_format
    x, dy = x.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt)
    y, mean, rstd = ops.group_norm_act_fwd(x, w, b, g, 1e-5, 1, 0.0)
    got = ops.group_norm_act_bwd(dy, x, w, b, mean, rstd, g, 1, 0.0, True)
    m, a, b2 = consts(mean, rstd)
    z = (x.reshape(n, c, -1).to(acc) - m) * a + b2
    dz = torch.where(z <= 0, torch.zeros_like(dy.reshape(n, c, -1)), dy.reshape(n, c, -1)).reshape(x.shape)
    want = ops.group_norm_bwd(dz.contiguous(memory_format=fmt), x, w, mean, rstd, g, True)  # (the same kernel)
    for i, ch in [(0, 1), (0, 3), (1, 3)] + ([] if nan else [(1, 1)]):  # z crosses 0 inside (but NaN's group)
        assert (z[i, ch] <= 0).sum() > 100 and (z[i, ch] > 0).sum() > 100, (i, ch)
    for i, (u, v) in enumerate(zip(got, want)):  # (a NaN's payload is not a result: NaN where NaN)
        bits = torch.int64 if u.dtype == torch.float64 else torch.int32 if u.dtype == torch.float32 else torch.int16
        isnan = u.isnan()
        assert torch.equal(isnan, v.isnan()), (dtype, nan, i)
        assert torch.equal(u.view(bits)[~isnan], v.view(bits)[~isnan]), (dtype, nan, i)


@pytest.mark.parametrize("act", ["relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("path", ["planes, parts", "planes, a task a channel", "channels_last rows"])
def test_batch_norm_act_gradients_with_an_activation(path, act):
    """The in-place dz with a real activation: gradients within the rule of the float64 reference."""
    shape, fmt = BN_PATHS[path]
    x, dy = _x(shape, torch.float32, fmt=fmt), _x(shape, torch.float32, seed=3, fmt=fmt)
    w, b = _params(shape[1], torch.float32)

    def run(x, w, b):
        return NF.batch_norm_act(x, None, None, w, b, True, 0.1, 1e-5, act)

    got = _grads(run, x, w, b, dy)
    with normlab.use_backend("ref"):
        ref = _grads(run, x.double(), w.double(), b.double(), dy.double())
        unfused = _grads(lambda x, w, b: A.act_forward(NF.batch_norm(x, None, None, w, b, True, 0.1, 1e-5),
                                                       A.ID[act]), x, w, b, dy)
    for i, (u, r, t) in enumerate(zip(got, ref, unfused)):
        assert_accurate_vs_unfused(u, t, r, f"{path} {act} {i}")


# LayerNormAct over rows: (shape, normalized_shape): rows shorter than 16 values, 16-31, 32-127 (the
# row kernel's 16-row blocks), long rows, a multi-dim normalized_shape, rows past a block's 1024
LN_CASES = {
    "rows of 7": ((37, 7), (7,)),
    "rows of 24": ((50, 24), (24,)),
    "rows of 72": ((3, 17, 72), (72,)),
    "rows of 1000": ((9, 1000), (1000,)),
    "(6, 5) rows": ((2, 11, 6, 5), (6, 5)),
    "many short rows": ((2100, 8), (8,)),
}
LN_AFFINE = {"weight and bias": (True, True), "weight alone": (True, False), "none": (False, False)}


def _ln_params(shape, dtype, affine):
    w, b = _params(math.prod(shape), dtype)
    return (w.reshape(shape) if affine[0] else None), (b.reshape(shape) if affine[1] else None)


@pytest.mark.parametrize("affine", list(LN_AFFINE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("case", list(LN_CASES))
def test_layer_norm_act_forward_is_the_unfused_path(case, dtype, affine):
    shape, ns = LN_CASES[case]
    x = _x(shape, dtype)
    w, b = _ln_params(ns, dtype, LN_AFFINE[affine])
    ops, err = ops_dispatched(lambda: NF.layer_norm_act(x, ns, w, b, 1e-5, "relu"))
    assert err is None and "normlab.layer_norm_act_fwd.default" in ops, ops
    z = NF.layer_norm(x, ns, w, b, 1e-5)
    for act in EXACT:
        y = NF.layer_norm_act(x, ns, w, b, 1e-5, act, 0.2)
        assert torch.equal(y, A.act_forward(z, A.ID[act], 0.2)), (case, act)
    with normlab.use_backend("ref"):
        z64 = NF.layer_norm(x.double(), ns, None if w is None else w.double(), None if b is None else b.double(),
                            1e-5)
    for act in SMOOTH:
        y = NF.layer_norm_act(x, ns, w, b, 1e-5, act)
        assert_accurate_vs_unfused(y, A.act_forward(z, A.ID[act]), A.act_forward(z64, A.ID[act]), f"{case} {act}")


def _grads_of(fn, tensors, dy):
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in tensors]
    y = fn(*leaves)
    wrt = [t for t in leaves if t is not None]
    return (y, *torch.autograd.grad(y, wrt, dy))


@pytest.mark.parametrize("affine", list(LN_AFFINE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(LN_CASES))
def test_layer_norm_act_backward_in_place_dz_is_layer_norms_backward(case, dtype, affine):
    shape, ns = LN_CASES[case]
    x, dy = _x(shape, dtype), _x(shape, dtype, seed=3)
    w, b = _ln_params(ns, dtype, LN_AFFINE[affine])
    fused = _grads_of(lambda x, w, b: NF.layer_norm_act(x, ns, w, b, 1e-5, "identity"), (x, w, b), dy)
    plain = _grads_of(lambda x, w, b: NF.layer_norm(x, ns, w, b, 1e-5), (x, w, b), dy)
    for i, (u, v) in enumerate(zip(fused, plain)):
        assert u.dtype == v.dtype and torch.equal(u, v), (case, i)


@pytest.mark.parametrize("act", ["relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("case", ["rows of 24", "rows of 1000"])
def test_layer_norm_act_gradients_with_an_activation(case, act):
    shape, ns = LN_CASES[case]
    x, dy = _x(shape, torch.float32), _x(shape, torch.float32, seed=3)
    w, b = _ln_params(ns, torch.float32, (True, True))
    got = _grads_of(lambda x, w, b: NF.layer_norm_act(x, ns, w, b, 1e-5, act), (x, w, b), dy)
    with normlab.use_backend("ref"):
        ref = _grads_of(lambda x, w, b: NF.layer_norm_act(x, ns, w, b, 1e-5, act), (x.double(), w.double(),
                                                                                    b.double()), dy.double())
        unfused = _grads_of(lambda x, w, b: A.act_forward(NF.layer_norm(x, ns, w, b, 1e-5), A.ID[act]), (x, w, b), dy)
    for i, (u, r, t) in enumerate(zip(got, ref, unfused)):
        assert_accurate_vs_unfused(u, t, r, f"{case} {act} {i}")


def _exact_acts_are_the_unfused_bits(x, w, b, op, fmt):
    """LayerNormAct2d runs the fused op ``op``, and for the piecewise-linear activations its output
    (in memory format ``fmt``, x's dtype) has the bits of LayerNorm2d then torch's activation.
    Returns LayerNorm2d's output."""
    ops, err = ops_dispatched(lambda: NF.layer_norm_act2d(x, w, b, 1e-6, "relu"))
    assert err is None and f"normlab.{op}.default" in ops, ops
    z = NF.layer_norm2d(x, w, b, 1e-6)
    for act in EXACT:
        y = NF.layer_norm_act2d(x, w, b, 1e-6, act, 0.2)
        assert y.is_contiguous(memory_format=fmt) and y.dtype == x.dtype, act
        assert torch.equal(y, A.act_forward(z, A.ID[act], 0.2)), act
    return z


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 24, 9, 10), (3, 7, 5, 4), (4, 16, 1, 1)])
def test_layer_norm_act2d_channels_last_fused(shape, dtype):
    x = _x(shape, dtype, fmt=CL)
    dy = _x(shape, dtype, seed=3, fmt=CL)
    w, b = _params(shape[1], dtype)
    _exact_acts_are_the_unfused_bits(x, w, b, "layer_norm_act_fwd", CL)
    fused = _grads_of(lambda x, w, b: NF.layer_norm_act2d(x, w, b, 1e-6, "identity"), (x, w, b), dy)
    plain = _grads_of(lambda x, w, b: NF.layer_norm2d(x, w, b, 1e-6), (x, w, b), dy)
    for i, (u, v) in enumerate(zip(fused, plain)):
        assert torch.equal(u, v), i


# NCHW LayerNormAct2d: LayerNorm2d's NCHW kernels with the activation in their passes. Shapes: one
# pixel block and several, a last vector of 1..15 pixels, C = 1, 3, 24, 96.
LN2D_NCHW = [(2, 24, 9, 10), (3, 7, 5, 4), (2, 96, 17, 19), (1, 3, 40, 41), (2, 1, 6, 7), (4, 16, 1, 3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shape", LN2D_NCHW)
def test_layer_norm_act2d_nchw_forward_is_the_unfused_path(shape, dtype):
    """The piecewise-linear activations: the bits of LayerNorm2d's own NCHW output, then torch's
    activation; the smooth ones: the accuracy rule against the float64 reference."""
    x = _x(shape, dtype)
    w, b = _params(shape[1], dtype)
    z = _exact_acts_are_the_unfused_bits(x, w, b, "layer_norm_act2d_fwd", torch.contiguous_format)
    with normlab.use_backend("ref"):
        z64 = NF.layer_norm2d(x.double(), w.double(), b.double(), 1e-6)
    for act in SMOOTH:
        y = NF.layer_norm_act2d(x, w, b, 1e-6, act)
        assert_accurate_vs_unfused(y, A.act_forward(z, A.ID[act]), A.act_forward(z64, A.ID[act]), f"{shape} {act}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [s for s in LN2D_NCHW if s[1] > 1])  # (C = 1: x_hat = 0, dw's reference is 0)
def test_layer_norm_act2d_nchw_backward(shape, dtype):
    """identity: LayerNorm2d's own gradients bit for bit (dz = dy exactly); relu, silu, gelu_tanh:
    the accuracy rule against the float64 reference path, torch's unfused gradients the yardstick."""
    x, dy = _x(shape, dtype), _x(shape, dtype, seed=3)
    w, b = _params(shape[1], dtype)
    fused = _grads_of(lambda x, w, b: NF.layer_norm_act2d(x, w, b, 1e-6, "identity"), (x, w, b), dy)
    plain = _grads_of(lambda x, w, b: NF.layer_norm2d(x, w, b, 1e-6), (x, w, b), dy)
    for i, (u, v) in enumerate(zip(fused, plain)):
        assert u.dtype == v.dtype and torch.equal(u, v), i
    for act in ("relu", "silu", "gelu_tanh"):
        got = _grads_of(lambda x, w, b: NF.layer_norm_act2d(x, w, b, 1e-6, act), (x, w, b), dy)
        with normlab.use_backend("ref"):
            ref = _grads_of(lambda x, w, b: NF.layer_norm_act2d(x, w, b, 1e-6, act),
                            (x.double(), w.double(), b.double()), dy.double())
            unfused = _grads_of(lambda x, w, b: A.act_forward(NF.layer_norm2d(x, w, b, 1e-6), A.ID[act]), (x, w, b),
                                dy)
        for i, (u, r, t) in enumerate(zip(got, ref, unfused)):
            assert u.dtype == t.dtype, (act, i)
            assert_accurate_vs_unfused(u, t, r, f"{shape} {dtype} {act} {i}")


@pytest.mark.parametrize("act", ["leaky_relu", "silu", "gelu", "tanh", "hardswish"])
def test_layer_norm_act2d_nchw_gradcheck(act):
    x = _x((2, 5, 3, 4), torch.float64).requires_grad_()
    w, b = (t.requires_grad_() for t in _params(5, torch.float64))
    with normlab.use_backend("cpu"):
        ops, err = ops_dispatched(lambda: NF.layer_norm_act2d(x, w, b, 1e-6, act, 0.2))
        assert err is None and "normlab.layer_norm_act2d_fwd.default" in ops, ops
        assert torch.autograd.gradcheck(lambda x, w, b: NF.layer_norm_act2d(x, w, b, 1e-6, act, 0.2), (x, w, b))


def test_layer_norm_act2d_nchw_without_affine_and_bad_input():
    x = _x((2, 8, 5, 5), torch.float32)
    ops, err = ops_dispatched(lambda: NF.layer_norm_act2d(x, None, None, 1e-6, "relu"))
    assert err is None and "normlab.layer_norm_act2d_fwd.default" in ops, ops
    assert torch.equal(NF.layer_norm_act2d(x, None, None, 1e-6, "relu"), torch.relu(NF.layer_norm2d(x, None, None, 1e-6)))
    with pytest.raises(RuntimeError, match="expected a contiguous"):
        torch.ops.normlab.layer_norm_act2d_fwd(x.transpose(2, 3), None, None, 1e-6, 1, 0.0)
    with pytest.raises(RuntimeError, match="expected a weight of 8 values"):
        torch.ops.normlab.layer_norm_act2d_fwd(x, torch.ones(7), None, 1e-6, 1, 0.0)
    with pytest.raises(RuntimeError, match="activation id in 0..7"):
        torch.ops.normlab.layer_norm_act2d_fwd(x, None, None, 1e-6, 9, 0.0)


@pytest.mark.parametrize("fn", ["layer_norm_act", "layer_norm_act2d channels_last", "layer_norm_act2d nchw"])
def test_layer_norm_act_same_bits_on_one_and_two_threads(fn):
    if fn == "layer_norm_act":
        x, dy, ns = _x((3000, 40), torch.float32), _x((3000, 40), torch.float32, seed=3), (40,)
        w, b = _ln_params(ns, torch.float32, (True, True))
        call = lambda x, w, b: NF.layer_norm_act(x, ns, w, b, 1e-5, "silu")  # noqa: E731
    else:
        fmt = CL if fn.endswith("channels_last") else None
        x, dy = _x((8, 32, 24, 24), torch.float32, fmt=fmt), _x((8, 32, 24, 24), torch.float32, seed=3, fmt=fmt)
        w, b = _params(32, torch.float32)
        call = lambda x, w, b: NF.layer_norm_act2d(x, w, b, 1e-6, "gelu_tanh")  # noqa: E731
    threads = torch.get_num_threads()
    out = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out.append(_grads_of(call, (x, w, b), dy))
    finally:
        torch.set_num_threads(threads)
    for u, v in zip(*out):
        assert torch.equal(u, v)


# bfloat16 rows (channels-last BatchNorm and GroupNorm, LayerNorm's rows) go two vectors at a time,
# even and odd values apart, with the per-column constants reordered to match: 40 columns are
# 32 by pairs and 8 after them, 12 columns none by pairs
ROWS_BY_PAIRS = {
    "batch_norm_act channels_last, 40": (lambda x, w, b, act: NF.batch_norm_act(x, None, None, w, b, True, act=act),
                                         lambda x, w, b: NF.batch_norm(x, None, None, w, b, True), (3, 40, 5, 7), CL),
    "batch_norm_act channels_last, 12": (lambda x, w, b, act: NF.batch_norm_act(x, None, None, w, b, True, act=act),
                                         lambda x, w, b: NF.batch_norm(x, None, None, w, b, True), (3, 12, 5, 7), CL),
    "group_norm_act channels_last, 40": (lambda x, w, b, act: NF.group_norm_act(x, 8, w, b, act=act),
                                         lambda x, w, b: NF.group_norm(x, 8, w, b), (3, 40, 5, 7), CL),
    "layer_norm_act, 40": (lambda x, w, b, act: NF.layer_norm_act(x, (40,), w, b, act=act),
                           lambda x, w, b: NF.layer_norm(x, (40,), w, b), (6, 7, 40), None),
}


@pytest.mark.parametrize("case", list(ROWS_BY_PAIRS))
def test_bfloat16_rows_by_pairs_relu_is_the_unfused_bits(case):
    """relu(z) rounded is relu of z rounded, and relu'(z) has z's sign, so the fused path's output
    and gradients are the unfused path's bits -- wherever a column's constants were read beside the
    wrong value (the even/odd order), z and so relu's mask would differ. (leaky_relu is not exact
    here: the fused BatchNorm pass applies it to z before rounding.)"""
    act = "relu"
    fused, norm, shape, fmt = ROWS_BY_PAIRS[case]
    x, dy = _x(shape, torch.bfloat16, fmt=fmt), _x(shape, torch.bfloat16, seed=3, fmt=fmt)
    # per-column constants that differ column by column
    w, b = _params(shape[1] if fmt is not None else shape[-1], torch.bfloat16)
    fn = A.ID[act]
    got = _grads(lambda x, w, b: fused(x, w, b, act), x, w, b, dy)
    want = _grads(lambda x, w, b: A.act_forward(norm(x, w, b), fn), x, w, b, dy)
    for i, (u, v) in enumerate(zip(got, want)):
        assert torch.equal(u, v), (case, act, i)


# The fused layers with an activation given by name (and leaky_relu's slope), beside their norm:
# BatchNormAct2d and GroupNormAct in both layouts (40 channels: bfloat16 rows go 32 values by pairs,
# 8 after them), LayerNormAct's rows and LayerNormAct2d's NCHW kernel.
ACT_CASES = {
    "batch_norm_act nchw": (lambda x, w, b, act, p: NF.batch_norm_act(x, None, None, w, b, True, act=act,
                                                                      negative_slope=p),
                            lambda x, w, b: NF.batch_norm(x, None, None, w, b, True), (3, 4, 6, 5), None),
    "batch_norm_act channels_last": (lambda x, w, b, act, p: NF.batch_norm_act(x, None, None, w, b, True, act=act,
                                                                               negative_slope=p),
                                     lambda x, w, b: NF.batch_norm(x, None, None, w, b, True), (3, 40, 5, 7), CL),
    "group_norm_act nchw": (lambda x, w, b, act, p: NF.group_norm_act(x, 2, w, b, act=act, negative_slope=p),
                            lambda x, w, b: NF.group_norm(x, 2, w, b), (3, 4, 6, 5), None),
    "group_norm_act channels_last": (lambda x, w, b, act, p: NF.group_norm_act(x, 8, w, b, act=act, negative_slope=p),
                                     lambda x, w, b: NF.group_norm(x, 8, w, b), (3, 40, 5, 7), CL),
    "layer_norm_act": (lambda x, w, b, act, p: NF.layer_norm_act(x, (40,), w, b, act=act, negative_slope=p),
                       lambda x, w, b: NF.layer_norm(x, (40,), w, b), (6, 7, 40), None),
    "layer_norm_act2d nchw": (lambda x, w, b, act, p: NF.layer_norm_act2d(x, w, b, 1e-6, act, p),
                              lambda x, w, b: NF.layer_norm2d(x, w, b, 1e-6), (2, 8, 5, 6), None),
}
_BN_GN = [k for k in ACT_CASES if k.startswith(("batch_norm", "group_norm"))]


# Where the statistics are x's own and every constant is finite, z = (x - mean) * a + b cannot be
# NaN, so a bfloat16 output pass may skip its store's NaN test -- for the activations that keep
# NaN-free values NaN-free (none, relu, leaky_relu with a slope other than 0). With a weight near
# bfloat16's largest, z overflows to +-inf; leaky_relu(-inf) with slope 0 and hardswish(-inf) are
# -inf * 0 = NaN, which must be stored as the unfused path stores it (the quiet NaN 0x7FC0), not as
# the bits the test-free store would make of it.
@pytest.mark.parametrize("act, slope", [("relu", 0.01), ("leaky_relu", 0.0), ("leaky_relu", 0.2), ("hardswish", 0.01)])
@pytest.mark.parametrize("case", _BN_GN)
def test_bfloat16_outputs_past_overflow_keep_the_unfused_nans(case, act, slope):
    fused, norm, shape, fmt = ACT_CASES[case]
    x = _x(shape, torch.bfloat16, fmt=fmt)
    c = shape[1]
    w = torch.full((c,), 3.0e38).to(torch.bfloat16)
    b = torch.zeros(c, dtype=torch.bfloat16)
    y = fused(x, w, b, act, slope)
    z = norm(x, w, b)
    assert z.isinf().any() and (z > 0).any() and (z < 0).any()  # (the case reaches overflow both ways)
    want = A.act_forward(z, A.ID[act], slope)
    nan = want.isnan()
    assert torch.equal(y.isnan(), nan), (case, act, slope)
    assert (y[nan].view(torch.int16) == 0x7FC0).all(), (case, act, slope)
    assert nan.any() == (act == "hardswish" or slope == 0.0)
    finite = ~nan
    if act == "relu" or slope == 0.0:  # (exact: relu of z rounded is relu(z) rounded; slope 0 gives 0)
        assert torch.equal(y[finite], want[finite]), (case, act, slope)


# relu's dz is dy where z > 0 and +0 where z <= 0, as torch's relu backward (threshold_backward)
# makes it -- not dy * 0, which is NaN for an infinite dy: an infinite dy where the unit is off
# leaves every gradient finite and the unfused path's bits.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(ACT_CASES))
def test_relu_backward_passes_dy_where_on_and_zero_where_off(case, dtype):
    fused, norm, shape, fmt = ACT_CASES[case]
    x, dy = _x(shape, dtype, fmt=fmt), _x(shape, dtype, seed=3, fmt=fmt)
    w, b = _params(shape[1] if fmt is not None or len(shape) == 4 else shape[-1], dtype)
    z = norm(x, w, b)
    off = z <= 0
    assert off.any() and (~off).any()
    dy = torch.where(off, torch.where(dy > 0, torch.inf, -torch.inf).to(dtype), dy)  # infinite where off
    got = _grads(lambda x, w, b: fused(x, w, b, "relu", 0.01), x, w, b, dy)
    want = _grads(lambda x, w, b: torch.relu(norm(x, w, b)), x, w, b, dy)
    for i, (u, v) in enumerate(zip(got, want)):
        assert torch.isfinite(u).all(), (case, i)
        assert torch.equal(u, v), (case, i)
