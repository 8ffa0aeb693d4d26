"""The model tools on BatchRenorm, GhostBatchNorm, LayerNorm2d and converted timm layers.

Oracles: torch.nn.BatchNorm in eval with the same running statistics and affine (a
BatchRenorm's or GhostBatchNorm's eval is BatchNorm's eval), statistics of the
concatenated data computed here in float64, the model's own eval output before the
tool ran, and the math of each layer (what it must or must not mix across samples).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import normlab
from normlab import nn as nnl
from tests.tools.test_timm import LayerNorm2d as TimmLayerNorm2d

RANKED = [(nnl.BatchRenorm1d, nnl.FrozenBatchNorm1d, (8, 4)), (nnl.BatchRenorm2d, nnl.FrozenBatchNorm2d, (8, 4, 3, 3)),
          (nnl.GhostBatchNorm1d, nnl.FrozenBatchNorm1d, (8, 4, 5)),
          (nnl.GhostBatchNorm3d, nnl.FrozenBatchNorm3d, (8, 4, 2, 2, 2))]


def _make(cls, c=4):
    return cls(c, virtual_batch_size=4) if "Ghost" in cls.__name__ else cls(c)


def _trained(cls, shape, seed=0):
    """A layer with moved running statistics and a non-trivial affine, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    m = _make(cls, shape[1])
    with torch.no_grad():
        m.weight.copy_(1 + 0.3 * torch.randn(shape[1], generator=g))
        m.bias.copy_(torch.randn(shape[1], generator=g))
    m.train()
    for _ in range(3):
        m(torch.randn(shape, generator=g) * 2 + 1)
    return m.eval()


def _torch_bn_eval(m, x):
    """torch.nn.functional.batch_norm in eval with the layer's running statistics and affine."""
    return nn.functional.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias, False, 0.0, m.eps)


# -- freeze -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, frozen_cls, shape", RANKED, ids=lambda v: getattr(v, "__name__", ""))
def test_freeze_makes_a_frozen_batch_norm_with_the_same_eval_output(cls, frozen_cls, shape):
    m = _trained(cls, shape)
    x = torch.randn(shape)
    want = _torch_bn_eval(m, x)
    model = nn.Sequential(nn.Identity(), m)
    normlab.freeze_batch_norm(model)
    assert type(model[1]) is frozen_cls
    torch.testing.assert_close(model(x), want, rtol=1e-6, atol=1e-6)
    model.train()  # frozen: training mode changes nothing
    torch.testing.assert_close(model(x), want, rtol=1e-6, atol=1e-6)
    normlab.unfreeze_batch_norm(model)
    assert model[1] is m


def test_untracked_ghost_batch_norm_is_left_alone_with_a_warning():
    m = nnl.GhostBatchNorm2d(4, virtual_batch_size=2, track_running_stats=False)
    model = nn.Sequential(m)
    with pytest.warns(UserWarning, match="track_running_stats=False"):
        normlab.freeze_batch_norm(model)
    assert model[0] is m


# -- recalibrate ------------------------------------------------------------------------------


def _population(x):
    x = torch.cat(x).double()
    dims = [0, *range(2, x.dim())]
    return x.mean(dims), x.var(dims, unbiased=True)


@pytest.mark.parametrize("cls", [nnl.BatchRenorm2d, nnl.GhostBatchNorm2d])
def test_recalibrate_sets_the_population_statistics(cls):
    m = _trained(cls, (8, 4, 3, 3))
    steps = int(m.num_batches_tracked)
    g = torch.Generator().manual_seed(5)
    data = [torch.randn(n, 4, 3, 3, generator=g) * 3 + 2 for n in (8, 8, 5, 6)]  # 4 batches; trained 3 steps
    normlab.recalibrate_batch_norm(nn.Sequential(m), data, progress=False)
    mean, var = _population(data)
    torch.testing.assert_close(m.running_mean.double(), mean, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(m.running_var.double(), var, rtol=2e-6, atol=1e-6)
    assert not m.training
    if cls is nnl.BatchRenorm2d:
        assert int(m.num_batches_tracked) == steps  # the warm-up step is not moved
    else:
        assert int(m.num_batches_tracked) == 2 + 2 + 2 + 2  # virtual batches of 4: ceil(8/4), ..., ceil(6/4)


# -- fold -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [nnl.BatchRenorm2d, nnl.GhostBatchNorm2d])
def test_batch_renorm_and_ghost_batch_norm_fold_into_the_conv_before(cls):
    torch.manual_seed(0)
    bn = _trained(cls, (8, 4, 6, 6))
    model = nn.Sequential(nn.Conv2d(3, 4, 3), bn, nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    want = torch.relu(_torch_bn_eval(bn, model[0](x)))
    folded = normlab.fold(model, x)
    assert [type(c) for c in folded.children()] == [nn.Conv2d, nn.ReLU]
    torch.testing.assert_close(folded(x), want.detach(), rtol=1e-5, atol=1e-5)


def test_ghost_batch_norm_in_training_mode_is_not_folded():
    model = nn.Sequential(nn.Linear(3, 4), nnl.GhostBatchNorm1d(4, virtual_batch_size=2))
    model[0].eval()
    with pytest.warns(UserWarning, match="not folded"):
        folded = normlab.fold(model, torch.randn(4, 3))
    assert "in training mode" in dict(folded.fold_report.not_folded)["1"]


def _ln2d_then_conv(norm, groups=1, padding=0):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), norm, nn.Conv2d(8, 6, 1, groups=groups, padding=padding), nn.GELU())
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(8))
        norm.bias.copy_(torch.randn(8))
    return model.eval()


