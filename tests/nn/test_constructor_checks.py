"""Every normlab.nn constructor checks its arguments before allocating anything.

A mistake raises the class torch raises for it (where torch catches it at all) with
"expected ..., got ..." and the fix where there is one; the valid edge cases
(num_groups == num_channels, normalized_shape as int, list, tuple or torch.Size,
eps=0, momentum at 0, 1 or None, zero channels, numpy ints) still construct and match
torch.nn.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import normlab

NN = normlab.nn
BATCH_LIKE = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
              "SyncBatchNorm"]
OURS_ONLY = ["FrozenBatchNorm2d", "BatchRenorm2d", "GhostBatchNorm2d"]


def _ours(name, *args, **kwargs):
    if name.startswith("GhostBatchNorm"):
        args = (*args[:1], 2, *args[1:])  # virtual_batch_size after num_features
    return getattr(NN, name)(*args, **kwargs)


def _torch_raises_the_same(exc, make_theirs):
    with pytest.raises(exc):
        make_theirs()


# ----------------------------------------------------------------------------
# GroupNorm
# ----------------------------------------------------------------------------


def test_group_norm_zero_groups_is_a_value_error_not_zero_division():
    with pytest.raises(ZeroDivisionError):  # torch's own
        nn.GroupNorm(0, 10)
    with pytest.raises(ValueError, match=r"^GroupNorm: expected num_groups to be a positive int, got 0$"):
        NN.GroupNorm(0, 10)
    with pytest.raises(ValueError, match=r"^GroupNorm: expected num_groups to be a positive int, got -2$"):
        NN.GroupNorm(-2, 10)  # torch accepts it, then fails in forward


@pytest.mark.parametrize("bad", [2.0, "2", True, None])
def test_group_norm_num_groups_of_another_type_is_a_type_error(bad):
    with pytest.raises(TypeError, match=rf"^GroupNorm: expected num_groups to be an int, got {bad!r}$"):
        NN.GroupNorm(bad, 10)


def test_group_norm_indivisible_names_the_divisors():
    _torch_raises_the_same(ValueError, lambda: nn.GroupNorm(3, 10))
    with pytest.raises(ValueError) as err:
        NN.GroupNorm(3, 10)
    assert str(err.value) == ("GroupNorm: num_channels (10) must be divisible by num_groups (3); "
                              "num_groups that divide 10: 1, 2, 5, 10")


def test_group_norm_swapped_arguments_are_pointed_out():
    with pytest.raises(ValueError) as err:
        NN.GroupNorm(32, 8)
    assert str(err.value) == ("GroupNorm: num_channels (8) must be divisible by num_groups (32); the arguments "
                              "are num_groups, then num_channels: did you mean GroupNorm(8, 32)?")


def test_group_norm_negative_or_float_channels():
    _torch_raises_the_same(RuntimeError, lambda: nn.GroupNorm(2, -4))
    with pytest.raises(RuntimeError, match=r"^GroupNorm: expected num_channels >= 0 \(the number of channels C\), "
                                           r"got -4$"):
        NN.GroupNorm(2, -4)
    _torch_raises_the_same(TypeError, lambda: nn.GroupNorm(2, 10.0))
    with pytest.raises(TypeError, match=r"^GroupNorm: expected num_channels to be an int .*got 10.0$"):
        NN.GroupNorm(2, 10.0)


@pytest.mark.parametrize("groups,channels", [(10, 10), (1, 10), (5, 10), (np.int64(2), np.int64(4)), (2, 0)])
def test_group_norm_valid_edges_match_torch(groups, channels):
    ours, theirs = NN.GroupNorm(groups, channels), nn.GroupNorm(int(groups), int(channels))
    assert (ours.num_groups, ours.num_channels) == (theirs.num_groups, theirs.num_channels)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = torch.randn(3, int(channels), 4)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# LayerNorm, RMSNorm, LayerNorm2d
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("shape", [-3, (2, -1), [-1]])
def test_negative_normalized_shape(name, shape):
    _torch_raises_the_same(RuntimeError, lambda: getattr(nn, name)(shape))
    with pytest.raises(RuntimeError, match=rf"^{name}: expected normalized_shape of sizes >= 0, got "
                                           rf"{repr(shape).replace('(', '.').replace(')', '.').replace('[', '.')}"):
        getattr(NN, name)(shape)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_empty_normalized_shape_is_refused_at_construction(name):
    """torch constructs it and raises RuntimeError at the first forward; normlab raises it at once."""
    m = getattr(nn, name)(())
    _torch_raises_the_same(RuntimeError, lambda: m(torch.randn(2, 3)))
    with pytest.raises(RuntimeError, match=rf"^{name}: expected normalized_shape to have at least one dim, got \(\); "
                                           rf"pass the size of the last dim, e.g. {name}\(512\)"):
        getattr(NN, name)(())


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("shape", [3.0, "3", (2, 3.0), True, None])
def test_normalized_shape_of_another_type(name, shape):
    with pytest.raises(TypeError, match=rf"^{name}: expected normalized_shape to be an int or a sequence of ints"):
        getattr(NN, name)(shape)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("shape", [5, (5,), [5], torch.Size([5]), (3, 5), np.int64(5), 0])
def test_normalized_shape_forms_match_torch(name, shape):
    ours, theirs = getattr(NN, name)(shape), getattr(nn, name)(shape)
    assert ours.normalized_shape == theirs.normalized_shape
    assert ours.weight.shape == theirs.weight.shape
    x = torch.randn(2, 3, 5) if shape != 0 else torch.randn(2, 0)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_layer_norm2d_channels():
    with pytest.raises(TypeError, match=r"^LayerNorm2d: expected num_channels to be an int \(the number of channels C\), "
                                        r"got 4.0$"):
        NN.LayerNorm2d(4.0)
    with pytest.raises(ValueError, match=r"^LayerNorm2d: expected num_channels to be a positive int, got -1$"):
        NN.LayerNorm2d(-1)
    assert NN.LayerNorm2d(np.int64(4)).weight.shape == (4,)


# ----------------------------------------------------------------------------
# num_features of the per-channel layers
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", BATCH_LIKE + OURS_ONLY)
def test_negative_num_features(name):
    if hasattr(nn, name) and not name.startswith("InstanceNorm"):  # torch's InstanceNorm accepts it
        _torch_raises_the_same(RuntimeError, lambda: getattr(nn, name)(-1))
    with pytest.raises(RuntimeError, match=rf"^{name}: expected num_features >= 0 \(the number of channels C\), "
                                           rf"got -1$"):
        _ours(name, -1)


@pytest.mark.parametrize("name", BATCH_LIKE + OURS_ONLY)
@pytest.mark.parametrize("bad", [3.0, "3", True, None])
def test_num_features_of_another_type(name, bad):
    with pytest.raises(TypeError, match=rf"^{name}: expected num_features to be an int \(the number of channels C\), "
                                        rf"got {bad!r}$"):
        _ours(name, bad)


@pytest.mark.parametrize("name", BATCH_LIKE)
@pytest.mark.parametrize("c", [0, np.int64(3)])
def test_num_features_edges_match_torch(name, c):
    ours, theirs = getattr(NN, name)(c), getattr(nn, name)(int(c))
    assert ours.num_features == theirs.num_features and type(ours.num_features) is int
    assert repr(ours) == repr(theirs)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}


# ----------------------------------------------------------------------------
# eps, momentum, dtype
# ----------------------------------------------------------------------------

ALL = ["LayerNorm", "RMSNorm", "GroupNorm", "LayerNorm2d", *BATCH_LIKE, *OURS_ONLY]


def _make(name, **kwargs):
    if name == "GroupNorm":
        return NN.GroupNorm(2, 4, **kwargs)
    return _ours(name, 4, **kwargs)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("eps", [-1e-5, float("nan")])
def test_eps_out_of_range(name, eps):
    """The judgement of normlab.functional (normlab._checks.check_eps), with its message."""
    with pytest.raises(ValueError, match=rf"^{name}: expected eps to be a non-negative number, got {eps!r}$"):
        _make(name, eps=eps)


@pytest.mark.parametrize("name", ALL)
def test_eps_inf_constructs(name):
    """eps=inf is accepted, as by torch.nn and normlab.functional (the output is 0, or the bias;
    tests/functional/test_argument_table.py compares the values with torch's)."""
    assert _make(name, eps=float("inf")).eps == float("inf")


@pytest.mark.parametrize("name", ALL)
def test_eps_bool_is_a_type_error(name):
    with pytest.raises(TypeError, match=rf"^{name}: expected eps to be a float( or None)?, got False; a bool here "
                                        rf"is usually a flag passed by position"):
        _make(name, eps=False)


@pytest.mark.parametrize("name", ALL)
def test_eps_of_another_type(name):
    with pytest.raises(TypeError, match=rf"^{name}: expected eps to be a float.*, got '1e-5'$"):
        _make(name, eps="1e-5")


def test_eps_none_only_for_rms_norm():
    assert NN.RMSNorm(4, eps=None).eps is None
    with pytest.raises(TypeError, match=r"^LayerNorm: expected eps to be a float, got None$"):
        NN.LayerNorm(4, eps=None)


@pytest.mark.parametrize("pair", [(NN.LayerNorm, nn.LayerNorm, (2, 4)), (NN.GroupNorm, nn.GroupNorm, (2, 4, 3)),
                                  (NN.RMSNorm, nn.RMSNorm, (2, 4))])
def test_eps_zero_matches_torch(pair):
    ours_cls, theirs_cls, shape = pair
    args = (2, 4) if ours_cls is NN.GroupNorm else (4,)
    x = torch.randn(shape, dtype=torch.float64)
    ours, theirs = ours_cls(*args, eps=0.0, dtype=torch.float64), theirs_cls(*args, eps=0.0, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x))


