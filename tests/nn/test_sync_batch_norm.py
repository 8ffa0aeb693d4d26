"""normlab.nn.SyncBatchNorm in one process: torch's signature and state, convert_sync_batchnorm,
and plain BatchNorm when there is nothing to synchronise with (no group, or a group of one)."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.distributed as dist
from torch import nn

import normlab
from normlab.nn import SyncBatchNorm


def test_constructor_signature_repr_and_state_dict_are_torchs():
    ours = inspect.signature(SyncBatchNorm.__init__).parameters
    ref = inspect.signature(nn.SyncBatchNorm.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in ref.values()]
    for kwargs in ({}, {"affine": False}, {"track_running_stats": False, "bias": False}, {"momentum": None}):
        a, b = SyncBatchNorm(4, **kwargs), nn.SyncBatchNorm(4, **kwargs)
        assert repr(a) == repr(b)
        assert a._version == b._version
        sa, sb = a.state_dict(), b.state_dict()
        assert list(sa) == list(sb)
        for k in sa:
            assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
        a.load_state_dict(nn.SyncBatchNorm(4, **kwargs).state_dict())  # and back: strict
    assert SyncBatchNorm(4, process_group="g").process_group == "g"


def test_input_checks_are_torchs():
    with pytest.raises(ValueError, match=r"expected at least 2D input \(got 1D input\)"):
        SyncBatchNorm(3)(torch.randn(3))
    with pytest.raises(ValueError, match="number of input channels should be non-zero"):
        SyncBatchNorm(3, affine=False, track_running_stats=False)(torch.randn(2, 0))
    with pytest.raises(RuntimeError, match="expected input with 3 channels"):
        SyncBatchNorm(3)(torch.randn(4, 5))


def _reference_pair(kwargs, dtype=torch.float64):
    ref = nn.BatchNorm2d(3, dtype=dtype, **kwargs)
    with torch.no_grad():
        if ref.weight is not None:
            ref.weight.copy_(torch.tensor([1.5, 0.5, -1.0]))
        if ref.bias is not None:
            ref.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    ours = SyncBatchNorm(3, dtype=dtype, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ours, ref


def _same_as_batch_norm(kwargs):
    """Three training steps with backward, then evaluation, against torch.nn.BatchNorm2d in float64."""
    ours, ref = _reference_pair(kwargs)
    for step in range(3):
        x = torch.randn(4, 3, 2, 5, dtype=torch.float64) * (step + 1)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), ref(xb)
        dy = torch.randn_like(ya)
        (ya * dy).sum().backward()
        (yb * dy).sum().backward()
        torch.testing.assert_close(ya, yb, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-10)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-10, atol=1e-10)
    x = torch.randn(2, 3, 2, 5, dtype=torch.float64)
    torch.testing.assert_close(ours.eval()(x), ref.eval()(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kwargs", [{}, {"momentum": None}, {"affine": False, "track_running_stats": False}], ids=str)
def test_without_a_process_group_it_is_batch_norm(kwargs):
    assert not dist.is_initialized()
    _same_as_batch_norm(kwargs)


def test_a_group_of_one_is_batch_norm():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        _same_as_batch_norm({})
        with pytest.raises(ValueError, match="Expected more than 1 value per channel"):  # local rule, as torch
            SyncBatchNorm(3)(torch.randn(1, 3))
    finally:
        dist.destroy_process_group()


def test_convert_sync_batchnorm_keeps_parameters_buffers_and_flags():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Sequential(normlab.nn.BatchNorm2d(4, momentum=None, bias=False), nn.BatchNorm2d(4, affine=False)),
        nn.SyncBatchNorm(4, eps=1e-3), nn.Flatten(), nn.BatchNorm1d(4 * 9, track_running_stats=False),
    )
    model(torch.randn(2, 3, 3, 3))  # buffers away from their initial values
    model[3].eval()
    before = {name: m for name, m in model.named_modules()}
    tensors = {k: v for k, v in list(model.named_parameters()) + list(model.named_buffers())}
    state = copy.deepcopy(model.state_dict())
    out = SyncBatchNorm.convert_sync_batchnorm(model, process_group="group")
    assert out is model
    converted = {name: m for name, m in model.named_modules() if isinstance(m, SyncBatchNorm)}
    assert sorted(converted) == ["1", "3.0", "3.1", "4", "6"]
    for name, m in converted.items():
        old = before[name]
        assert m.process_group == "group" and m.training == old.training
        assert (m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats) == (
            old.num_features, old.eps, old.momentum, old.affine, old.track_running_stats)
        assert (m.bias is None) == (old.bias is None)
    for k, v in list(model.named_parameters()) + list(model.named_buffers()):
        assert v is tensors[k], k  # the very same objects: an optimizer built before keeps working
    assert list(model.state_dict()) == list(state)
    single = SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(3))
    assert type(single) is SyncBatchNorm
