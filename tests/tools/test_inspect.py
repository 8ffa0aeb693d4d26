"""normlab.inspect and `normlab inspect`: measured batch dependence (what the layers' math says
it must be), running-statistics health, the pitfalls, and a model left exactly as it was."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import normlab
from normlab import cli


def build_model() -> nn.Module:
    """The factory `normlab inspect tests.tools.test_inspect:build_model` builds."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 4, 1, bias=False), nn.GroupNorm(2, 4),
                         nn.InstanceNorm2d(4, affine=True), nn.Flatten(), nn.Linear(64, 6, bias=False),
                         nn.LayerNorm(6))


def _by_name(report):
    return {l.name: l for l in report.layers}


def _problems(report):
    return {(w.layer, w.problem.split(":")[0]) for w in report.warnings}


def test_measured_batch_dependence_matches_what_each_layer_computes():
    model = build_model()
    x = torch.randn(5, 3, 6, 6)
    report = normlab.inspect(model, x, show=False)
    assert ("(the model)", "model in training mode") in _problems(report)
    train = _by_name(report)
    # training BatchNorm mixes the batch; GroupNorm, InstanceNorm and LayerNorm never do
    assert train["1"].others_changed and train["1"].batch_size_changed
    for name in ("4", "5", "8"):
        assert train[name].batch_dependent is False, name
        assert train[name].others_diff == 0.0 or train[name].others_diff < 1e-6
    normlab.recalibrate_batch_norm(model, [x], progress=False)
    ev = _by_name(normlab.inspect(model.eval(), x, show=False))
    assert ev["1"].batch_dependent is False  # eval with running statistics: a per-channel affine
    frozen = _by_name(normlab.inspect(normlab.freeze_batch_norm(model).train(), x, show=False))
    assert frozen["1"].batch_dependent is False and frozen["1"].family == "frozen"


def test_axes_and_parameters_per_family():
    model = nn.Sequential(nn.BatchNorm2d(3), nn.GroupNorm(1, 3), nn.InstanceNorm2d(3),
                          nn.LayerNorm((5, 6)), nn.RMSNorm(6))
    layers = _by_name(normlab.inspect(model, torch.randn(2, 3, 5, 6), show=False))
    assert layers["0"].axes == [0, 2, 3] and layers["0"].axes_text.startswith("N,H,W")
    assert layers["1"].axes == [1, 2, 3]
    assert layers["2"].axes == [2, 3]
    assert layers["3"].axes == [2, 3] and layers["4"].axes == [3]
    assert layers["0"].params["momentum"] == 0.1 and layers["0"].params["parameters"] == 6
    assert layers["3"].params["normalized_shape"] == [5, 6]
    assert layers["0"].running["num_batches_tracked"] == 0
    layers = _by_name(normlab.inspect(model.eval(), torch.randn(2, 3, 5, 6), show=False))
    assert layers["0"].axes is None and "running" in layers["0"].axes_text


def test_normlab_layers_report_like_torch_layers():
    x = torch.randn(4, 3, 6, 6)
    theirs = normlab.inspect(build_model(), x, show=False)
    ours = normlab.inspect(normlab.convert(build_model()), x, show=False)
    assert [(l.name, l.batch_dependent, l.axes) for l in ours.layers] == \
        [(l.name, l.batch_dependent, l.axes) for l in theirs.layers]
    assert ours.layers[0].cls == "normlab.BatchNorm2d" and theirs.layers[0].cls == "torch.BatchNorm2d"


def test_inspecting_changes_no_buffer_and_no_mode():
    model = build_model()
    model[4].eval()  # a mixed-mode model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [m.training for m in model.modules()]
    report = normlab.inspect(model, torch.randn(4, 3, 6, 6), show=False)
    assert report.model_mode == "mixed"
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert [m.training for m in model.modules()] == flags


