"""FrozenBatchNorm1d/2d/3d: torch.nn.BatchNorm's eval output in every mode, torchvision's state_dict."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab
from normlab.nn import FrozenBatchNorm1d, FrozenBatchNorm2d, FrozenBatchNorm3d

CASES = [  # frozen class, torch twin, input shape
    (FrozenBatchNorm1d, nn.BatchNorm1d, (5, 3)),
    (FrozenBatchNorm1d, nn.BatchNorm1d, (4, 3, 7)),
    (FrozenBatchNorm2d, nn.BatchNorm2d, (2, 3, 5, 4)),
    (FrozenBatchNorm3d, nn.BatchNorm3d, (2, 3, 2, 3, 4)),
]


def _stats(c: int, dtype=torch.float32, seed: int = 3) -> dict:
    """A BatchNorm checkpoint in the layout torch writes it (values far from the defaults)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(c, generator=g, dtype=dtype),
        "bias": torch.randn(c, generator=g, dtype=dtype),
        "running_mean": torch.randn(c, generator=g, dtype=dtype),
        "running_var": torch.rand(c, generator=g, dtype=dtype) + 0.1,
        "num_batches_tracked": torch.tensor(17),
    }


def _pair(frozen_cls, torch_cls, c=3, dtype=torch.float32, eps=1e-5):
    sd = _stats(c, dtype)
    bn = torch_cls(c, eps=eps, dtype=dtype).eval()
    bn.load_state_dict(sd)
    frozen = frozen_cls(c, eps=eps, dtype=dtype)
    frozen.load_state_dict(sd)  # a BatchNorm checkpoint: num_batches_tracked dropped, strict passes
    return frozen, bn


@pytest.mark.parametrize("frozen_cls, torch_cls, shape", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_output_and_input_gradient_equal_torch_batch_norm_in_eval_in_every_mode(frozen_cls, torch_cls, shape, dtype):
    frozen, bn = _pair(frozen_cls, torch_cls, dtype=dtype)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    dy = torch.randn(shape, dtype=dtype)
    ref = bn(x)
    (dx_ref,) = torch.autograd.grad(ref, x, dy)
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    for training in (False, True):
        frozen.train(training)
        y = frozen(x)
        torch.testing.assert_close(y, ref, **tol)
        (dx,) = torch.autograd.grad(y, x, dy)  # the input gradient flows
        torch.testing.assert_close(dx, dx_ref, **tol)


def test_channels_last_input_gives_torch_values_and_layout():
    frozen, bn = _pair(FrozenBatchNorm2d, nn.BatchNorm2d)
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    y = frozen.train()(x)
    torch.testing.assert_close(y, bn(x), atol=1e-6, rtol=1e-5)
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_buffers_only_and_train_mode_changes_nothing():
    frozen, _ = _pair(FrozenBatchNorm2d, nn.BatchNorm2d)
    assert list(frozen.parameters()) == []
    assert [n for n, _ in frozen.named_buffers()] == ["weight", "bias", "running_mean", "running_var"]
    before = {n: b.clone() for n, b in frozen.named_buffers()}
    x = torch.randn(4, 3, 3, 3)
    y_eval = frozen.eval()(x)
    y_train = frozen.train()(x)
    assert torch.equal(y_eval, y_train)
    for n, b in frozen.named_buffers():
        assert torch.equal(b, before[n]), n
    # one sample alone gets the same output as inside its batch: no batch dependence
    assert torch.equal(frozen(x[:1]), y_train[:1])


def test_state_dict_matches_torchvision_layout_written_by_hand():
    # torchvision.ops.FrozenBatchNorm2d(num_features, eps) keeps exactly these four buffers
    sd = {"weight": torch.tensor([2.0, 0.5]), "bias": torch.tensor([1.0, -1.0]),
          "running_mean": torch.tensor([0.25, 3.0]), "running_var": torch.tensor([4.0, 0.25])}
    frozen = FrozenBatchNorm2d(2, eps=0.0)
    frozen.load_state_dict(sd, strict=True)
    assert list(frozen.state_dict()) == ["weight", "bias", "running_mean", "running_var"]
    x = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    # by hand: (1 - 0.25) / 2 * 2 + 1 = 1.75 and (2 - 3) / 0.5 * 0.5 - 1 = -2
    torch.testing.assert_close(frozen(x).flatten(), torch.tensor([1.75, -2.0]))
    assert frozen.eps == 0.0 and repr(frozen) == "FrozenBatchNorm2d(2, eps=0.0)"
    # and a frozen checkpoint goes back into a torch BatchNorm, strictly: it is saved as a
    # version-1 module, so BatchNorm keeps its own num_batches_tracked
    bn = nn.BatchNorm2d(2)
    bn.load_state_dict(frozen.state_dict(), strict=True)
    assert torch.equal(bn.running_var, sd["running_var"]) and int(bn.num_batches_tracked) == 0


def test_checkpoint_with_missing_key_is_reported():
    frozen = FrozenBatchNorm1d(3)
    sd = _stats(3)
    del sd["running_var"]
    with pytest.raises(RuntimeError, match="running_var"):
        frozen.load_state_dict(sd)


@pytest.mark.parametrize("frozen_cls, torch_cls, bad_shape", [
    (FrozenBatchNorm1d, nn.BatchNorm1d, (2, 3, 4, 5)),
    (FrozenBatchNorm2d, nn.BatchNorm2d, (2, 3, 4)),
    (FrozenBatchNorm3d, nn.BatchNorm3d, (2, 3, 4, 4)),
])
def test_input_rank_checked_like_torch(frozen_cls, torch_cls, bad_shape):
    x = torch.randn(bad_shape)
    with pytest.raises(ValueError) as theirs:
        torch_cls(3).eval()(x)
    with pytest.raises(ValueError) as ours:
        frozen_cls(3)(x)
    assert str(ours.value) == str(theirs.value)


def test_wrong_channel_count_says_expected_and_got():
    with pytest.raises(RuntimeError, match=r"expected input with 3 channels.*got input of shape \[2, 4, 5\]"):
        FrozenBatchNorm1d(3)(torch.randn(2, 4, 5))


def test_exported_from_normlab_nn():
    assert normlab.nn.FrozenBatchNorm2d is FrozenBatchNorm2d
    assert {"FrozenBatchNorm1d", "FrozenBatchNorm2d", "FrozenBatchNorm3d"} <= set(normlab.nn.__all__)
