"""normlab's twins of timm's RmsNorm2d, SimpleNorm(2d), EvoNorm2dB0/S0 and FilterResponseNorm*2d
against faithful stand-ins of timm's classes (``timm_standins.py``, the oracle: timm's own forward in
torch ops, autograd's gradients), and ``normlab.convert`` / ``revert`` on them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab
from normlab.tools import timm as nl_timm
from tests.tools import timm_standins as T

BACKENDS = ["ref"] + (["cpu"] if "cpu" in normlab.available_backends() else [])

# name -> (constructor args, input shape)
CASES = {
    "RmsNorm2d": ((6,), {}, (3, 6, 4, 5)),
    "SimpleNorm": ((5,), {}, (3, 6, 4, 5)),
    "SimpleNorm2d": ((6,), {}, (3, 6, 4, 5)),
    "FilterResponseNormTlu2d": ((6,), {}, (3, 6, 4, 5)),
    "FilterResponseNormAct2d": ((6,), {"act_layer": "silu"}, (3, 6, 4, 5)),
    "EvoNorm2dB0": ((6,), {}, (3, 6, 4, 5)),
    "EvoNorm2dS0": ((6,), {"groups": 3}, (3, 6, 4, 5)),
}


def _pair(name, dtype=torch.float64, **extra):
    args, kwargs, _ = CASES[name]
    kwargs = {**kwargs, **extra}
    torch.manual_seed(0)
    timm_m = getattr(T, name)(*args, **kwargs).to(dtype)
    with torch.no_grad():  # parameters away from their identity values (tau, bias: both signs)
        for p in timm_m.parameters():
            p.add_(0.4 * torch.randn_like(p))
    ours = getattr(normlab.nn, name)(*args, **kwargs).to(dtype)
    ours.load_state_dict(timm_m.state_dict(), strict=True)
    return timm_m, ours


def _grads(m, x, dy):
    y = m(x)
    return (y, *torch.autograd.grad(y, [x, *m.parameters()], dy))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("name", list(CASES))
def test_module_matches_timm_in_float64(name, training, fmt, backend):
    timm_m, ours = _pair(name)
    timm_m.train(training)
    ours.train(training)
    x = torch.randn(CASES[name][2], dtype=torch.float64).contiguous(memory_format=fmt).requires_grad_()
    dy = torch.randn(CASES[name][2], dtype=torch.float64)
    want = _grads(timm_m, x, dy)
    with normlab.use_backend(backend):
        got = _grads(ours, x, dy)
    # timm computes FRN's and EvoNorm's statistics in float32 (x.float()): 1e-6 of float32 rounding
    tol = 1e-12 if name in ("RmsNorm2d", "SimpleNorm", "SimpleNorm2d") else 2e-6
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=f"{name} output/grad {i}")
    for (k, b_ours), b_timm in zip(ours.named_buffers(), timm_m.buffers()):
        torch.testing.assert_close(b_ours, b_timm, rtol=1e-7, atol=1e-7, msg=k)  # B0's running_var
    if fmt == torch.channels_last and name not in ("SimpleNorm",):
        assert got[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_low_precision_within_twice_the_rounding_of_float64(name, dtype):
    """The output in ``dtype`` against timm's module in float64 (the exact value): the error is at
    most twice the rounding error of ``dtype`` (half an ulp, relative) at each value."""
    timm_m, ours = _pair(name)
    ours = ours.to(dtype)
    if name == "FilterResponseNormAct2d":  # the norm's rounding: the activation after it is torch's own op
        timm_m.act = ours.act = nn.Identity()
    timm_m.train(False)
    ours.train(False)
    x = torch.randn(CASES[name][2], dtype=torch.float64)
    xd = x.to(dtype)
    exact = timm_m(xd.double())  # the same rounded input, in float64
    got = ours(xd).double()
    ulp_half = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}[dtype]
    p_round = max((p.to(dtype).double() - p).abs().max().item() for p in timm_m.parameters())
    bound = 2 * ulp_half * exact.abs() + 4 * p_round * (exact.abs() + 1) + 1e-30
    assert ((got - exact).abs() <= bound).all(), (got - exact).abs().max()


def test_state_dict_keys_are_timms_and_load_strictly():
    for name, (args, kwargs, _) in CASES.items():
        a = getattr(T, name)(*args, **kwargs)
        b = getattr(normlab.nn, name)(*args, **kwargs)
        assert list(b.state_dict()) == list(a.state_dict()), name
        b.load_state_dict(a.state_dict(), strict=True)
        a.load_state_dict(b.state_dict(), strict=True)
    for name, kw in [("FilterResponseNormTlu2d", {"apply_act": False}), ("EvoNorm2dB0", {"apply_act": False}),
                     ("EvoNorm2dS0", {"apply_act": False}), ("FilterResponseNormAct2d", {"act_layer": nn.PReLU}),
                     ("RmsNorm2d", {"affine": False}), ("EvoNorm2dS0", {"group_size": 2})]:
        a, b = getattr(T, name)(6, **kw), getattr(normlab.nn, name)(6, **kw)
        assert list(b.state_dict()) == list(a.state_dict()), (name, kw)
        assert getattr(b, "groups", None) == getattr(a, "groups", None)


@pytest.mark.filterwarnings(r"ignore:var\(\). degrees of freedom:UserWarning")
def test_simple_norm_of_one_value_is_nan_as_timm():
    x = torch.randn(4, 1, dtype=torch.float64)
    want = T.SimpleNorm(1).double()(x)
    got = normlab.nn.SimpleNorm(1).double()(x)
    assert want.isnan().all() and got.isnan().all()


@pytest.mark.parametrize("act", ["relu", "silu", "gelu", "gelu_tanh", "leaky_relu", nn.ELU, nn.PReLU])
def test_frn_act_activations(act):
    ours = normlab.nn.FilterResponseNormAct2d(3, act_layer=act, inplace=True).double()
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    z = normlab.functional.filter_response_norm(x, ours.weight, ours.bias)
    want = {"relu": torch.relu, "silu": nn.functional.silu, "gelu": nn.functional.gelu,
            "gelu_tanh": lambda t: nn.functional.gelu(t, approximate="tanh"),
            "leaky_relu": nn.functional.leaky_relu, nn.ELU: nn.functional.elu,
            nn.PReLU: lambda t: nn.functional.prelu(t, torch.tensor([0.25], dtype=torch.float64))}[act](z)
    torch.testing.assert_close(ours(x), want)


def test_bad_arguments_are_refused_with_the_fix():
    NN = normlab.nn
    with pytest.raises(ValueError, match=r"unknown activation 'swishy'; expected one of .*relu.*silu"):
        NN.FilterResponseNormAct2d(4, act_layer="swishy")
    with pytest.raises(TypeError, match=r"expected act_layer to be an activation name .* got 3"):
        NN.FilterResponseNormAct2d(4, act_layer=3)
    with pytest.raises(ValueError, match=r"expected num_features \(6\) to be divisible by groups \(4\)"):
        NN.EvoNorm2dS0(6, groups=4)
    with pytest.raises(ValueError, match=r"divisible by groups \(32\)"):
        NN.EvoNorm2dS0(16)  # timm's default groups=32 does not divide 16 channels
    with pytest.raises(ValueError, match=r"expected num_features \(6\) to be divisible by group_size \(4\)"):
        NN.EvoNorm2dS0(6, group_size=4)
    with pytest.raises(ValueError, match=r"expected momentum in \[0, 1\]"):
        NN.EvoNorm2dB0(4, momentum=2.0)
    with pytest.raises(ValueError, match=r"expected eps to be a non-negative number, got -1"):
        NN.RmsNorm2d(4, eps=-1)
    with pytest.raises(TypeError, match=r"expected channels to be an int .* got \(4,\)"):
        NN.SimpleNorm2d((4,))
    with pytest.raises(TypeError, match=r"expected apply_act to be a bool, got 'yes'"):
        NN.FilterResponseNormTlu2d(4, apply_act="yes")
    with pytest.raises(ValueError, match=r"expected a 4-D input \(N, C, H, W\), got input of shape \[2, 4, 5\]"):
        NN.FilterResponseNormTlu2d(4)(torch.randn(2, 4, 5))
    with pytest.raises(RuntimeError, match=r"expected weight of shape \[5\] .* got weight of shape \[4\]"):
        NN.RmsNorm2d(4)(torch.randn(2, 5, 3, 3))
    with pytest.raises(ValueError, match=r"expected the input's channels \(6\) to be divisible by groups \(4\)"):
        normlab.functional.evo_norm2d_s0(torch.randn(2, 6, 3, 3), 4, v=torch.ones(6))
    with pytest.raises(ValueError, match=r"expected more than 1 value per channel when training"):
        NN.EvoNorm2dB0(4)(torch.randn(1, 4, 1, 1))
    with pytest.raises(ValueError, match=r"expected running_var in eval"):
        normlab.functional.evo_norm2d_b0(torch.randn(2, 4, 3, 3), None, v=torch.ones(4))


# -- convert / revert ------------------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.rms = T.RmsNorm2d(8)
        self.simple2d = T.SimpleNorm2d(8)
        self.frn = T.FilterResponseNormTlu2d(8)
        self.frn_act = T.FilterResponseNormAct2d(8, act_layer=nn.PReLU)
        self.b0 = T.EvoNorm2dB0(8)
        self.s0 = T.EvoNorm2dS0(8, groups=4)
        self.simple = T.SimpleNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.stem(x)
        for m in (self.rms, self.simple2d, self.frn, self.frn_act, self.b0, self.s0):
            h = m(h)
        return self.head(self.simple(h.mean((2, 3))))


def _net():
    torch.manual_seed(0)
    net = Net().double()
    with torch.no_grad():
        for n, p in net.named_parameters():
            if not n.startswith(("stem", "head")):
                p.add_(0.3 * torch.randn_like(p))
    return net


KINDS = {"rms": "RmsNorm2d", "simple2d": "SimpleNorm2d", "frn": "FilterResponseNormTlu2d",
         "frn_act": "FilterResponseNormAct2d", "b0": "EvoNorm2dB0", "s0": "EvoNorm2dS0", "simple": "SimpleNorm"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_convert_keeps_parameters_outputs_gradients_and_running_var(backend):
    ref, net = _net(), _net()
    params = dict(net.named_parameters())
    keys = list(net.state_dict())
    normlab.convert(net)
    for attr, cls in KINDS.items():
        assert type(getattr(net, attr)) is getattr(normlab.nn, cls), attr
    assert net.frn_act.act is net.frn_act.act and isinstance(net.frn_act.act, nn.PReLU)
    assert all(p is params[n] for n, p in net.named_parameters())
    assert list(net.state_dict()) == keys
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    for _ in range(2):  # training steps: outputs, gradients and B0's running variance agree
        with normlab.use_backend(backend):
            y = net(x)
        y_ref = ref(x)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
        y.square().sum().backward()
        y_ref.square().sum().backward()
        for (n, p), p_ref in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-5, atol=1e-6, msg=n)
            p.grad = p_ref.grad = None
    torch.testing.assert_close(net.b0.running_var, ref.b0.running_var, rtol=1e-6, atol=1e-7)
    net.eval()
    ref.eval()
    torch.testing.assert_close(net(x), ref(x), rtol=1e-5, atol=1e-6)


def test_revert_gives_timms_modules_back_with_current_state():
    net = _net()
    originals = {a: getattr(net, a) for a in KINDS}
    act = net.frn_act.act
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    normlab.convert(net)
    net(x)  # a training step moves B0's running_var
    rv = net.b0.running_var.clone()
    net.b0.eps, net.s0.eps, net.b0.momentum = 1e-2, 1e-3, 0.2
    normlab.revert(net)
    for a, m in originals.items():
        assert getattr(net, a) is m, a
    assert net.frn_act.act is act
    assert net.b0.eps == 1e-2 and net.s0.eps == 1e-3 and net.b0.momentum == 0.2
    torch.testing.assert_close(net.b0.running_var, rv, rtol=0, atol=0)


def test_timm_classes_are_recognised_by_module_name_and_base():
    for name, cls in T.CLASSES.items():
        assert nl_timm.kind_of(cls) == name

    class Sub(T.RmsNorm2d):
        pass

    assert nl_timm.kind_of(Sub) is None
    Moved = type("EvoNorm2dB0", (nn.Module,), {"__module__": "timm.layers.norm"})  # the wrong timm module
    assert nl_timm.kind_of(Moved) is None


def test_instances_normlab_cannot_express_are_left_alone():
    fast = T.RmsNorm2d(4)
    fast._fast_norm = True
    odd_groups = T.EvoNorm2dS0(6, groups=4)  # timm fails at its first forward
    rms_biased = T.SimpleNorm2d(4)
    rms_biased.bias = nn.Parameter(torch.zeros(4))
    b0_bad_momentum = T.EvoNorm2dB0(4, momentum=1.5)
    model = nn.Sequential(fast, odd_groups, rms_biased, b0_bad_momentum)
    normlab.convert(model)
    assert list(model) == [fast, odd_groups, rms_biased, b0_bad_momentum]


def test_scale_norm2d_twins_lay_out_their_output_as_timm():
    """timm's SimpleNorm2d permutes, but its elementwise ops keep the permuted view's layout, so
    its output is in the input's format, as its twin's (no channels_last_output); RmsNorm2d does
    not permute. Both layouts in, each twin's strides as timm's."""
    for name, fmt in (("SimpleNorm2d", torch.contiguous_format), ("SimpleNorm2d", torch.channels_last),
                      ("RmsNorm2d", torch.contiguous_format), ("RmsNorm2d", torch.channels_last)):
        timm_m, _ = _pair(name, torch.float32)
        x = torch.randn(CASES[name][2]).contiguous(memory_format=fmt)
        want = timm_m(x)
        twin = normlab.convert(timm_m)
        assert not getattr(twin, "channels_last_output", False), name
        y = twin(x)
        assert y.stride() == want.stride(), name
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
