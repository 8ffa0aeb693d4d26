"""normlab.recalibrate_batch_norm against float64 statistics of the concatenated data, and
against torch.optim.swa_utils.update_bn where the two must agree (and where they must not)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import update_bn
from torch.utils.data import DataLoader, TensorDataset

import normlab


def _batches(sizes, c=3, hw=(4, 5), seed=0, spread=2.0):
    """Batches whose means differ a lot (an unshuffled loader): the between-batch variance matters."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, *hw, generator=g) * (1 + i) + spread * i for i, n in enumerate(sizes)]


def _population(x: torch.Tensor):
    """The oracle: mean and unbiased variance per channel of all the data at once, in float64."""
    x = x.double().transpose(0, 1).reshape(x.shape[1], -1)
    return x.mean(1), x.var(1, unbiased=True)


def _close(got, want, rtol=2e-6):
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("make_bn", [nn.BatchNorm2d, normlab.nn.BatchNorm2d])
def test_single_layer_equals_statistics_of_the_concatenated_data(make_bn):
    batches = _batches([5, 3, 7, 2])
    model = nn.Sequential(make_bn(3, momentum=0.3)).eval()
    out = normlab.recalibrate_batch_norm(model, batches, progress=False)
    assert out is model
    mean, var = _population(torch.cat(batches))
    _close(model[0].running_mean, mean)
    _close(model[0].running_var, var)
    assert int(model[0].num_batches_tracked) == 4  # as update_bn leaves it: one per batch
    assert model[0].momentum == 0.3 and not model.training


def test_deeper_layer_equals_statistics_of_its_own_concatenated_inputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1),
                          nn.BatchNorm2d(2, momentum=None))
    batches = _batches([6, 4, 6], hw=(5, 5))
    # the oracle collects the second BatchNorm's inputs in a training-mode pass, by itself
    ref = copy.deepcopy(model).train()
    seen = []
    ref[4].register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        for x in batches:
            ref(x)
    model.eval()
    normlab.recalibrate_batch_norm(model, batches, progress=False)
    mean, var = _population(torch.cat(seen))
    _close(model[4].running_mean, mean, rtol=1e-5)
    _close(model[4].running_var, var, rtol=1e-5)
    assert model[4].momentum is None and not any(m.training for m in model.modules())


def test_agrees_with_update_bn_on_one_batch_and_on_the_mean_of_equal_batches():
    # one batch: update_bn's cumulative average of one batch is that batch's statistics
    one = _batches([9])
    ours, theirs = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    normlab.recalibrate_batch_norm(ours, one, progress=False)
    update_bn(one, theirs)
    _close(ours.running_mean, theirs.running_mean)
    _close(ours.running_var, theirs.running_var)
    assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked) == 1

    # equal batch sizes: the average of the batch means is the population mean; the
    # average of the batches' unbiased variances is not the population variance
    batches = _batches([4, 4, 4, 4])
    ours, theirs = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    normlab.recalibrate_batch_norm(ours, batches, progress=False)
    update_bn(batches, theirs)
    _close(ours.running_mean, theirs.running_mean)
    assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked) == 4
    mean, var = _population(torch.cat(batches))
    per_batch = torch.stack([_population(b)[1] for b in batches]).mean(0)
    _close(theirs.running_var, per_batch)  # what update_bn computes
    _close(ours.running_var, var)  # what the population has
    # the gap is the between-batch variance of the means: large for these batches
    assert (var - per_batch).min() > 0.2 * var.max()
    assert not torch.allclose(ours.running_var, theirs.running_var, rtol=0.1)


def test_unequal_batches_update_bn_mean_is_off_ours_is_not():
    batches = _batches([8, 2])
    ours, theirs = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    normlab.recalibrate_batch_norm(ours, batches, progress=False)
    update_bn(batches, theirs)
    mean, _ = _population(torch.cat(batches))
    _close(ours.running_mean, mean)
    assert (theirs.running_mean.double() - mean).abs().min() > 0.1


