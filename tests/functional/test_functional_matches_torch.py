"""Where torch.nn.functional computes, normlab computes the same; where it raises, so does normlab.

Oracle: torch.nn.functional itself, on the same inputs.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

import normlab
import normlab.functional as NF

BACKENDS = ["ref", "cpu"]
# (input dtype, weight dtype): torch's rms_norm takes any float weight, with type promotion
MIXED = [
    (torch.float64, torch.float32),
    (torch.float32, torch.float64),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.bfloat16),
]


def _ulp(dtype):
    return torch.finfo(dtype).eps


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_dtype,w_dtype", MIXED)
def test_rms_norm_weight_of_another_dtype(backend, x_dtype, w_dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 3, 8, dtype=torch.float64).to(x_dtype).requires_grad_()
    w = torch.randn(8, dtype=torch.float64).to(w_dtype).requires_grad_()
    dy = torch.randn(5, 3, 8, dtype=torch.float64).to(x_dtype)
    want = F.rms_norm(x, (8,), w)
    with normlab.use_backend(backend):
        got = NF.rms_norm(x, (8,), w)
    assert got.dtype == want.dtype == x_dtype
    gx, gw = torch.autograd.grad(got, (x, w), dy)
    tx, tw = torch.autograd.grad(want, (x, w), dy)
    assert gw.dtype == tw.dtype == w_dtype
    # both round x_hat to the input's dtype before the weight: they may differ by that rounding
    # (an ulp of x_hat, times |w| <= ~3) and the final one
    tol = 8 * _ulp(x_dtype)
    for a, b in ((got, want), (gx, tx)):
        scale = b.double().abs().max().item()
        assert (a.double() - b.double()).abs().max().item() <= tol * max(scale, 1.0)
    scale = tw.double().abs().max().item()
    assert (gw.double() - tw.double()).abs().max().item() <= 8 * max(_ulp(x_dtype), _ulp(w_dtype)) * max(scale, 1.0) * 15


def test_rms_norm_module_with_weight_of_another_dtype():
    m = normlab.nn.RMSNorm(8)  # float32 weight
    t = torch.nn.RMSNorm(8)
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x), t(x), rtol=1e-12, atol=1e-12)  # float64 product, float64 out
    assert m(x).dtype == torch.float64


def test_rms_norm_weight_of_another_dtype_keeps_the_shape_check():
    with pytest.raises(RuntimeError, match="rms_norm: expected weight of shape"):
        NF.rms_norm(torch.randn(4, 8), (8,), torch.ones(7, dtype=torch.float64))
    with pytest.raises(RuntimeError):
        F.rms_norm(torch.randn(4, 8), (8,), torch.ones(7, dtype=torch.float64))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("eps", [0.0, -1e-5])
def test_batch_norm_training_needs_positive_eps(backend, eps):
    x = torch.randn(4, 3)
    with pytest.raises(ValueError):
        F.batch_norm(x, None, None, training=True, eps=eps)
    with normlab.use_backend(backend), pytest.raises(ValueError, match="batch_norm: expected eps > 0 in training"):
        NF.batch_norm(x, None, None, training=True, eps=eps)
    with pytest.raises(ValueError, match="BatchNorm1d: expected eps to be a non-negative number") if eps < 0 else nullcontext():
        normlab.nn.BatchNorm1d(3, eps=eps)  # a negative eps is refused at construction
    m = normlab.nn.BatchNorm1d(3)
    m.eps = eps  # set afterwards: the forward refuses it too, before any update
    before = m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone()
    with normlab.use_backend(backend), pytest.raises(ValueError):
        m(x)
    assert all(torch.equal(a, b) for a, b in zip(before, (m.running_mean, m.running_var, m.num_batches_tracked)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_eval_with_zero_eps_computes(backend):
    x = torch.randn(4, 3, dtype=torch.float64)
    rm, rv = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    with normlab.use_backend(backend):
        got = NF.batch_norm(x, rm, rv, training=False, eps=0.0)
    torch.testing.assert_close(got, F.batch_norm(x, rm, rv, training=False, eps=0.0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("use_input_stats", [True, False])
def test_instance_norm_without_channels(backend, use_input_stats):
    x = torch.randn(2, 0, 5, requires_grad=True)
    w = torch.ones(0, requires_grad=True)
    b = torch.zeros(0, requires_grad=True)
    rm, rv = torch.zeros(0), torch.ones(0)
    # torch 2.13 gives an empty output without weight, bias and running statistics, and fails
    # inside its kernel (an IndexError) with 0-channel ones; normlab returns the empty output
    # in every case
    want = F.instance_norm(x)
    with normlab.use_backend(backend):
        got = NF.instance_norm(x, rm, rv, w, b, use_input_stats=use_input_stats)
    assert got.shape == want.shape and got.dtype == want.dtype
    grads = torch.autograd.grad(got.sum(), (x, w, b))
    assert [g.shape for g in grads] == [x.shape, w.shape, b.shape]
    for cls in (normlab.nn.InstanceNorm1d,):
        m = cls(0, affine=True, track_running_stats=True)
        assert m(x).shape == x.shape and m.eval()(x).shape == x.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_momentum_none_under_fullgraph_compile(backend):
    """``momentum=None`` (the cumulative average) traces as one graph and updates as torch's eager module."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = normlab.nn.BatchNorm1d(3, momentum=None)
    t = torch.nn.BatchNorm1d(3, momentum=None)
    xs = [torch.randn(8, 3) * (k + 1) + k for k in range(3)]
    with normlab.use_backend(backend):
        f = torch.compile(m, fullgraph=True, backend="eager")
        for x in xs:
            torch.testing.assert_close(f(x), t(x), rtol=1e-5, atol=1e-5)
    assert int(m.num_batches_tracked) == 3
    # the plain average of the three batches' statistics
    torch.testing.assert_close(m.running_mean, t.running_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(m.running_var, t.running_var, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(m.running_mean, torch.stack([x.mean(0) for x in xs]).mean(0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_normalized_shape_must_name_the_trailing_dims(backend):
    """(4, 6) with normalized_shape (3,): 3 divides the 24 values evenly, yet it does not name
    the trailing dim, so torch raises -- and so must every row norm, on every backend (a
    reshape to (-1, 3) would silently normalise other rows)."""
    x, r = torch.randn(4, 6), torch.randn(4, 6)
    w = torch.ones(3)
    with pytest.raises(RuntimeError):
        F.layer_norm(x, (3,))
    with pytest.raises(RuntimeError):
        F.rms_norm(x, (3,))
    calls = {
        "layer_norm": lambda: NF.layer_norm(x, (3,)),
        "layer_norm weight": lambda: NF.layer_norm(x, (3,), w, w),
        "rms_norm": lambda: NF.rms_norm(x, (3,)),
        "rms_norm weight": lambda: NF.rms_norm(x, (3,), w),
        "add_layer_norm": lambda: NF.add_layer_norm(x, r, (3,)),
        "add_layer_norm weight": lambda: NF.add_layer_norm(x, r, (3,), w, w),
        "add_rms_norm": lambda: NF.add_rms_norm(x, r, (3,)),
        "add_rms_norm weight": lambda: NF.add_rms_norm(x, r, (3,), w),
    }
    for name, call in calls.items():
        with normlab.use_backend(backend), pytest.raises(RuntimeError, match=r"expected input with shape \[\*, 3\]"):
            call()


def _cases():
    """(name, normlab call, torch call, input shape, parameter shape): float64, every family, train and eval."""
    rm, rv = torch.randn(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64) + 0.5
    res = torch.randn(3, 5, 4, dtype=torch.float64)
    return [
        ("layer_norm", lambda x, w, b: NF.layer_norm(x, (4,), w, b), lambda x, w, b: F.layer_norm(x, (4,), w, b),
         (3, 5, 4)),
        ("rms_norm", lambda x, w, b: NF.rms_norm(x, (4,), w) + b, lambda x, w, b: F.rms_norm(x, (4,), w) + b,
         (3, 5, 4)),
        ("batch_norm train", lambda x, w, b: NF.batch_norm(x, None, None, w, b, True),
         lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (6, 4, 3)),
        ("batch_norm eval", lambda x, w, b: NF.batch_norm(x, rm, rv, w, b, False),
         lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False), (6, 4, 3)),
        ("group_norm", lambda x, w, b: NF.group_norm(x, 2, w, b), lambda x, w, b: F.group_norm(x, 2, w, b),
         (3, 4, 5)),
        ("instance_norm train", lambda x, w, b: NF.instance_norm(x, None, None, w, b, True),
         lambda x, w, b: F.instance_norm(x, None, None, w, b, True), (3, 4, 5)),
        ("instance_norm eval", lambda x, w, b: NF.instance_norm(x, rm, rv, w, b, False),
         lambda x, w, b: F.instance_norm(x, rm, rv, w, b, False), (3, 4, 5)),
        # the fused adds: both outputs used, so the gradient reaches x through y and through h
        ("add_layer_norm", lambda x, w, b: _both(NF.add_layer_norm(x, res, (4,), w, b)),
         lambda x, w, b: _both((F.layer_norm(x + res, (4,), w, b), x + res)), (3, 5, 4)),
        ("add_rms_norm", lambda x, w, b: _both(NF.add_rms_norm(x, res, (4,), w)) + b,
         lambda x, w, b: _both((F.rms_norm(x + res, (4,), w), x + res)) + b, (3, 5, 4)),
    ]


def _both(pair):
    y, h = pair
    return y + 0.5 * h * h


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", range(len(_cases())), ids=[c[0] for c in _cases()])
def test_first_order_gradients_with_create_graph_match_torch(backend, case):
    """The differentiable (``create_graph=True``) backward gives torch's first-order gradients,
    in training and in eval mode, and its second-order ones."""
    name, ours, theirs, shape = _cases()[case]
    torch.manual_seed(case)
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 1).requires_grad_()
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(shape, dtype=torch.float64)
    with normlab.use_backend(backend):
        got = torch.autograd.grad(ours(x, w, b), (x, w, b), dy, create_graph=True)
        got2 = torch.autograd.grad(sum((g * g).sum() for g in got), (x, w), allow_unused=True)
    want = torch.autograd.grad(theirs(x, w, b), (x, w, b), dy, create_graph=True)
    want2 = torch.autograd.grad(sum((g * g).sum() for g in want), (x, w), allow_unused=True)
    for g, t in zip(got, want):
        torch.testing.assert_close(g, t, rtol=1e-9, atol=1e-9)
    for g, t in zip(got2, want2):
        torch.testing.assert_close(g, t, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("case", range(len(_cases())), ids=[c[0] for c in _cases()])
def test_ref_forward_matches_torch(case):
    """``"ref"`` serves every tensor the cpu kernels do not (other devices): checked directly."""
    name, ours, theirs, shape = _cases()[case]
    torch.manual_seed(100 + case)
    x = torch.randn(shape, dtype=torch.float64) * 3 - 2
    w, b = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    with normlab.use_backend("ref"):
        got = ours(x, w, b)
    torch.testing.assert_close(got, theirs(x, w, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grad", [False, True], ids=["no grad", "grad"])
def test_running_statistics_update_moves_each_version_counter_once(backend, grad):
    """One rule on every path: an update of the running statistics is one in-place write of
    each buffer, seen by autograd's version counter (the reference path writes with ``copy_``,
    the kernels through the buffer's address)."""
    x = torch.randn(4, 3, 5, requires_grad=grad)
    calls = {
        "batch_norm": lambda rm, rv: NF.batch_norm(x, rm, rv, training=True),
        "instance_norm": lambda rm, rv: NF.instance_norm(x, rm, rv, use_input_stats=True),
    }
    for name, call in calls.items():
        rm, rv = torch.zeros(3), torch.ones(3)
        with normlab.use_backend(backend):
            call(rm, rv)
        assert (rm._version, rv._version) == (1, 1), name
        assert not torch.equal(rm, torch.zeros(3)), name  # it did update
