"""normlab.fold: the folded copy's outputs equal the original's eval outputs (torch.nn is the
oracle), with fewer modules; what cannot be folded is listed with the reason."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import normlab
from normlab.tools import fold


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Statistics and affines far from the identity, so that a wrong fold shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            for name in ("running_mean", "weight", "bias"):
                t = getattr(m, name, None)
                if isinstance(t, torch.Tensor) and t.dim() == 1 and not isinstance(m, (nn.Linear,)):
                    t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
            if getattr(m, "running_var", None) is not None:
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g, dtype=m.running_var.dtype) + 0.2)
    return model


def _assert_same_outputs(folded, model, x, rtol=1e-5):
    with torch.no_grad():
        got, want = folded(x), model(x)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err <= rtol, f"folded output off by {err:.2e} (relative)"


def _count(model, kind=nn.Module):
    return sum(isinstance(m, kind) for m in model.modules())


PRODUCERS = [  # (layer before the BatchNorm, BatchNorm, input shape)
    (lambda: nn.Conv1d(4, 6, 3), nn.BatchNorm1d, (3, 4, 9)),
    (lambda: nn.Conv2d(4, 6, 3, groups=2, bias=False), nn.BatchNorm2d, (2, 4, 7, 6)),
    (lambda: nn.Conv3d(4, 6, 2, padding=1, groups=2), nn.BatchNorm3d, (2, 4, 3, 4, 4)),
    (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2), nn.BatchNorm1d, (3, 4, 5)),
    (lambda: nn.ConvTranspose2d(4, 6, 3, groups=2, bias=False), nn.BatchNorm2d, (2, 4, 5, 4)),
    (lambda: nn.ConvTranspose3d(6, 4, 2, groups=2), nn.BatchNorm3d, (2, 6, 3, 3, 3)),
    (lambda: nn.Linear(5, 6), nn.BatchNorm1d, (7, 5)),
]


@pytest.mark.parametrize("make_layer, make_bn, shape", PRODUCERS)
@pytest.mark.parametrize("flavour", ["torch", "normlab", "frozen", "no affine"])
def test_batch_norm_folds_into_the_layer_before(make_layer, make_bn, shape, flavour):
    torch.manual_seed(0)
    layer = make_layer()
    c = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
    bn = make_bn(c, affine=flavour != "no affine", eps=1e-3)
    model = _randomize(nn.Sequential(layer, bn, nn.ReLU())).eval()
    if flavour == "normlab":
        normlab.convert(model)
    elif flavour == "frozen":
        normlab.freeze_batch_norm(model)
        model.train()  # a frozen layer folds in any mode
    before = copy.deepcopy(model.state_dict())
    x = torch.randn(shape)

    folded = fold(model, x)
    _assert_same_outputs(folded, model.eval(), x)
    assert _count(folded) == _count(model) - 1
    assert folded.fold_report.folded == [("1", "0")] and folded.fold_report.not_folded == []
    assert folded.fold_report.max_rel_err is None or folded.fold_report.max_rel_err < 1e-5
    for k, v in model.state_dict().items():  # the original is untouched
        assert torch.equal(v, before[k]), k


def test_float64_model_folds_to_float64_precision():
    model = _randomize(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))).double().eval()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    _assert_same_outputs(fold(model, x), model, x, rtol=1e-12)


@pytest.mark.parametrize("norm", [nn.LayerNorm(6), nn.RMSNorm(6), normlab.nn.LayerNorm(6), normlab.nn.RMSNorm(6)],
                         ids=["torch-ln", "torch-rms", "normlab-ln", "normlab-rms"])
def test_layer_norm_affine_folds_into_the_linears_after_it(norm):
    class Attention(nn.Module):  # the norm's output goes to two Linears: both take the affine
        def __init__(self):
            super().__init__()
            self.norm, self.q, self.k = norm, nn.Linear(6, 4), nn.Linear(6, 4, bias=False)

        def forward(self, x):
            h = self.norm(x)
            return self.q(h) * self.k(h)

    model = _randomize(Attention()).eval()
    x = torch.randn(3, 5, 6)
    folded = fold(model, x)
    _assert_same_outputs(folded, model, x)
    assert folded.fold_report.folded == [("norm", "q, k")]
    assert folded.norm.weight is None and not folded.norm.elementwise_affine
    # an RMSNorm has no beta: the bias-free Linear stays bias-free
    assert (folded.k.bias is None) == isinstance(norm, (nn.RMSNorm, normlab.nn.RMSNorm))


def test_what_cannot_be_folded_is_listed_and_the_rest_is_folded():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)  # foldable
            self.conv2, self.bn2 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)  # conv2 also feeds the residual
            self.conv3, self.bn3 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)  # bn3 stays in training mode
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.bn4 = nn.BatchNorm1d(4)  # after a function, not a layer
            self.ln = nn.LayerNorm(4)  # feeds a Linear and the output
            self.fc = nn.Linear(4, 2)
            self.gn = nn.GroupNorm(2, 4)

        def forward(self, x):
            h = self.bn1(self.conv1(x))
            c = self.conv2(h)
            h = self.bn2(c) + c
            h = self.gn(self.bn3(self.conv3(h)))
            z = self.ln(self.bn4(self.pool(h).flatten(1)))
            return self.fc(z).sum(1) + z.sum(1)

    model = _randomize(Net()).eval()
    model.bn3.train()
    x = torch.randn(4, 3, 6, 6)
    with pytest.warns(UserWarning, match="not folded"):
        folded = fold(model, x)
    report = folded.fold_report
    assert report.folded == [("bn1", "conv1")]
    reasons = dict(report.not_folded)
    assert "also used by" in reasons["bn2"] and "conv2" in reasons["bn2"]
    assert "training mode" in reasons["bn3"] and "model.eval()" in reasons["bn3"]
    assert "not from a Conv" in reasons["bn4"]
    assert "not only to Linear" in reasons["ln"] and "2 consumers ('fc', call_method sum)" in reasons["ln"]
    assert "GroupNorm" in reasons["gn"]
    assert report.max_rel_err is None  # bn3 trains: outputs depend on the batch
    # compare with the unfolded model run the same way (bn3 on the same batch)
    ref = copy.deepcopy(model)
    _assert_same_outputs(folded, ref, x)


def test_layers_called_twice_and_linear_on_sequences_are_not_folded():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv1d(2, 2, 1), nn.BatchNorm1d(2)
            self.seq_fc, self.seq_bn = nn.Linear(3, 4), nn.BatchNorm1d(4)  # BN's channel dim 1 is the 4 steps

        def forward(self, x):
            return self.bn(self.conv(self.conv(x))) + self.seq_bn(self.seq_fc(x.new_ones(2, 4, 3))).sum()

    model = _randomize(Twice()).eval()
    x = torch.randn(2, 2, 3)
    with pytest.warns(UserWarning):
        folded = fold(model, x)
    reasons = dict(folded.fold_report.not_folded)
    assert "called 2 times" in reasons["bn"]
    assert "[2, 4, 4]" in reasons["seq_bn"] and "(N, features)" in reasons["seq_bn"]
    _assert_same_outputs(folded, model, x)


def test_untraceable_model_still_folds_its_traceable_parts():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(64, 5), nn.BatchNorm1d(5))
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x):
            h = self.stem(x)
            if h.mean() > 0:  # data-dependent control flow: torch.fx cannot trace this
                h = self.bn(h)
            return self.head(h)

    model = _randomize(Branchy()).eval()
    x = torch.randn(3, 3, 6, 6)
    with pytest.warns(UserWarning, match="cannot trace"):
        folded = fold(model, x)
    report = folded.fold_report
    assert report.folded == [("stem.1", "stem.0"), ("head.2", "head.1")]
    reasons = dict(report.not_folded)
    assert "torch.fx cannot trace" in reasons["(the model)"] and "could not be traced" in reasons["bn"]
    assert type(folded) is Branchy and _count(folded, nn.BatchNorm1d) == 0
    _assert_same_outputs(folded, model, x)


def test_bad_example_input_and_bad_model():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    with pytest.raises(ValueError, match=r"example_input of shape \[2, 5, 8, 8\].*Pass an input"):
        fold(model, torch.randn(2, 5, 8, 8))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        fold(lambda x: x, torch.randn(2))


def test_no_warning_when_everything_folds(recwarn):
    model = _randomize(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))).eval()
    folded = fold(model, torch.randn(5, 4))
    assert not [w for w in recwarn if "fold" in str(w.message)]
    assert "folded 1 into 0" in str(folded.fold_report)


def test_batch_norm_whose_own_output_has_several_consumers_still_folds():
    class Fork(nn.Module):  # what the BatchNorm's consumers see is its output, unchanged by folding
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3)

        def forward(self, x):
            h = self.bn(self.conv(x))
            return h.relu() + h.sigmoid()

    model = _randomize(Fork()).eval()
    x = torch.randn(2, 2, 4, 4)
    folded = fold(model, x)
    assert folded.fold_report.folded == [("bn", "conv")]
    _assert_same_outputs(folded, model, x)
