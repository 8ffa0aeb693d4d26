"""normlab.nn.LazyBatchNorm*/LazyInstanceNorm* beside torch.nn's Lazy classes (the oracle): the
state before the first call, the class, values, running statistics and state_dict after it,
state_dict loading in both states, and the errors."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

import normlab

pytestmark = pytest.mark.filterwarnings("ignore:input.s size at dim")  # torch.nn.InstanceNorm with num_features 0

NAMES = {  # name -> a batched input shape (C = 3)
    "LazyBatchNorm1d": (4, 3),
    "LazyBatchNorm2d": (2, 3, 4, 4),
    "LazyBatchNorm3d": (2, 3, 2, 2, 2),
    "LazyInstanceNorm1d": (2, 3, 5),
    "LazyInstanceNorm2d": (2, 3, 4, 4),
    "LazyInstanceNorm3d": (2, 3, 2, 2, 2),
}
KWARGS = [{}, {"affine": False}, {"track_running_stats": False}, {"bias": False}, {"momentum": None},
          {"affine": False, "track_running_stats": False}]


def _pair(name, **kwargs):
    return getattr(normlab.nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)


def _keys_and_kinds(sd):
    return {k: type(v).__name__ if isinstance(v, (UninitializedParameter, UninitializedBuffer)) else tuple(v.shape)
            for k, v in sd.items()}


@pytest.mark.parametrize("name", NAMES)
def test_constructor_signature_is_torchs(name):
    # the six classes share one __init__ (nn/lazy.py's _LazyNormBase): names, defaults and kinds
    # (positional or keyword-only) still those of each torch class
    def params(cls):
        return [(p.name, p.default, p.kind) for p in inspect.signature(cls.__init__).parameters.values()]

    assert params(getattr(normlab.nn, name)) == params(getattr(torch.nn, name))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kwargs", KWARGS)
def test_before_the_first_call_as_torch(name, kwargs):
    ours, theirs = _pair(name, **kwargs)
    assert repr(ours) == repr(theirs)
    assert _keys_and_kinds(ours.state_dict()) == _keys_and_kinds(theirs.state_dict())
    assert ours.has_uninitialized_params() == theirs.has_uninitialized_params()
    assert len(list(ours.parameters())) == len(list(theirs.parameters()))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kwargs", KWARGS)
def test_first_calls_match_torch(name, kwargs):
    ours, theirs = _pair(name, **kwargs)
    twin = getattr(normlab.nn, name.removeprefix("Lazy"))
    for step in range(3):
        x = torch.randn(NAMES[name], generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert type(ours) is twin and type(theirs) is getattr(torch.nn, name.removeprefix("Lazy"))
    sd_ours, sd_theirs = ours.state_dict(), theirs.state_dict()
    assert list(sd_ours) == list(sd_theirs)
    for key in sd_ours:
        torch.testing.assert_close(sd_ours[key], sd_theirs[key], rtol=1e-5, atol=1e-6)
    if sd_ours:
        assert ours.num_features == theirs.num_features == 3
    assert ours.num_features == 3  # also where torch leaves 0 (nothing to materialise)
    ours.eval(), theirs.eval()
    x = torch.randn(NAMES[name])
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_another_channel_count_after_materialisation_raises_torchs_class(name):
    ours, theirs = _pair(name)
    ours(torch.randn(NAMES[name])), theirs(torch.randn(NAMES[name]))
    bad = list(NAMES[name])
    bad[1] = 5
    with pytest.raises(Exception) as want:
        theirs(torch.randn(bad))
    with pytest.raises(want.type, match=r"3.*5|5.*3") as got:
        ours(torch.randn(bad))
    assert "expected" in str(got.value)
    assert ours.num_features == 3 and ours.weight.shape == (3,)


@pytest.mark.parametrize("name", NAMES)
def test_wrong_rank_first_call_is_refused_before_materialising(name):
    ours, theirs = _pair(name)
    bad = torch.randn(*NAMES[name], 2, 2)
    with pytest.raises(ValueError, match=r"expected .*D input \(got \dD input\)"):
        ours(bad)
    with pytest.raises(ValueError):
        theirs(bad)
    assert type(ours).__name__ == name and ours.has_uninitialized_params()  # still lazy: nothing done
    ours(torch.randn(NAMES[name]))
    assert ours.num_features == 3


@pytest.mark.parametrize("name", ["LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d"])
def test_unbatched_instance_norm_reads_the_channel_dim(name):
    ours = getattr(normlab.nn, name)()
    twin = getattr(torch.nn, name.removeprefix("Lazy"))(3, affine=True, track_running_stats=True)
    x = torch.randn(NAMES[name][1:])  # (C, *spatial)
    torch.testing.assert_close(ours(x), twin(x), rtol=1e-5, atol=1e-5)
    assert ours.num_features == 3
    torch.testing.assert_close(ours.running_mean, twin.running_mean)


@pytest.mark.parametrize("name", NAMES)
def test_loading_a_materialised_state_dict_materialises_as_torch(name):
    """Loading materialises as torch's does (the class stays lazy until the first call); the
    first call then runs as the source module (the oracle: torch's Lazy InstanceNorm keeps
    num_features 0 after a load and refuses the input, so the materialised source answers)."""
    source = getattr(torch.nn, name.removeprefix("Lazy"))(4, affine=True, track_running_stats=True)
    with torch.no_grad():
        source.weight.uniform_(), source.running_mean.uniform_()
    ours, theirs = _pair(name)
    ours.load_state_dict(source.state_dict()), theirs.load_state_dict(source.state_dict())
    assert not ours.has_uninitialized_params() and not theirs.has_uninitialized_params()
    assert type(ours).__name__ == type(theirs).__name__ == name
    torch.testing.assert_close(ours.weight, source.weight)
    x = torch.randn(2, 4, *NAMES[name][2:]) if name != "LazyBatchNorm1d" else torch.randn(4, 4)
    ours.eval(), source.eval()
    torch.testing.assert_close(ours(x), source(x), rtol=1e-5, atol=1e-5)
    assert ours.num_features == 4  # from the loaded shape (torch's stays 0)


@pytest.mark.parametrize("name", NAMES)
def test_an_unmaterialised_state_dict_loads_into_a_lazy_module(name):
    ours, theirs = _pair(name)
    assert str(ours.load_state_dict(theirs.state_dict())) == "<All keys matched successfully>"
    assert ours.has_uninitialized_params()


def test_lazy_state_dict_into_a_materialised_module_raises_as_torch():
    lazy_sd = normlab.nn.LazyBatchNorm2d().state_dict()
    with pytest.raises(RuntimeError, match="uninitialized parameter"):
        normlab.nn.BatchNorm2d(3).load_state_dict(lazy_sd)
    with pytest.raises(RuntimeError, match="uninitialized parameter"):
        torch.nn.BatchNorm2d(3).load_state_dict(lazy_sd)


def test_dtype_and_to_before_the_first_call():
    ours = normlab.nn.LazyBatchNorm2d(dtype=torch.float64)
    ours(torch.randn(2, 3, 2, 2, dtype=torch.float64))
    assert ours.weight.dtype == ours.running_mean.dtype == torch.float64
    ours = normlab.nn.LazyBatchNorm1d().to(torch.float64)
    ours(torch.randn(4, 3, dtype=torch.float64))
    assert ours.running_var.dtype == torch.float64


@pytest.mark.parametrize("name", NAMES)
def test_constructor_checks_as_the_materialised_classes(name):
    """The judgements of normlab's BatchNorm/InstanceNorm constructors (tests/nn/test_constructor_checks.py),
    with the lazy class's name, at construction."""
    make = getattr(normlab.nn, name)
    with pytest.raises(ValueError, match=rf"^{name}: expected eps to be a non-negative number, got -1e-05$"):
        make(eps=-1e-5)
    with pytest.raises(ValueError, match=rf"^{name}: expected momentum in \[0, 1\] .*got 1.5$"):
        make(momentum=1.5)
    with pytest.raises(TypeError, match=rf"^{name}: expected momentum to be a float in \[0, 1\] or None, got '0.1'$"):
        make(momentum="0.1")
    with pytest.raises(RuntimeError, match=rf"^{name}: expected a floating-point dtype .*got torch.int64$"):
        make(dtype=torch.int64)
    with pytest.raises(RuntimeError):  # torch refuses an integer dtype too, at the first call
        getattr(torch.nn, name)(dtype=torch.int64)(torch.randn(NAMES[name]))
    for momentum in (0.0, 1.0, None):
        assert repr(make(momentum=momentum)) == repr(getattr(torch.nn, name)(momentum=momentum))


def test_instance_norm_without_state_gives_no_channel_warning():
    m = normlab.nn.LazyInstanceNorm1d(affine=False, track_running_stats=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(torch.randn(2, 3, 5))
        m(torch.randn(2, 3, 5))