def test_each_pitfall_is_found_with_a_fix():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn_train = nn.Linear(4, 3), nn.BatchNorm1d(3)  # bias before BN; BN left training
            self.bn_stale = nn.BatchNorm1d(3)  # eval, never updated
            self.bn_nostats = nn.BatchNorm1d(3, track_running_stats=False)
            self.seq_fc, self.seq_bn = nn.Linear(4, 2), nn.BatchNorm1d(3)  # channels = 3 steps: bias is fine

        def forward(self, x):
            h = self.bn_nostats(self.bn_stale(self.bn_train(self.fc(x))))
            return h.sum() + self.seq_bn(self.seq_fc(x.unsqueeze(1).expand(-1, 3, -1))).sum()

    model = Net().eval()
    model.bn_train.train()
    model.seq_bn.running_mean.fill_(0.5)
    model.seq_bn.running_var[0] = float("nan")
    report = normlab.inspect(model, torch.randn(5, 4), show=False)
    assert _problems(report) == {
        ("bn_train", "BatchNorm in training mode inside a model in eval mode"),
        ("bn_train", "bias before BatchNorm"),
        ("bn_stale", "running statistics never updated"),
        ("bn_nostats", "track_running_stats=False in eval"),
        ("seq_bn", "running statistics broken"),
    }
    assert all(w.fix for w in report.warnings)
    assert _by_name(report)["seq_bn"].running["nan_inf"] == 1
    assert _by_name(report)["bn_nostats"].batch_dependent  # eval, yet batch statistics

    clean = nn.Sequential(nn.Linear(4, 3, bias=False), nn.BatchNorm1d(3))
    normlab.recalibrate_batch_norm(clean, [torch.randn(8, 4)], progress=False)
    assert normlab.inspect(clean.eval(), torch.randn(5, 4), show=False).warnings == []


def test_a_batch_of_one_reaching_a_training_batch_norm():
    model = nn.Sequential(nn.Conv2d(2, 2, 1, bias=False), nn.BatchNorm2d(2))  # spatial dims: runs
    report = normlab.inspect(model, torch.randn(1, 2, 3, 3), show=False)
    assert ("1", "batch of 1 reaches a training BatchNorm") in _problems(report)
    assert report.layers[0].batch_dependent  # measured in a batch built around the one sample

    model = nn.Sequential(nn.Linear(2, 3, bias=False), nn.BatchNorm1d(3), nn.LayerNorm(3))  # fails in torch
    report = normlab.inspect(model, torch.randn(1, 2), show=False)
    assert ("1", "batch of 1 reaches a training BatchNorm") in _problems(report)
    assert "not reached" in _by_name(report)["2"].measure_note


def test_running_statistics_health():
    bn = nn.BatchNorm1d(4).eval()
    bn.running_var.copy_(torch.tensor([1e-9, 2.0, 3e7, -1.0]))
    bn.num_batches_tracked.fill_(12)
    r = normlab.inspect(nn.Sequential(bn), torch.randn(3, 4), show=False).layers[0].running
    assert (r["near_zero_var"], r["huge_var"], r["negative_var"], r["num_batches_tracked"]) == (1, 1, 1, 12)
    assert r["momentum"] == 0.1 and not r["initial"]


def test_bad_inputs_say_what_was_expected():
    with pytest.raises(ValueError, match=r"example_input of shape \[2, 5, 6, 6\].*--input-shape"):
        normlab.inspect(build_model(), torch.randn(2, 5, 6, 6), show=False)
    with pytest.raises(TypeError, match="example_input"):
        normlab.inspect(build_model(), "x", show=False)
    empty = normlab.inspect(nn.Linear(2, 2), torch.randn(3, 2), show=False)
    assert empty.layers == [] and empty.warnings == []


def test_table_json_and_the_command(capsys):
    report = normlab.inspect(build_model(), torch.randn(4, 3, 6, 6), show=True)
    shown = capsys.readouterr().out
    assert "BatchNorm2d" in shown and "sample 0 vs others" in shown and "changes" in shown
    assert "GroupNorm" in str(report)
    json.dumps(report.to_dict(), allow_nan=False)

    assert cli.main(["inspect", "tests.tools.test_inspect:build_model", "--input-shape", "4,3,6,6", "--eval"]) == 0
    out = capsys.readouterr().out
    assert "Sequential (eval mode)" in out and "running statistics never updated" in out
    assert cli.main(["inspect", "tests.tools.test_inspect:build_model", "--input-shape", "4,3,6,6", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [l["name"] for l in data["layers"]] == ["1", "4", "5", "8"] and data["model_mode"] == "train"
    for argv, msg in [(["tests.tools.test_inspect:nope", "--input-shape", "4,3,6,6"], "no attribute"),
                      (["tests.tools.test_inspect", "--input-shape", "4,3,6,6"], "MODULE:FACTORY"),
                      (["tests.tools.test_inspect:build_model", "--input-shape", "4,x"], "positive ints"),
                      (["tests.tools.test_inspect:build_model", "--input-shape", "4,2,6,6"], "shape \\[4, 2, 6, 6\\]")]:
        with pytest.raises(SystemExit, match=msg):
            cli.main(["inspect", *argv])
