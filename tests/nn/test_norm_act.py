"""The norm+act Modules and functions (``normlab.nn.BatchNormAct2d``, ...; ``normlab.functional.*_act``)
against timm's classes (faithful stand-ins, tests/tools/timm_norm_act_standins.py) run in float64:
values and gradients within the project's accuracy rule (2x the error of the unfused torch path in
the same dtype, and at least the rounding error), the same bits as normlab's own norm then torch's
activation where the dtype allows, float64 gradcheck of the reference and of the fused kernels,
the same bits on 1 and 2 threads, state_dict loading both ways, memory, and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import normlab
import normlab.functional as NF
import normlab.nn as NN
from normlab.nn._activations import act_of, make_act
from normlab.ops import activation as A
from tests.oracle import rel_err, rounding_err, saved_bytes_beyond_inputs
from tests.tools import timm_norm_act_standins as T

HAS_FUSED = "cpu" in normlab.available_backends()  # (the fused ops come with the C++ extension)

ACTS = ["identity", "relu", "leaky_relu", "silu", "gelu", "gelu_tanh", "hardswish", "tanh"]
# activations whose output torch computes exactly from z (piecewise linear): the same bits
EXACT = {"identity", "relu", "leaky_relu", "hardswish"}
needs_cpu = pytest.mark.skipif(not HAS_FUSED, reason="the fused C++ ops are not built")


def _x(shape, dtype=torch.float32, seed=0, fmt=None):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.3).to(dtype)
    return t.contiguous(memory_format=fmt) if fmt is not None else t


TIGHT = {torch.float32: 1e-5, torch.float64: 1e-12}


def _rule(got, ref64, torch_got, what):
    """got within 2x the larger of the unfused torch path's error and the rounding error (the
    project's rule), or within the tight float32/float64 bound the other families' tests use."""
    bound = max(2 * rel_err(torch_got, ref64), 2 * rounding_err(ref64, got.dtype), TIGHT.get(got.dtype, 0.0))
    err = rel_err(got, ref64)
    assert err <= bound, f"{what}: relative error {err:.3e} > {bound:.3e}"


# -- the activation table ----------------------------------------------------------------------


@pytest.mark.parametrize("spec,kwargs,want", [
    ("relu", None, (A.RELU, 0.0)), ("ReLU", None, (A.RELU, 0.0)), ("silu", None, (A.SILU, 0.0)),
    ("swish", None, (A.SILU, 0.0)), ("gelu", None, (A.GELU, 0.0)), ("gelu_tanh", None, (A.GELU_TANH, 0.0)),
    ("hard_swish", None, (A.HARDSWISH, 0.0)), ("hardswish", None, (A.HARDSWISH, 0.0)), ("tanh", None, (A.TANH, 0.0)),
    ("identity", None, (A.IDENTITY, 0.0)), (None, None, (A.IDENTITY, 0.0)), ("", None, (A.IDENTITY, 0.0)),
    ("leaky_relu", {"negative_slope": 0.2}, (A.LEAKY_RELU, 0.2)), (nn.LeakyReLU, None, (A.LEAKY_RELU, 0.01)),
    (nn.ReLU, None, (A.RELU, 0.0)), (nn.SiLU, None, (A.SILU, 0.0)), (nn.GELU, {"approximate": "tanh"}, (A.GELU_TANH, 0.0)),
    (nn.Hardswish, None, (A.HARDSWISH, 0.0)), (nn.Tanh, None, (A.TANH, 0.0)), (nn.Identity, None, (A.IDENTITY, 0.0)),
    (T.GELU, None, (A.GELU, 0.0)), (T.GELUTanh, None, (A.GELU_TANH, 0.0)), (T.Tanh, None, (A.TANH, 0.0)),
    (nn.LeakyReLU(0.3), None, (A.LEAKY_RELU, 0.3)), (nn.GELU(), None, (A.GELU, 0.0)),
])
def test_activation_table(spec, kwargs, want):
    m = make_act("X", spec, kwargs)
    a, p = act_of(m)
    assert (A.ID[a], pytest.approx(p)) == want
    # and the Module computes what the id's reference computes
    z = torch.linspace(-5, 5, 101, dtype=torch.float64)
    torch.testing.assert_close(m(z.clone()), A.act_forward(z, A.ID[a], p), rtol=1e-12, atol=1e-12)


def test_apply_act_false_is_identity():
    assert isinstance(make_act("X", nn.SiLU, apply_act=False), nn.Identity)
    assert isinstance(NN.BatchNormAct2d(3, apply_act=False).act, nn.Identity)


@pytest.mark.parametrize("spec,exc,words", [
    ("mish", ValueError, r"unknown activation name 'mish'; expected one of: names 'identity', 'relu'"),
    (nn.Mish, ValueError, r"unknown activation class Mish; expected one of"),
    (nn.ELU(), ValueError, r"unknown activation ELU\(alpha=1.0\); expected one of"),
    (nn.GELU, None, None),
    (3, TypeError, r"expected act_layer to be a name, an activation Module class or instance, or None, got int"),
])
def test_unknown_activation(spec, exc, words):
    if exc is None:
        with pytest.raises(ValueError, match=r"unknown activation GELU\(approximate='nope'\)"):
            NN.BatchNormAct2d(3, act_layer=spec, act_kwargs={"approximate": "nope"})
        return
    with pytest.raises(exc, match=words) as info:
        NN.BatchNormAct2d(3, act_layer=spec)
    assert "BatchNormAct2d: " in str(info.value)
    if exc is ValueError:
        assert "apply_act=False" in str(info.value)  # the fix


def test_functional_unknown_activation():
    x = _x((2, 3, 4))
    with pytest.raises(ValueError, match=r"batch_norm_act: unknown activation 'mish'; expected one of: identity, relu"):
        NF.batch_norm_act(x, None, None, training=True, act="mish")
    with pytest.raises(TypeError, match=r"group_norm_act: expected act to be an activation name"):
        NF.group_norm_act(x, 3, act=nn.ReLU)
    with pytest.raises(ValueError, match=r"layer_norm_act: expected negative_slope to be a finite float, got nan"):
        NF.layer_norm_act(x, (4,), act="leaky_relu", negative_slope=float("nan"))


def test_instance_with_act_kwargs_refused():
    with pytest.raises(ValueError, match=r"expected act_kwargs only with an act_layer name or class"):
        NN.GroupNormAct(4, 2, act_layer=nn.ReLU(), act_kwargs={"inplace": False})


@pytest.mark.parametrize("act", ACTS)
def test_derivative_is_the_activations_derivative(act):
    """act_derivative (hand-written) against autograd of torch's activation, float64."""
    z = torch.cat([torch.linspace(-6, 6, 241, dtype=torch.float64), torch.tensor([-3.0, 3.0, 1e-3, -1e-3],
                                                                                  dtype=torch.float64)])
    z = z[(z != 0) & (z.abs() != 3)] if act in ("relu", "leaky_relu", "hardswish") else z  # the kinks
    zr = z.clone().requires_grad_()
    (g,) = torch.autograd.grad(A.act_forward(zr, A.ID[act], 0.2).sum(), zr)
    torch.testing.assert_close(A.act_derivative(z, A.ID[act], 0.2), g, rtol=1e-12, atol=1e-14)


