"""BatchNorm math (normlab.ops.batch_norm through normlab.functional.batch_norm).

The oracle is torch.nn.functional.batch_norm, or a float64 computation from
the same (rounded) inputs; no expected value comes from normlab itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

import normlab
import normlab.functional as NF
from normlab._backend import EAGER, REF
from normlab.functional import batch_norms
from normlab.ops import batch_norm as bn_ops
from normlab.ops.layouts import output_memory_format
from tests.oracle import assert_within_rounding, rel_err

LOW = (torch.bfloat16, torch.float16)


def _params(c, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (1 + 0.5 * torch.randn(c, generator=g, dtype=torch.float64)).to(dtype)
    b = torch.randn(c, generator=g, dtype=torch.float64).to(dtype)
    rm = torch.randn(c, generator=g, dtype=torch.float64).to(dtype)
    rv = (0.5 + torch.rand(c, generator=g, dtype=torch.float64)).to(dtype)
    return w, b, rm, rv


def _randn(shape, dtype=torch.float32, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)


# Layouts: name -> input of logical shape (N, C, ...) built from a float64 tensor.
def _layout(name, dtype, seed=0):
    if name == "NC":
        return _randn((5, 3), dtype, seed)
    if name == "NCL":
        return _randn((4, 3, 6), dtype, seed)
    if name == "NCHW":
        return _randn((3, 4, 5, 6), dtype, seed)
    if name == "NCDHW":
        return _randn((2, 3, 3, 4, 5), dtype, seed)
    if name == "NCHW_channels_last":
        return _randn((3, 4, 5, 6), dtype, seed).contiguous(memory_format=torch.channels_last)
    if name == "NCDHW_channels_last_3d":
        return _randn((2, 3, 3, 4, 5), dtype, seed).contiguous(memory_format=torch.channels_last_3d)
    if name == "NCL_transposed":  # (N, L, C) viewed as (N, C, L)
        return _randn((4, 6, 3), dtype, seed).transpose(1, 2)
    if name == "NCHW_sliced":  # every other channel and column
        return _randn((3, 8, 5, 12), dtype, seed)[:, ::2, :, ::2]
    if name == "NCHW_permuted":  # strides that are neither contiguous nor channels_last
        return _randn((4, 2, 6, 5), dtype, seed).permute(1, 3, 0, 2)
    if name == "NCHW_channels_last_sliced":
        return _randn((3, 4, 5, 12), dtype, seed).contiguous(memory_format=torch.channels_last)[..., ::2]
    if name == "NCHW_N2":  # tiny batch
        return _randn((2, 3, 2, 2), dtype, seed)
    if name == "NC_N2":
        return _randn((2, 4), dtype, seed)
    raise KeyError(name)


LAYOUTS = [
    "NC", "NCL", "NCHW", "NCDHW", "NCHW_channels_last", "NCDHW_channels_last_3d",
    "NCL_transposed", "NCHW_sliced", "NCHW_permuted", "NCHW_channels_last_sliced",
    "NCHW_N2", "NC_N2",
]


# --------------------------------------------------------------------------
# Gradients: gradcheck and gradgradcheck in float64
# --------------------------------------------------------------------------

GRAD_SHAPES = [(4, 3), (3, 2, 3), (2, 2, 3, 2), (2, 2, 2, 2, 2)]


@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=lambda s: f"{len(s)}d")
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_gradcheck_and_gradgradcheck_float64(shape, training, affine):
    c = shape[1]
    x = _randn(shape, torch.float64, seed=1).requires_grad_()
    w, b, rm, rv = _params(c, torch.float64, seed=2)
    inputs = [x]
    if affine in ("wb", "w"):
        inputs.append(w.requires_grad_())
    if affine == "wb":
        inputs.append(b.requires_grad_())

    def f(x, w=None, b=None):
        if training:  # no running stats: nothing is updated between gradcheck's calls
            return NF.batch_norm(x, None, None, w, b, training=True, eps=1e-3)
        return NF.batch_norm(x, rm, rv, w, b, training=False, eps=1e-3)

    assert gradcheck(f, tuple(inputs))
    assert gradgradcheck(f, tuple(inputs))


def test_double_backward_matches_torch():
    """Second derivatives (Hessian-vector products) equal torch's."""
    x = _randn((3, 2, 4), torch.float64, seed=3)
    w, b, _, _ = _params(2, torch.float64)
    dy = _randn((3, 2, 4), torch.float64, seed=4)
    v = _randn((3, 2, 4), torch.float64, seed=5)
    results = []
    for fn in (NF.batch_norm, TF.batch_norm):
        xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
        y = fn(xr, None, None, wr, br, True)
        (dx,) = torch.autograd.grad(y, xr, dy, create_graph=True)
        results.append(torch.autograd.grad((dx * v).sum(), (xr, wr)))
    for ours, ref in zip(*results):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------
