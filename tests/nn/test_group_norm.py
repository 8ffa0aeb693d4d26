"""normlab.nn.GroupNorm / InstanceNorm1d/2d/3d as drop-ins for their torch.nn twins."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch import nn

import normlab

PAIRS = [
    (normlab.nn.GroupNorm, nn.GroupNorm),
    (normlab.nn.InstanceNorm1d, nn.InstanceNorm1d),
    (normlab.nn.InstanceNorm2d, nn.InstanceNorm2d),
    (normlab.nn.InstanceNorm3d, nn.InstanceNorm3d),
]
IN_PAIRS = PAIRS[1:]
SPATIAL = {"InstanceNorm1d": (7,), "InstanceNorm2d": (4, 5), "InstanceNorm3d": (3, 2, 4)}

CONFIGS = {
    "GroupNorm": [
        dict(num_groups=2, num_channels=4),
        dict(num_groups=3, num_channels=6, eps=1e-3),
        dict(num_groups=1, num_channels=5, affine=False),
        dict(num_groups=4, num_channels=4, bias=False),
        dict(num_groups=2, num_channels=8, affine=False, bias=False),
    ],
    "InstanceNorm": [
        dict(num_features=3),
        dict(num_features=4, eps=1e-3, momentum=0.3, affine=True),
        dict(num_features=4, affine=True, bias=False),
        dict(num_features=3, track_running_stats=True),
        dict(num_features=5, momentum=None, affine=True, track_running_stats=True),
        dict(num_features=2, momentum=0.5, affine=True, bias=False, track_running_stats=True),
    ],
}


def _configs(theirs):
    return CONFIGS["GroupNorm" if theirs is nn.GroupNorm else "InstanceNorm"]


def _cases(pairs=PAIRS):
    for ours, theirs in pairs:
        for cfg in _configs(theirs):
            yield pytest.param(ours, theirs, cfg, id=f"{theirs.__name__}-{cfg}")


def _channels(cfg):
    return cfg.get("num_channels", cfg.get("num_features"))


def _input(theirs, cfg, n=3, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    spatial = (5, 6) if theirs is nn.GroupNorm else SPATIAL[theirs.__name__]
    return (torch.randn(n, _channels(cfg), *spatial, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)


def _randomise(module, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
        for name, buf in module.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(torch.randn(buf.shape, generator=g, dtype=torch.float64))
            elif name.endswith("running_var"):
                buf.copy_(torch.rand(buf.shape, generator=g, dtype=torch.float64) + 0.5)
            elif name.endswith("num_batches_tracked"):
                buf.fill_(7)


def _copy_sd(sd, version="keep"):
    """A copy of a state_dict with its metadata; ``version=None`` drops the version (pre-0.4)."""
    out = type(sd)(sd)
    out._metadata = {k: dict(v) for k, v in sd._metadata.items()}
    if version is None:
        out._metadata[""].pop("version", None)
    elif version != "keep":
        out._metadata[""]["version"] = version
    return out


def _params_of(cls):
    return [(p.name, p.default, p.kind) for p in inspect.signature(cls.__init__).parameters.values()]


# ----------------------------------------------------------------------------
# construction: signature, parameters, buffers, state_dict keys, repr
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_constructor_signature_matches_torch(ours, theirs):
    """Same argument names, order, kinds (bias is keyword-only) and defaults as torch.nn."""
    assert _params_of(ours) == _params_of(theirs)


@pytest.mark.parametrize("ours,theirs,cfg", list(_cases()))
def test_parameters_buffers_state_dict_and_repr_match_torch(ours, theirs, cfg):
    a, b = ours(**cfg), theirs(**cfg)
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]
    assert [n for n, _ in a.named_buffers()] == [n for n, _ in b.named_buffers()]
    assert list(a.state_dict()) == list(b.state_dict())
    for (_, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q) and p.dtype == q.dtype
    assert repr(a) == repr(b)
    assert a.state_dict()._metadata[""].get("version") == b.state_dict()._metadata[""].get("version")
    for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
        assert (getattr(a, name, None) is None) == (getattr(b, name, None) is None), name
    for attr in ("eps", "affine", "num_groups", "num_channels", "num_features", "momentum", "track_running_stats"):
        assert getattr(a, attr, "absent") == getattr(b, attr, "absent"), attr


def test_repr_text():
    assert repr(normlab.nn.GroupNorm(2, 4)) == "GroupNorm(2, 4, eps=1e-05, affine=True, bias=True)"
    assert repr(normlab.nn.InstanceNorm2d(3)) == (
        "InstanceNorm2d(3, eps=1e-05, momentum=0.1, affine=False, bias=False, track_running_stats=False)"
    )


def test_group_norm_channels_not_divisible_is_a_value_error_at_construction():
    with pytest.raises(ValueError) as theirs:
        nn.GroupNorm(3, 10)
    with pytest.raises(ValueError) as ours:
        normlab.nn.GroupNorm(3, 10)
    assert str(theirs.value) == "num_channels (10) must be divisible by num_groups (3)"
    assert str(ours.value) == f"GroupNorm: {theirs.value}; num_groups that divide 10: 1, 2, 5, 10"


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_factory_kwargs(ours, theirs):
    args = (2, 4) if theirs is nn.GroupNorm else (4,)
    kw = {} if theirs is nn.GroupNorm else {"affine": True, "track_running_stats": True}
    m = ours(*args, dtype=torch.float64, device="cpu", **kw)
    t = theirs(*args, dtype=torch.float64, device="cpu", **kw)
    for (n, p), (_, q) in zip(m.state_dict().items(), t.state_dict().items()):
        assert p.dtype == q.dtype and p.device == q.device, n
    meta = ours(*args, device="meta", **kw)
    assert meta.weight.is_meta


@pytest.mark.parametrize("ours,theirs", IN_PAIRS)
def test_reset_running_stats_and_parameters(ours, theirs):
    m = ours(3, affine=True, track_running_stats=True)
    _randomise(m)
    m.reset_running_stats()
    assert torch.equal(m.running_mean, torch.zeros(3)) and torch.equal(m.running_var, torch.ones(3))
    assert m.num_batches_tracked.item() == 0
    assert not torch.equal(m.weight, torch.ones(3))  # parameters untouched
    _randomise(m)
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(3)) and torch.equal(m.bias, torch.zeros(3))
    assert torch.equal(m.running_mean, torch.zeros(3)) and torch.equal(m.running_var, torch.ones(3))
    g = normlab.nn.GroupNorm(2, 4)
    _randomise(g)
    g.reset_parameters()
    assert torch.equal(g.weight, torch.ones(4)) and torch.equal(g.bias, torch.zeros(4))


# ----------------------------------------------------------------------------
# behaviour: training steps, running statistics, eval, unbatched input
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("ours,theirs,cfg", list(_cases()))
def test_train_then_eval_matches_torch(ours, theirs, cfg):
    """Three SGD steps in train mode (running stats updated), then eval: same as torch."""
    a, b = ours(**cfg), theirs(**cfg)
    _randomise(a)
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        opt = torch.optim.SGD(m.parameters(), lr=0.1) if cfg.get("affine", theirs is nn.GroupNorm) else None
        for step in range(3):
            x = _input(theirs, cfg, n=2 + step, seed=step)
            loss = (m(x) * torch.linspace(-1, 2, x.shape[-1])).pow(2).mean()
            if opt is not None:
                opt.zero_grad()
                loss.backward()
                opt.step()
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")
    if "num_batches_tracked" in a.state_dict():  # torch's InstanceNorm never counts
        assert a.num_batches_tracked.item() == b.num_batches_tracked.item() == 7
    x = _input(theirs, cfg, seed=10)
    for mode in ("eval", "train"):
        getattr(a, mode)()
        getattr(b, mode)()
        with torch.no_grad():
            torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ours,theirs", IN_PAIRS)
def test_eval_uses_running_stats_only_when_tracked(ours, theirs):
    x = _input(theirs, dict(num_features=3), seed=3)
    tracked, untracked = ours(3, track_running_stats=True).eval(), ours(3).eval()
    _randomise(tracked)
    rm, rv = tracked.running_mean.clone(), tracked.running_var.clone()
    shape = (1, 3) + (1,) * (x.dim() - 2)
    expected = (x.double() - rm.double().view(shape)) / torch.sqrt(rv.double().view(shape) + 1e-5)
    torch.testing.assert_close(tracked(x).double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(tracked.running_mean, rm)  # eval never updates
    torch.testing.assert_close(untracked(x), theirs(3).eval()(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ours,theirs", IN_PAIRS)
@pytest.mark.parametrize("affine", [True, False])
def test_unbatched_input_matches_torch(ours, theirs, affine):
    cfg = dict(num_features=3, affine=affine, track_running_stats=True, momentum=0.4)
    a, b = ours(**cfg), theirs(**cfg)
    _randomise(a)
    b.load_state_dict(a.state_dict())
    x = _input(theirs, cfg, n=1, seed=4)[0]  # (C, *spatial)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = a(xa), b(xb)
    assert ya.shape == yb.shape == x.shape
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    ya.backward(dy)
    yb.backward(dy)
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.running_mean, b.running_mean, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(a.running_var, b.running_var, atol=1e-6, rtol=1e-6)
    # unbatched == a batch of one
    assert torch.equal(a.eval()(x), a(x.unsqueeze(0)).squeeze(0))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_group_norm_module_half_input_float32_params(layout):
    """bfloat16 input through a float32 module, as torch allows: bf16 output, float32 grads."""
    torch.manual_seed(0)
    a, b = normlab.nn.GroupNorm(4, 8), nn.GroupNorm(4, 8)
    _randomise(a)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 8, 5, 6).to(torch.bfloat16)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    y, y_t = a(x), b(x)
    assert y.dtype == y_t.dtype == torch.bfloat16
    assert y.is_contiguous(memory_format=torch.channels_last) == y_t.is_contiguous(memory_format=torch.channels_last)
    y.float().sum().backward()
    assert a.weight.grad.dtype == torch.float32
    ref = nn.GroupNorm(4, 8).double()
    ref.load_state_dict(a.state_dict())
    torch.testing.assert_close(y.double(), ref(x.double()), atol=2e-2, rtol=1e-2)


# ----------------------------------------------------------------------------
# state_dict: round trips and torch's legacy-checkpoint rules
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("ours,theirs,cfg", list(_cases()))
def test_state_dict_round_trip_both_ways_gives_same_outputs(ours, theirs, cfg):
    b = theirs(**cfg)
    _randomise(b)
    a = ours(**cfg)
    a.load_state_dict(b.state_dict(), strict=True)
    c = theirs(**cfg)
    c.load_state_dict(a.state_dict(), strict=True)
    for (k, p), (_, q) in zip(b.state_dict().items(), c.state_dict().items()):
        assert torch.equal(p, q), k
    x = _input(theirs, cfg, seed=6)
    for mode in ("eval", "train"):
        for m in (a, b, c):
            getattr(m, mode)()
        with torch.no_grad():
            torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-5)
            assert torch.equal(c(x), b(x))


@pytest.mark.parametrize("ours,theirs", IN_PAIRS)
def test_legacy_state_dict_with_running_stats_but_untracked_is_rejected_like_torch(ours, theirs):
    """A pre-0.4 checkpoint (no version) carrying running stats into track_running_stats=False."""
    src = theirs(3, affine=True, track_running_stats=True)
    sd = src.state_dict()
    del sd["num_batches_tracked"]
    errors = []
    for cls in (ours, theirs):
        with pytest.raises(RuntimeError) as exc:
            cls(3, affine=True).load_state_dict(_copy_sd(sd, version=None), strict=False)
        errors.append(str(exc.value))
    assert 'Unexpected running stats buffer(s) "running_mean" and "running_var"' in errors[0]
    assert errors[0] == errors[1]
    # with a version (saved since 0.4) the same keys are plain unexpected keys
    for cls in (ours, theirs):
        cls(3, affine=True).load_state_dict(_copy_sd(sd), strict=False)
        with pytest.raises(RuntimeError, match="Unexpected key"):
            cls(3, affine=True).load_state_dict(_copy_sd(sd), strict=True)


@pytest.mark.parametrize("ours,theirs", IN_PAIRS)
def test_version_1_state_dict_without_num_batches_tracked_loads(ours, theirs):
    src = theirs(3, track_running_stats=True)
    _randomise(src)
    sd = src.state_dict()
    del sd["num_batches_tracked"]
    a, b = ours(3, track_running_stats=True), theirs(3, track_running_stats=True)
    a.load_state_dict(_copy_sd(sd, version=1), strict=True)
    b.load_state_dict(_copy_sd(sd, version=1), strict=True)
    assert torch.equal(a.running_mean, src.running_mean)
    assert a.num_batches_tracked.item() == b.num_batches_tracked.item() == 0
    for cls in (ours, theirs):  # version 2 must carry it
        with pytest.raises(RuntimeError, match='Missing key.*"num_batches_tracked"'):
            cls(3, track_running_stats=True).load_state_dict(_copy_sd(sd), strict=True)


def test_state_dict_inside_a_parent_module():
    """Prefixed keys load both ways (the legacy rules use the prefix)."""
    a = nn.Sequential(normlab.nn.GroupNorm(2, 4), normlab.nn.InstanceNorm2d(4, affine=True, track_running_stats=True))
    b = nn.Sequential(nn.GroupNorm(2, 4), nn.InstanceNorm2d(4, affine=True, track_running_stats=True))
    _randomise(b)
    a.load_state_dict(b.state_dict(), strict=True)
    assert list(a.state_dict()) == list(b.state_dict())
    x = torch.randn(2, 4, 3, 3)
    a.eval()
    b.eval()
    torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------
# errors: torch's class and message
# ----------------------------------------------------------------------------


def _same_error(make_ours, make_theirs, x, exact=True):
    with pytest.raises(Exception) as theirs:
        make_theirs()(x)
    with pytest.raises(theirs.type) as ours:
        make_ours()(x)
    if exact:
        assert str(ours.value) == str(theirs.value)
    return str(ours.value)


@pytest.mark.parametrize("ours,theirs,bad_dims", [
    (normlab.nn.InstanceNorm1d, nn.InstanceNorm1d, [1, 4]),
    (normlab.nn.InstanceNorm2d, nn.InstanceNorm2d, [2, 5]),
    (normlab.nn.InstanceNorm3d, nn.InstanceNorm3d, [3, 6]),
])
def test_instance_norm_wrong_rank(ours, theirs, bad_dims):
    for d in bad_dims:
        x = torch.randn(*([3] * d))
        msg = _same_error(lambda: ours(3), lambda: theirs(3), x)
        assert msg.startswith("expected ") and f"(got {d}D input)" in msg


@pytest.mark.parametrize("ours,theirs", IN_PAIRS)
def test_instance_norm_wrong_channel_count(ours, theirs):
    x = _input(theirs, dict(num_features=4), seed=7)
    msg = _same_error(lambda: ours(3, affine=True), lambda: theirs(3, affine=True), x)
    assert msg == "expected input's size at dim=1 to match num_features (3), but got: 4."
    msg = _same_error(lambda: ours(3, affine=True), lambda: theirs(3, affine=True), x[0])
    assert "dim=0" in msg
    # affine=False: a warning (torch's text), and the statistics still per instance
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = ours(3)(x)
        y_t = theirs(3)(x)
    texts = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(texts) == 2 and texts[0] == texts[1] and "does not match num_features" in texts[0]
    torch.testing.assert_close(y, y_t, atol=1e-5, rtol=1e-5)
    # ... but running statistics of the wrong size are an error, as in torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        msg = _same_error(lambda: ours(3, track_running_stats=True),
                          lambda: theirs(3, track_running_stats=True), x, exact=False)
    assert "running_mean of shape [4]" in msg


def test_group_norm_module_errors():
    m_ours, m_theirs = normlab.nn.GroupNorm(2, 4), nn.GroupNorm(2, 4)
    msg = _same_error(lambda: m_ours, lambda: m_theirs, torch.randn(2, 6, 5), exact=False)
    assert "weight of shape [4]" in msg and "[6]" in msg
    msg = _same_error(lambda: m_ours, lambda: m_theirs, torch.randn(5), exact=False)
    assert "[5]" in msg
    msg = _same_error(lambda: m_ours, lambda: m_theirs, torch.ones(2, 4, 3, dtype=torch.long), exact=False)
    assert "torch.int64" in msg
    msg = _same_error(lambda: m_ours, lambda: m_theirs, torch.randn(2, 4, 3, dtype=torch.float64), exact=False)
    assert "mixed dtypes" in msg
    # without affine torch checks nothing but divisibility: 6 channels, 2 groups is fine
    x = torch.randn(2, 6, 5)
    torch.testing.assert_close(normlab.nn.GroupNorm(2, 4, affine=False)(x), nn.GroupNorm(2, 4, affine=False)(x),
                               atol=1e-5, rtol=1e-5)
    msg = _same_error(lambda: normlab.nn.GroupNorm(4, 4, affine=False), lambda: nn.GroupNorm(4, 4, affine=False),
                      torch.randn(2, 6, 5), exact=False)
    assert "divisible by num_groups (4)" in msg


@pytest.mark.parametrize("ours,theirs", IN_PAIRS)
def test_instance_norm_integer_and_mixed_dtype_errors(ours, theirs):
    x = _input(theirs, dict(num_features=3), seed=8)
    msg = _same_error(lambda: ours(3), lambda: theirs(3), x.long(), exact=False)
    assert "floating-point" in msg
    msg = _same_error(lambda: ours(3, affine=True), lambda: theirs(3, affine=True), x.double(), exact=False)
    assert "mixed dtypes" in msg


# ----------------------------------------------------------------------------
# layering: the Modules hold no math
# ----------------------------------------------------------------------------


def test_modules_compute_what_normlab_functional_computes():
    """The Modules hold no math: their outputs and running statistics are normlab.functional's, bit for bit."""
    import normlab.functional as NF

    x = torch.randn(2, 4, 3)
    gn = normlab.nn.GroupNorm(2, 4)
    assert torch.equal(gn(x), NF.group_norm(x, 2, gn.weight, gn.bias, gn.eps))
    m = normlab.nn.InstanceNorm1d(4, track_running_stats=True)
    mean, var = torch.zeros(4), torch.ones(4)
    assert torch.equal(m(x), NF.instance_norm(x, mean, var, use_input_stats=True, momentum=0.1, eps=m.eps))
    assert torch.equal(m.running_mean, mean) and torch.equal(m.running_var, var)
    x1 = torch.randn(4, 3)
    assert torch.equal(m.eval()(x1), NF.instance_norm(x1.unsqueeze(0), mean, var, use_input_stats=False,
                                                      eps=m.eps).squeeze(0))