# -- the Modules against timm's ----------------------------------------------------------------

def _pair(kind, act, c=8, **kw):
    """(normlab module, timm stand-in) with the same random parameters and statistics."""
    torch.manual_seed(3)
    mk = {"BatchNormAct2d": (NN.BatchNormAct2d, T.BatchNormAct2d, {}),
          "FrozenBatchNormAct2d": (NN.FrozenBatchNormAct2d, T.FrozenBatchNormAct2d, {}),
          "GroupNormAct": (NN.GroupNormAct, T.GroupNormAct, {"num_groups": 4}),
          "LayerNormAct": (NN.LayerNormAct, T.LayerNormAct, {}),
          "LayerNormAct2d": (NN.LayerNormAct2d, T.LayerNormAct2d, {})}[kind]
    args = dict(mk[2], **kw)
    act_layer, act_kwargs = (act, None) if act != "leaky_relu" else ("leaky_relu", {"negative_slope": 0.2})
    ours = mk[0](c, act_layer=act_layer, act_kwargs=dict(act_kwargs or {}), **args)
    theirs = mk[1](c, act_layer=act_layer, act_kwargs=dict(act_kwargs or {}), **args)
    sd = theirs.state_dict()
    for k, v in sd.items():
        if v.is_floating_point():
            v.copy_(torch.rand_like(v) + 0.5 if "var" in k or "weight" in k else torch.randn_like(v) * 0.3)
    ours.load_state_dict(sd, strict=True)
    return ours, theirs