# Forward and backward against torch, every layout, float64 and float32
# --------------------------------------------------------------------------


def _run(fn, x, w, b, rm, rv, training, momentum=0.1, dy=None):
    """Output, gradients (x, w, b) and the running stats after one call of ``fn``."""
    xr = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    wr = w.detach().clone().requires_grad_() if w is not None else None
    br = b.detach().clone().requires_grad_() if b is not None else None
    rm = rm.clone() if rm is not None else None
    rv = rv.clone() if rv is not None else None
    y = fn(xr, rm, rv, wr, br, training, momentum, 1e-5)
    if dy is None:
        dy = _randn(y.shape, y.dtype, seed=7)
    leaves = [t for t in (xr, wr, br) if t is not None]
    grads = torch.autograd.grad(y, leaves, dy)
    return y, grads, rm, rv


TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=2e-5)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_matches_torch(layout, dtype, training):
    x = _layout(layout, dtype)
    w, b, rm, rv = _params(x.shape[1], dtype)
    y, grads, rm1, rv1 = _run(NF.batch_norm, x, w, b, rm, rv, training)
    yt, gradst, rmt, rvt = _run(TF.batch_norm, x, w, b, rm, rv, training)
    assert y.dtype == yt.dtype and y.shape == yt.shape
    # same memory format as torch's output (channels_last in -> channels_last out)
    assert y.stride() == yt.stride(), (y.stride(), yt.stride())
    torch.testing.assert_close(y, yt, **TOL[dtype])
    for ours, ref in zip(grads, gradst):
        assert ours.dtype == ref.dtype
        torch.testing.assert_close(ours, ref, **TOL[dtype])
    torch.testing.assert_close(rm1, rmt, **TOL[dtype])
    torch.testing.assert_close(rv1, rvt, **TOL[dtype])
    if training:  # the running stats really moved
        assert not torch.equal(rm1, rm) and not torch.equal(rv1, rv)
    else:  # and are left alone in eval
        assert torch.equal(rm1, rm) and torch.equal(rv1, rv)


def test_channels_last_gradient_layout():
    """dx of a channels_last input comes back channels_last (as torch's does)."""
    x = _layout("NCHW_channels_last", torch.float32)
    w, b, rm, rv = _params(4, torch.float32)
    for training in (True, False):
        xr = x.clone(memory_format=torch.channels_last).requires_grad_()
        y = NF.batch_norm(xr, rm.clone(), rv.clone(), w, b, training)
        assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
        dy = torch.randn(y.shape).contiguous(memory_format=torch.channels_last)
        (dx,) = torch.autograd.grad(y, xr, dy)
        assert dx.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("which", ["w_only", "b_only", "none"])
def test_weight_or_bias_none(training, which):
    x = _layout("NCL", torch.float64)
    w, b, rm, rv = _params(3, torch.float64)
    w = None if which in ("b_only", "none") else w
    b = None if which in ("w_only", "none") else b
    y, grads, _, _ = _run(NF.batch_norm, x, w, b, rm, rv, training)
    yt, gradst, _, _ = _run(TF.batch_norm, x, w, b, rm, rv, training)
    torch.testing.assert_close(y, yt, **TOL[torch.float64])
    assert len(grads) == len(gradst)
    for ours, ref in zip(grads, gradst):
        torch.testing.assert_close(ours, ref, **TOL[torch.float64])


