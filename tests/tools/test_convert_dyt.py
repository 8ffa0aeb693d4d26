"""normlab.convert(model, to="dyt") and revert: LayerNorm / RMSNorm -> DyT and back.

Oracles: torch.nn's own modules (classes, parameters, outputs after revert) and DyT's formula
written here, ``weight * tanh(alpha * x) + bias``, in float64.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import normlab


def _dyt64(x, alpha, weight=None, bias=None):
    """DyT by hand, in float64."""
    y = torch.tanh(alpha.double() * x.double())
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def _encoder(seed=0, **kw):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # weights away from ones / zeros, so that a lost copy shows
        for m in (layer.norm1, layer.norm2):
            m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
            m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
    return layer


def test_encoder_layer_every_layer_norm_becomes_a_dyt_holding_its_parameters():
    layer = _encoder()
    ref = copy.deepcopy(layer)
    params = {n: p for n, p in layer.named_parameters()}
    keys = set(layer.state_dict())
    out = normlab.convert(layer, to="dyt")
    assert out is layer
    assert type(layer.norm1) is normlab.nn.DyT and type(layer.norm2) is normlab.nn.DyT
    assert not any(isinstance(m, (nn.LayerNorm, normlab.nn.LayerNorm)) for m in layer.modules())
    for name in ("norm1", "norm2"):
        d = getattr(layer, name)
        assert d.normalized_shape == (16,) and d.bias is not None
        assert d.weight is params[f"{name}.weight"] and d.bias is params[f"{name}.bias"]
        assert d.alpha.item() == 0.5 and d.alpha.dtype == torch.float32
    # the keys: the same, plus one alpha per DyT
    assert set(layer.state_dict()) == keys | {"norm1.alpha", "norm2.alpha"}
    # the other modules are untouched
    for (n, p), (n0, p0) in zip(layer.named_parameters(), ref.named_parameters()):
        if "norm" not in n:
            assert n == n0 and torch.equal(p, p0)
    # outputs finite, gradients reach every parameter, alpha included
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    y = layer(x)
    assert torch.isfinite(y).all()
    y.square().sum().backward()
    for n, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_dyt_output_is_the_hand_formula_in_float64():
    ln = nn.LayerNorm(24)
    with torch.no_grad():
        ln.weight.uniform_(-2, 2), ln.bias.uniform_(-1, 1)
    d = normlab.convert(ln, to="dyt", alpha_init=0.7)
    x = 4 * torch.randn(7, 24, generator=torch.Generator().manual_seed(3))
    exact = _dyt64(x, d.alpha, d.weight, d.bias)
    got = d(x)
    # within twice float32's rounding of the exact result (tanh, the affine: a few ulp of |y| or |bias|)
    tol = 2 * torch.finfo(torch.float32).eps * (exact.abs() + d.bias.double().abs() + d.weight.double().abs())
    assert ((got.double() - exact).abs() <= tol).all()
    x64 = x.double()
    d64 = normlab.convert(nn.LayerNorm(24, dtype=torch.float64), to="dyt")
    assert d64.alpha.dtype == torch.float64
    torch.testing.assert_close(d64(x64), _dyt64(x64, d64.alpha, d64.weight, d64.bias), rtol=1e-15, atol=1e-15)


def test_flags_dtype_and_device_are_kept():
    m = nn.Sequential(nn.LayerNorm(8, bias=False), nn.LayerNorm((2, 4), elementwise_affine=False),
                      nn.RMSNorm(8, eps=1e-6), nn.RMSNorm(8, elementwise_affine=False),
                      nn.LayerNorm(8, dtype=torch.bfloat16), normlab.nn.LayerNorm(8), normlab.nn.RMSNorm(8))
    normlab.convert(m, to="dyt")
    assert all(type(x) is normlab.nn.DyT for x in m)
    assert m[0].weight is not None and m[0].bias is None
    assert m[1].weight is None and m[1].bias is None and m[1].normalized_shape == (2, 4)
    assert m[2].weight is not None and m[2].bias is None  # an RMSNorm has no bias
    assert m[3].weight is None and m[3].bias is None
    assert m[4].weight.dtype == m[4].alpha.dtype == torch.bfloat16
    assert m[5].bias is not None and m[6].bias is None
    assert all(p.device.type == "cpu" for p in m.parameters())


def test_batch_group_and_instance_norms_are_left_untouched():
    bn, gn, inn = nn.BatchNorm1d(4), nn.GroupNorm(2, 4), nn.InstanceNorm1d(4)
    m = nn.Sequential(nn.Linear(4, 4), bn, gn, inn, nn.LayerNorm(4))
    normlab.convert(m, to="dyt")
    assert m[1] is bn and m[2] is gn and m[3] is inn and type(m[4]) is normlab.nn.DyT
    assert normlab.convert(bn, to="dyt") is bn


def test_a_model_without_a_norm_is_returned_unchanged_as_convert_does():
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    before = copy.deepcopy(m.state_dict())
    assert normlab.convert(m, to="dyt") is m
    assert normlab.convert(m) is m
    assert m.state_dict().keys() == before.keys() and all(torch.equal(m.state_dict()[k], v) for k, v in before.items())


def test_revert_restores_classes_weights_flags_and_hooks():
    layer = _encoder()
    ref = copy.deepcopy(layer)
    w1 = layer.norm1.weight
    calls = []
    layer.norm2.register_forward_hook(lambda *a: calls.append(1))
    normlab.convert(layer, to="dyt")
    with torch.no_grad():  # as a training step would: the affine moves
        layer.norm1.weight.add_(0.25)
        layer.norm2.bias.sub_(0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # alpha did not move: no warning
        normlab.revert(layer)
    assert type(layer.norm1) is nn.LayerNorm and type(layer.norm2) is nn.LayerNorm
    assert layer.norm1.weight is w1
    assert layer.norm1.eps == ref.norm1.eps and layer.norm1.normalized_shape == (16,)
    torch.testing.assert_close(layer.norm1.weight, ref.norm1.weight + 0.25, rtol=0, atol=0)
    torch.testing.assert_close(layer.norm2.bias, ref.norm2.bias - 0.5, rtol=0, atol=0)
    assert set(layer.state_dict()) == set(ref.state_dict())
    layer(torch.randn(1, 2, 16))
    assert calls == [1]


def test_round_trip_gives_the_original_outputs_back():
    layer, ref = _encoder(), _encoder()
    x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(4))
    normlab.convert(layer, to="dyt")
    assert not torch.allclose(layer(x), ref(x))  # DyT is another layer
    normlab.revert(layer)
    torch.testing.assert_close(layer(x), ref(x), rtol=0, atol=0)
    # and after a plain convert first: revert goes all the way back to torch.nn
    normlab.convert(layer)
    normlab.convert(layer, to="dyt")
    normlab.revert(layer)
    assert type(layer.norm1) is nn.LayerNorm
    torch.testing.assert_close(layer(x), ref(x), rtol=0, atol=0)


def test_revert_warns_when_alpha_moved_and_drops_it():
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    normlab.convert(m, to="dyt")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(8, 4)).pow(3).sum().backward()
    opt.step()
    assert m[1].alpha.item() != 0.5
    with pytest.warns(UserWarning, match=r"revert: the DyT at '1' has alpha = .*moved from the 0.5 convert gave "
                                          r"it; the LayerNorm it goes back to has no alpha"):
        normlab.revert(m)
    assert type(m[1]) is nn.LayerNorm and "1.alpha" not in m.state_dict()


def test_a_dyt_that_convert_did_not_make_stays():
    d = normlab.nn.DyT(4)
    m = nn.Sequential(d)
    normlab.revert(m)
    assert m[0] is d


def test_alpha_init_float_and_per_layer_function():
    m = nn.Sequential(nn.LayerNorm(4), nn.Sequential(nn.RMSNorm(4)))
    normlab.convert(m, to="dyt", alpha_init=0.2)
    assert m[0].alpha.item() == pytest.approx(0.2) and m[1][0].alpha.item() == pytest.approx(0.2)
    seen = []

    def per_layer(name, module):
        seen.append((name, type(module)))
        return 0.8 if name == "0" else 0.2

    m = nn.Sequential(nn.LayerNorm(4), nn.Sequential(nn.RMSNorm(4)))
    normlab.convert(m, to="dyt", alpha_init=per_layer)
    assert seen == [("0", nn.LayerNorm), ("1.0", nn.RMSNorm)]
    assert m[0].alpha.item() == pytest.approx(0.8) and m[1][0].alpha.item() == pytest.approx(0.2)


def test_bad_arguments_fail_before_any_work():
    m = nn.Sequential(nn.LayerNorm(4))
    with pytest.raises(ValueError, match=r"^convert: expected to to be one of 'normlab', 'dyt', got 'rms'$"):
        normlab.convert(m, to="rms")
    with pytest.raises(ValueError, match=r"alpha_init=0.3 is DyT's, given with to='normlab'"):
        normlab.convert(m, alpha_init=0.3)
    with pytest.raises(ValueError, match=r"expected alpha_init to be a finite float, got nan"):
        normlab.convert(m, to="dyt", alpha_init=float("nan"))
    with pytest.raises(TypeError, match=r"expected alpha_init to be a finite float, got '0.5'"):
        normlab.convert(m, to="dyt", alpha_init="0.5")
    with pytest.raises(TypeError, match=r"got None \(alpha_init\('0', LayerNorm\) returned it\)"):
        normlab.convert(m, to="dyt", alpha_init=lambda n, x: None)
    assert type(m[0]) is nn.LayerNorm


def test_hf_llama_and_gemma_norms_become_dyts_and_come_back():
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    n_norms = sum(type(m) is LlamaRMSNorm for m in model.modules())
    assert n_norms == 5
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    before = model(input_ids=ids).logits.detach()
    normlab.convert(model, to="dyt")
    assert sum(type(m) is normlab.nn.DyT for m in model.modules()) == n_norms
    assert not any(type(m) is LlamaRMSNorm for m in model.modules())
    out = model(input_ids=ids).logits
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "norm" in n)
    normlab.revert(model)
    assert sum(type(m) is LlamaRMSNorm for m in model.modules()) == n_norms
    torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)

    # Gemma's scale is 1 + weight: the DyT's weight is that scale, and revert takes the 1 off again
    g = GemmaRMSNorm(8, eps=1e-6)
    with torch.no_grad():
        g.weight.copy_(torch.linspace(-0.5, 0.5, 8))
    d = normlab.convert(g, to="dyt")
    assert type(d) is normlab.nn.DyT
    torch.testing.assert_close(d.weight, 1 + g.weight, rtol=0, atol=0)
    with torch.no_grad():
        d.weight.mul_(2)
    back = normlab.revert(d)
    assert back is g
    torch.testing.assert_close(back.weight, 2 * (1 + torch.linspace(-0.5, 0.5, 8)) - 1, rtol=0, atol=1e-7)


def test_timm_norms_become_dyts_and_layer_norm_2d_stays():
    from tests.tools import test_timm as t  # timm's classes written from their documented math

    net = t._net()
    params = dict(net.named_parameters())
    norm2d = net.norm2d
    normlab.convert(net, to="dyt")
    assert net.norm2d is norm2d  # channels-first: not DyT's trailing dims
    assert type(net.norm) is normlab.nn.DyT and type(net.rms) is normlab.nn.DyT
    assert net.norm.weight is params["norm.weight"] and net.norm.bias is params["norm.bias"]
    assert net.rms.weight is params["rms.weight"] and net.rms.bias is None
    x = torch.randn(2, 3, 6, 5, generator=torch.Generator().manual_seed(5))
    assert torch.isfinite(net(x)).all()
    normlab.revert(net)
    assert type(net.norm) is t.LayerNorm and type(net.rms) is t.RmsNorm
    assert net.norm.eps == net.rms.eps == 1e-6
    torch.testing.assert_close(net(x), t._net()(x), rtol=0, atol=0)