def test_batch_norm_eps_zero_constructs_and_evaluates_as_torch():
    """torch takes eps=0 at construction and in eval (its training forward refuses it; so does normlab's)."""
    ours, theirs = NN.BatchNorm1d(4, eps=0.0).eval(), nn.BatchNorm1d(4, eps=0.0).eval()
    x = torch.randn(5, 4)
    torch.testing.assert_close(ours(x), theirs(x))
    with pytest.raises(ValueError):
        theirs.train()(x)
    with pytest.raises(ValueError, match="expected eps > 0 in training"):
        ours.train()(x)


@pytest.mark.parametrize("name", [*BATCH_LIKE, "BatchRenorm2d", "GhostBatchNorm2d"])
@pytest.mark.parametrize("momentum", [-0.1, 1.5, float("nan")])
def test_momentum_out_of_range(name, momentum):
    with pytest.raises(ValueError, match=rf"^{name}: expected momentum in \[0, 1\] \(the weight of the new batch "
                                         rf"statistic in the running ones; None: a cumulative average\), "
                                         rf"got {momentum!r}$"):
        _ours(name, 4, momentum=momentum)


@pytest.mark.parametrize("name", BATCH_LIKE)
def test_momentum_of_another_type(name):
    with pytest.raises(TypeError, match=rf"^{name}: expected momentum to be a float in \[0, 1\] or None, got '0.1'$"):
        getattr(NN, name)(4, momentum="0.1")


