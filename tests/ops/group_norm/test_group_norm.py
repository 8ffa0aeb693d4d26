"""GroupNorm and InstanceNorm math: torch.nn.functional and float64 references as oracles."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF

import normlab
import normlab.functional as NF
from normlab._backend import EAGER, REF
from normlab.functional import group_norms
from normlab.ops import group_norm as gn_ops
from tests.oracle import (
    affine_params,
    assert_within_rounding,
    ops_dispatched,
    graph_nodes,
    rel_err,
)

HALF_DTYPES = [torch.bfloat16, torch.float16]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _make_x(shape, layout, dtype=torch.float64, seed=0, scale=2.0, shift=1.0):
    """A tensor of ``shape`` with values from ``seed`` laid out as ``layout``."""
    g = _gen(seed)
    if layout in ("contiguous", "channels_last"):
        base = torch.randn(shape, generator=g, dtype=torch.float64)
    elif layout == "sliced":  # every other element of the last dim
        base = torch.randn(*shape[:-1], 2 * shape[-1], generator=g, dtype=torch.float64)
    elif layout == "batch_transposed":  # stored as (C, N, *), viewed as (N, C, *)
        base = torch.randn(shape[1], shape[0], *shape[2:], generator=g, dtype=torch.float64)
    else:  # pragma: no cover
        raise ValueError(layout)
    base = (base * scale + shift).to(dtype)
    if layout == "channels_last":
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        return base.contiguous(memory_format=fmt)
    if layout == "sliced":
        return base[..., ::2]
    if layout == "batch_transposed":
        return base.transpose(0, 1)
    return base


def _memory_format_flags(t):
    return (
        t.is_contiguous(),
        t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last),
        t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d),
    )


def _leaves(*ts):
    return [t.detach().clone().requires_grad_(True) if t is not None else None for t in ts]


def _run(fn, x, params, dy):
    """Forward and backward of ``fn(x, *params)``; returns ``(y, [dx, *dparams])``."""
    leaves = _leaves(x, *params)
    y = fn(*leaves)
    y.backward(dy)
    return y.detach(), [t.grad if t is not None else None for t in leaves]


# ----------------------------------------------------------------------------
# gradients: gradcheck / gradgradcheck in float64
# ----------------------------------------------------------------------------

GN_GRAD_CASES = [((2, 4), 2), ((2, 6, 3), 3), ((1, 4, 2, 3), 2), ((2, 4, 2, 2), 4), ((2, 4, 2, 1, 2), 1)]


def _split(args, w, b):
    it = iter(args)
    xx = next(it)
    ww = next(it) if w is not None else None
    bb = next(it) if b is not None else None
    return xx, ww, bb


@pytest.mark.parametrize("x_shape,groups", GN_GRAD_CASES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_group_norm_gradcheck_and_gradgradcheck(x_shape, groups, affine):
    x = _make_x(x_shape, "contiguous", seed=3).requires_grad_(True)
    w, b = affine_params(x_shape[1], affine, requires_grad=True)
    inputs = tuple(t for t in (x, w, b) if t is not None)

    def fn(*args):
        xx, ww, bb = _split(args, w, b)
        return NF.group_norm(xx, groups, ww, bb)

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


IN_GRAD_SHAPES = [(2, 3, 4), (1, 2, 2, 3), (2, 2, 2, 1, 2)]


@pytest.mark.parametrize("x_shape", IN_GRAD_SHAPES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
@pytest.mark.parametrize("use_input_stats", [True, False])
def test_instance_norm_gradcheck_and_gradgradcheck(x_shape, affine, use_input_stats):
    c = x_shape[1]
    x = _make_x(x_shape, "contiguous", seed=4).requires_grad_(True)
    w, b = affine_params(c, affine, requires_grad=True)
    g = _gen(5)
    rm = torch.randn(c, generator=g, dtype=torch.float64)
    rv = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    inputs = tuple(t for t in (x, w, b) if t is not None)

    def fn(*args):
        xx, ww, bb = _split(args, w, b)
        if use_input_stats:
            return NF.instance_norm(xx, None, None, ww, bb, use_input_stats=True)
        return NF.instance_norm(xx, rm, rv, ww, bb, use_input_stats=False)

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


def test_second_derivative_matches_torch():
    """d/dx of <dx, v> (a Hessian-vector product through GroupNorm) equals torch's."""
    x = _make_x((2, 6, 5), "contiguous", seed=6)
    w, b = affine_params(6, "both")
    dy = torch.randn(2, 6, 5, generator=_gen(7), dtype=torch.float64)
    v = torch.randn(2, 6, 5, generator=_gen(8), dtype=torch.float64)
    out = []
    for fn in (NF.group_norm, TF.group_norm):
        xx, ww = _leaves(x, w)
        (dx,) = torch.autograd.grad(fn(xx, 3, ww, b), xx, dy, create_graph=True)
        out.append(torch.autograd.grad((dx * v).sum(), (xx, ww)))
    for ours, ref in zip(*out):
        torch.testing.assert_close(ours, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("fn,name", [
    (lambda x, w: NF.group_norm(x, 2, w), "GroupNorm"),
    (lambda x, w: NF.instance_norm(x, weight=w), "GroupNorm"),
    (lambda x, w: NF.instance_norm(x, torch.zeros(4), torch.ones(4), w, use_input_stats=False),
     "InstanceNormEval"),
])
def test_backward_is_the_hand_written_function(fn, name):
    """The graph holds our Function -- ``<name>Function``: the Python one (``"ref"``) or the C++ one
    (``"cpu"``, a node named ``normlab::...::<name>Function``) -- and no recorded reductions of the
    forward composite."""
    x = torch.randn(3, 4, 5, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    names = graph_nodes(fn(x, w)) + graph_nodes(fn(x, w), own_names=True)
    assert any(name in n for n in names), names
    assert not any(n.startswith(("Mean", "Sum", "Rsqrt", "Var", "Sub")) for n in names), names


# ----------------------------------------------------------------------------
# torch.nn.functional as the oracle: float64 / float32, every layout
# ----------------------------------------------------------------------------

GN_CASES = [
    ((5, 6), 3, "contiguous"),
    ((4, 6), 6, "batch_transposed"),
    ((3, 6, 7), 2, "contiguous"),
    ((3, 6, 7), 3, "sliced"),
    ((3, 6, 7), 6, "batch_transposed"),
    ((2, 8, 5, 6), 4, "contiguous"),
    ((2, 8, 5, 6), 2, "channels_last"),
    ((2, 8, 5, 6), 8, "sliced"),
    ((2, 8, 5, 6), 1, "batch_transposed"),
    ((2, 4, 3, 4, 5), 2, "contiguous"),
    ((2, 4, 3, 4, 5), 4, "channels_last"),
    ((1, 32, 16, 16), 8, "channels_last"),
]


def _compare_with_torch(fn_ours, fn_torch, x, params, dy, what):
    """Forward and every gradient of ours vs torch's.

    The oracle is torch in float64 on the same values (for float32 input too:
    torch 2.13's own float32 GroupNorm is off by ~2e-5 on some groups of one
    value, where the exact answer is ``b``). The output's dtype and memory
    format are compared with torch run in the input's own dtype.
    """
    dtype = x.dtype
    tol = TOL[dtype]
    y, grads = _run(fn_ours, x, params, dy)
    y_t, grads_t = _run(fn_torch, x.double(), [p.double() if p is not None else None for p in params],
                        dy.double())
    y_same = fn_torch(x, *params)
    assert y.dtype == y_same.dtype == dtype, what
    assert _memory_format_flags(y) == _memory_format_flags(y_same), f"{what}: output layout"
    torch.testing.assert_close(y, y_t.to(dtype), atol=tol, rtol=tol, msg=lambda m: f"{what} y: {m}")
    for i, (g, g_t) in enumerate(zip(grads, grads_t)):
        assert (g is None) == (g_t is None), f"{what}: grad {i}"
        if g is not None:
            assert g.dtype == dtype
            torch.testing.assert_close(g, g_t.to(dtype), atol=10 * tol, rtol=10 * tol,
                                       msg=lambda m: f"{what} grad {i}: {m}")


@pytest.mark.parametrize("x_shape,groups,layout", GN_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_group_norm_matches_torch(x_shape, groups, layout, dtype, affine):
    x = _make_x(x_shape, layout, dtype)
    if layout != "contiguous":
        assert not x.is_contiguous()
    w, b = affine_params(x_shape[1], affine, dtype)
    dy = torch.randn(x_shape, generator=_gen(1), dtype=torch.float64).to(dtype)
    _compare_with_torch(
        lambda x, w, b: NF.group_norm(x, groups, w, b, eps=1e-4),
        lambda x, w, b: TF.group_norm(x, groups, w, b, eps=1e-4),
        x, [w, b], dy, f"group_norm {x_shape} G={groups} {layout}",
    )


IN_CASES = [
    ((3, 4, 7), "contiguous"),
    ((3, 4, 7), "sliced"),
    ((3, 4, 7), "batch_transposed"),
    ((2, 5, 4, 6), "contiguous"),
    ((2, 5, 4, 6), "channels_last"),
    ((2, 5, 4, 6), "batch_transposed"),
    ((2, 3, 3, 4, 2), "contiguous"),
    ((2, 3, 3, 4, 2), "channels_last"),
]


@pytest.mark.parametrize("x_shape,layout", IN_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("affine", ["both", "none"])
@pytest.mark.parametrize("use_input_stats", [True, False])
def test_instance_norm_matches_torch(x_shape, layout, dtype, affine, use_input_stats):
    c = x_shape[1]
    x = _make_x(x_shape, layout, dtype)
    w, b = affine_params(c, affine, dtype)
    dy = torch.randn(x_shape, generator=_gen(1), dtype=torch.float64).to(dtype)
    g = _gen(2)
    rm0 = torch.randn(c, generator=g, dtype=torch.float64).to(dtype)
    rv0 = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    stats = {}

    def make(fn, key):
        def call(x, w, b):
            rm, rv = rm0.to(x.dtype, copy=True), rv0.to(x.dtype, copy=True)
            stats.setdefault(key, (rm, rv))  # keep the first call's (the one with a backward)
            return fn(x, rm, rv, w, b, use_input_stats=use_input_stats, momentum=0.3, eps=1e-4)
        return call

    _compare_with_torch(make(NF.instance_norm, "ours"), make(TF.instance_norm, "torch"),
                        x, [w, b], dy, f"instance_norm {x_shape} {layout}")
    for s, s_t in zip(stats["ours"], stats["torch"]):
        torch.testing.assert_close(s, s_t.to(dtype), atol=TOL[dtype], rtol=TOL[dtype])
    if not use_input_stats:  # running statistics are read, never written
        assert torch.equal(stats["ours"][0], rm0) and torch.equal(stats["ours"][1], rv0)
    else:
        assert not torch.equal(stats["ours"][0], rm0)


@pytest.mark.parametrize("dtype,stat_dtype", [
    (torch.float64, torch.float64),
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.float32),
])
@pytest.mark.parametrize("momentum", [0.1, 0.7, 0.0])
def test_instance_norm_running_stats_after_several_steps(dtype, stat_dtype, momentum):
    """Batch average of per-instance means and *unbiased* variances, weighted by momentum.

    Oracle: torch in float64 on the same (rounded) input. For bfloat16 input
    torch's own running statistics are off by ~2e-3 (computed at bfloat16
    precision); normlab accumulates in float32.
    """
    c = 5
    rm, rv = torch.zeros(c, dtype=stat_dtype), torch.ones(c, dtype=stat_dtype)
    rm_t, rv_t = torch.zeros(c, dtype=torch.float64), torch.ones(c, dtype=torch.float64)
    for step in range(4):
        n = 2 + step  # batch size changes between steps
        x = _make_x((n, c, 3, 4), "contiguous", seed=10 + step, scale=1 + step, shift=step - 1.5).to(dtype)
        NF.instance_norm(x, rm, rv, momentum=momentum)
        TF.instance_norm(x.double(), rm_t, rv_t, momentum=momentum)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(rm, rm_t.to(stat_dtype), atol=tol, rtol=tol)
    torch.testing.assert_close(rv, rv_t.to(stat_dtype), atol=tol, rtol=tol)
    if dtype == torch.float32:  # and torch itself in float32 agrees
        rm32, rv32 = torch.zeros(c), torch.ones(c)
        for step in range(4):
            x = _make_x((2 + step, c, 3, 4), "contiguous", seed=10 + step, scale=1 + step, shift=step - 1.5)
            TF.instance_norm(x.float(), rm32, rv32, momentum=momentum)
        torch.testing.assert_close(rm, rm32, atol=tol, rtol=tol)
        torch.testing.assert_close(rv, rv32, atol=tol, rtol=tol)
    if momentum == 0.0:
        assert torch.equal(rm, torch.zeros(c, dtype=stat_dtype)) and torch.equal(rv, torch.ones(c, dtype=stat_dtype))


def test_instance_norm_running_var_is_unbiased_batch_average():
    """The rule written out in float64, independent of torch: S = 6 values per instance."""
    x = _make_x((3, 2, 6), "contiguous", seed=11)
    rm, rv = torch.full((2,), 0.5, dtype=torch.float64), torch.full((2,), 2.0, dtype=torch.float64)
    NF.instance_norm(x, rm, rv, momentum=0.25)
    mean_stat = x.mean(dim=2).mean(dim=0)
    var_stat = x.var(dim=2, unbiased=True).mean(dim=0)
    torch.testing.assert_close(rm, 0.75 * 0.5 + 0.25 * mean_stat, atol=1e-14, rtol=0)
    torch.testing.assert_close(rv, 0.75 * 2.0 + 0.25 * var_stat, atol=1e-14, rtol=0)


def test_group_norm_float64_against_written_out_formula():
    x = _make_x((3, 6, 5), "contiguous", seed=12)
    w, b = affine_params(6, "both")
    xg = x.reshape(3, 2, 15)
    mean = xg.mean(-1, keepdim=True)
    var = xg.var(-1, unbiased=False, keepdim=True)
    manual = ((xg - mean) / torch.sqrt(var + 1e-5)).reshape(3, 6, 5) * w[:, None] + b[:, None]
    assert rel_err(NF.group_norm(x, 2, w, b), manual) < 1e-14


@pytest.mark.parametrize("make_view", [
    lambda t: t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),  # channels_last by hand
    lambda t: t[:, :, :1, :1],                                         # (N, C, 1, 1) slice
    lambda t: t[:, :1],                                                # C = 1
    lambda t: t.permute(0, 3, 2, 1).contiguous().permute(0, 3, 2, 1),  # N W H C storage
    lambda t: t[:1, :, :, :1].permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3),
    lambda t: t.unsqueeze(-1).permute(0, 4, 2, 3, 1).contiguous().permute(0, 4, 2, 3, 1).expand(-1, -1, -1, -1, 3),
], ids=["nhwc", "n_c_1_1", "c1", "nwhc", "1_h_c_1", "expanded_5d"])
def test_group_norm_output_layout_follows_torch(make_view):
    """Odd strides: the output's layout (channels_last or contiguous) is torch's."""
    x = make_view(_make_x((2, 4, 3, 5), "contiguous", torch.float32))
    groups = 1 if x.shape[1] == 1 else 2
    y, y_t = NF.group_norm(x, groups), TF.group_norm(x, groups)
    sized = [i for i in range(y.dim()) if y.shape[i] > 1]  # strides of size-1 dims are arbitrary
    assert [y.stride(i) for i in sized] == [y_t.stride(i) for i in sized]
    torch.testing.assert_close(y, y_t, atol=1e-5, rtol=1e-5)
    # InstanceNorm always returns a contiguous output, as torch does
    if math.prod(x.shape[2:]) > 1:
        assert NF.instance_norm(x).is_contiguous() and TF.instance_norm(x).is_contiguous()


@pytest.mark.parametrize("x_shape", [(0, 4, 3), (2, 4, 0), (0, 4), (2, 4, 0, 3)])
def test_empty_input(x_shape):
    """Empty in, empty out (shape as torch's); the parameter gradients are sums over
    nothing: exactly zero (torch 2.13 gives NaN for dweight when a spatial size is 0)."""
    w, b = affine_params(4, "both")
    x = torch.zeros(x_shape, dtype=torch.float64)
    dy = torch.zeros(x_shape, dtype=torch.float64)
    rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    cases = [(lambda x, w, b: NF.group_norm(x, 2, w, b), TF.group_norm(x, 2).shape)]
    if len(x_shape) >= 3:
        cases.append((lambda x, w, b: NF.instance_norm(x, rm, rv, w, b, use_input_stats=False),
                      TF.instance_norm(x, rm, rv, use_input_stats=False).shape))
        if x_shape[0] == 0:  # (spatial size 0 in training: see normlab.functional's check)
            cases.append((lambda x, w, b: NF.instance_norm(x, None, None, w, b), TF.instance_norm(x).shape))
    for fn, torch_shape in cases:
        y, (dx, dw, db) = _run(fn, x, [w, b], dy)
        assert y.shape == torch_shape == x_shape and dx.shape == x_shape
        assert torch.equal(dw, torch.zeros(4, dtype=torch.float64))
        assert torch.equal(db, torch.zeros(4, dtype=torch.float64))


def test_empty_spatial_instance_norm_op():
    """The path entry itself (below the public function's checks) serves a spatial size of 0 in
    training, as torch does."""
    x = torch.zeros(2, 4, 0)
    for path in (REF, EAGER):  # the reference and the kernels' entry
        y = group_norms._instance_norm_path(path, x, None, None, None, None, True, 0.1, 1e-5)
        assert y.shape == TF.instance_norm(x).shape == (2, 4, 0)


# ----------------------------------------------------------------------------
# float16 / bfloat16: within 2x the rounding error of a float64 reference
# ----------------------------------------------------------------------------


LP_CASES = [((4, 16, 9), 4, "contiguous"), ((2, 32, 6, 7), 8, "channels_last"),
            ((3, 12, 4, 5), 3, "sliced"), ((2, 8, 3, 4, 5), 2, "contiguous"), ((64, 24), 6, "contiguous")]


def _assert_half_results(y, grads, y64, grads64, dtype, pdt):
    """y and dx in the input's dtype, dw and db in the parameters' (pdt); each within 2x the error
    of rounding the float64 result."""
    assert y.dtype == dtype and grads[0].dtype == dtype
    assert grads[1].dtype == pdt and grads[2].dtype == pdt
    assert_within_rounding(y, y64, 2.0, f"{dtype} y", dtype=dtype)
    for name, g, g64 in zip(("dx", "dw", "db"), grads, grads64):
        assert_within_rounding(g, g64, 2.0, f"{dtype} {name}", dtype=dtype)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("param_dtype", ["same", "float32"])
@pytest.mark.parametrize("x_shape,groups,layout", LP_CASES)
def test_group_norm_half_within_twice_rounding_error(dtype, param_dtype, x_shape, groups, layout):
    pdt = dtype if param_dtype == "same" else torch.float32
    x = _make_x(x_shape, layout, dtype)
    w, b = affine_params(x_shape[1], "both", pdt)
    dy = torch.randn(x_shape, generator=_gen(1)).to(dtype)
    y, grads = _run(lambda x, w, b: NF.group_norm(x, groups, w, b), x, [w, b], dy)
    y64, grads64 = _run(lambda x, w, b: TF.group_norm(x, groups, w, b),
                        x.double(), [w.double(), b.double()], dy.double())
    _assert_half_results(y, grads, y64, grads64, dtype, pdt)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("param_dtype", ["same", "float32"])
@pytest.mark.parametrize("use_input_stats", [True, False])
@pytest.mark.parametrize("x_shape,layout", [((4, 6, 40), "contiguous"), ((2, 8, 6, 7), "channels_last")])
def test_instance_norm_half_within_twice_rounding_error(dtype, param_dtype, use_input_stats, x_shape, layout):
    pdt = dtype if param_dtype == "same" else torch.float32
    c = x_shape[1]
    x = _make_x(x_shape, layout, dtype)
    w, b = affine_params(c, "both", pdt)
    rm = torch.randn(c, generator=_gen(2)).to(pdt)
    rv = (torch.rand(c, generator=_gen(3)) + 0.5).to(pdt)
    dy = torch.randn(x_shape, generator=_gen(1)).to(dtype)
    rm_ours, rv_ours = rm.clone(), rv.clone()
    y, grads = _run(lambda x, w, b: NF.instance_norm(x, rm_ours, rv_ours, w, b, use_input_stats),
                    x, [w, b], dy)
    rm64, rv64 = rm.double(), rv.double()
    y64, grads64 = _run(lambda x, w, b: TF.instance_norm(x, rm64, rv64, w, b, use_input_stats),
                        x.double(), [w.double(), b.double()], dy.double())
    _assert_half_results(y, grads, y64, grads64, dtype, pdt)
    # the running statistics are stored in their own dtype, rounded once
    assert rm_ours.dtype == rv_ours.dtype == pdt
    for got, ref in ((rm_ours, rm64), (rv_ours, rv64)):
        if pdt == torch.float32:  # a few float32 ops from the float64 answer
            assert rel_err(got, ref) <= 1e-6
        else:
            assert_within_rounding(got, ref, 2.0, "running statistics", dtype=pdt)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_large_mean_groups_float32(layout):
    """Groups with mean 1e4 and std 1: within 1e-5 of float64 computed from the same float32 input.

    (torch 2.13 on CPU: 1e-3 off for contiguous input, ~1e3 off for channels_last.)
    """
    x = _make_x((4, 8, 32, 32), layout, torch.float32, seed=13, scale=1.0, shift=1e4)
    ref = TF.group_norm(x.double(), 2)
    err = (NF.group_norm(x, 2).double() - ref).abs().max().item()
    assert err <= 1e-5, err
    err = (NF.instance_norm(x).double() - TF.instance_norm(x.double())).abs().max().item()
    assert err <= 1e-5, err


# ----------------------------------------------------------------------------
# constant groups, NaN and inf
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_constant_group_gives_exactly_beta(dtype):
    big = 1e3 if dtype == torch.float16 else 1e4
    x = torch.empty(3, 6, 4, dtype=dtype)
    for n, value in enumerate((0.1, big, -3.3)):
        x[n, :3] = value           # group 0 of sample n: one constant
        x[n, 3:] = value / 7 - 1   # group 1: another
    w = torch.randn(6, generator=_gen(14)).to(dtype)
    b = torch.randn(6, generator=_gen(15)).to(dtype)
    expected = b[None, :, None].expand(3, 6, 4)
    assert torch.equal(NF.group_norm(x, 2, w, b), expected)
    assert torch.equal(NF.instance_norm(x, weight=w, bias=b), expected)
    # float32 params with half input: beta rounded once to the input's dtype
    if dtype in HALF_DTYPES:
        w32, b32 = torch.randn(6, generator=_gen(16)), torch.randn(6, generator=_gen(17))
        assert torch.equal(NF.group_norm(x, 2, w32, b32), b32.to(dtype)[None, :, None].expand(3, 6, 4))


def test_nan_and_inf_propagate_like_torch():
    nan, inf = float("nan"), float("inf")
    x = torch.randn(3, 4, 5, generator=_gen(18))
    x[0, 0, 2] = nan    # poisons group 0 of sample 0 (and instance (0, 0))
    x[1, 3, 0] = inf    # poisons group 1 of sample 1
    x[2, 1, 4] = -inf
    for ours, ref in [
        (NF.group_norm(x, 2), TF.group_norm(x, 2)),
        (NF.group_norm(x, 4), TF.group_norm(x, 4)),
        (NF.instance_norm(x), TF.instance_norm(x)),
        (NF.instance_norm(x, torch.zeros(4), torch.ones(4), use_input_stats=False),
         TF.instance_norm(x, torch.zeros(4), torch.ones(4), use_input_stats=False)),
    ]:
        assert ours.isnan().any()
        assert torch.equal(ours.isnan(), ref.isnan())
        assert torch.equal(ours.isinf(), ref.isinf())
        finite = ref.isfinite()
        torch.testing.assert_close(ours[finite], ref[finite], atol=1e-5, rtol=1e-5)


def test_nan_reaches_running_stats_like_torch():
    x = torch.randn(2, 3, 4, generator=_gen(19))
    x[1, 2, 1] = float("nan")
    rm, rv = torch.zeros(3), torch.ones(3)
    rm_t, rv_t = rm.clone(), rv.clone()
    NF.instance_norm(x, rm, rv)
    TF.instance_norm(x, rm_t, rv_t)
    assert torch.equal(rm.isnan(), rm_t.isnan()) and torch.equal(rv.isnan(), rv_t.isnan())
    assert rm.isnan().tolist() == [False, False, True]


# ----------------------------------------------------------------------------
# bad input: torch's exception class, a message naming expected and given
# ----------------------------------------------------------------------------


def _raises_like_torch(ours, theirs, match):
    with pytest.raises(Exception) as torch_exc:
        theirs()
    with pytest.raises(torch_exc.type, match=match):
        ours()


def test_errors_group_norm():
    x = torch.randn(2, 10, 3)
    _raises_like_torch(lambda: NF.group_norm(x, 3), lambda: TF.group_norm(x, 3),
                       r"channels \(10.*\[2, 10, 3\].*divisible by num_groups \(3\)")
    x1 = torch.randn(5)
    _raises_like_torch(lambda: NF.group_norm(x1, 1), lambda: TF.group_norm(x1, 1),
                       r"\(N, C, \*\).*got input of shape \[5\]")
    _raises_like_torch(lambda: NF.group_norm(torch.ones(2, 4, 3, dtype=torch.long), 2),
                       lambda: TF.group_norm(torch.ones(2, 4, 3, dtype=torch.long), 2),
                       "floating-point.*torch.int64")
    xd = torch.randn(2, 4, 3, dtype=torch.float64)
    _raises_like_torch(lambda: NF.group_norm(xd, 2, torch.ones(4)), lambda: TF.group_norm(xd, 2, torch.ones(4)),
                       "mixed dtypes.*torch.float64.*torch.float32")
    xf = torch.randn(2, 4, 3)
    _raises_like_torch(lambda: NF.group_norm(xf, 2, torch.ones(4, dtype=torch.float64)),
                       lambda: TF.group_norm(xf, 2, torch.ones(4, dtype=torch.float64)), "mixed dtypes")
    _raises_like_torch(lambda: NF.group_norm(xf, 2, torch.ones(3)), lambda: TF.group_norm(xf, 2, torch.ones(3)),
                       r"weight of shape \[4\].*got weight of shape \[3\]")
    _raises_like_torch(lambda: NF.group_norm(xf, 2, torch.ones(4), torch.ones(5)),
                       lambda: TF.group_norm(xf, 2, torch.ones(4), torch.ones(5)),
                       r"bias of shape \[4\].*got bias of shape \[5\]")


def test_errors_instance_norm():
    x2 = torch.randn(2, 4)
    _raises_like_torch(lambda: NF.instance_norm(x2), lambda: TF.instance_norm(x2), r"\[2, 4\]")
    x1 = torch.randn(2, 4, 1)
    _raises_like_torch(lambda: NF.instance_norm(x1), lambda: TF.instance_norm(x1),
                       "Expected more than 1 spatial element")
    _raises_like_torch(lambda: NF.instance_norm(torch.ones(2, 4, 3, dtype=torch.int32)),
                       lambda: TF.instance_norm(torch.ones(2, 4, 3, dtype=torch.int32)), "floating-point")
    xd = torch.randn(2, 4, 3, dtype=torch.float64)
    _raises_like_torch(lambda: NF.instance_norm(xd, weight=torch.ones(4), bias=torch.ones(4)),
                       lambda: TF.instance_norm(xd, weight=torch.ones(4), bias=torch.ones(4)), "mixed dtypes")
    x = torch.randn(2, 4, 3)
    _raises_like_torch(lambda: NF.instance_norm(x, weight=torch.ones(3)),
                       lambda: TF.instance_norm(x, weight=torch.ones(3)), r"weight of shape \[4\].*\[3\]")
    _raises_like_torch(lambda: NF.instance_norm(x, torch.zeros(3), torch.ones(3)),
                       lambda: TF.instance_norm(x, torch.zeros(3), torch.ones(3)),
                       r"running_mean of shape \[4\].*\[3\]")


@pytest.mark.parametrize("backend", normlab.available_backends())
def test_errors_are_raised_before_any_work(backend):
    """A bad argument never reaches an op, on any backend: not one op is dispatched before the error."""
    x6, x4, rm, rv = torch.randn(2, 6, 3), torch.randn(2, 4, 3), torch.zeros(3), torch.ones(3)
    with normlab.use_backend(backend):
        ops, err = ops_dispatched(lambda: NF.group_norm(x6, 4))
        assert isinstance(err, RuntimeError) and "divisible by num_groups" in str(err) and ops == []
        ops, err = ops_dispatched(lambda: NF.instance_norm(x4, rm, rv))
        assert isinstance(err, RuntimeError) and "running_mean of shape [4]" in str(err) and ops == []
        ops, err = ops_dispatched(lambda: NF.group_norm(x6, 3))  # the oracle sees the ops of a good call
        assert err is None and ops
    assert torch.equal(rm, torch.zeros(3))