@pytest.mark.parametrize("norm", [nnl.LayerNorm2d(8), TimmLayerNorm2d(8)], ids=["normlab", "timm"])
@pytest.mark.parametrize("groups", [1, 2])
def test_layer_norm2d_affine_folds_into_the_1x1_conv_after_it(norm, groups):
    model = _ln2d_then_conv(norm, groups)
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    model = model.double()
    want = model(x)
    # the oracle of the math: conv(n(x) * gamma + beta) by hand, n(x) from float64 torch
    h = model[0](x)
    nx = nn.functional.layer_norm(h.permute(0, 2, 3, 1), (8,), eps=1e-6).permute(0, 3, 1, 2)
    by_hand = model[3](model[2](nx * norm.weight.view(1, 8, 1, 1) + norm.bias.view(1, 8, 1, 1)))
    torch.testing.assert_close(want, by_hand, rtol=1e-12, atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folded = normlab.fold(model, x)
    assert folded.fold_report.folded == [("1", "2")]
    assert folded.get_submodule("1").weight is None and folded.get_submodule("1").bias is None
    torch.testing.assert_close(folded(x), want, rtol=1e-12, atol=1e-12)


def test_layer_norm2d_before_a_padded_conv_is_not_folded():
    model = _ln2d_then_conv(nnl.LayerNorm2d(8), padding=1)
    with pytest.warns(UserWarning, match="not folded"):
        folded = normlab.fold(model, torch.randn(2, 3, 7, 7))
    assert "1x1 Conv2d layers without padding" in dict(folded.fold_report.not_folded)["1"]


# -- inspect ----------------------------------------------------------------------------------


def test_inspect_lists_them_with_measured_batch_dependence():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1, bias=False),
        nnl.BatchRenorm2d(4),                          # 1: training: mixes the batch
        nnl.GhostBatchNorm2d(4, virtual_batch_size=2),  # 2: mixes its virtual batch of 2
        nnl.GhostBatchNorm2d(4, virtual_batch_size=1),  # 3: a virtual batch per sample: mixes nothing
        nnl.LayerNorm2d(4),                            # 4: per pixel: mixes nothing
        TimmLayerNorm2d(4),                            # 5: the same, not converted
    )
    report = normlab.inspect(model, torch.randn(6, 3, 4, 4), show=False)
    layers = {layer.name: layer for layer in report.layers}
    assert list(layers) == ["1", "2", "3", "4", "5"]
    assert [layers[n].family for n in layers] == ["batch", "batch", "batch", "layer2d", "layer2d"]
    assert layers["1"].batch_dependent and layers["2"].others_changed
    assert layers["3"].others_changed is False
    assert layers["4"].batch_dependent is False and layers["5"].batch_dependent is False
    assert layers["4"].axes == [1] and layers["2"].params["virtual_batch_size"] == 2
    assert "virtual batch of 2" in layers["2"].axes_text
    model.eval()
    report = normlab.inspect(model, torch.randn(6, 3, 4, 4), show=False)
    assert not any(layer.batch_dependent for layer in report.layers)  # eval: running statistics


def test_converted_timm_and_hf_style_layers_are_seen_by_the_tools():
    """After normlab.convert, a timm LayerNorm2d is a normlab LayerNorm2d: inspect and fold know it."""
    model = _ln2d_then_conv(TimmLayerNorm2d(8))
    x = torch.randn(2, 3, 7, 7)
    want = model(x)
    normlab.convert(model)
    assert type(model[1]) is nnl.LayerNorm2d
    report = normlab.inspect(model, x, show=False)
    assert [layer.family for layer in report.layers] == ["layer2d"]
    folded = normlab.fold(model, x)
    assert folded.fold_report.folded == [("1", "2")]
    torch.testing.assert_close(folded(x), want, rtol=1e-5, atol=1e-5)


def test_transformers_channels_first_layer_norm_is_seen_as_layer2d_and_folds_once_converted():
    convnext = pytest.importorskip("transformers.models.convnext.modeling_convnext")
    norm = convnext.ConvNextLayerNorm(8, eps=1e-6, data_format="channels_first")
    model = _ln2d_then_conv(norm)
    x = torch.randn(2, 3, 7, 7)
    want = model(x)
    report = normlab.inspect(model, x, show=False)
    assert [(layer.family, layer.axes, layer.batch_dependent) for layer in report.layers] == [("layer2d", [1], False)]
    with pytest.warns(UserWarning, match="not folded"):
        folded = normlab.fold(model, x)
    assert "normlab.convert" in dict(folded.fold_report.not_folded)["1"]
    normlab.convert(model)
    folded = normlab.fold(model, x)
    assert folded.fold_report.folded == [("1", "2")]
    torch.testing.assert_close(folded(x), want, rtol=1e-5, atol=1e-5)