def test_data_loader_tuples_max_batches_and_a_custom_forward():
    x = torch.cat(_batches([4, 4, 4, 3], c=2, hw=(3,)))
    loader = DataLoader(TensorDataset(x, torch.zeros(len(x))), batch_size=4)
    bn = nn.BatchNorm1d(2)
    normlab.recalibrate_batch_norm(nn.Sequential(bn), loader, max_batches=3, progress=False)
    mean, var = _population(x[:12])  # the first three batches only
    _close(bn.running_mean, mean)
    _close(bn.running_var, var)
    assert int(bn.num_batches_tracked) == 3

    bn2 = nn.BatchNorm1d(2)
    dicts = ({"inputs": x[i:i + 5]} for i in range(0, 15, 5))  # a generator: no len()
    normlab.recalibrate_batch_norm(nn.Sequential(bn2), dicts, forward=lambda m, b: m(b["inputs"]),
                                   progress=False)
    mean, var = _population(x)
    _close(bn2.running_mean, mean)
    _close(bn2.running_var, var)


def test_float32_data_with_a_large_offset_stays_exact():
    g = torch.Generator().manual_seed(5)
    batches = [torch.randn(64, 2, generator=g) + 1e4 for _ in range(4)]
    bn = nn.BatchNorm1d(2)
    normlab.recalibrate_batch_norm(nn.Sequential(bn), batches, progress=False)
    _, var = _population(torch.cat(batches))
    _close(bn.running_var, var, rtol=1e-5)


def test_modes_restored_and_frozen_or_untracked_layers_left_alone():
    model = nn.Sequential(nn.BatchNorm1d(2), normlab.nn.FrozenBatchNorm1d(2),
                          nn.BatchNorm1d(2, track_running_stats=False), nn.Dropout(0.5))
    model.eval()
    model[3].train()
    frozen_before = {k: v.clone() for k, v in model[1].state_dict().items()}
    with pytest.warns(UserWarning, match=r"\['2'\] have track_running_stats=False"):
        normlab.recalibrate_batch_norm(model, _batches([4, 4], c=2, hw=()), progress=False)
    assert [m.training for m in model] == [False, False, False, True] and not model.training
    for k, v in model[1].state_dict().items():
        assert torch.equal(v, frozen_before[k])


def test_empty_batches_and_a_failing_batch_change_nothing():
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2, momentum=0.5)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="batches yielded no batch"):
        normlab.recalibrate_batch_norm(model, [], progress=False)
    with pytest.raises(ValueError, match="batches yielded no batch"):
        normlab.recalibrate_batch_norm(model, DataLoader(TensorDataset(torch.zeros(0, 3))), progress=False)
    with pytest.raises(RuntimeError):  # the second batch has the wrong width: Linear rejects it
        normlab.recalibrate_batch_norm(model, [torch.randn(4, 3), torch.randn(4, 5)], progress=False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not model.training and model[1].momentum == 0.5


def test_bad_arguments_and_a_model_without_batch_norm():
    model = nn.Sequential(nn.BatchNorm1d(2))
    with pytest.raises(TypeError, match=r"pass \[tensor\]"):
        normlab.recalibrate_batch_norm(model, torch.randn(4, 2))
    with pytest.raises(ValueError, match="max_batches.*got 0"):
        normlab.recalibrate_batch_norm(model, [torch.randn(4, 2)], max_batches=0)
    with pytest.raises(TypeError, match="forward"):
        normlab.recalibrate_batch_norm(model, [torch.randn(4, 2)], forward="model")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        normlab.recalibrate_batch_norm(None, [torch.randn(4, 2)])
    plain = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    with pytest.warns(UserWarning, match="no BatchNorm layer"):
        assert normlab.recalibrate_batch_norm(plain, [torch.randn(4, 2)]) is plain


def test_no_progress_output_when_stderr_is_not_a_terminal(capfd):
    normlab.recalibrate_batch_norm(nn.Sequential(nn.BatchNorm1d(2)), _batches([4, 4], c=2, hw=()))
    assert capfd.readouterr().err == ""
