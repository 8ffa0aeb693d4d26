"""normlab.nn.LayerNorm2d: the channels-first LayerNorm of ConvNeXt, SAM, detectron2 and timm.

Oracles: the formula those libraries write (the mean and biased variance over
dim 1, then the per-channel affine) in float64, and a module written here the
way they write it, for the state_dict.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab
import normlab.functional as NF
from tests.oracle import assert_close_to_float64

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def formula(x, w, b, eps=1e-6):
    u = x.mean(1, keepdim=True)
    s = (x - u).pow(2).mean(1, keepdim=True)
    return (x - u) / torch.sqrt(s + eps) * w[:, None, None] + b[:, None, None]


class ChannelsFirstLayerNorm(nn.Module):
    """The module as those libraries define it: weight, bias, eps."""

    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.eps = eps

    def forward(self, x):
        return formula(x, self.weight, self.bias, self.eps)


def _data(dtype, fmt, shape=(3, 24, 5, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 1).to(dtype).contiguous(memory_format=fmt)
    w = (torch.randn(shape[1], generator=g, dtype=torch.float64) * 0.5 + 1).to(dtype)
    b = torch.randn(shape[1], generator=g, dtype=torch.float64).to(dtype)
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return x, w, b, dy


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_output_and_gradients_against_the_float64_formula(backend, dtype, fmt):
    x, w, b, dy = _data(dtype, FORMATS[fmt])
    m = normlab.nn.LayerNorm2d(24, dtype=dtype)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
    xs = x.clone().requires_grad_()
    with normlab.use_backend(backend):
        y = m(xs)
    y.backward(dy)
    assert y.dtype == dtype and y.is_contiguous(memory_format=FORMATS[fmt])
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    y64 = formula(x64, w64, b64)
    y64.backward(dy.double())
    got = [y.detach(), xs.grad, m.weight.grad, m.bias.grad]
    assert_close_to_float64(got, [y64, x64.grad, w64.grad, b64.grad], dtype,
                            {torch.float32: 2e-6, torch.float64: 1e-12}, ["y", "dx", "dw", "db"])


def test_channels_last_input_reaches_the_kernel_without_a_copy():
    x, w, b, _ = _data(torch.float32, torch.channels_last)
    with normlab.use_backend("cpu"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            y = NF.layer_norm2d(x, w, b)
    copies = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy"}
    assert [e.name for e in prof.events() if e.name in copies] == []  # the kernel read the input's own memory
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_state_dict_and_defaults_match_the_channels_first_layer_norm_of_those_libraries():
    theirs = ChannelsFirstLayerNorm(6)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours = normlab.nn.LayerNorm2d(6)
    assert ours.eps == theirs.eps == 1e-6
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 6, 4, 4)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-6)
    assert ours.normalized_shape == (6,) and ours.elementwise_affine  # as on a torch.nn.LayerNorm subclass
    plain = normlab.nn.LayerNorm2d(6, affine=False)
    assert plain.weight is None and plain.bias is None and list(plain.state_dict()) == []
    assert repr(ours) == "LayerNorm2d(6, eps=1e-06, affine=True)"


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gradcheck(backend, fmt):
    x, w, b, _ = _data(torch.float64, FORMATS[fmt], shape=(2, 3, 2, 3))
    inputs = tuple(t.clone().requires_grad_() for t in (x, w, b))
    with normlab.use_backend(backend):
        assert torch.autograd.gradcheck(lambda x, w, b: NF.layer_norm2d(x, w, b), inputs)


def test_torch_compile_fullgraph():
    m = normlab.nn.LayerNorm2d(8)
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    with normlab.use_backend("cpu"):
        y = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(y, formula(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_channels to be a positive int, got 0"):
        normlab.nn.LayerNorm2d(0)
    m = normlab.nn.LayerNorm2d(4)
    with pytest.raises(ValueError, match=r"expected 4D input \(N, C, H, W\) \(got 3D input\)"):
        m(torch.randn(2, 4, 5))
    with pytest.raises(RuntimeError, match=r"4 channels .* got input of shape \[2, 5, 3, 3\]"):
        m(torch.randn(2, 5, 3, 3))
    with pytest.raises(RuntimeError, match=r"weight of shape \[3\]"):
        NF.layer_norm2d(torch.randn(2, 3, 4, 4), torch.ones(4))
    with pytest.raises(ValueError, match="eps"):
        NF.layer_norm2d(torch.randn(2, 3, 4, 4), eps=-1.0)