SHAPES = {"BatchNormAct2d": (4, 8, 6, 5), "FrozenBatchNormAct2d": (4, 8, 6, 5), "GroupNormAct": (3, 8, 5, 7),
          "LayerNormAct": (6, 5, 8), "LayerNormAct2d": (3, 8, 5, 4)}


def _run(m, x, g):
    x = x.detach().clone().requires_grad_()
    y = m(x)
    grads = torch.autograd.grad((y.float() * g.to(y.dtype).float()).sum(), [x] + [p for p in m.parameters()])
    return y, grads


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("fmt", [None, torch.channels_last])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kind", list(SHAPES))
def test_matches_timm(kind, act, dtype, fmt, training):
    shape = SHAPES[kind]
    if fmt is not None and len(shape) != 4:
        pytest.skip("channels_last: 4-D inputs")
    if not training and kind not in ("BatchNormAct2d",):
        pytest.skip("train and eval are the same")
    ours, theirs = _pair(kind, act)
    ours.train(training), theirs.train(training)
    x = _x(shape, dtype, fmt=fmt)
    g = _x(shape, torch.float64, seed=5)
    ref64 = copy.deepcopy(theirs).double()
    y64, g64 = _run(ref64, x.double(), g)
    tm = copy.deepcopy(theirs).to(dtype) if kind != "BatchNormAct2d" or dtype == torch.float32 else None
    if tm is None:  # torch's BatchNorm keeps float32 parameters for a bf16 input (autocast's way)
        tm = copy.deepcopy(theirs)
    yt, gt = _run(tm, x, g)
    om = ours.to(dtype) if tm is not theirs and kind != "BatchNormAct2d" else ours
    if kind == "BatchNormAct2d" and dtype != torch.float32:
        om = ours  # float32 parameters, as torch's
    y, gr = _run(om, x, g)
    assert y.dtype == dtype and y.shape == x.shape
    _rule(y, y64, yt, f"{kind} {act} output")
    for i, (a, b, c) in enumerate(zip(gr, g64, gt)):
        _rule(a, b, c, f"{kind} {act} gradient {i}")
    if training and kind == "BatchNormAct2d":  # the running statistics as timm's
        for name in ("running_mean", "running_var"):
            torch.testing.assert_close(getattr(om, name).double(), getattr(ref64, name), rtol=1e-5, atol=1e-6)
        assert int(om.num_batches_tracked) == int(ref64.num_batches_tracked) == 1


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("fmt", [None, torch.channels_last])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_batch_norm_act_bits_of_the_unfused_normlab_path(act, training, fmt, dtype):
    """The fused BatchNorm+act gives the bits of normlab's batch_norm followed by torch's activation
    where the activation is exact on the norm's rounded output (identity, relu: every dtype; the
    piecewise-linear ones in float32/float64); the others within the accuracy rule."""
    x = _x((4, 16, 7, 9), dtype, fmt=fmt)
    pd = torch.float64 if dtype == torch.float64 else torch.float32
    w, b = _x((16,), pd, seed=1).abs() + 0.5, _x((16,), pd, seed=2)
    rm, rv = _x((16,), pd, seed=3) * 0.1, _x((16,), pd, seed=4).abs() + 0.5
    slope = 0.2
    y = NF.batch_norm_act(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5, act, slope)
    z = NF.batch_norm(x, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5)
    unfused = A.act_forward(z, A.ID[act], slope)
    assert y.is_contiguous(memory_format=fmt or torch.contiguous_format)
    if act in ("identity", "relu") or (act in EXACT and dtype != torch.bfloat16):
        assert torch.equal(y, unfused)
    else:
        z64 = NF.batch_norm(x.double(), rm.double(), rv.double(), w.double(), b.double(), training, 0.1, 1e-5)
        _rule(y, A.act_forward(z64, A.ID[act], slope), unfused, act)