def _with_specials(shape, values, channels_last=False, seed=21):
    """A random ``x`` with ``values`` (floats or None) put at the first and the last value
    of channel 1 of sample 0."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    spots = [(0, 1) + (0,) * (len(shape) - 2), (0, 1) + tuple(s - 1 for s in shape[2:])]
    for spot, v in zip(spots, values):
        if v is not None:
            x[spot] = float(v)
    return x


_SPECIALS = [("inf", None), ("-inf", None), ("inf", "-inf"), ("nan", None), (None, "inf")]


def _assert_same_specials(ours, theirs):
    """Same NaN and infinity pattern, finite values close (torch is the oracle)."""
    torch.testing.assert_close(ours, theirs, equal_nan=True, rtol=1e-4, atol=1e-4)


def _assert_forward_backward_match(ours, theirs, x, backend, seed):
    """One forward and backward of each module (ours on ``backend``) with the same ``dy``;
    outputs, ``dx``, ``dw`` and ``db`` compared with :func:`_assert_same_specials`."""
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    with normlab.use_backend(backend):
        yo = ours(xo)
    yt = theirs(xt)
    dy = torch.randn(yt.shape, generator=torch.Generator().manual_seed(seed))
    with normlab.use_backend(backend):
        yo.backward(dy)
    yt.backward(dy)
    _assert_same_specials(yo, yt)
    _assert_same_specials(xo.grad, xt.grad)
    _assert_same_specials(ours.bias.grad, theirs.bias.grad)
    _assert_same_specials(ours.weight.grad, theirs.weight.grad)


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("values", _SPECIALS)
@pytest.mark.parametrize("shape,channels_last", [((2, 4, 3, 3), False), ((2, 4, 32, 32), False),
                                                 ((2, 4, 3, 3), True), ((2, 4, 32, 32), True)])
def test_group_norm_gradients_with_inf_or_nan_match_torch(backend, values, shape, channels_last):
    """db = sum of dy does not depend on x: an infinity or a NaN in a group leaves it finite in
    torch (dw and dx of that group are NaN). The kernels' sum of dy once started from
    ``mean - mean``, NaN for an infinite mean."""
    x = _with_specials(shape, values, channels_last)
    ours, theirs = normlab.nn.GroupNorm(2, 4), nn.GroupNorm(2, 4)
    _assert_forward_backward_match(ours, theirs, x, backend, seed=3)
    assert torch.isfinite(ours.bias.grad).all()


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("values", _SPECIALS)
@pytest.mark.parametrize("spatial", [(4, 4), (32, 32)])
def test_instance_norm_running_stats_with_inf_or_nan_match_torch(backend, values, spatial):
    """torch's per-instance mean is sum / count: +-inf for infinities of one sign, and the
    running mean takes it (the shifted statistics alone would give NaN)."""
    x = _with_specials((2, 3, *spatial), values)
    ours = normlab.nn.InstanceNorm2d(3, affine=True, track_running_stats=True)
    theirs = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)
    _assert_forward_backward_match(ours, theirs, x, backend, seed=4)
    _assert_same_specials(ours.running_mean, theirs.running_mean)
    _assert_same_specials(ours.running_var, theirs.running_var)


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("make", [
    lambda: torch.randn(1, 6, 5, 3).contiguous(memory_format=torch.channels_last),
    lambda: torch.randn(2, 6, 5, 3).contiguous(memory_format=torch.channels_last),
    lambda: torch.randn(1, 6, 2, 5, 3).contiguous(memory_format=torch.channels_last_3d),
    lambda: torch.randn(1, 6, 1, 3).contiguous(memory_format=torch.channels_last),
    lambda: torch.randn(1, 6, 5, 3),
    lambda: torch.randn(3, 6, 5, 4).permute(0, 1, 3, 2),
])
def test_group_norm_output_strides_match_torch(backend, make):
    """The output has torch's strides, also in dims of size 1 (a batch of one image in
    channels_last: torch gives dim 0 the stride C*H*W), in training and evaluation alike."""
    x = make().requires_grad_()
    ours, theirs = normlab.nn.GroupNorm(2, 6), nn.GroupNorm(2, 6)
    with normlab.use_backend(backend):
        y = ours(x)
    yt = theirs(x)
    assert y.stride() == yt.stride()
    torch.testing.assert_close(y, yt, rtol=1e-5, atol=1e-5)
    g = torch.randn(yt.shape)
    (gx,) = torch.autograd.grad(y, x, g)
    (gxt,) = torch.autograd.grad(yt, x, g)
    torch.testing.assert_close(gx, gxt, rtol=1e-4, atol=1e-4)
