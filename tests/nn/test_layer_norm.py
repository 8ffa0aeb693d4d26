"""normlab.nn.LayerNorm / RMSNorm as drop-ins for torch.nn.LayerNorm / RMSNorm."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import normlab

PAIRS = [
    (normlab.nn.LayerNorm, nn.LayerNorm),
    (normlab.nn.RMSNorm, nn.RMSNorm),
]

CONFIGS = {
    "LayerNorm": [
        dict(normalized_shape=6),
        dict(normalized_shape=(3, 4), eps=1e-3),
        dict(normalized_shape=[8], elementwise_affine=False),
        dict(normalized_shape=8, bias=False),
        dict(normalized_shape=torch.Size([2, 5]), elementwise_affine=False, bias=False),
    ],
    "RMSNorm": [
        dict(normalized_shape=6),
        dict(normalized_shape=(3, 4), eps=1e-6),
        dict(normalized_shape=8, elementwise_affine=False),
    ],
}


def _cases():
    for ours, theirs in PAIRS:
        for cfg in CONFIGS[theirs.__name__]:
            yield pytest.param(ours, theirs, cfg, id=f"{theirs.__name__}-{cfg}")


@pytest.mark.parametrize("ours,theirs", PAIRS)
def _params_of(cls):
    return [(p.name, p.default, p.kind) for p in inspect.signature(cls.__init__).parameters.values()]


# normlab's own options, keyword-only after torch's arguments; their defaults keep torch's behaviour
EXTRA_KEYWORDS = {"RMSNorm": [("casting", "torch"), ("offset", 0.0)]}


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_constructor_signature_matches_torch(ours, theirs):
    """Same argument names, order, kinds and defaults as torch.nn; then only keyword-only extras."""
    mine, torchs = _params_of(ours), _params_of(theirs)
    assert mine[: len(torchs)] == torchs
    extra = EXTRA_KEYWORDS.get(theirs.__name__, [])
    assert mine[len(torchs):] == [(n, d, inspect.Parameter.KEYWORD_ONLY) for n, d in extra]


@pytest.mark.parametrize("ours,theirs,cfg", list(_cases()))
def test_parameters_state_dict_and_repr_match_torch(ours, theirs, cfg):
    a, b = ours(**cfg), theirs(**cfg)
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]
    assert list(a.state_dict()) == list(b.state_dict())
    for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q) and p.shape == q.shape and p.dtype == q.dtype
    assert repr(a) == repr(b)
    assert a.normalized_shape == b.normalized_shape and a.eps == b.eps
    # attributes that are None in torch are None here too (bias=False never creates a bias)
    for name in ("weight", "bias"):
        if hasattr(b, name):
            assert (getattr(a, name) is None) == (getattr(b, name) is None)


@pytest.mark.parametrize("ours,theirs,cfg", list(_cases()))
def test_state_dict_round_trip_both_ways_gives_same_outputs(ours, theirs, cfg):
    torch.manual_seed(0)
    b = theirs(**cfg)
    with torch.no_grad():
        for p in b.parameters():
            p.copy_(torch.randn_like(p))
    a = ours(**cfg)
    a.load_state_dict(b.state_dict(), strict=True)
    shape = a.normalized_shape
    x = torch.randn(5, *shape)
    torch.testing.assert_close(a(x), b(x), atol=1e-6, rtol=1e-6)
    c = theirs(**cfg)
    c.load_state_dict(a.state_dict(), strict=True)
    torch.testing.assert_close(c(x), b(x), atol=0, rtol=0)


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_factory_kwargs_and_to(ours, theirs):
    m = ours(4, dtype=torch.float64, device="cpu")
    assert m.weight.dtype == torch.float64 and m.weight.device.type == "cpu"
    m = ours(4).to(torch.bfloat16)
    y = m(torch.randn(2, 4, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    meta = ours(4, device="meta")
    assert meta.weight.is_meta


def test_reset_parameters():
    m = normlab.nn.LayerNorm(4)
    with torch.no_grad():
        m.weight.fill_(3)
        m.bias.fill_(2)
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(4)) and torch.equal(m.bias, torch.zeros(4))
    r = normlab.nn.RMSNorm(4)
    with torch.no_grad():
        r.weight.fill_(3)
    r.reset_parameters()
    assert torch.equal(r.weight, torch.ones(4))


def test_transformer_shape_and_batch_size_one():
    """[batch, seq, d_model] = [32, 10, 512]: weight/bias [d_model]; a sample alone == in a batch."""
    torch.manual_seed(0)
    ln = normlab.nn.LayerNorm(512)
    ref = nn.LayerNorm(512)
    x = torch.randn(32, 10, 512)
    y = ln(x)
    assert y.shape == (32, 10, 512) and ln.weight.shape == (512,) and ln.bias.shape == (512,)
    torch.testing.assert_close(y, ref(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(ln(x[7:8]), y[7:8])


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_training_step_matches_torch(ours, theirs):
    torch.manual_seed(0)
    a, b = ours(16), theirs(16)
    x = torch.randn(8, 16)
    for m in (a, b):
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            (m(x) * torch.arange(16.0)).pow(2).mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)


def test_module_errors_name_expected_and_given():
    with pytest.raises(RuntimeError, match=r"\[\*, 6\].*\[4, 5\]"):
        normlab.nn.LayerNorm(6)(torch.randn(4, 5))
    with pytest.raises(RuntimeError, match="mixed dtypes"):
        normlab.nn.LayerNorm(6)(torch.randn(4, 6, dtype=torch.float64))
    with pytest.raises(NotImplementedError):
        normlab.nn.RMSNorm(6)(torch.ones(4, 6, dtype=torch.long))


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("make", [
    lambda: torch.randn(4, 6, 5, 3).contiguous(memory_format=torch.channels_last),
    lambda: torch.randn(2, 4, 3, 5, 6).contiguous(memory_format=torch.channels_last_3d),
    lambda: torch.randn(4, 6, 5, 3).permute(0, 2, 1, 3),
    lambda: torch.randn(5, 8).t(),
    lambda: torch.randn(1, 6, 1, 1).contiguous(memory_format=torch.channels_last),
])
def test_output_strides_match_torch(backend, make):
    """torch's rms_norm gives its output the input's suggested memory format (channels_last for
    a channels-last 4-D input), its layer_norm a contiguous one; normlab's modules do the same."""
    x = make()
    for k in range(1, x.dim()):
        shape = tuple(x.shape[-k:])
        pairs = [(normlab.nn.RMSNorm(shape), torch.nn.RMSNorm(shape, eps=1e-6)),
                 (normlab.nn.LayerNorm(shape), torch.nn.LayerNorm(shape))]
        for ours, theirs in pairs:
            if isinstance(ours, normlab.nn.RMSNorm):
                ours.eps = 1e-6
            with normlab.use_backend(backend):
                y = ours(x)
            yt = theirs(x)
            assert y.stride() == yt.stride(), (type(ours).__name__, shape, y.stride(), yt.stride())
            torch.testing.assert_close(y, yt, rtol=1e-5, atol=1e-5)