# -- gradcheck, threads ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("fn", ["batch_norm_act", "batch_norm_act eval", "group_norm_act", "layer_norm_act",
                                "layer_norm_act2d"])
def test_gradcheck(fn, act, backend):
    if backend == "cpu" and "cpu" not in normlab.available_backends():
        pytest.skip("no C++ extension")
    torch.manual_seed(0)
    x = (torch.randn(3, 4, 3, 2, dtype=torch.float64) * 2).requires_grad_()
    w = (torch.rand(4, dtype=torch.float64) + 0.5).requires_grad_()
    b = torch.randn(4, dtype=torch.float64).requires_grad_()
    rm, rv = torch.randn(4, dtype=torch.float64) * 0.1, torch.rand(4, dtype=torch.float64) + 0.5
    call = {
        "batch_norm_act": lambda x, w, b: NF.batch_norm_act(x, None, None, w, b, True, 0.1, 1e-5, act, 0.2),
        "batch_norm_act eval": lambda x, w, b: NF.batch_norm_act(x, rm, rv, w, b, False, 0.1, 1e-5, act, 0.2),
        "group_norm_act": lambda x, w, b: NF.group_norm_act(x, 2, w, b, 1e-5, act, 0.2),
        "layer_norm_act": lambda x, w, b: NF.layer_norm_act(x.reshape(9, 8), (8,), w.repeat(2), b.repeat(2), 1e-5,
                                                            act, 0.2),
        "layer_norm_act2d": lambda x, w, b: NF.layer_norm_act2d(x, w, b, 1e-5, act, 0.2),
    }[fn]
    with normlab.use_backend(backend):
        assert torch.autograd.gradcheck(call, (x, w, b))


@needs_cpu
@pytest.mark.parametrize("fmt", [None, torch.channels_last])
@pytest.mark.parametrize("act", ["silu", "gelu", "relu"])
def test_same_bits_on_one_and_two_threads(act, fmt):
    x = _x((8, 32, 24, 24), fmt=fmt).requires_grad_()
    w, b = _x((32,), seed=1).requires_grad_(), _x((32,), seed=2).requires_grad_()
    g = _x((8, 32, 24, 24), seed=3)
    out = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y = NF.batch_norm_act(x, None, None, w, b, True, 0.1, 1e-5, act)
            out.append((y, *torch.autograd.grad((y * g).sum(), (x, w, b))))
    finally:
        torch.set_num_threads(threads)
    for a, c in zip(*out):
        assert torch.equal(a, c)


@needs_cpu
def test_fused_path_runs_the_fused_op_and_saves_no_more_than_torch():
    from tests.oracle import ops_dispatched

    x = _x((4, 16, 10, 10)).requires_grad_()
    m = NN.BatchNormAct2d(16, act_layer="silu")
    ops, err = ops_dispatched(lambda: m(x))
    assert err is None and "normlab.batch_norm_act_fwd.default" in ops, ops
    ours = saved_bytes_beyond_inputs(lambda: m(x), x)
    t = T.BatchNormAct2d(16, act_layer="silu")
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: kept.append(s) or s, lambda s: s):
        t(x)
    theirs = sum(s.numel() * s.element_size() for s in kept if s.untyped_storage().data_ptr()
                 != x.untyped_storage().data_ptr())
    assert ours <= theirs, (ours, theirs)


# -- state_dict both ways, repr, dropout ------------------------------------------------------------


@pytest.mark.parametrize("kind", list(SHAPES))
def test_state_dict_loads_both_ways(kind):
    ours, theirs = _pair(kind, "silu")
    fresh_ours, fresh_theirs = _pair(kind, "silu")[0], _pair(kind, "silu")[1]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    fresh_theirs.load_state_dict(ours.state_dict(), strict=True)
    fresh_ours.load_state_dict(theirs.state_dict(), strict=True)
    for k, v in theirs.state_dict().items():
        assert torch.equal(fresh_ours.state_dict()[k], v)