@pytest.mark.parametrize("momentum", [0, 0.0, 1.0, None, np.float64(0.3)])
def test_momentum_edges_match_torch(momentum):
    ours, theirs = NN.BatchNorm1d(3, momentum=momentum), nn.BatchNorm1d(3, momentum=momentum)
    for _ in range(2):
        x = torch.randn(6, 3)
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.running_mean, theirs.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.running_var, theirs.running_var, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_integer_dtype(name):
    if hasattr(nn, name) and name != "GroupNorm":  # (torch's GroupNorm also raises, the same class)
        _torch_raises_the_same(RuntimeError, lambda: getattr(nn, name)(4, affine=True, dtype=torch.int64)
                               if "Instance" in name else getattr(nn, name)(4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match=rf"^{name}: expected a floating-point dtype \(torch.float16, torch.bfloat16, "
                                           rf"torch.float32 or torch.float64\), got torch.int64$"):
        _make(name, dtype=torch.int64)


def test_dtype_of_another_type():
    with pytest.raises(TypeError, match=r"^LayerNorm: expected dtype to be a torch.dtype or None, got 'float32'$"):
        NN.LayerNorm(4, dtype="float32")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_float_dtypes_construct(dtype):
    assert NN.BatchNorm2d(4, dtype=dtype).running_var.dtype == dtype
    assert NN.LayerNorm(4, dtype=dtype).weight.dtype == dtype


# ----------------------------------------------------------------------------
# the variants' own arguments
# ----------------------------------------------------------------------------


def test_ghost_batch_norm_virtual_batch_size():
    with pytest.raises(TypeError, match=r"^GhostBatchNorm1d: expected virtual_batch_size to be a positive int "
                                        r"\(samples per virtual batch\), got 2.5$"):
        NN.GhostBatchNorm1d(3, 2.5)
    with pytest.raises(ValueError, match=r"^GhostBatchNorm1d: expected virtual_batch_size .*got 0$"):
        NN.GhostBatchNorm1d(3, 0)


@pytest.mark.parametrize("kwargs,exc,message", [
    ({"r_max": "3"}, TypeError, r"^BatchRenorm1d: expected r_max to be a float, got '3'$"),
    ({"d_max": None}, TypeError, r"^BatchRenorm1d: expected d_max to be a float, got None$"),
    ({"r_max": 0.5}, ValueError, r"^BatchRenorm1d: expected r_max >= 1 \(r is clipped to \[1 / r_max, r_max\]\), got 0.5$"),
    ({"d_max": float("inf")}, ValueError, r"^BatchRenorm1d: expected d_max >= 0 .*got inf$"),
    ({"warmup_steps": 1.5}, TypeError, r"^BatchRenorm1d: expected warmup_steps to be an int >= 0, got 1.5$"),
    ({"warmup_steps": -1}, ValueError, r"^BatchRenorm1d: expected warmup_steps to be an int >= 0, got -1$"),
])
def test_batch_renorm_limits(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        NN.BatchRenorm1d(3, **kwargs)


def test_batch_renorm_limits_at_their_edges():
    m = NN.BatchRenorm1d(3, r_max=1, d_max=0, warmup_steps=np.int64(0))
    assert (m.r_max, m.d_max, m.warmup_steps) == (1.0, 0.0, 0)


class _TorchCalls(TorchFunctionMode):
    """Records the name of every torch function called inside it (factories included)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_nothing_is_allocated_before_a_check_fails():
    """The checks run before any tensor is made: a refused constructor calls no torch factory."""
    with _TorchCalls() as seen:
        NN.LayerNorm(3)
    assert "empty" in seen.names  # the recorder sees a constructor's allocations
    for make in (lambda: NN.GroupNorm(0, 10), lambda: NN.LayerNorm(-3), lambda: NN.BatchNorm2d(4, momentum=2),
                 lambda: NN.InstanceNorm1d(4, eps=-1), lambda: NN.FrozenBatchNorm2d(4, dtype=torch.int32)):
        with _TorchCalls() as seen, pytest.raises((ValueError, RuntimeError, TypeError)):
            make()
        made = [n for n in seen.names if n in ("empty", "zeros", "ones", "tensor", "full", "empty_like", "rand", "randn")]
        assert made == [], made