@pytest.mark.parametrize("backend", normlab.available_backends()[1:])
@pytest.mark.parametrize("training", [True, False])
def test_running_stats_that_require_grad_are_refused_as_torch(backend, training):
    """Running statistics are never differentiated: with grad mode on, torch refuses ones that
    require grad (RuntimeError), and so does normlab, on every backend; under no_grad both accept."""
    x = _randn((4, 3), torch.float64).requires_grad_()
    rm = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    rv = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError):
        TF.batch_norm(x, rm, rv, None, None, training=training)
    with normlab.use_backend(backend):
        with pytest.raises(RuntimeError, match="expected running_mean not to require grad"):
            NF.batch_norm(x, rm, rv, None, None, training=training)
        with torch.no_grad():
            y = NF.batch_norm(x, rm, rv, None, None, training=training)
    with torch.no_grad():
        torch.testing.assert_close(y, TF.batch_norm(x, rm.clone(), rv.clone(), None, None, training=training))


# --------------------------------------------------------------------------
# Low precision: error against float64 at most 2x the rounding error
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LOW, ids=["bf16", "f16"])
@pytest.mark.parametrize("param_dtype", ["same", "float32"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("layout", ["NCHW", "NCHW_channels_last", "NCL_transposed"])
def test_low_precision_error_within_twice_rounding(dtype, param_dtype, training, layout):
    pdt = dtype if param_dtype == "same" else torch.float32
    x = _layout(layout, dtype, seed=11) * 2 + 1  # rounded input, mean away from 0
    w, b, rm, rv = _params(x.shape[1], pdt, seed=12)
    dy = _randn(x.shape, dtype, seed=13)
    y, grads, rm1, rv1 = _run(NF.batch_norm, x, w, b, rm, rv, training, dy=dy)
    assert y.dtype == dtype
    assert [g.dtype for g in grads] == [dtype, pdt, pdt]  # dx in x's dtype, dw/db in the params'
    # float64 reference from the very same rounded values
    y64, grads64, rm64, rv64 = _run(
        TF.batch_norm, x.double(), w.double(), b.double(), rm.double(), rv.double(),
        training, dy=dy.double(),
    )
    for name, ours, ref in zip(("y", "dx", "dw", "db"), (y, *grads), (y64, *grads64)):
        assert_within_rounding(ours, ref, 2.0, name, dtype=dtype)
    if training:  # running stats in the buffer's dtype
        for ours, ref in ((rm1, rm64), (rv1, rv64)):
            assert ours.dtype == pdt
            if pdt == torch.float32:  # float32 statistics of float32-exact values
                torch.testing.assert_close(ours.double(), ref, rtol=1e-6, atol=1e-6)
            else:  # half buffers: the blend is rounded once, so within half an ulp
                assert (ours.double() - ref).abs().le(0.51 * _ulp(ref, pdt)).all(), (ours, ref)


def _ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` numbers at each value of ``ref``."""
    _, exponent = torch.frexp(ref)  # ref = m * 2**exponent, 0.5 <= |m| < 1
    return torch.finfo(dtype).eps * torch.pow(2.0, exponent.double() - 1)


# --------------------------------------------------------------------------
# Running statistics
# --------------------------------------------------------------------------


@pytest.mark.parametrize("momentum", [0.1, 0.5, 1.0, 0.0])
def test_running_stats_update_formula_float64(momentum):
    """running = (1 - m) * running + m * stat, with the unbiased variance (n / (n - 1))."""
    x = _randn((3, 2, 5), torch.float64, seed=21)
    _, _, rm, rv = _params(2, torch.float64)
    rm1, rv1 = rm.clone(), rv.clone()
    NF.batch_norm(x, rm1, rv1, None, None, training=True, momentum=momentum)
    xc = x.transpose(0, 1).reshape(2, -1)  # (C, n) with n = 15
    expected_mean = (1 - momentum) * rm + momentum * xc.mean(dim=1)
    expected_var = (1 - momentum) * rv + momentum * xc.var(dim=1, correction=1)
    torch.testing.assert_close(rm1, expected_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rv1, expected_var, rtol=1e-12, atol=1e-12)


def test_running_stats_several_steps_match_torch():
    _, _, rm, rv = _params(4, torch.float32)
    ours = (rm.clone(), rv.clone())
    ref = (rm.clone(), rv.clone())
    for step in range(4):
        x = _randn((3, 4, 2, 3), torch.float32, seed=30 + step, scale=2.0, shift=step)
        NF.batch_norm(x, *ours, None, None, True, 0.3)
        TF.batch_norm(x, *ref, None, None, True, 0.3)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-6, atol=1e-6)


def test_training_without_running_stats_touches_nothing():
    x = _randn((4, 3), torch.float32)
    y = NF.batch_norm(x, None, None, None, None, training=True)
    torch.testing.assert_close(y, TF.batch_norm(x, None, None, None, None, True))


# --------------------------------------------------------------------------
# Numerics
# --------------------------------------------------------------------------


def test_float32_large_mean_channels():
    """Channels with mean 1e4 and std 1: within 1e-3 of float64 from the same float32 input."""
    x = _randn((16, 3, 8, 8), torch.float32, seed=41, scale=1.0, shift=1e4)
    w, b, _, _ = _params(3, torch.float32)
    y = NF.batch_norm(x, None, None, w, b, training=True)
    y64 = TF.batch_norm(x.double(), None, None, w.double(), b.double(), True)
    err = (y.double() - y64).abs().max().item()
    assert err <= 1e-3, err
    # and the gradient too
    xr = x.clone().requires_grad_()
    dy = _randn(x.shape, torch.float32, seed=42)
    (dx,) = torch.autograd.grad(NF.batch_norm(xr, None, None, w, b, True), xr, dy)
    x64 = x.double().requires_grad_()
    (dx64,) = torch.autograd.grad(
        TF.batch_norm(x64, None, None, w.double(), b.double(), True), x64, dy.double()
    )
    assert (dx.double() - dx64).abs().max().item() <= 1e-3 * dx64.abs().max().item()


def test_float32_mean_of_a_large_channel_is_accurate():
    """131072 values per channel whose first value lies 5 std from the mean.

    The running mean (momentum 1: the batch mean itself) is within 2 ulps of
    the float64 mean of the same float32 values, and ``dw`` -- which moves by
    ``rstd * sum(dy)`` per unit of error in the mean -- within 1e-5 relative.
    """
    x = _randn((128, 2, 32, 32), torch.float32, seed=45, scale=2.0, shift=1.0)
    x[0, :, 0, 0] = 11.0  # the value a shifted algorithm would shift by
    rm, rv = torch.zeros(2), torch.ones(2)
    xr = x.clone().requires_grad_()
    w = torch.ones(2, requires_grad=True)
    y = NF.batch_norm(xr, rm, rv, w, None, training=True, momentum=1.0)
    mean64 = x.double().mean(dim=(0, 2, 3))
    assert (rm.double() - mean64).abs().max().item() <= 2 * torch.finfo(torch.float32).eps * mean64.abs().max().item()
    dy = _randn(x.shape, torch.float32, seed=46, shift=0.5)  # sum(dy) far from 0
    (dw,) = torch.autograd.grad(y, w, dy)
    x64, w64 = x.double().requires_grad_(), torch.ones(2, dtype=torch.float64, requires_grad=True)
    (dw64,) = torch.autograd.grad(TF.batch_norm(x64, None, None, w64, None, True), w64, dy.double())
    assert rel_err(dw, dw64) <= 1e-5, rel_err(dw, dw64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_constant_channel_gives_exactly_beta(dtype):
    x = _randn((4, 3, 5), dtype, seed=43)
    x[:, 1] = 3.7
    w, b, _, _ = _params(3, dtype)
    y = NF.batch_norm(x, None, None, w, b, training=True)
    assert torch.equal(y[:, 1], b[1].expand(4, 5))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("where", [(0, 0, 0), (2, 1, 3)])
def test_nan_propagates_like_torch(training, where):
    x = _randn((3, 2, 4), torch.float32, seed=44)
    x[where] = float("nan")
    w, b, rm, rv = _params(2, torch.float32)
    rm1, rv1, rmt, rvt = rm.clone(), rv.clone(), rm.clone(), rv.clone()
    y = NF.batch_norm(x, rm1, rv1, w, b, training)
    yt = TF.batch_norm(x, rmt, rvt, w, b, training)
    assert torch.equal(y.isnan(), yt.isnan())
    assert y.isnan().any()
    assert torch.equal(rm1.isnan(), rmt.isnan()) and torch.equal(rv1.isnan(), rvt.isnan())


# --------------------------------------------------------------------------
# Batch dependence (property)
# --------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(2, 5),
    c=st.integers(1, 3),
    length=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    shift=st.floats(20.0, 100.0),
)
def test_train_output_depends_on_batch_eval_does_not(n, c, length, seed, shift):
    # With 2 values per channel the train output is +-1 whatever they are; 3 or more
    # values carry information. The shift is large against the unit spread of x.
    assume(n * length >= 3)
    x = _randn((n, c, length), torch.float64, seed=seed)
    w, b, rm, rv = _params(c, torch.float64, seed=seed + 1)
    other = x.clone()
    other[1:] += shift  # move every other sample; sample 0 is unchanged

    y = NF.batch_norm(x, None, None, w, b, training=True)
    y_other = NF.batch_norm(other, None, None, w, b, training=True)
    # the batch mean of every channel moved by shift * (n - 1) / n, so sample 0's output moved
    moved = (y[0] - y_other[0]).abs().max().item()
    assert moved > 1e-3
    torch.testing.assert_close(y_other, TF.batch_norm(other, None, None, w, b, True), rtol=1e-9, atol=1e-9)

    e = NF.batch_norm(x, rm, rv, w, b, training=False)
    e_other = NF.batch_norm(other, rm, rv, w, b, training=False)
    e_alone = NF.batch_norm(x[:1], rm, rv, w, b, training=False)
    assert torch.equal(e[0], e_other[0])
    assert torch.equal(e[:1], e_alone)
    # and the eval output is torch's
    torch.testing.assert_close(e, TF.batch_norm(x, rm, rv, w, b, False), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------
# Bad input: torch's exception class, a message that says what was expected
# --------------------------------------------------------------------------


def _bad_cases():
    x = torch.randn(4, 3, 5)
    ones, zeros = torch.ones(3), torch.zeros(3)
    return {
        "integer_input": (
            (torch.ones(4, 3, 5, dtype=torch.long), zeros.clone(), ones.clone(), None, None, True),
            NotImplementedError, r"floating-point.*torch\.int64",
        ),
        "one_value_per_channel": (
            (torch.randn(1, 3), None, None, None, None, True),
            ValueError, r"Expected more than 1 value per channel when training, got input size torch\.Size\(\[1, 3\]\)",
        ),
        "one_value_per_channel_spatial": (
            (torch.randn(1, 3, 1, 1), zeros.clone(), ones.clone(), None, None, True),
            ValueError, r"Expected more than 1 value per channel when training",
        ),
        "weight_wrong_shape": (
            (x, None, None, torch.ones(4), None, True),
            RuntimeError, r"expected weight of shape \[3\].*got weight of shape \[4\]",
        ),
        "bias_wrong_shape_eval": (
            (x, zeros.clone(), ones.clone(), None, torch.zeros(2), False),
            RuntimeError, r"expected bias of shape \[3\].*got bias of shape \[2\]",
        ),
        "running_mean_wrong_shape": (
            (x, torch.zeros(4), torch.ones(4), None, None, True),
            RuntimeError, r"expected running_mean of shape \[3\].*got running_mean of shape \[4\]",
        ),
        "float64_input_float32_params": (
            (x.double(), zeros.clone(), ones.clone(), ones.clone(), zeros.clone(), True),
            RuntimeError, r"mixed dtype",
        ),
        "float32_input_float64_params": (
            (x, zeros.clone(), ones.clone(), ones.double(), zeros.double(), False),
            RuntimeError, r"mixed dtype",
        ),
        "float32_input_bfloat16_params": (
            (x, None, None, ones.bfloat16(), zeros.bfloat16(), True),
            RuntimeError, r"mixed dtype",
        ),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_input_raises_like_torch(case):
    args, exc, pattern = _bad_cases()[case]
    with pytest.raises(exc):  # the oracle: torch raises this class for this mistake
        TF.batch_norm(*args)
    with pytest.raises(exc, match=pattern):
        NF.batch_norm(*args)


def test_failed_call_leaves_running_stats_alone():
    rm, rv = torch.zeros(3), torch.ones(3)
    with pytest.raises(RuntimeError):
        NF.batch_norm(torch.randn(4, 3), rm, rv, torch.ones(4), None, True)
    assert torch.equal(rm, torch.zeros(3)) and torch.equal(rv, torch.ones(3))


def test_mixed_precision_allowed_like_torch():
    """float16/bfloat16 input with float32 weight, bias and running stats is accepted."""
    for dtype in LOW:
        x = _randn((4, 3, 2), dtype)
        w, b, rm, rv = _params(3, torch.float32)
        y = NF.batch_norm(x, rm, rv, w, b, training=True)
        assert y.dtype == dtype and rm.dtype == torch.float32


# --------------------------------------------------------------------------
# The reference pieces directly
# --------------------------------------------------------------------------


def test_train_ref_returns_biased_statistics():
    x = _randn((3, 2, 4), torch.float64, seed=51)
    y, mean, rstd, mean_c, var_c = bn_ops.batch_norm_train_ref(x, None, None, 1e-5)
    xc = x.transpose(0, 1).reshape(2, -1)
    torch.testing.assert_close(mean_c, xc.mean(dim=1))
    torch.testing.assert_close(var_c, xc.var(dim=1, correction=0))
    assert mean.shape == rstd.shape == (1, 2, 1)
    torch.testing.assert_close(rstd.reshape(-1), 1 / torch.sqrt(xc.var(dim=1, correction=0) + 1e-5))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_memory_format_rule_matches_torch(layout):
    x = _layout(layout, torch.float32)
    expected = TF.batch_norm(x, None, None, training=True)
    fmt = output_memory_format(x)
    assert torch.empty(x.shape).contiguous(memory_format=fmt).stride() == expected.stride()


def test_entry_point_with_ref_backend():
    x = _randn((4, 3), torch.float64)
    w, b, rm, rv = _params(3, torch.float64)
    y = bn_ops.ref_batch_norm(x, rm.clone(), rv.clone(), w, b, True, 0.1, 1e-5)
    torch.testing.assert_close(y, TF.batch_norm(x, rm.clone(), rv.clone(), w, b, True))


def test_entry_point_empty_batch_in_training_like_torch():
    """torch accepts N=0 in training: empty output, zero dw/db, running stats untouched.

    (normlab.functional.batch_norm rejects it today; this is its path entry's side.)
    """
    x = torch.randn(0, 3, 2, 2, requires_grad=True)
    w, b = torch.ones(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    rm, rv = torch.zeros(3), torch.ones(3)
    yt = TF.batch_norm(x, rm.clone(), rv.clone(), w, b, True)
    dwt, dbt = torch.autograd.grad(yt.sum(), (w, b))
    for path in (REF, EAGER):  # the reference and the kernels' entry
        y = batch_norms._batch_norm_path(path, x, rm, rv, w, b, True, 0.1, 1e-5)
        assert y.shape == yt.shape == x.shape and y.dtype == yt.dtype
        dw, db = torch.autograd.grad(y.sum(), (w, b))
        assert torch.equal(dw, dwt) and torch.equal(db, dbt)
        assert torch.equal(rm, torch.zeros(3)) and torch.equal(rv, torch.ones(3))