def test_frozen_loads_a_batch_norm_checkpoint():
    sd = T.BatchNormAct2d(4).state_dict()
    m = NN.FrozenBatchNormAct2d(4)
    m.load_state_dict(sd, strict=True)  # num_batches_tracked dropped, as timm's does


def test_dropout_between_norm_and_act_as_timm():
    ours, theirs = _pair("BatchNormAct2d", "silu", drop_layer=lambda: nn.Dropout(0.5))
    x = _x((4, 8, 6, 5))
    torch.manual_seed(11)
    y = ours(x)
    torch.manual_seed(11)
    yt = theirs(x)
    torch.testing.assert_close(y, yt, rtol=1e-5, atol=1e-5)


def test_group_size():
    assert NN.GroupNormAct(32, group_size=8).num_groups == 4 == T.GroupNormAct(32, group_size=8).num_groups
    with pytest.raises(ValueError, match=r"GroupNormAct: expected group_size to divide num_channels \(30\)"):
        NN.GroupNormAct(30, group_size=8)


def test_bad_input_words_the_norms_error():
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input\)"):
        NN.BatchNormAct2d(3)(torch.randn(2, 3, 4))
    with pytest.raises(RuntimeError, match=r"expected input with 3 channels"):
        NN.LayerNormAct2d(3)(torch.randn(2, 4, 2, 2))
    with pytest.raises(RuntimeError, match=r"FrozenBatchNormAct2d: expected input with 3 channels"):
        NN.FrozenBatchNormAct2d(3)(torch.randn(2, 4, 2, 2))


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("fmt", [None, torch.channels_last])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_group_norm_act_bits_of_the_unfused_normlab_path(act, fmt, dtype):
    """The fused GroupNorm+act applies the activation to GroupNorm's own output as torch would (the
    piecewise-linear ones: the same bits in every dtype); its gradients within the accuracy rule."""
    x = _x((3, 16, 7, 9), dtype, fmt=fmt).requires_grad_()
    w, b = (_x((16,), dtype, seed=1).abs() + 0.5).requires_grad_(), _x((16,), dtype, seed=2).requires_grad_()
    g = _x((3, 16, 7, 9), dtype, seed=6)
    y = NF.group_norm_act(x, 4, w, b, 1e-5, act, 0.2)
    z = NF.group_norm(x, 4, w, b, 1e-5)
    unfused = A.act_forward(z, A.ID[act], 0.2)
    if act in EXACT:
        assert torch.equal(y, unfused)
    with normlab.use_backend("ref"):
        x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
        y64 = NF.group_norm_act(x64, 4, w64, b64, 1e-5, act, 0.2)
        g64 = torch.autograd.grad((y64 * g.double()).sum(), (x64, w64, b64))
    _rule(y, y64, unfused, act)
    gu = torch.autograd.grad((unfused * g).sum(), (x, w, b))
    for i, (a, r, u) in enumerate(zip(torch.autograd.grad((y * g).sum(), (x, w, b)), g64, gu)):
        _rule(a, r, u, f"{act} gradient {i}")


@needs_cpu
@pytest.mark.parametrize("fmt", [None, torch.channels_last])
def test_group_norm_act_fused_and_thread_independent(fmt):
    from tests.oracle import ops_dispatched

    x = _x((4, 32, 20, 20), fmt=fmt).requires_grad_()
    m = NN.GroupNormAct(32, 8, act_layer="silu")
    ops, err = ops_dispatched(lambda: m(x))
    assert err is None and "normlab.group_norm_act_fwd.default" in ops, ops
    g = _x((4, 32, 20, 20), seed=3)
    out = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y = m(x)
            out.append((y, *torch.autograd.grad((y * g).sum(), (x, m.weight, m.bias))))
    finally:
        torch.set_num_threads(threads)
    for a, c in zip(*out):
        assert torch.equal(a, c)
